"""The Server-Sent Events wire format, read: lines → events (the HTML standard's parsing rules
for the fields `event`, `data`, `id` and `retry`; comment lines ignored). Used by the client to
follow the API's event streams (api/streams.py writes them)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One dispatched event. `data` is the JSON it carried (None for an event with only an
    `id:`, such as a stream's opening, which tells where the stream stands)."""

    id: str | None
    event: str
    data: Any
    retry_ms: int | None = None


def parse_events(lines: Iterable[str]) -> Iterator[StreamEvent]:
    data: list[str] = []
    event, event_id, retry = "", None, None
    last_id: str | None = None
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data or event_id is not None:
                text = "\n".join(data)
                body = json.loads(text) if text else None
                yield StreamEvent(event_id or last_id, event or "message", body, retry)
                last_id = event_id or last_id
            event, data, event_id, retry = "", [], None, None
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id" and "\0" not in value:
            event_id = value
        elif name == "retry" and value.isdigit():
            retry = int(value)
