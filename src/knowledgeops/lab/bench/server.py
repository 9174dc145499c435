"""`python -m knowledgeops.lab.bench.server`: `kops serve` with the null embedder, for
`kops bench`'s pipeline-ceiling run. Settings come from the environment exactly as for
`kops serve`."""

from __future__ import annotations

from knowledgeops.lab.embedders import NullEmbedder
from knowledgeops.roles.embedded import serve
from knowledgeops.settings import load_settings


def main() -> None:
    serve(load_settings(), embedder=NullEmbedder())


if __name__ == "__main__":
    main()
