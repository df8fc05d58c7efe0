"""A small Server-Sent Events decoder (the WHATWG event-stream format), fed one line at a time.

Written here rather than pulled in as a dependency: the client must stay httpx + pydantic only.
"""

from __future__ import annotations

import json
from typing import Any

from .models import JobEvent


class SSEDecoder:
    """Turns event-stream lines into `JobEvent`s; an event is dispatched at each blank line."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []
        self.last_event_id: str | None = None
        self.retry_ms: int | None = None

    def feed(self, line: str) -> JobEvent | None:
        line = line.rstrip("\r\n")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment, e.g. a keep-alive
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            if "\0" not in value:
                self.last_event_id = value
        elif name == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None

    def _dispatch(self) -> JobEvent | None:
        if not self._data:
            self._event = ""
            return None
        raw = "\n".join(self._data)
        data: Any
        try:
            data = json.loads(raw)
        except ValueError:
            data = raw
        event = JobEvent(event=self._event or "message", data=data, id=self.last_event_id)
        self._event = ""
        self._data = []
        return event
