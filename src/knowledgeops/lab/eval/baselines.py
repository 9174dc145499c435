"""The two baselines `kops eval` prints beside the service, on the same files and questions.

- `bm25`: BM25 (bm25s) over plain fixed-size passages of each page's body text: windows of
  `PASSAGE_UNITS` words (a CJK character counts as one) overlapping by `PASSAGE_OVERLAP`, with the
  service's own keyword terms (terms.py), so that the comparison is about passages and fusion,
  not about tokenizing Chinese.
- `llamaindex`: LlamaIndex's default as its users write it: `SimpleDirectoryReader` with the HTML
  body reader, `SentenceSplitter` with its default size and overlap (counted in the model's own
  tokens: tiktoken cannot download its tables here), `VectorStoreIndex` and its retriever, on
  the same embedding model as the service (the bench extra installs it).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from selectolax.lexbor import LexborHTMLParser

from knowledgeops.ingest.chunker import Tokenizer
from knowledgeops.ingest.embedders.base import Embedder
from knowledgeops.ingest.index.terms import index_text, query_terms

PASSAGE_UNITS = 200
PASSAGE_OVERLAP = 50
_UNIT = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]|\w+")
_WORD = re.compile(r"\w+")

Retrieve = Callable[[str, int], list[str]]
"""A baseline's search: (query, k) → the texts of its k best passages, best first."""


def body_text(path: Path) -> str:
    tree = LexborHTMLParser(path.read_bytes())
    for node in tree.css("script, style"):
        node.decompose()
    body = tree.body
    return body.text(separator="\n") if body is not None else ""


def passages(text: str) -> list[str]:
    """Windows of PASSAGE_UNITS units, overlapping, cut from `text` as it is written."""
    spans = [m.span() for m in _UNIT.finditer(text)]
    out = []
    step = PASSAGE_UNITS - PASSAGE_OVERLAP
    for first in range(0, max(1, len(spans) - PASSAGE_OVERLAP), step):
        window = spans[first : first + PASSAGE_UNITS]
        if window:
            out.append(" ".join(text[window[0][0] : window[-1][1]].split()))
    return out


def bm25(documents: Sequence[Path]) -> Retrieve:
    import bm25s  # noqa: PLC0415 (the eval's baseline: only when it runs)

    texts = [p for path in documents for p in passages(body_text(path))]
    retriever = bm25s.BM25()
    retriever.index([_WORD.findall(index_text(t).lower()) for t in texts], show_progress=False)
    vocabulary = set(retriever.vocab_dict)

    def retrieve(query: str, k: int) -> list[str]:
        terms = [t for t in query_terms(query) if t in vocabulary]
        if not terms:
            return []
        found, scores = retriever.retrieve([terms], k=min(k, len(texts)), show_progress=False)
        return [texts[int(i)] for i, s in zip(found[0], scores[0], strict=True) if s > 0]

    return retrieve


def llamaindex(documents: Sequence[Path], embedder: Embedder, tokenizer: Tokenizer) -> Retrieve:
    from llama_index.core import (  # noqa: PLC0415 (the bench extra: only when this baseline runs)
        SimpleDirectoryReader,
        VectorStoreIndex,
    )
    from llama_index.core.embeddings import BaseEmbedding  # noqa: PLC0415 (as above)
    from llama_index.core.node_parser import SentenceSplitter  # noqa: PLC0415 (as above)
    from llama_index.readers.file import HTMLTagReader  # noqa: PLC0415 (as above)

    queries = embedder.for_queries()

    class SameModel(BaseEmbedding):  # type: ignore[misc, unused-ignore]  # Any without the bench extra
        """The service's embedding model, as LlamaIndex calls a model."""

        def _get_text_embedding(self, text: str) -> list[float]:
            return [float(x) for x in embedder.embed([text])[0]]

        def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
            return [[float(x) for x in row] for row in embedder.embed(texts)]

        def _get_query_embedding(self, query: str) -> list[float]:
            return [float(x) for x in queries.embed([query])[0]]

        async def _aget_query_embedding(self, query: str) -> list[float]:
            return self._get_query_embedding(query)

    def tokens(text: str) -> list[str]:
        return list(tokenizer.encode(text).tokens)

    html = HTMLTagReader(tag="body")
    loaded = SimpleDirectoryReader(
        input_files=[str(p) for p in documents], file_extractor={".html": html}
    ).load_data()
    nodes = SentenceSplitter(tokenizer=tokens).get_nodes_from_documents(loaded)
    index = VectorStoreIndex(nodes, embed_model=SameModel(embed_batch_size=32))

    def retrieve(query: str, k: int) -> list[str]:
        found = index.as_retriever(similarity_top_k=k).retrieve(query)
        return [hit.node.get_content() for hit in found]

    return retrieve


def timed(retrieve: Retrieve, query: str, k: int) -> tuple[list[str], float]:
    began = time.perf_counter()
    found = retrieve(query, k)
    return found, (time.perf_counter() - began) * 1000
