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


class EventParser:
    """Lines in, events out, one line at a time: the same rules for a blocking and an
    asynchronous reader (the SDK has both)."""

    def __init__(self) -> None:
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self._retry: int | None = None
        self._last_id: str | None = None

    def feed(self, raw: str) -> StreamEvent | None:
        """The event this line completes (a blank line ends one), else None."""
        line = raw.rstrip("\r\n")
        if not line:
            found = None
            if self._data or self._id is not None:
                text = "\n".join(self._data)
                body = json.loads(text) if text else None
                event_id = self._id or self._last_id
                found = StreamEvent(event_id, self._event or "message", body, self._retry)
                self._last_id = event_id
            self._event, self._data, self._id, self._retry = "", [], None, None
            return found
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isdigit():
            self._retry = int(value)
        return None


def parse_events(lines: Iterable[str]) -> Iterator[StreamEvent]:
    parser = EventParser()
    for line in lines:
        event = parser.feed(line)
        if event is not None:
            yield event
