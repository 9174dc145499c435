"""KnowledgeOps: reliable document ingestion for retrieval-augmented generation.

The public surface is `__all__` (pinned by tests/unit/test_public_surface.py): the SDK for a
running KnowledgeOps (`KnowledgeOps`, `AsyncKnowledgeOps`; all of it in `knowledgeops.client`),
the settings, and the root of every error it raises on purpose. The architecture and the map of
the package: docs/architecture.md.

The names are imported when first used, not with the package: every process imports it (the
parser's child process too), and none should pay for httpx or pydantic it does not use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from knowledgeops.client import AsyncKnowledgeOps, KnowledgeOps
    from knowledgeops.errors import ClientError, KopsError, SettingsError
    from knowledgeops.settings import Settings, load_settings

__version__ = "0.1.0"

_HOMES = {
    "AsyncKnowledgeOps": "knowledgeops.client",
    "KnowledgeOps": "knowledgeops.client",
    "ClientError": "knowledgeops.errors",
    "KopsError": "knowledgeops.errors",
    "Settings": "knowledgeops.settings",
    "SettingsError": "knowledgeops.errors",
    "load_settings": "knowledgeops.settings",
}

__all__ = [
    "AsyncKnowledgeOps",
    "ClientError",
    "KnowledgeOps",
    "KopsError",
    "Settings",
    "SettingsError",
    "__version__",
    "load_settings",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'knowledgeops' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
