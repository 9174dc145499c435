"""How text and queries become keyword terms, the same for every index.

Chinese, Japanese and Korean put no spaces between words (Korean puts them between phrases), so
a run of their characters is cut into terms before an engine's word tokenizer sees it:

- Chinese (Han characters in a text without kana): words by jieba's dictionary (`rjieba`, its
  dictionary inside the wheel), in search mode, so a long word also yields the dictionary words
  inside it ("数据库" → 数据, 据库, 数据库);
- Japanese (any text with kana) and Korean (Hangul): overlapping character bigrams, the CJK
  analyzer of Lucene and Elasticsearch ("設定ファイル" → 設定, 定フ, ファ, ァイ, イル).

`index_text` rewrites a chunk's text with its CJK runs replaced by their terms between spaces,
for SQLite FTS5 and PostgreSQL's `simple` configuration alike; `query_terms` cuts a query the
same way, so a query's word is a term the index holds. A query is an OR of its terms: a chunk
holding most of them ranks, not only one holding all of them side by side. A Han-only query
cannot say whether it is Chinese or Japanese, so it asks for both cuts (jieba's words and the
bigrams); the ones a dataset does not hold match nothing.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Sequence

TERMS_VERSION = 2
"""Bumped whenever `index_text` changes, so indexes built with the old terms are rebuilt."""

_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_KANA = "\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f"
_HANGUL = "\uac00-\ud7af\u1100-\u11ff\u3130-\u318f"
_CJK = _HAN + _KANA + _HANGUL
_CJK_RUN = re.compile(f"[{_CJK}]+")
_HAS_KANA = re.compile(f"[{_KANA}]")
_HAN_ONLY = re.compile(f"[{_HAN}]+")
_WORD = re.compile(r"\w+")
_TERM = re.compile(f"[{_CJK}]+|[^\\W{_CJK}]+")  # a CJK run, or a run of other word characters


@functools.cache
def _jieba() -> Callable[[str], list[str]]:
    import rjieba  # noqa: PLC0415 (its dictionary takes 0.14 s to load: only once Chinese is seen)

    cut: Callable[[str], list[str]] = rjieba.cut_for_search
    return cut


def _bigrams(run: str) -> Iterator[str]:
    if len(run) == 1:
        yield run
        return
    for start in range(len(run) - 1):
        yield run[start : start + 2]


def _run_terms(run: str, *, japanese: bool) -> Iterator[str]:
    if japanese or not _HAN_ONLY.fullmatch(run):
        yield from _bigrams(run)
        return
    for word in _jieba()(run):
        if word.strip():
            yield word


RUN_CACHED_MAX = 32  # characters of a CJK run whose cut is kept (a corpus repeats its words) …
RUN_CACHE = 16_384  # … in so many runs at most (about 5 MB full)


@functools.lru_cache(maxsize=RUN_CACHE)
def _cached_run_text(run: str, japanese: bool) -> str:
    return _run_text(run, japanese)


def _run_text(run: str, japanese: bool) -> str:
    """A CJK run as `index_text` writes it: its terms between spaces."""
    return " " + " ".join(_run_terms(run, japanese=japanese)) + " "


def index_text(text: str) -> str:
    """`text` with each CJK run replaced by its terms between spaces (the rest unchanged): what
    the keyword index tokenizes."""
    if not _CJK_RUN.search(text):
        return text
    japanese = _HAS_KANA.search(text) is not None

    def cut(match: re.Match[str]) -> str:
        run = match.group()
        if len(run) > RUN_CACHED_MAX:
            return _run_text(run, japanese)
        return _cached_run_text(run, japanese)

    return _CJK_RUN.sub(cut, text)


# Function words carry no topic; in a small dataset BM25 still scores them high when they are
# rare, which lets "how do I ..." outrank the words that matter. Dropped unless nothing else is.
STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further
    had has have having he her here hers him his how i if in into is it its itself just me more
    most my no nor not of off on once only or other our ours out over own same she should so some
    such than that the their theirs them then there these they this those through to too under
    until up very was we were what when where which while who whom why will with would you your
    yours
    的 了 是 在 和 与 及 或 也 都 就 而 吗 呢 吧 啊 么 把 被 让 对 从 向 后 前 中 里 上 下
    这 那 这个 那个 这些 那些 哪 哪些 哪个 什么 怎么 怎样 怎么样 如何 为什么 为何 是否 能否
    可以 能 会 要 需要 应该 有 没有 我 你 他 她 它 我们 你们 他们 一个 一些 请问 呢""".split()  # noqa: SIM905
)


def query_words(query: str) -> list[str]:
    """The query's own words, lower-cased, function words dropped (unless nothing else is
    left), each once, in the query's order: what a chunk answering it would hold."""
    return _content(_terms(query, expand=False))


def query_terms(query: str) -> list[str]:
    """The terms a keyword search asks the index for: the query's words and, for a Han-only
    run, the bigrams a Japanese text would hold of it."""
    return _content(_terms(query, expand=True))


def _terms(query: str, *, expand: bool) -> list[str]:
    terms: list[str] = []
    lowered = query.lower()
    japanese = _HAS_KANA.search(lowered) is not None
    for match in _TERM.finditer(lowered):
        term = match.group()
        if not _CJK_RUN.fullmatch(term):
            terms.append(term)
            continue
        terms.extend(_run_terms(term, japanese=japanese))
        if expand and not japanese and _HAN_ONLY.fullmatch(term):
            terms.extend(_bigrams(term))  # the same words in a Japanese text
    return terms


def _content(terms: list[str]) -> list[str]:
    unique = list(dict.fromkeys(terms))
    content = [term for term in unique if term not in STOPWORDS]
    return content or unique


QUERY_POSTINGS_PER_CHUNK = 3.0
"""How many postings a keyword search at scale reads, at most, per chunk of its dataset, when
the rarest words alone do not find enough candidates (`rarest_terms`; docs/architecture.md,
"The rarest words find the candidates; every word scores them")."""


def rarest_terms(
    terms: Sequence[str],
    doc_freq: Callable[[str], int],
    chunks: int,
    per_chunk: float | None = None,
) -> list[str]:
    """The terms a search asks a large index for: the rarest first (fewest chunks holding
    them), as many as the dataset holds `per_chunk` (QUERY_POSTINGS_PER_CHUNK unless given) ×
    `chunks` times together, at least the rarest one; in the query's order. The keyword index
    scores every posting of every term asked (keywords.py: tantivy-py's searches do not
    prune): a question of forty
    Japanese bigrams or of "debian linux gnu" in a Debian dataset read millions of postings
    for words whose BM25 weight is a tenth of a rare word's. Left out, they move
    `kops eval`'s MRR@10 by at most 0.003 (docs/search-quality.md, "The keyword index's
    ranking")."""
    freq = {term: doc_freq(term) for term in terms}
    budget = (QUERY_POSTINGS_PER_CHUNK if per_chunk is None else per_chunk) * chunks
    kept: set[str] = set()
    used = 0
    for term in sorted(freq, key=lambda term: freq[term]):  # stable: the query's order on ties
        if kept and used + freq[term] > budget:
            break
        kept.add(term)
        used += freq[term]
    return [term for term in freq if term in kept]


def coverage(words: list[str], text: str) -> float:
    """The share of `words` (query_words) that `text` holds as terms, as index_text makes
    them. A term is a piece of the text, so a word that is not cannot be held; a CJK word is
    looked for among the terms of the text's CJK runs that hold it, cut (jieba, bigrams) only
    then; any other word is a whole run of other word characters."""
    if not words:
        return 0.0
    lowered = text.lower()
    held = 0
    runs: list[str] | None = None
    for word in words:
        if word not in lowered:
            continue
        if _CJK_RUN.search(word) is None:
            held += _whole(word, lowered)
            continue
        if runs is None:
            runs = _CJK_RUN.findall(text)
            japanese = _HAS_KANA.search(text) is not None
        for run in runs:
            if word in run and word in _run_words(run, japanese):
                held += 1
                break
    return held / len(words)


@functools.lru_cache(maxsize=8192)
def _run_words(run: str, japanese: bool) -> frozenset[str]:
    """The terms index_text makes of a CJK run, lower-cased (the same runs come back in the
    texts of search after search: cut once)."""
    return frozenset(_WORD.findall(" ".join(_run_terms(run, japanese=japanese)).lower()))


_PLAIN_CHAR = re.compile(f"[^\\W{_CJK}]")  # what a run of other word characters is made of


def _whole(word: str, lowered: str) -> bool:
    """Whether `word` (a run of non-CJK word characters) is a whole term of the text: an
    occurrence not inside a longer run of such characters (a CJK character or any other ends
    a term). The word is found as a literal and the characters either side checked by hand: a
    regex made for the word cost 2.7 ms to compile (its character class holds the CJK ranges),
    a search's first sight of 40 texts 20 ms; one that begins with a lookbehind is tried at
    every position (three times slower)."""
    size, end_of_text = len(word), len(lowered)
    start = lowered.find(word)
    while start >= 0:
        end = start + size
        if (start == 0 or _PLAIN_CHAR.match(lowered, start - 1) is None) and (
            end == end_of_text or _PLAIN_CHAR.match(lowered, end) is None
        ):
            return True
        start = lowered.find(word, start + 1)
    return False
