"""Property-based API tests from the service's own OpenAPI spec (schemathesis): with a valid
key (none in a negative case about it), every operation, fed generated (valid and invalid)
input, answers without a 5xx and with a status, headers and body that the spec declares.

Short in CI (KOPS_SCHEMATHESIS_EXAMPLES, default 30 per operation); set it higher to dig.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from knowledgeops.api.app import create_app

EXAMPLES = int(os.environ.get("KOPS_SCHEMATHESIS_EXAMPLES", "30"))


# Operations whose valid input is narrower than a JSON schema can say: schemathesis may send
# schema-valid input that is rightly refused (with a documented status).
SPEC_CANNOT_SAY = {
    # any bytes fit `format: binary`, but only the five document formats are accepted (415)
    ("POST", "/docs/upload"),
    # chunkOverlap must stay under half of chunkSize, a rule between two fields (400)
    ("POST", "/datasets"),
    ("PATCH", "/datasets/{dataset_id}"),
    # a webhook's URL must resolve, to public addresses only: DNS is not a JSON schema (422)
    ("POST", "/webhooks"),
}


@pytest.fixture
def api_schema(make_runtime: Callable[..., Any]) -> Any:
    """The spec of a started embedded runtime, served from the app itself."""
    runtime = make_runtime(max_upload_mb=1)
    _, key = runtime.service.keys.create("default", "schemathesis")
    app = create_app(runtime.service)
    app.state.test_key = key
    return schemathesis.openapi.from_asgi("/api/openapi.json", app)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.auth(refresh_interval=None)  # each test's runtime has a key of its own
class ApiKey:
    """The test's key, sent by schemathesis itself, which leaves it out of a negative case
    whose point is a missing `Authorization` (a key the test added back would make that case a
    valid request that schemathesis still expects to be refused)."""

    def get(self, case: Any, context: Any) -> str:
        return str(context.app.state.test_key)

    def set(self, case: Any, data: str, context: Any) -> None:
        sent = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
        case.headers = {**sent, "Authorization": f"Bearer {data}"}


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_every_operation_keeps_to_its_spec(case: Any) -> None:
    key = case.operation.schema.app.state.test_key
    excluded = []
    if (case.method, case.operation.path) in SPEC_CANNOT_SAY:
        excluded.append(schemathesis.checks.positive_data_acceptance)
    response = case.call()
    if not case.operation.schema.is_security_param_negated(case):  # the key was sent
        assert response.request.headers.get("Authorization") == f"Bearer {key}"
        assert response.status_code != 401, "the test's key was refused: nothing past auth ran"
    case.validate_response(response, excluded_checks=excluded)
