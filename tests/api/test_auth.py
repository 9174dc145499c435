"""API keys: every endpoint but /healthz, /readyz and /metrics needs one; unknown, malformed and
revoked keys get 401; a first key is made (and printed once) at the first start; the rate limit
counts per key; `KOPS_AUTH=off` opens the API and says so."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from knowledgeops.errors import SettingsError
from knowledgeops.roles.first_key import announce_first_key
from knowledgeops.service.keys import hash_key
from knowledgeops.settings import load_settings
from tests.api.conftest import assert_error, ingest, runtime_of
from tests.fixtures.documents import make_text

OPEN_PATHS = {"/healthz", "/readyz", "/metrics"}


def protected_operations(client: TestClient) -> list[tuple[str, str]]:
    """Every operation in the OpenAPI spec, with a random UUID for each path parameter."""
    spec = client.get("/api/openapi.json").json()
    found = []
    for path, operations in spec["paths"].items():
        concrete = re.sub(r"\{[^}]+\}", str(uuid.uuid4()), path)
        for method in operations:
            if path not in OPEN_PATHS:
                found.append((method.upper(), concrete))
    return found


def test_every_operation_in_the_spec_needs_a_key(client: TestClient) -> None:
    operations = protected_operations(client)
    assert len(operations) >= 14  # uploads, jobs, documents, datasets, search
    anonymous = TestClient(client.app)
    for method, path in operations:
        response = anonymous.request(method, path)
        body = assert_error(response, 401, "unauthorized")
        assert "Authorization: Bearer" in body["error"]
        assert response.headers["www-authenticate"] == "Bearer"


def test_the_spec_declares_the_bearer_scheme_and_401(client: TestClient) -> None:
    spec = client.get("/api/openapi.json").json()
    assert spec["components"]["securitySchemes"]["ApiKey"] == {
        "type": "http",
        "scheme": "bearer",
        "description": spec["components"]["securitySchemes"]["ApiKey"]["description"],
    }
    upload = spec["paths"]["/docs/upload"]["post"]
    assert upload["security"] == [{"ApiKey": []}]
    assert "401" in upload["responses"]


@pytest.mark.parametrize(
    "header",
    [
        "Bearer kops_" + "x" * 43,  # well-formed, unknown
        "Bearer not-a-key",
        "Bearer ",
        "Basic dXNlcjpwYXNz",
        "kops_" + "x" * 43,  # no scheme
    ],
)
def test_unknown_or_malformed_keys_get_401(client: TestClient, header: str) -> None:
    response = client.get("/datasets", headers={"Authorization": header})
    assert response.status_code == 401
    assert response.json()["code"] in {"unauthorized", "invalid_api_key"}


def test_open_endpoints_need_no_key(client: TestClient) -> None:
    anonymous = TestClient(client.app)
    assert anonymous.get("/healthz").status_code == 200
    assert anonymous.get("/readyz").status_code == 200
    assert anonymous.get("/metrics").status_code == 200


def test_metrics_behind_their_own_token(make_client: Callable[..., TestClient]) -> None:
    client = make_client(metrics_token="scrape-me-0123456789")
    anonymous = TestClient(client.app)
    assert_error(anonymous.get("/metrics"), 401, "unauthorized")
    # an API key is not the metrics token: the figures are deployment-wide
    assert client.get("/metrics").status_code == 401
    ok = anonymous.get("/metrics", headers={"Authorization": "Bearer scrape-me-0123456789"})
    assert ok.status_code == 200
    assert "kops_jobs" in ok.text


def test_a_revoked_key_is_refused_at_the_next_request(client: TestClient) -> None:
    runtime = runtime_of(client)
    view, secret = runtime.service.keys.create("default", "short-lived")
    headers = {"Authorization": f"Bearer {secret}"}
    assert client.get("/datasets", headers=headers).status_code == 200
    runtime.service.keys.revoke(view.id)
    assert_error(client.get("/datasets", headers=headers), 401, "invalid_api_key")
    assert client.get("/datasets").status_code == 200  # other keys go on working


def test_first_start_makes_one_key_shows_it_once_and_stores_only_its_hash(
    make_runtime: Callable[..., object],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Not on a terminal (as here), the key goes to a file only its user can read, and the log
    says where; the database keeps only its hash; a second start makes no other key."""
    with caplog.at_level(logging.INFO):
        runtime = make_runtime()
    data_dir = Path(runtime.settings.data_dir)  # type: ignore[attr-defined]
    key_file = data_dir / "first-api-key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    secret = key_file.read_text().strip()
    assert re.fullmatch(r"kops_[A-Za-z0-9_-]{43}", secret)
    assert str(key_file) in caplog.text
    assert secret not in caplog.text
    assert secret not in capsys.readouterr().err
    keys = runtime.service.keys.list()  # type: ignore[attr-defined]
    assert [(k.tenant_id, k.prefix) for k in keys] == [("default", secret[:12])]
    assert runtime.service.keys.authenticate(secret).tenant_id == "default"  # type: ignore[attr-defined]
    runtime.stop()  # type: ignore[attr-defined]
    stored = b"".join(p.read_bytes() for p in data_dir.glob("kops.db*"))
    assert secret.encode() not in stored
    assert hash_key(secret).encode() in stored
    key_file.unlink()  # as the operator is told to
    again = make_runtime(data_dir=data_dir)
    assert not key_file.exists()
    assert len(again.service.keys.list()) == 1  # type: ignore[attr-defined]


def test_on_a_terminal_the_first_key_is_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:

    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    announce_first_key("kops_" + "t" * 43, tmp_path)
    assert "kops_" + "t" * 43 in capsys.readouterr().err
    assert not (tmp_path / "first-api-key").exists()


def test_rate_limit_per_key_answers_429_with_retry_after(
    make_client: Callable[..., TestClient],
) -> None:
    client = make_client(rate_limit="5/minute")
    for _ in range(5):
        assert client.get("/datasets").status_code == 200
    refused = client.get("/datasets")
    body = assert_error(refused, 429, "rate_limited")
    assert "5 per 1 minute" in body["error"]
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    # another key has its own count
    _, other = runtime_of(client).service.keys.create("default", "second")
    assert client.get("/datasets", headers={"Authorization": f"Bearer {other}"}).status_code == 200


def test_auth_off_serves_everyone_as_the_default_tenant_and_warns(
    make_client: Callable[..., TestClient], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        client = make_client(auth="off")
    assert "KOPS_AUTH=off" in caplog.text
    assert "Authorization" not in client.headers
    done = ingest(client, make_text(tmp_path / "open.txt", "open door policy"))
    assert done["status"] == "completed"
    assert runtime_of(client).service.keys.list() == []  # no first key when auth is off


def test_keys_never_reach_the_logs(
    client: TestClient, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    secret = client.headers["Authorization"].split()[1]
    wrong = "kops_" + "y" * 43
    with caplog.at_level(logging.DEBUG):
        ingest(client, make_text(tmp_path / "a.txt", "some words"))
        client.get("/datasets", headers={"Authorization": f"Bearer {wrong}"})
    assert secret not in caplog.text
    assert wrong not in caplog.text


def test_guessing_keys_from_one_address_meets_the_rate_limit(
    make_client: Callable[..., TestClient],
) -> None:
    client = make_client(rate_limit="3/minute")
    anonymous = TestClient(client.app)
    guesses = [
        anonymous.get("/datasets", headers={"Authorization": f"Bearer kops_{n:043d}"})
        for n in range(4)
    ]
    assert [g.status_code for g in guesses] == [401, 401, 401, 429]
    assert "retry-after" in guesses[-1].headers


def test_a_caller_without_a_key_learns_nothing_about_parameters(client: TestClient) -> None:
    anonymous = TestClient(client.app)
    assert_error(anonymous.get("/docs/jobs", params={"limt": "5"}), 401, "unauthorized")


@pytest.mark.parametrize(
    ("settings", "phrase"),
    [
        ({"rate_limit": "lots"}, "rate_limit"),
        ({"rate_limit": "0/minute"}, "rate_limit"),
        ({"metrics_token": ""}, "metrics_token"),
        ({"metrics_token": "short"}, "metrics_token"),
        ({"auth": "maybe"}, "KOPS_AUTH"),
    ],
)
def test_bad_security_settings_stop_the_start(settings: dict[str, str], phrase: str) -> None:

    with pytest.raises(SettingsError) as caught:
        load_settings(**settings)
    assert phrase in str(caught.value)
