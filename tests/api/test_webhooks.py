"""Webhooks end to end, on SQLite and PostgreSQL: made and managed through the API, each job's
end delivered, signed, to a real HTTP receiver on a local port by the workers' own lane; the
receiver's answers classified (2xx delivered, 5xx and 429 retried, other 4xx and redirects
final); a URL to a private address refused unless allowed."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from knowledgeops.client import SignatureInvalid, verify_signature
from tests.conftest import wait_for
from tests.fixtures.receiver import Receiver

ALLOW = {"webhook_allow_private": True}  # the receiver listens on 127.0.0.1


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    started = Receiver().start()
    yield started
    started.stop()


def upload(client: TestClient, name: str, body: bytes) -> str:
    response = client.post("/docs/upload", files={"file": (name, body)})
    assert response.status_code == 202, response.text
    job_id: str = response.json()["jobId"]
    return job_id


def job_of(client: TestClient, job_id: str) -> dict[str, Any]:
    body: dict[str, Any] = client.get(f"/docs/jobs/{job_id}").json()
    return body


def ended(client: TestClient, job_id: str) -> dict[str, Any]:
    return wait_for(
        lambda: (job := job_of(client, job_id))["status"] in {"completed", "failed"} and job,
        what=f"job {job_id} ends",
    )


def subscribe(client: TestClient, url: str, **fields: Any) -> dict[str, Any]:
    response = client.post("/webhooks", json={"url": url, **fields})
    assert response.status_code == 201, response.text
    made: dict[str, Any] = response.json()
    return made


def deliveries(client: TestClient, webhook_id: str) -> list[dict[str, Any]]:
    response = client.get(f"/webhooks/{webhook_id}/deliveries")
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def test_a_webhook_is_made_read_listed_and_deleted_and_its_secret_shown_once(
    make_client: Callable[..., TestClient], receiver: Receiver
) -> None:
    client = make_client(**ALLOW)
    made = subscribe(client, receiver.url, events=["job.failed"], description="alerts")
    assert made["secret"].startswith("whsec_")
    assert len(made["secret"]) > 40
    assert made["events"] == ["job.failed"]
    assert made["datasetId"] is None
    read = client.get(f"/webhooks/{made['id']}")
    assert read.status_code == 200
    assert "secret" not in read.json()
    assert made["secret"].startswith(read.json()["secretHint"].rstrip("…"))
    assert [w["id"] for w in client.get("/webhooks").json()["items"]] == [made["id"]]
    default = subscribe(client, receiver.url)
    assert default["events"] == ["job.completed", "job.failed"]
    assert client.delete(f"/webhooks/{made['id']}").status_code == 204
    assert client.get(f"/webhooks/{made['id']}").status_code == 404
    assert client.delete(f"/webhooks/{made['id']}").json()["code"] == "webhook_not_found"


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("ftp://example.com/hook", "validation_error"),  # the schema says http(s)
        ("http://user:pw@example.com/hook", "webhook_url_refused"),
        ("http://127.0.0.1:9/hook", "webhook_url_refused"),  # loopback
        ("http://10.1.2.3/hook", "webhook_url_refused"),  # private
        ("http://169.254.169.254/latest/meta-data", "webhook_url_refused"),  # cloud metadata
        ("http://[::1]/hook", "webhook_url_refused"),
        ("http://[::ffff:127.0.0.1]/hook", "webhook_url_refused"),  # IPv4-mapped loopback
        ("http://localhost/hook", "webhook_url_refused"),
        ("http://no-such-host.invalid/hook", "webhook_url_unresolved"),
        ("HTTP://\u0080", "webhook_url_refused"),  # no valid host name (was a 500)
    ],
)
def test_a_url_that_may_not_be_called_is_refused_with_the_reason(
    make_client: Callable[..., TestClient], url: str, code: str
) -> None:
    client = make_client()
    response = client.post("/webhooks", json={"url": url})
    assert (response.status_code, response.json()["code"]) == (422, code), response.text
    assert "url" in response.json()["error"]
    assert client.get("/webhooks").json()["total"] == 0


def test_bad_bodies_and_other_tenants_get_clear_errors(
    make_client: Callable[..., TestClient], receiver: Receiver
) -> None:
    client = make_client(**ALLOW)
    assert client.post("/webhooks", json={"url": receiver.url, "events": []}).status_code == 422
    unknown = client.post("/webhooks", json={"url": receiver.url, "events": ["job.exploded"]})
    assert unknown.status_code == 422
    missing = client.post(
        "/webhooks",
        json={"url": receiver.url, "datasetId": "00000000-0000-0000-0000-000000000000"},
    )
    assert (missing.status_code, missing.json()["code"]) == (404, "dataset_not_found")
    made = subscribe(client, receiver.url)
    stranger = make_client(tenant="acme", **ALLOW)
    assert stranger.get(f"/webhooks/{made['id']}").status_code == 404
    assert stranger.get(f"/webhooks/{made['id']}/deliveries").status_code == 404
    assert stranger.get("/webhooks").json()["total"] == 0


def test_each_end_of_a_job_is_delivered_signed_with_its_event_id(
    make_client: Callable[..., TestClient], receiver: Receiver
) -> None:
    client = make_client(**ALLOW)
    made = subscribe(client, receiver.url)
    done = upload(client, "notes.txt", b"webhooks tell a receiver when a document is ready " * 40)
    broken = upload(client, "broken.pdf", b"%PDF-1.7 this is not really a pdf")
    ended(client, done), ended(client, broken)
    got = wait_for(lambda: len(receiver.received()) >= 2 and receiver.received(), what="two")
    by_job = {r.json["data"]["job"]["id"]: r for r in got}
    assert set(by_job) == {done, broken}
    completed, failed = by_job[done], by_job[broken]
    assert completed.path == "/hooks/kops"
    assert completed.headers["kops-event-type"] == "job.completed"
    assert completed.json["type"] == "job.completed"
    assert completed.json["id"] == completed.event_id
    job = completed.json["data"]["job"]
    assert (job["status"], job["fileName"], job["kind"]) == ("completed", "notes.txt", "ingest")
    assert job["processedChunks"] == job["totalChunks"] > 0
    assert failed.json["type"] == "job.failed"
    assert failed.json["data"]["job"]["errorCategory"] == "permanent"
    assert failed.json["data"]["job"]["error"]
    for request in got:  # the README's check: HMAC-SHA256 of `t.body` under the secret
        assert verify_signature(made["secret"], request.body, request.headers)
        with pytest.raises(SignatureInvalid):
            verify_signature(made["secret"], request.body + b" ", request.headers)
        with pytest.raises(SignatureInvalid):
            verify_signature("whsec_not-the-secret", request.body, request.headers)

    def all_delivered() -> list[dict[str, Any]]:
        found = deliveries(client, made["id"])
        return found if len(found) == 2 and all(d["status"] == "completed" for d in found) else []

    listed = wait_for(all_delivered, what="both deliveries completed")
    assert {d["id"] for d in listed} == {r.event_id for r in got}
    assert all(d["deliveredAt"] and d["attempts"][0]["statusCode"] == 200 for d in listed)
    # deliveries are the webhook's own: not in the jobs list, not holding up the documents
    kinds = {j["kind"] for j in client.get("/docs/jobs").json()["items"]}
    assert kinds == {"ingest"}


def test_a_webhook_of_one_dataset_gets_only_its_events_and_only_the_events_it_asked_for(
    make_client: Callable[..., TestClient], receiver: Receiver
) -> None:
    client = make_client(**ALLOW)
    other = client.post("/datasets", json={"name": "other"}).json()["id"]
    subscribe(client, receiver.url, datasetId=other, events=["job.completed"])
    mine = upload(client, "mine.txt", b"a document of the default dataset " * 30)
    response = client.post(
        "/docs/upload", params={"datasetId": other}, files={"file": ("theirs.txt", b"x " * 300)}
    )
    theirs = response.json()["jobId"]
    broken = client.post(
        "/docs/upload", params={"datasetId": other}, files={"file": ("bad.pdf", b"%PDF-1.7 no")}
    ).json()["jobId"]
    for job_id in (mine, theirs, broken):
        ended(client, job_id)
    wait_for(receiver.received, what="a delivery")
    time.sleep(1.0)  # time for a wrong one to arrive too
    assert [r.json["data"]["job"]["id"] for r in receiver.received()] == [theirs]


def test_a_receiver_answer_decides_retry_or_not(
    make_client: Callable[..., TestClient], receiver: Receiver
) -> None:
    client = make_client(**ALLOW, webhook_max_attempts=5)
    made = subscribe(client, receiver.url)
    receiver.status = 503  # unavailable: tried again, with backoff
    job_id = upload(client, "retry.txt", b"retry me until the receiver takes it " * 30)
    ended(client, job_id)
    wait_for(lambda: len(receiver.received()) >= 2, what="a second attempt after a 503")
    receiver.status = 200
    (delivery,) = wait_for(
        lambda: [d for d in deliveries(client, made["id"]) if d["status"] == "completed"],
        what="delivered after the 503s",
    )
    attempts = delivery["attempts"]
    assert attempts[0]["statusCode"] == 200
    assert attempts[-1]["statusCode"] == 503
    assert "503" in attempts[-1]["error"]
    assert len({r.event_id for r in receiver.received()}) == 1  # one event, attempted again


def test_a_refusal_is_final_a_redirect_is_not_followed_and_a_failed_delivery_can_be_sent_again(
    make_client: Callable[..., TestClient], receiver: Receiver
) -> None:
    client = make_client(**ALLOW)
    target = Receiver().start()
    try:
        made = subscribe(client, receiver.url)
        receiver.status, receiver.headers = 302, {"Location": target.url}
        ended(client, upload(client, "moved.txt", b"the receiver moved away " * 30))
        (moved,) = wait_for(
            lambda: [d for d in deliveries(client, made["id"]) if d["status"] == "failed"],
            what="the redirect answered as final",
        )
        assert "302" in moved["attempts"][0]["error"]
        assert "redirect" in moved["attempts"][0]["error"]
        assert len(moved["attempts"]) == 1
        assert target.received() == []
        receiver.status, receiver.headers = 410, {}
        ended(client, upload(client, "gone.txt", b"the receiver says gone " * 30))
        wait_for(
            lambda: sum(d["status"] == "failed" for d in deliveries(client, made["id"])) == 2,
            what="the 410 answered as final",
        )
        assert len(receiver.received()) == 2  # one attempt each
        receiver.status = 200
        again = client.post(f"/webhooks/{made['id']}/deliveries/{moved['id']}/retry")
        assert again.status_code == 202, again.text
        wait_for(
            lambda: any(
                d["id"] == moved["id"] and d["status"] == "completed"
                for d in deliveries(client, made["id"])
            ),
            what="the delivery sent again",
        )
        assert receiver.received()[-1].event_id == moved["id"]  # the same event, the same id
        delivered = client.post(f"/webhooks/{made['id']}/deliveries/{moved['id']}/retry")
        assert (delivered.status_code, delivered.json()["code"]) == (409, "already_delivered")
    finally:
        target.stop()


def test_a_429_retry_after_is_honoured(
    make_client: Callable[..., TestClient], receiver: Receiver
) -> None:
    client = make_client(**ALLOW, backoff_max_s=5.0)  # a wait is honoured up to the cap
    made = subscribe(client, receiver.url)
    receiver.status, receiver.headers = 429, {"Retry-After": "2"}
    ended(client, upload(client, "busy.txt", b"a busy receiver asks for two seconds " * 30))
    wait_for(receiver.received, what="the first attempt")
    receiver.status, receiver.headers = 200, {}
    wait_for(
        lambda: any(d["status"] == "completed" for d in deliveries(client, made["id"])),
        what="delivered after the wait",
    )
    first, second = receiver.received()[:2]
    assert second.at - first.at >= 1.9  # its own backoff would be at most 0.05 s


def test_deleting_a_webhook_stops_its_deliveries(
    make_client: Callable[..., TestClient], receiver: Receiver
) -> None:
    client = make_client(**ALLOW, webhook_max_attempts=50)
    made = subscribe(client, receiver.url)
    receiver.status = 500
    ended(client, upload(client, "doomed.txt", b"nobody will take this one " * 30))
    wait_for(lambda: len(receiver.received()) >= 2, what="attempts under way")
    assert client.delete(f"/webhooks/{made['id']}").status_code == 204
    time.sleep(0.5)  # an attempt in flight may still land
    count = len(receiver.received())
    time.sleep(1.5)
    assert len(receiver.received()) == count


def test_an_answer_trickled_a_byte_at_a_time_is_cut_off_at_the_attempts_limit(
    make_client: Callable[..., TestClient], receiver: Receiver
) -> None:
    client = make_client(**ALLOW, webhook_timeout_s=2.0, webhook_max_attempts=1)
    made = subscribe(client, receiver.url)
    receiver.trickle_s = 0.3  # within any read timeout, for ever
    ended(client, upload(client, "slow.txt", b"a receiver that never finishes " * 30))
    started = time.monotonic()
    (failed,) = wait_for(
        lambda: [d for d in deliveries(client, made["id"]) if d["status"] == "failed"],
        what="the attempt cut off",
    )
    assert time.monotonic() - started < 10
    (attempt,) = failed["attempts"]
    assert attempt["error"] == "no answer within 2 s"
    assert 1900 <= attempt["durationMs"] < 5000


def test_an_unreadable_retry_after_is_ignored(
    make_client: Callable[..., TestClient], receiver: Receiver
) -> None:
    client = make_client(**ALLOW)
    made = subscribe(client, receiver.url)
    receiver.status, receiver.headers = 503, {"Retry-After": "soon"}
    ended(client, upload(client, "odd.txt", b"an odd header from the receiver " * 30))
    wait_for(lambda: len(receiver.received()) >= 2, what="retried after a 503 anyway")
    receiver.status = 200  # still with its odd header: delivered all the same
    wait_for(
        lambda: any(d["status"] == "completed" for d in deliveries(client, made["id"])),
        what="delivered",
    )
