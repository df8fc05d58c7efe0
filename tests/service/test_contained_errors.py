"""An exception nothing handled is answered 500 in the protocol's shape, and the connection stays usable:
the next request on the same socket is answered (Starlette's handler re-raises, and uvicorn then closes)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from fastapi import FastAPI

from service.api.errors import install_error_handlers
from service.http_protocol import with_header_timeout
from tests.live import free_port


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/v1/boom")
    async def boom_v1() -> None:
        raise RuntimeError("/srv/secret/path exploded")

    @app.get("/v2/boom")
    async def boom_v2() -> None:
        raise KeyError("no")

    @app.get("/v1/fine")
    async def fine() -> dict[str, bool]:
        return {"ok": True}

    return app


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(_app(), host="127.0.0.1", port=port, log_level="critical",
                            http=with_header_timeout(30.0))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.05)
    yield port
    server.should_exit = True
    thread.join(10)


def _exchange(sock: socket.socket, path: str) -> tuple[int, dict[str, str], bytes]:
    """One request on an open keep-alive socket; the status, headers and body of its answer."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nhost: t\r\n\r\n".encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before answering {path}"
        buf += chunk
    head, body = buf.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers["content-length"])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the connection closed mid-body"
        body += chunk
    return status, headers, body


@pytest.mark.parametrize(("path", "key"), [("/v1/boom", "detail"), ("/v2/boom", "error")])
def test_unhandled_error_keeps_the_connection(port: int, path: str, key: str) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for _ in range(2):  # twice on the same socket: the first 500 did not close it
            status, headers, body = _exchange(sock, path)
            assert status == 500
            assert headers.get("connection", "").lower() != "close"
            answer = json.loads(body)
            assert list(answer) == [key]
            assert "logged on the server" in answer[key]
            assert "secret" not in body.decode() and "RuntimeError" not in body.decode()
        status, _, body = _exchange(sock, "/v1/fine")
        assert status == 200 and json.loads(body) == {"ok": True}
