"""The API's request and response bodies live in `knowledgeops.schemas` (plain pydantic, shared with
the SDK); this module adds what only the API needs: a listing built from a service page."""

from __future__ import annotations

from typing import Any

from knowledgeops.schemas import Camel
from knowledgeops.service.views import Page


def listing(page: Page[Any], model: type[Camel]) -> dict[str, Any]:
    return {
        "items": [model.model_validate(item) for item in page.items],
        "total": page.total,
        "page": page.page,
        "limit": page.limit,
        "has_more": page.has_more,
    }
