"""The embedding models a process can use, one per dataset (docs/architecture.md: Embedding and
search).

A dataset names its model when it is created (`embeddingModel`; the deployment's default
otherwise) and keeps it: its chunks are embedded by that model and its queries too, so vectors
of two models are never compared. `Models` holds the catalogue (what each model is: dimension,
how many tokens it reads, its tokenizer for the chunker) and makes each model's embedder the
first time a dataset needs it, wrapped the way the process wraps every model (its model thread
and the embedding cache, by `wrap`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from knowledgeops.errors import InvalidField
from knowledgeops.ingest.chunker import Tokenizer
from knowledgeops.ingest.embedders.base import Embedder


@dataclass(frozen=True)
class ModelSpec:
    """One model of the catalogue. `make` builds the bare model (it loads lazily)."""

    model_id: str  # what datasets record and the API names
    dimension: int
    max_tokens: int  # the model reads at most this many tokens, its special tokens included
    summary: str  # languages and speed, for people choosing
    make: Callable[[], Embedder]
    tokenizer: Callable[[], Tokenizer]
    # the vector ranking's weight when hybrid search fuses it with the keyword ranking: how far
    # this model's vectors are to be trusted (service/search.py, docs/search-quality.md)
    vector_weight: float = 0.5


def _given(embedder: Embedder) -> Callable[[], Embedder]:
    return lambda: embedder


class UnknownModel(InvalidField):
    """A dataset asked for a model this deployment does not run."""

    def __init__(self, name: str, known: Iterable[str]) -> None:
        super().__init__(
            f"there is no embedding model {name!r} here; the available models are "
            + ", ".join(known),
            code="unknown_model",
        )


@dataclass(eq=False)
class Models:
    """The catalogue, its default for new datasets, and the embedders made so far."""

    specs: dict[str, ModelSpec]
    default: str
    wrap: Callable[[Embedder], Embedder] = lambda model: model
    _embedders: dict[str, Embedder] = field(default_factory=dict)
    _tokenizers: dict[str, Tokenizer] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.spec(self.default)

    @classmethod
    def only(
        cls, embedder: Embedder, tokenizer: Callable[[], Tokenizer], max_tokens: int
    ) -> Models:
        """A catalogue of one model, already made (tests, benchmarks, a provider over HTTP)."""
        return cls.of([embedder], tokenizer, max_tokens)

    @classmethod
    def of(
        cls, embedders: Sequence[Embedder], tokenizer: Callable[[], Tokenizer], max_tokens: int
    ) -> Models:
        """A catalogue of these models, already made, the first the default (tests)."""
        specs = {
            e.model_id: ModelSpec(e.model_id, e.dimension, max_tokens, "", _given(e), tokenizer)
            for e in embedders
        }
        models = cls(specs, embedders[0].model_id)
        models._embedders.update({e.model_id: e for e in embedders})
        return models

    @property
    def names(self) -> list[str]:
        return sorted(self.specs)

    @property
    def dimensions(self) -> set[int]:
        return {spec.dimension for spec in self.specs.values()}

    def spec(self, name: str) -> ModelSpec:
        found = self.specs.get(name)
        if found is None:
            raise UnknownModel(name, self.names)
        return found

    def embedder(self, name: str) -> Embedder:
        """The model's embedder for documents (made on first use; not loaded until it embeds)."""
        spec = self.spec(name)
        with self._lock:
            made = self._embedders.get(name)
            if made is None:
                made = self._embedders[name] = self.wrap(spec.make())
        return made

    def for_queries(self, name: str) -> Embedder:
        return self.embedder(name).for_queries()

    def fusion_weight(self, name: str) -> float:
        """The model's vector weight in hybrid search (0.5 for a model this process does not
        run: a dataset of a model since removed is still searched by words)."""
        spec = self.specs.get(name)
        return spec.vector_weight if spec is not None else 0.5

    def tokenizer(self, name: str) -> Tokenizer:
        spec = self.spec(name)
        with self._lock:
            made = self._tokenizers.get(name)
            if made is None:
                made = self._tokenizers[name] = spec.tokenizer()
        return made

    def close(self) -> None:
        with self._lock:
            made, self._embedders = list(self._embedders.values()), {}
        for embedder in made:
            embedder.close()
