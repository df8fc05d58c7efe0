"""The HTTP protocol the server speaks: uvicorn's httptools protocol with a deadline on request headers.

uvicorn closes an idle keep-alive connection, but not one that opens and never finishes its request line
and headers: a client sending a byte now and then would hold a connection, and a file descriptor, for
ever. Here the headers of each request must all arrive within `header_timeout_s` of its first byte, or
the client is answered 408; a connection that sends nothing for as long after it opened is closed without
a word, as uvicorn closes an idle keep-alive one (a pooling proxy must never read an answer it did not ask
for). The body has its own limit (`service.api.limits`).
"""

from __future__ import annotations

import asyncio
import json
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("ovex.http")


class HeaderDeadlineProtocol(HttpToolsProtocol):
    header_timeout_s = 30.0
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(answer=False)

    def on_message_begin(self) -> None:
        self._arm(answer=True)
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, answer: bool) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.header_timeout_s, self._expired, answer)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self, answer: bool) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        timeout_s = self.header_timeout_s
        log.info("request headers timed out", extra={"client": self.client, "timeout_s": timeout_s})
        if not answer:
            self.transport.close()
            return
        body = json.dumps({"detail": f"the request headers did not arrive within {timeout_s:g} s"}).encode()
        self.transport.write(
            b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            + b"content-length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        self.transport.close()


def with_header_timeout(timeout_s: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class for uvicorn's `http=` option, with this server's header deadline."""
    return type("HttpProtocol", (HeaderDeadlineProtocol,), {"header_timeout_s": timeout_s})
