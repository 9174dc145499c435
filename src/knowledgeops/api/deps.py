"""Dependencies for routes: the runtime, ids checked as UUIDs, pagination."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Query, Request

from knowledgeops.runtime import Services

UUID_PATTERN = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"


def get_runtime(request: Request) -> Services:
    runtime: Services = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Services, Depends(get_runtime)]
JobId = Annotated[str, Path(pattern=UUID_PATTERN, description="A job id (UUID).")]
DatasetId = Annotated[str, Path(pattern=UUID_PATTERN, description="A dataset id (UUID).")]
DocumentId = Annotated[str, Path(pattern=UUID_PATTERN, description="A document id (UUID).")]
PageNo = Annotated[int, Query(ge=1, le=1_000_000, description="Page number, from 1.")]
Limit = Annotated[int, Query(ge=1, le=200, description="Items per page.")]
