"""Request body size limit (413), before FastAPI reads anything: it has no limit of its own we rely on.

Checks `Content-Length` up front and counts streamed bytes for chunked bodies; dataset uploads get their
own, larger limit.
"""

from __future__ import annotations

import contextlib
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(Exception):
    """Raised from `receive` when a streamed body passes the limit."""


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, default_limit: int, prefix_limits: dict[str, int] | None = None) -> None:
        self.app = app
        self.default_limit = default_limit
        self.prefix_limits = prefix_limits or {}

    def limit_for(self, path: str) -> int:
        for prefix, limit in self.prefix_limits.items():
            if path.startswith(prefix):
                return limit
        return self.default_limit

    async def _reject(self, send: Send, limit: int) -> None:
        body = json.dumps({"detail": f"request body over the limit of {limit} bytes"}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("path", ""))
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    too_big = int(value) > limit
                except ValueError:
                    too_big = False
                if too_big:
                    await self._reject(send, limit)
                    return
        seen = 0
        started = False
        exceeded = False

        async def _receive() -> Message:
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    exceeded = True
                    raise BodyTooLarge
            return message

        async def _send(message: Message) -> None:
            nonlocal started
            if exceeded:  # whatever the app made of the interrupted body, the answer is 413
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        with contextlib.suppress(BodyTooLarge):
            await self.app(scope, _receive, _send)
        if exceeded and not started:
            await self._reject(send, limit)
