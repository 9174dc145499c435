"""How text and queries become keyword terms, the same for every index: CJK characters one by one
(Chinese and Japanese have no spaces between words), function words dropped from queries."""

from __future__ import annotations

import re

_CJK_RUN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+")
_TERM = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+|\w+")


def spaced_cjk(text: str) -> str:
    """Put spaces between CJK characters so that a word tokenizer indexes each one; a CJK query
    then becomes a phrase of characters (Chinese and Japanese have no spaces between words)."""
    return _CJK_RUN.sub(lambda m: " " + " ".join(m.group()) + " ", text)


# Function words carry no topic; in a small dataset BM25 still scores them high when they are
# rare, which lets "how do I ..." outrank the words that matter. Dropped unless nothing else is.
STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further
    had has have having he her here hers him his how i if in into is it its itself just me more
    most my no nor not of off on once only or other our ours out over own same she should so some
    such than that the their theirs them then there these they this those through to too under
    until up very was we were what when where which while who whom why will with would you your
    yours""".split()  # noqa: SIM905
)


def query_terms(query: str) -> list[str]:
    """Words of a free-text query, lower-cased, function words dropped; a run of CJK characters
    is one phrase term."""
    terms = []
    for match in _TERM.finditer(query.lower()):
        term = match.group()
        terms.append(" ".join(term) if _CJK_RUN.fullmatch(term) else term)
    unique = list(dict.fromkeys(terms))
    content = [term for term in unique if term not in STOPWORDS]
    return content or unique
