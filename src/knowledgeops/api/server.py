"""The HTTP server: uvicorn, which also ends this process's event streams when it is told to
stop, so that a browser tab left open does not hold the graceful shutdown for its timeout."""

from __future__ import annotations

from types import FrameType
from typing import Any

import uvicorn

from knowledgeops.api.streams import StreamSlots

GRACEFUL_SHUTDOWN_S = 20  # s: requests under way (an upload) get this long when stopping


class Server(uvicorn.Server):
    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        StreamSlots.close_all()
        super().handle_exit(sig, frame)


def run(app: Any, **config: Any) -> None:
    """Serve `app` (an ASGI app, or an import string with `factory=True`) until a signal."""
    config.setdefault("timeout_graceful_shutdown", GRACEFUL_SHUTDOWN_S)
    Server(uvicorn.Config(app, **config)).run()
