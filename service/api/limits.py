"""Request body limits before FastAPI reads anything: size (413) and stalls (408).

Checks `Content-Length` up front and counts streamed bytes for chunked bodies; dataset uploads get their
own, larger limit. A body that sends nothing for `body_timeout_s` is dropped with 408, so a client that
holds a connection open mid-body cannot pin a file descriptor and a task for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(Exception):
    """Raised from `receive` when a streamed body passes the limit."""


class BodyStalled(Exception):
    """Raised from `receive` when the client sent nothing for the body timeout."""


class BodyLimitMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        default_limit: int,
        prefix_limits: dict[str, int] | None = None,
        body_timeout_s: float = 30.0,
    ) -> None:
        self.app = app
        self.default_limit = default_limit
        self.prefix_limits = prefix_limits or {}
        self.body_timeout_s = body_timeout_s

    def limit_for(self, path: str) -> int:
        for prefix, limit in self.prefix_limits.items():
            if path.startswith(prefix):
                return limit
        return self.default_limit

    async def _reject(self, send: Send, status: int, message: str) -> None:
        body = json.dumps({"detail": message}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
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
                    await self._reject(send, 413, f"request body over the limit of {limit} bytes")
                    return
        seen = 0
        started = False
        exceeded = stalled = done = False

        async def _receive() -> Message:
            nonlocal seen, exceeded, stalled, done
            if done:  # the body is read: this waits for a disconnect (event streams), with no deadline
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.body_timeout_s)
            except TimeoutError:
                stalled = True
                raise BodyStalled from None
            if message["type"] == "http.request":
                done = not message.get("more_body", False)
                seen += len(message.get("body", b""))
                if seen > limit:
                    exceeded = True
                    raise BodyTooLarge
            return message

        async def _send(message: Message) -> None:
            nonlocal started
            if exceeded or stalled:  # whatever the app made of the interrupted body, the answer is ours
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        with contextlib.suppress(BodyTooLarge, BodyStalled):
            await self.app(scope, _receive, _send)
        if started:
            return
        if exceeded:
            await self._reject(send, 413, f"request body over the limit of {limit} bytes")
        elif stalled:
            await self._reject(send, 408, f"the request body stalled for {self.body_timeout_s:g} s")
