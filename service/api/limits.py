"""Request body limits before FastAPI reads anything: size (413), stalls and a total deadline (408).

Checks `Content-Length` up front and counts streamed bytes for chunked bodies; dataset uploads get their
own, larger limit. A body that sends nothing for `body_timeout_s` is dropped with 408, and so is one
that has not all arrived by its deadline (`body_deadline_s` plus its size at `body_min_rate`): a client
trickling a byte now and then cannot pin a file descriptor and a task for ever. Answers are in the
protocol's error shape of their path (`{"error": ...}` under /v2).
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import error_response
from service.errors import DomainError, TooLarge


# Both are error kinds the app's handlers answer quietly (the app may read the body itself, as uploads
# do); whatever they answer is dropped, and this middleware answers instead.
class BodyTooLarge(TooLarge):
    """Raised from `receive` when a streamed body passes the limit."""


class BodyStalled(DomainError):
    """Raised from `receive` when the client sent nothing for the body timeout, or ran past the deadline."""

    kind = "timeout"


# a refused request's unread rest is read and dropped for at most this long (and, before a 413, this
# much): a client still sending when the connection closes gets a reset, and may lose the answer with it.
# The protocol's lingering close after a 431 or 408 (`service.http_protocol`) waits as long
DRAIN_S = 2.0
DRAIN_BYTES = 64 << 20


async def _drain(receive: Receive) -> None:
    """Read and drop the rest of a request body, within DRAIN_S and DRAIN_BYTES."""
    loop = asyncio.get_running_loop()
    end, drained = loop.time() + DRAIN_S, 0
    while drained < DRAIN_BYTES and (left := end - loop.time()) > 0:
        try:
            message = await asyncio.wait_for(receive(), left)
        except TimeoutError:
            return
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        drained += len(message.get("body", b""))


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            with contextlib.suppress(ValueError):
                return int(value)
    return None


class BodyLimitMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        default_limit: int,
        prefix_limits: dict[str, int] | None = None,
        body_timeout_s: float = 30.0,
        body_deadline_s: float = 60.0,
        body_min_rate: int = 64 << 10,
    ) -> None:
        self.app = app
        self.default_limit = default_limit
        self.prefix_limits = prefix_limits or {}
        self.body_timeout_s = body_timeout_s
        self.body_deadline_s = body_deadline_s
        self.body_min_rate = body_min_rate

    def limit_for(self, path: str) -> int:
        for prefix, limit in self.prefix_limits.items():
            if path.startswith(prefix):
                return limit
        return self.default_limit

    def deadline_for(self, size: int) -> float:
        """Seconds a body of `size` bytes is given in all: large uploads get time in proportion."""
        return self.body_deadline_s + size / self.body_min_rate

    async def _reject(self, scope: Scope, receive: Receive, send: Send, status: int, message: str) -> None:
        # the rest of the body is unread: the connection cannot carry another request
        response = error_response(scope.get("path", ""), status, message, {"connection": "close"})
        await response(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("path", ""))
        declared = _declared_length(scope)
        if declared is not None and declared > limit:
            await _drain(receive)
            await self._reject(scope, receive, send, 413, f"request body over the limit of {limit} bytes")
            return
        allowed_s = self.deadline_for(limit if declared is None else declared)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + allowed_s
        seen = 0
        started = False
        exceeded = stalled = late = done = False

        async def _receive() -> Message:
            nonlocal seen, exceeded, stalled, late, done
            if done:  # the body is read: this waits for a disconnect (event streams), with no deadline
                return await receive()
            left = deadline - loop.time()
            try:
                if left <= 0:
                    raise TimeoutError
                message = await asyncio.wait_for(receive(), min(self.body_timeout_s, left))
            except TimeoutError:
                late = loop.time() >= deadline
                stalled = not late
                raise BodyStalled("the request body was not received in time") from None
            if message["type"] == "http.request":
                done = not message.get("more_body", False)
                seen += len(message.get("body", b""))
                if seen > limit:
                    exceeded = True
                    raise BodyTooLarge(f"request body over the limit of {limit} bytes")
            return message

        async def _send(message: Message) -> None:
            nonlocal started
            if exceeded or stalled or late:  # the app saw an interrupted body: the answer is ours
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        with contextlib.suppress(BodyTooLarge, BodyStalled):
            await self.app(scope, _receive, _send)
        if started:
            return
        if exceeded:
            await _drain(receive)
            await self._reject(scope, receive, send, 413, f"request body over the limit of {limit} bytes")
        elif stalled:
            why = f"nothing arrived for {self.body_timeout_s:g} s; send it without pauses"
            await self._reject(scope, receive, send, 408, f"the request body stalled: {why}")
        elif late:
            why = (
                f"{self.body_deadline_s:g} s plus {self.body_min_rate} bytes/s of its size: send it faster, "
                "or in smaller requests"
            )
            message = f"the request body did not all arrive within {allowed_s:.3g} s ({why})"
            await self._reject(scope, receive, send, 408, message)
