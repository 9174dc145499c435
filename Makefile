# Two commands do all the set-up on a fresh machine (Python 3.11+):
#   make serve   install and run the embedded default on http://127.0.0.1:8000
#   make test    install the test tools and run lint, types and the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: serve test lint install install-test bench eval clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch is pinned to the local CPU build (pyproject.toml); a bare `torch` would pull a CUDA build.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

serve: install
	$(BIN)/kops serve

lint: install-test
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

test: lint
	$(BIN)/pytest

# `kops bench` with every phase: the peer (LlamaIndex), the int8 model, the scale-out topology
$(VENV)/.installed-bench: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[bench]'
	touch $@

bench: $(VENV)/.installed-bench
	$(BIN)/kops bench --out bench.json

# `kops eval` on every judged collection (eval/), both baselines, for the default model and for
# the multilingual one, with the targets they hold (docs/search-quality.md)
E5 = intfloat/multilingual-e5-small:q4
# all-MiniLM-L6-v2 reads no CJK text: questions in English against CJK pages need e5
MONOLINGUAL = $(foreach l,en de fr zh-cn ja ko,debian-faq-$(l))
eval: $(VENV)/.installed-bench
	$(BIN)/kops eval --out eval-minilm.json --require '*:hybrid:mrr10>=bm25' \
		$(foreach c,$(MONOLINGUAL),--require '$(c):hybrid:mrr10>=llamaindex+0.1')
	$(BIN)/kops eval --model $(E5) --out eval-e5.json \
		--require '*:hybrid:mrr10>=llamaindex+0.1' --require '*:hybrid:mrr10>=bm25' \
		--require '*:hybrid:mrr10>=keyword' \
		--require 'debian-faq-zh-cn:hybrid:r5>=0.95' --require 'debian-faq-zh-cn:hybrid:mrr10>=0.85' \
		--require 'debian-faq-ja:hybrid:r5>=0.95' --require 'debian-faq-ja:hybrid:mrr10>=0.85' \
		--require 'debian-faq-en>ja:hybrid:r5>=0.8' --require 'debian-faq-en>zh-cn:hybrid:r5>=0.8' \
		--require 'debian-faq-en:hybrid:mrr10>=0.95'

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
