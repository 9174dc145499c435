"""The peer, side by side: LlamaIndex's `IngestionPipeline` over the same corpus with the same
model, as its users run it.

`SimpleDirectoryReader` with its own readers (pypdf for PDF, docx2txt for DOCX, and, so that HTML
markup is not embedded as text, `HTMLTagReader` on <body>), `SentenceSplitter` at our chunk size
and overlap counted in the model's own tokens, and `HuggingFaceEmbedding` on the same
all-MiniLM-L6-v2 files with the same threads and batch size. The peer keeps its nodes in memory:
it writes no index and no job state, which our figures include. Installed by the `bench` extra.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from knowledgeops.ingest.embedders.local import load_tokenizer, model_path


@dataclass
class PeerFigures:
    name: str
    documents: int
    chunks: int
    seconds: float
    documents_per_s: float
    chunks_per_s: float
    read_s: float
    pipeline_s: float


def available() -> str | None:
    """None when the peer can run, else what to install."""

    for module in (
        "docx2txt",
        "llama_index.core",
        "llama_index.embeddings.huggingface",
        "llama_index.readers.file",
    ):
        try:
            found = find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return f"{module} is missing: pip install -e '.[bench]'"
    return None


def run_peer(
    files: list[Path], *, chunk_size: int, chunk_overlap: int, threads: int, batch_size: int
) -> PeerFigures:
    import torch  # noqa: PLC0415 (torch: the peer's model)
    from llama_index.core import SimpleDirectoryReader  # noqa: PLC0415 (the bench extra: the peer, only when it runs)
    from llama_index.core.ingestion import IngestionPipeline  # noqa: PLC0415 (the bench extra: the peer, only when it runs)
    from llama_index.core.node_parser import SentenceSplitter  # noqa: PLC0415 (the bench extra: the peer, only when it runs)
    from llama_index.embeddings.huggingface import (  # noqa: PLC0415 (the bench extra: the peer, only when it runs)
        HuggingFaceEmbedding,
    )
    from llama_index.readers.file import HTMLTagReader  # noqa: PLC0415 (the bench extra: the peer, only when it runs)

    torch.set_num_threads(threads)
    tokenizer = load_tokenizer()
    tokenizer.no_truncation()
    tokenizer.no_padding()

    def tokens(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    embedding = HuggingFaceEmbedding(
        model_name=str(model_path()), device="cpu", embed_batch_size=batch_size
    )
    embedding.get_text_embedding("warm-up")
    html = HTMLTagReader(tag="body")
    began = time.perf_counter()
    documents = SimpleDirectoryReader(
        input_files=[str(f) for f in files], file_extractor={".html": html, ".htm": html}
    ).load_data()
    read = time.perf_counter()
    pipeline = IngestionPipeline(
        transformations=[
            SentenceSplitter(chunk_size=chunk_size, chunk_overlap=chunk_overlap, tokenizer=tokens),
            embedding,
        ]
    )
    nodes = pipeline.run(documents=documents)
    done = time.perf_counter()
    seconds = done - began
    return PeerFigures(
        name="LlamaIndex IngestionPipeline",
        documents=len(files),
        chunks=len(nodes),
        seconds=round(seconds, 2),
        documents_per_s=round(len(files) / seconds, 3),
        chunks_per_s=round(len(nodes) / seconds, 1),
        read_s=round(read - began, 2),
        pipeline_s=round(done - read, 2),
    )
