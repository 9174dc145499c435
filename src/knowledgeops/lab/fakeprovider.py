"""A small OpenAI-compatible embeddings server for tests and the chaos suite: real vectors from
the local model (or the deterministic test embedder), and faults on request.

    POST /v1/embeddings   {"model": "...", "input": ["text", ...]}  (Authorization: Bearer KEY)
    POST /_control        {"mode": "ok" | "error500" | "throttle" | "hang" | "unauthorized" |
                           "bad_request", "count": N (then back to ok; omit: until changed),
                           "retry_after": S, "delay": S per answer, "keys": ["key", ...]}
    GET  /_stats          requests, served, refused by status, most requests at once

It is not part of the service: it stands in for a production provider so that every answer the
HTTP embedder must handle can be produced on purpose.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from knowledgeops.ingest.embedders.base import Embedder
from knowledgeops.ingest.embedders.local import LocalMiniLM
from knowledgeops.lab.embedders import HashingEmbedder

MODES = {"ok", "error500", "throttle", "hang", "unauthorized", "bad_request"}


@dataclass
class ProviderState:
    keys: set[str] = field(default_factory=lambda: {"test-key"})
    mode: str = "ok"
    remaining: int | None = None  # faults left before going back to ok (None: until changed)
    retry_after: float = 1.0
    delay_s: float = 0.0  # added to every answer (slow embedding, for kill-mid-work tests)
    requests: int = 0
    served: int = 0
    refused: Counter[int] = field(default_factory=Counter)
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def configure(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            if "mode" in body:
                self.mode = body["mode"]
                self.remaining = body.get("count")
            if "retry_after" in body:
                self.retry_after = float(body["retry_after"])
            if "delay" in body:
                self.delay_s = float(body["delay"])
            if "keys" in body:
                self.keys = set(body["keys"])
            return {"mode": self.mode, "remaining": self.remaining}

    @contextmanager
    def in_flight_request(self) -> Iterator[None]:
        """Count a request, and the most answered at once."""
        with self.lock:
            self.requests += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            yield
        finally:
            with self.lock:
                self.in_flight -= 1

    def fault(self) -> str:
        with self.lock:
            if self.mode == "ok":
                return "ok"
            mode = self.mode
            if self.remaining is not None:
                self.remaining -= 1
                if self.remaining <= 0:
                    self.mode, self.remaining = "ok", None
            return mode


def create_provider_app(embedder: Embedder, state: ProviderState | None = None) -> FastAPI:
    state = state or ProviderState()
    app = FastAPI(title="fake embeddings provider")
    app.state.provider = state
    model_lock = threading.Lock()

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Any:
        with state.in_flight_request():
            token = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            mode = state.fault()
            refused = _refusal(state, mode, token)
            if refused is not None:
                return refused
            if mode == "hang":
                await asyncio.sleep(3600)
            body = await request.json()
            texts = body.get("input")
            texts = [texts] if isinstance(texts, str) else texts
            bad = _bad_input(state, mode, texts)
            if bad is not None:
                return bad

            def embed() -> Any:
                with model_lock:
                    return embedder.embed(texts)

            if state.delay_s:
                await asyncio.sleep(state.delay_s)
            vectors = await asyncio.to_thread(embed)
            with state.lock:
                state.served += 1
            return {
                "object": "list",
                "model": body.get("model", "fake"),
                "data": [
                    {"object": "embedding", "index": n, "embedding": vector.tolist()}
                    for n, vector in enumerate(vectors)
                ],
                "usage": {"prompt_tokens": 0, "total_tokens": 0},
            }

    @app.post("/_control")
    async def control(request: Request) -> Any:
        body = await request.json()
        if body.get("mode", "ok") not in MODES:
            return JSONResponse({"error": f"mode must be one of {sorted(MODES)}"}, 400)
        return state.configure(body)

    @app.get("/_stats")
    def stats() -> Any:
        with state.lock:
            return {
                "requests": state.requests,
                "served": state.served,
                "refused": dict(state.refused),
                "max_in_flight": state.max_in_flight,
            }

    return app


def _error(state: ProviderState, status: int, message: str, **headers: str) -> JSONResponse:
    with state.lock:
        state.refused[status] += 1
    body = {"error": {"message": message, "type": "fake_provider_error"}}
    return JSONResponse(body, status_code=status, headers=headers)


def _refusal(state: ProviderState, mode: str, token: str) -> JSONResponse | None:
    """The answer of a fault (or of a wrong key), as the provider would give it."""
    if mode == "unauthorized" or token not in state.keys:
        return _error(state, 401, "Incorrect API key provided.")
    if mode == "throttle":
        retry = {"Retry-After": f"{state.retry_after:g}"}
        return _error(state, 429, "Rate limit reached.", **retry)
    if mode == "error500":
        return _error(state, 500, "The server had an error while processing your request.")
    return None


def _bad_input(state: ProviderState, mode: str, texts: Any) -> JSONResponse | None:
    if mode == "bad_request" or not isinstance(texts, list) or not texts:
        return _error(state, 400, "'input' must be a non-empty list of strings.")
    if not all(isinstance(t, str) and t for t in texts):
        return _error(state, 400, "every input must be a non-empty string.")
    return None


@contextmanager
def serve_in_thread(app: FastAPI, port: int) -> Iterator[str]:
    """Run `app` on 127.0.0.1:`port` in a thread; yields its base URL (…/v1)."""

    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=server.run, name="fake-provider", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the fake provider did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def main() -> None:
    """`python -m knowledgeops.lab.fakeprovider --port P [--hashing]` (for the chaos suite)."""

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key", action="append", default=None, help="accepted API key")
    parser.add_argument("--hashing", action="store_true", help="test embedder, not the model")
    args = parser.parse_args()
    embedder: Embedder = HashingEmbedder(dimension=384) if args.hashing else LocalMiniLM(threads=1)
    state = ProviderState(keys=set(args.key or ["test-key"]))
    uvicorn.run(create_provider_app(embedder, state), host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
