"""The HTTP protocol the server speaks: uvicorn's httptools protocol with a deadline on request headers
and a limit on their size.

uvicorn closes an idle keep-alive connection, but not one that opens and never finishes its request line
and headers: a client sending a byte now and then would hold a connection, and a file descriptor, for
ever. Here the headers of each request must all arrive within `header_timeout_s` of its first byte, or
the client is answered 408; a connection that sends nothing for as long after it opened is closed without
a word, as uvicorn closes an idle keep-alive one (a pooling proxy must never read an answer it did not ask
for). Nor does httptools bound the headers' size: the request line and headers together may hold at most
`max_header_bytes`, or the client is answered 431 (counted while they arrive, so a huge header is refused
before it is whole in memory). Both answers close the connection, whose stream can no longer be parsed,
and take the error shape of the request's path. The body has its own limits (`service.api.limits`).
"""

from __future__ import annotations

import asyncio
import http
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.api.limits import DRAIN_S

log = logging.getLogger("ovex.http")

# what a header line adds to its name and value: ": " and CRLF
_LINE_OVERHEAD = 4


class HeaderDeadlineProtocol(HttpToolsProtocol):
    header_timeout_s = 30.0
    max_header_bytes = 64 << 10
    _deadline: asyncio.TimerHandle | None = None
    _in_head = True  # awaiting or reading a request line and headers (not a body)
    _head_bytes = 0  # the current head's url and complete header lines, as the parser hands them over
    _head_raw = 0  # bytes of whole reads that arrived within the current head (a header still arriving)
    _begun = 0  # requests begun on this connection
    _refused = False  # answered before a request started (431, 408): the rest is ignored

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(answer=False)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        in_head, begun = self._in_head, self._begun
        super().data_received(data)
        if self._refused or not (in_head and self._in_head and begun == self._begun):
            return
        # the whole read was head: this bounds what the parser holds of a header not yet complete
        self._head_raw += len(data)
        if self._head_raw > self.max_header_bytes:
            self._refuse()

    def on_message_begin(self) -> None:
        if self._refused:
            return
        self._arm(answer=True)
        self._in_head, self._head_bytes, self._head_raw = True, 0, 0
        self._begun += 1
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        if self._refused or self._count(len(url)):
            return
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused or self._count(len(name) + len(value) + _LINE_OVERHEAD):
            return
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        if self._refused:
            return
        self._in_head = False
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        super().on_message_complete()
        self._in_head = True

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _count(self, n: int) -> bool:
        """Add `n` bytes to the head; True when that puts it over the limit (and it was refused)."""
        self._head_bytes += n
        if self._head_bytes <= self.max_header_bytes:
            return False
        self._refuse()
        return True

    def _refuse(self) -> None:
        if self.transport.is_closing():
            self._refused = True
            return
        log.info("request headers too large", extra={"client": self.client, "limit": self.max_header_bytes})
        self._answer(
            431,
            f"the request line and headers are over the limit of {self.max_header_bytes} bytes: "
            "send fewer or smaller headers (and a shorter URL)",
        )

    def send_400_response(self, msg: str) -> None:
        """What the parser cannot read (a Content-Length that is no number, an unknown Transfer-Encoding)
        is answered in the error shape of every other answer, not uvicorn's plain text."""
        self._answer(400, "the request is not valid HTTP/1.1: check its request line and its Content-Length "
                          "and Transfer-Encoding headers")

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
        self._answer(408, f"the request headers did not arrive within {timeout_s:g} s")

    def _answer(self, status: int, message: str) -> None:
        """Answer before any request started, in the error shape of the path seen so far, and close."""
        from service.api.errors import error_response  # the app's own rule; loaded where the app serves

        self._refused = True
        self._disarm()
        path = (getattr(self, "url", None) or b"").split(b"?", 1)[0].decode("latin-1")
        body = error_response(path, status, message).body
        self.transport.write(
            f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n".encode()
            + b"content-type: application/json\r\nconnection: close\r\n"
            + b"content-length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        # Lingering close: a client still sending would get a reset and could lose the answer, so the
        # write side is shut (the client reads the answer, then the end), and whatever else it sends is
        # read and dropped for a moment before the connection is closed.
        self.transport.write_eof()
        self.loop.call_later(DRAIN_S, self.transport.close)


def with_header_timeout(
    timeout_s: float, max_header_bytes: int = HeaderDeadlineProtocol.max_header_bytes
) -> type[HeaderDeadlineProtocol]:
    """The protocol class for uvicorn's `http=` option, with this server's header deadline and size limit."""
    return type(
        "HttpProtocol",
        (HeaderDeadlineProtocol,),
        {"header_timeout_s": timeout_s, "max_header_bytes": max_header_bytes},
    )
