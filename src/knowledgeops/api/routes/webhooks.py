"""Webhooks: make, list, read and delete them; list a webhook's deliveries and send a failed
one again (docs/architecture.md: Webhooks)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Response

from knowledgeops.api.auth import Tenant
from knowledgeops.api.deps import UUID_PATTERN, Limit, PageNo, ServiceDep
from knowledgeops.api.schemas import listing
from knowledgeops.schemas import (
    ErrorPublic,
    Listing,
    WebhookCreate,
    WebhookCreated,
    WebhookDeliveryPublic,
    WebhookPublic,
)

router = APIRouter(prefix="/webhooks", tags=["webhooks"])
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorPublic}}
WebhookId = Annotated[str, Path(pattern=UUID_PATTERN, description="A webhook id (UUID).")]
EventId = Annotated[str, Path(pattern=UUID_PATTERN, description="An event id (Kops-Event-Id).")]


@router.post(
    "",
    status_code=201,
    response_model=WebhookCreated,
    responses={**NOT_FOUND, 409: {"model": ErrorPublic}, 422: {"model": ErrorPublic}},
    summary="Subscribe a URL to job events; the answer holds the signing secret, shown once",
)
def create_webhook(
    body: WebhookCreate, service: ServiceDep, tenant: Tenant, response: Response
) -> Any:
    made = service.webhooks.create(
        tenant,
        body.url,
        body.events,
        dataset_id=body.dataset_id,
        description=body.description,
    )
    response.headers["Location"] = f"/webhooks/{made.id}"
    return made


@router.get("", response_model=Listing[WebhookPublic], summary="List webhooks, oldest first")
def list_webhooks(service: ServiceDep, tenant: Tenant, page: PageNo = 1, limit: Limit = 20) -> Any:
    return listing(service.webhooks.list(tenant, page=page, limit=limit), WebhookPublic)


@router.get("/{webhook_id}", response_model=WebhookPublic, responses=NOT_FOUND, summary="Read")
def get_webhook(webhook_id: WebhookId, service: ServiceDep, tenant: Tenant) -> Any:
    return service.webhooks.get(tenant, webhook_id)


@router.delete(
    "/{webhook_id}",
    status_code=204,
    responses=NOT_FOUND,
    summary="Delete the webhook; its deliveries still on their way are cancelled",
)
def delete_webhook(webhook_id: WebhookId, service: ServiceDep, tenant: Tenant) -> Response:
    service.webhooks.delete(tenant, webhook_id)
    return Response(status_code=204)


@router.get(
    "/{webhook_id}/deliveries",
    response_model=Listing[WebhookDeliveryPublic],
    responses=NOT_FOUND,
    summary="The webhook's deliveries, newest first, each with its latest attempts",
)
def list_deliveries(
    webhook_id: WebhookId,
    service: ServiceDep,
    tenant: Tenant,
    page: PageNo = 1,
    limit: Limit = 20,
) -> Any:
    found = service.webhooks.deliveries(tenant, webhook_id, page=page, limit=limit)
    return listing(found, WebhookDeliveryPublic)


@router.post(
    "/{webhook_id}/deliveries/{event_id}/retry",
    status_code=202,
    response_model=WebhookDeliveryPublic,
    responses={**NOT_FOUND, 409: {"model": ErrorPublic}},
    summary="Send a failed delivery again (the same event id and body)",
)
def retry_delivery(
    webhook_id: WebhookId, event_id: EventId, service: ServiceDep, tenant: Tenant
) -> Any:
    return service.webhooks.redeliver(tenant, webhook_id, event_id)
