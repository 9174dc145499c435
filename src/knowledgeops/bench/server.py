"""`python -m knowledgeops.bench.server`: `kops serve` with the null embedder, for `kops bench`'s
pipeline-ceiling run. Settings come from the environment exactly as for `kops serve`."""

from __future__ import annotations

from knowledgeops.cli import _settings, run_embedded_server
from knowledgeops.ingest.embedders.null import NullEmbedder


def main() -> None:
    run_embedded_server(_settings(), embedder=NullEmbedder())


if __name__ == "__main__":
    main()
