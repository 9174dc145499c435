from __future__ import annotations

import itertools
import re

import pytest

from knowledgeops.ingest.chunker import HFTokenizer, TokenChunker
from knowledgeops.ingest.embedders.local import load_tokenizer
from knowledgeops.ingest.parsers.base import Block


@pytest.fixture(scope="module")
def tokenizer() -> HFTokenizer:
    return HFTokenizer(load_tokenizer())


def words(n: int, start: int = 0) -> str:
    vocabulary = ["ownership", "borrowing", "lifetimes", "unbelievably", "crates", "traits"]
    return " ".join(f"{vocabulary[i % len(vocabulary)]}{i}" for i in range(start, start + n))


def test_every_chunk_fits_the_model(tokenizer: HFTokenizer) -> None:
    chunker = TokenChunker(tokenizer, size=50, overlap=10)
    chunks = list(chunker.chunk([Block(words(600))]))
    assert len(chunks) > 10
    for chunk in chunks:
        real = len(tokenizer.encode(chunk.text).tokens)
        assert real == chunk.token_count
        assert chunk.token_count <= 50


def test_ordinals_are_consecutive_and_stable(tokenizer: HFTokenizer) -> None:
    chunker = TokenChunker(tokenizer, size=40, overlap=5)
    blocks = [Block(words(200), section="A"), Block(words(200, 200), section="B")]
    first = list(chunker.chunk(blocks))
    second = list(chunker.chunk(blocks))
    assert [c.ordinal for c in first] == list(range(len(first)))
    assert first == second
    assert first[0].content_hash == second[0].content_hash


def test_no_chunk_cuts_inside_a_word(tokenizer: HFTokenizer) -> None:
    text = words(800)
    vocabulary = set(text.split())
    chunks = list(TokenChunker(tokenizer, size=32, overlap=6).chunk([Block(text)]))
    for chunk in chunks:
        assert set(chunk.text.split()) <= vocabulary, chunk.text


def test_overlap_repeats_the_end_of_the_previous_chunk(tokenizer: HFTokenizer) -> None:
    chunks = list(TokenChunker(tokenizer, size=40, overlap=10).chunk([Block(words(300))]))
    for before, after in itertools.pairwise(chunks):
        first_word = after.text.split()[0]
        assert first_word in before.text.split(), (before.text, after.text)
    no_overlap = list(TokenChunker(tokenizer, size=40, overlap=0).chunk([Block(words(300))]))
    joined = " ".join(c.text for c in no_overlap)
    assert joined.split() == words(300).split()


def test_all_text_is_covered(tokenizer: HFTokenizer) -> None:
    text = words(1000)
    chunks = list(TokenChunker(tokenizer, size=60, overlap=10).chunk([Block(text)]))
    seen: set[str] = set()
    for chunk in chunks:
        seen.update(chunk.text.split())
    assert seen == set(text.split())


def test_paragraph_and_sentence_breaks_are_preferred(tokenizer: HFTokenizer) -> None:
    paragraph = "This sentence is about ownership. " * 6
    text = "\n\n".join(paragraph.strip() for _ in range(6))
    chunks = list(TokenChunker(tokenizer, size=60, overlap=0).chunk([Block(text)]))
    for chunk in chunks:
        assert chunk.text.endswith("."), chunk.text


def test_sections_never_share_a_chunk(tokenizer: HFTokenizer) -> None:
    blocks = [
        Block("Install cargo with rustup.", section="Install"),
        Block("Then run cargo new.", section="Install"),
        Block("Ownership moves values.", section="Ownership"),
    ]
    chunks = list(TokenChunker(tokenizer, size=100, overlap=10).chunk(blocks))
    assert [(c.section, c.text) for c in chunks] == [
        ("Install", "Install cargo with rustup.\n\nThen run cargo new."),
        ("Ownership", "Ownership moves values."),
    ]


def test_pages_are_tracked(tokenizer: HFTokenizer) -> None:
    pages = [Block(f"Page {n} talks about " + words(30, n * 100), page=n) for n in range(1, 6)]
    chunks = list(TokenChunker(tokenizer, size=50, overlap=5).chunk(pages))
    assert chunks[0].page_start == 1
    assert chunks[-1].page_end == 5
    for chunk in chunks:
        assert chunk.page_start is not None
        assert chunk.page_end is not None
        assert chunk.page_start <= chunk.page_end
        for number in re.findall(r"Page (\d+)", chunk.text):
            assert chunk.page_start <= int(number) <= chunk.page_end


def test_long_sections_stream_through_a_bounded_buffer(tokenizer: HFTokenizer) -> None:
    text_blocks = [Block(words(400, n * 400), page=n + 1) for n in range(20)]  # ~100 k chars
    chunks = list(TokenChunker(tokenizer, size=100, overlap=10).chunk(text_blocks))
    everything = set()
    for block in text_blocks:
        everything.update(block.text.split())
    seen: set[str] = set()
    for chunk in chunks:
        seen.update(chunk.text.split())
        assert chunk.token_count <= 100
    assert seen == everything
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    assert chunks[-1].page_end == 20


def test_chinese_text_is_cut_between_characters(tokenizer: HFTokenizer) -> None:
    text = "用户上传文档后，请求应该立刻返回任务编号；真正的工作由后台完成。" * 30
    chunks = list(TokenChunker(tokenizer, size=40, overlap=5).chunk([Block(text)]))
    assert len(chunks) > 5
    assert all(c.token_count <= 40 for c in chunks)
    assert "".join(chunks[0].text.split()) in text


def test_a_word_longer_than_a_chunk_is_still_cut(tokenizer: HFTokenizer) -> None:
    blob = "a" * 3000  # e.g. base64 without spaces: no word boundary exists
    chunks = list(TokenChunker(tokenizer, size=32, overlap=4).chunk([Block(blob)]))
    assert all(c.token_count <= 32 for c in chunks)
    assert "".join(c.text for c in chunks).count("a") >= 3000


def test_blank_input_gives_no_chunks(tokenizer: HFTokenizer) -> None:
    chunker = TokenChunker(tokenizer, size=32, overlap=4)
    assert list(chunker.chunk([])) == []
    assert list(chunker.chunk([Block("   \n\n  "), Block("")])) == []


@pytest.mark.parametrize(("size", "overlap"), [(4, 0), (32, 16), (32, -1)])
def test_bad_settings_are_refused(tokenizer: HFTokenizer, size: int, overlap: int) -> None:
    with pytest.raises(ValueError, match=r"size|overlap"):
        TokenChunker(tokenizer, size=size, overlap=overlap)
