"""A small HTTP client for a running KnowledgeOps (used by the CLI; usable from scripts)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from knowledgeops.errors import ClientError
from knowledgeops.events_wire import StreamEvent, parse_events

_UUID = re.compile(r"^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")


class Client:
    """`api_key`: sent as `Authorization: Bearer …`; default: the KOPS_API_KEY variable."""

    def __init__(self, base_url: str, *, timeout: float = 60.0, api_key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        key = api_key if api_key is not None else os.environ.get("KOPS_API_KEY")
        headers = {"Authorization": f"Bearer {key.strip()}"} if key else {}
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, headers=headers)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def follow(
        self,
        path: str,
        *,
        last_event_id: str | None = None,
        idle_timeout_s: float = 60.0,
        reconnects: int = 5,
    ) -> Iterator[StreamEvent]:
        """The events of an event stream (`/docs/jobs/{id}/events`, `/datasets/{id}/events`),
        reconnecting with Last-Event-ID when the connection drops (at most `reconnects` times in
        a row), so none is missed. The first event has only an id: where the stream began. A
        stream idle longer than `idle_timeout_s` (the server sends a comment every 15 s) counts
        as dropped."""
        failures = 0
        while True:
            headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else {}
            timeout = httpx.Timeout(10.0, read=idle_timeout_s)
            try:
                with self._http.stream("GET", path, headers=headers, timeout=timeout) as response:
                    if response.status_code >= 400:
                        response.read()
                        self._raise_for(response)
                    for event in parse_events(response.iter_lines()):
                        failures = 0
                        if event.id is not None:
                            last_event_id = event.id
                        yield event
            except httpx.TransportError as exc:
                failures += 1
                if failures > reconnects:
                    raise ClientError(
                        f"lost the event stream {path} from {self.base_url} "
                        f"({type(exc).__name__}: {exc or 'no detail'})"
                    ) from None
            time.sleep(min(2.0, 0.2 * 2**failures))

    def _raise_for(self, response: httpx.Response) -> None:
        try:
            body = response.json()
            message, code = body.get("error", response.text), body.get("code")
        except ValueError:
            message, code = response.text or response.reason_phrase, None
        if response.status_code == 401:
            message = f"{message} (the kops CLI sends the key in KOPS_API_KEY)"
        raise ClientError(message, status=response.status_code, code=code)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.ConnectError:
            raise ClientError(
                f"cannot reach KnowledgeOps at {self.base_url}; start it with `kops serve` "
                "or pass --url"
            ) from None
        except httpx.TransportError as exc:  # reset, closed mid-answer, timed out
            raise ClientError(
                f"lost the connection to KnowledgeOps at {self.base_url} during {method} {path} "
                f"({type(exc).__name__}: {exc or 'no detail'})"
            ) from None
        except httpx.HTTPError as exc:
            raise ClientError(f"request to {self.base_url}{path} failed: {exc}") from None
        if response.status_code >= 400:
            self._raise_for(response)
        return response.json() if response.content else None

    # --- documents and jobs ---------------------------------------------------------------------
    def upload(self, path: Path, *, dataset_id: str | None = None) -> dict[str, Any]:
        params = {"datasetId": dataset_id} if dataset_id else None
        with path.open("rb") as handle:
            result: dict[str, Any] = self._call(
                "POST", "/docs/upload", files={"file": (path.name, handle)}, params=params
            )
        return result

    def job(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/docs/jobs/{job_id}")
        return result

    def jobs(
        self, *, status: str | None = None, dataset_id: str | None = None, limit: int = 20
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        if dataset_id:
            params["datasetId"] = dataset_id
        result: dict[str, Any] = self._call("GET", "/docs/jobs", params=params)
        return result

    def retry(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/docs/jobs/{job_id}/retry")
        return result

    def cancel(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/docs/jobs/{job_id}/cancel")
        return result

    # --- datasets and search --------------------------------------------------------------------
    def datasets(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        page = 1
        while True:
            body = self._call("GET", "/datasets", params={"page": page, "limit": 200})
            found.extend(body["items"])
            if not body["hasMore"]:
                return found
            page += 1

    def resolve_dataset(self, ref: str | None) -> str:
        """A dataset id from an id or a name (None: the default dataset)."""
        if ref is not None and _UUID.match(ref):
            return ref
        for dataset in self.datasets():
            if (ref is None and dataset["isDefault"]) or dataset["name"] == ref:
                return str(dataset["id"])
        raise ClientError(f"no dataset named {ref!r}; list them with GET /datasets")

    def search(
        self, query: str, *, dataset_id: str, top_k: int = 5, mode: str = "hybrid"
    ) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "POST",
            f"/datasets/{dataset_id}/search",
            json={"query": query, "topK": top_k, "mode": mode},
        )
        return result
