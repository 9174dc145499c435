"""A search's filter on the documents it may answer from, applied inside the index's query on
every engine, so that `topK` counts only chunks that pass it.

A filter names document ids, content types, and metadata conditions (a key equal to one of some
values; JSON scalars compared with their type: the string "2" is not the number 2). Every part
given must hold (AND); the values of one part are alternatives (OR). The SQL is written against
the `documents` row of the chunk, aliased `d`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

Scalar = str | int | float | bool | None


@dataclass(frozen=True)
class SearchFilter:
    document_ids: tuple[str, ...] | None = None
    content_types: tuple[str, ...] | None = None
    metadata: tuple[tuple[str, tuple[Scalar, ...]], ...] = field(default=())
    # the model that embedded the document's searchable generation: set by search itself while
    # a dataset's documents are on two models (a re-embed on its way), never by a user
    models: tuple[str, ...] | None = None

    @property
    def empty(self) -> bool:
        return (
            self.document_ids is None
            and self.content_types is None
            and not self.metadata
            and self.models is None
        )

    def admits(
        self,
        document_id: str,
        content_type: str,
        metadata: Mapping[str, Any],
        model: str | None = None,
    ) -> bool:
        """The same test in Python (the in-memory index)."""
        if self.document_ids is not None and document_id not in self.document_ids:
            return False
        if self.content_types is not None and content_type not in self.content_types:
            return False
        if self.models is not None and model not in self.models:
            return False
        for key, values in self.metadata:
            if key not in metadata or not any(_same(metadata[key], v) for v in values):
                return False
        return True


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    return type(a) is type(b) and bool(a == b)


def sqlite_where(where: SearchFilter | None, params: list[Any]) -> str:
    """` AND …` conditions on `d` for SQLite (qmark parameters appended to `params`)."""
    if where is None or where.empty:
        return ""
    parts: list[str] = []
    if where.document_ids is not None:
        parts.append(_in_list("d.id", where.document_ids, params))
    if where.content_types is not None:
        parts.append(_in_list("d.content_type", where.content_types, params))
    if where.models is not None:
        parts.append(_in_list("d.embedding_model", where.models, params))
    for key, values in where.metadata:
        path = "$." + json.dumps(key)
        alternatives = []
        for value in values:
            # json_type tells a JSON true from the number 1 and a string from a number
            params.extend([path, _sqlite_type(value)])
            if value is None:
                alternatives.append("json_type(d.meta, ?) = ?")
                continue
            params.extend([path, int(value) if isinstance(value, bool) else value])
            if isinstance(value, bool):
                alternatives.append("(json_type(d.meta, ?) = ? AND json_extract(d.meta, ?) = ?)")
            elif isinstance(value, int | float):
                alternatives.append(
                    "(json_type(d.meta, ?) IN (?, 'real', 'integer') AND "
                    "json_extract(d.meta, ?) = ?)"
                )
            else:
                alternatives.append("(json_type(d.meta, ?) = ? AND json_extract(d.meta, ?) = ?)")
        parts.append("(" + " OR ".join(alternatives) + ")")
    return "".join(f" AND {part}" for part in parts)


def sqlite_passing(
    conn: Connection,
    seqs: Sequence[int],
    dataset_id: str,
    where: SearchFilter | None,
    *,
    active: bool = True,
) -> Iterable[int]:
    """The seqs among `seqs` of the dataset's chunks whose document `where` admits, of the
    document's active generation where `active` (SQLite)."""
    params: list[Any] = [json.dumps(list(seqs)), dataset_id]
    conditions = sqlite_where(where, params)
    generation = " AND d.active_generation = c.generation" if active else ""
    return conn.exec_driver_sql(
        f"SELECT c.seq FROM chunks c JOIN documents d ON d.id = c.document_id{generation} "
        "WHERE c.seq IN (SELECT value FROM json_each(?)) AND c.dataset_id = ?"
        f"{conditions}",
        tuple(params),
    ).scalars()


def _sqlite_type(value: Scalar) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return "real"
    return "text"


def _in_list(column: str, values: tuple[str, ...], params: list[Any]) -> str:
    if not values:
        return "0 = 1"
    params.extend(values)
    return f"{column} IN ({','.join('?' * len(values))})"


def postgres_where(where: SearchFilter | None, params: dict[str, Any]) -> str:
    """` AND …` conditions on `d` for PostgreSQL (named parameters added to `params`); metadata
    is jsonb, whose equality compares type and value (1 = 1.0, "1" ≠ 1, true ≠ 1)."""
    if where is None or where.empty:
        return ""
    parts: list[str] = []
    if where.document_ids is not None:
        params["f_ids"] = list(where.document_ids)
        parts.append("d.id = ANY(:f_ids)")
    if where.content_types is not None:
        params["f_types"] = list(where.content_types)
        parts.append("d.content_type = ANY(:f_types)")
    if where.models is not None:
        params["f_models"] = list(where.models)
        parts.append("d.embedding_model = ANY(:f_models)")
    for n, (key, values) in enumerate(where.metadata):
        params[f"f_key{n}"] = key
        params[f"f_values{n}"] = json.dumps(list(values))
        parts.append(
            f"(d.meta -> :f_key{n}) IN (SELECT jsonb_array_elements(CAST(:f_values{n} AS jsonb)))"
        )
    return "".join(f" AND {part}" for part in parts)
