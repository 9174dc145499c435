"""Dependencies for routes: the use cases, ids checked as UUIDs, pagination."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Path, Query, Request
from fastapi.exceptions import RequestValidationError

from knowledgeops.schemas import UUID_PATTERN
from knowledgeops.service.knowledge_base import KnowledgeBase

__all__ = ["UUID_PATTERN"]


def get_service(request: Request) -> KnowledgeBase:
    service: KnowledgeBase = request.app.state.service
    return service


ServiceDep = Annotated[KnowledgeBase, Depends(get_service)]
JobId = Annotated[str, Path(pattern=UUID_PATTERN, description="A job id (UUID).")]
DatasetId = Annotated[str, Path(pattern=UUID_PATTERN, description="A dataset id (UUID).")]
DocumentId = Annotated[str, Path(pattern=UUID_PATTERN, description="A document id (UUID).")]
PageNo = Annotated[int, Query(ge=1, le=1_000_000, description="Page number, from 1.")]
Limit = Annotated[int, Query(ge=1, le=200, description="Items per page.")]


def reject_unknown_query(request: Request) -> None:
    """A query parameter the operation does not know is refused (422), not ignored: a typo
    (`?limt=5`) would otherwise silently give another answer than the one asked for."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    known = _query_names(dependant)
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        raise RequestValidationError(
            [
                {
                    "type": "extra_forbidden",
                    "loc": ("query", name),
                    "msg": "unknown query parameter"
                    + (f"; this operation takes {', '.join(sorted(known))}" if known else ""),
                    "input": request.query_params.get(name),
                }
                for name in unknown[:10]
            ]
        )


def _query_names(dependant: Any) -> set[str]:
    """The query parameters of an operation and of all its dependencies."""
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names
