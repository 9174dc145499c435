"""GET /models: the embedding models a dataset may be created with."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from knowledgeops.api.deps import ServiceDep
from knowledgeops.schemas import ModelPublic

router = APIRouter(tags=["datasets"])


@router.get(
    "/models", response_model=list[ModelPublic], summary="The embedding models datasets may use"
)
def list_models(service: ServiceDep) -> Any:
    models = service.models
    return [
        ModelPublic(
            id=spec.model_id,
            dimension=spec.dimension,
            max_tokens=spec.max_tokens,
            summary=spec.summary,
            is_default=spec.model_id == models.default,
        )
        for spec in (models.spec(name) for name in models.names)
    ]
