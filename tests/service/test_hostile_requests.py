"""Hostile requests against a live server: refused before the work, quickly, in the protocol's shape,
with the event loop free meanwhile and the connection still usable where the request was read whole.

Huge lists are counted before they are validated (the batch limit, the V2 tensors' declared shapes),
field errors are capped, a body has a total deadline, headers a size limit, and every answer says what
to fix.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.service.conftest import API_KEY, Server, copy_version, start_server, stop_server

N = 100_000
JSON = {"content-type": "application/json"}
GOOD = {"inputs": [{"features": {"indices": [1, 2], "values": [1.0, 0.5]}}], "top_k": 3}


def _v2_offsets(n: int) -> dict[str, Any]:
    """A V2 request whose `offsets` tensor declares n - 1 (empty) rows: 300 KB for 100,000."""
    return {
        "inputs": [
            {"name": "indices", "shape": [0], "datatype": "INT64", "data": []},
            {"name": "values", "shape": [0], "datatype": "FP32", "data": []},
            {"name": "offsets", "shape": [n], "datatype": "INT64", "data": [0] * n},
        ]
    }


HUGE = {
    "v2 offsets": ("/v2/models/small/infer", _v2_offsets(N)),
    "v1 model predict": ("/v1/models/small/predict", {"inputs": [{}] * N}),
    "v1 default predict": ("/v1/predict", {"inputs": [{}] * N}),
}


def _address(srv: Server) -> tuple[str, int]:
    url = urlsplit(srv.base)
    assert url.hostname is not None and url.port is not None
    return url.hostname, url.port


class Conn:
    """One keep-alive connection, so a test can tell whether the server kept it after an answer."""

    def __init__(self, srv: Server) -> None:
        host, port = _address(srv)
        self.http = http.client.HTTPConnection(host, port, timeout=60)
        self.http.connect()
        self.sock = self.http.sock

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], Any]:
        self.http.request(method, path, body=body, headers=headers or {})
        r = self.http.getresponse()
        raw = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, json.loads(raw) if raw else None

    def post(self, path: str, body: Any) -> tuple[int, dict[str, str], Any]:
        return self.request("POST", path, json.dumps(body).encode(), JSON)

    def still_serves(self) -> None:
        """A good request is answered on the same socket: the refusal left the connection usable."""
        status, _, body = self.post("/v1/models/small/predict", GOOD)
        assert status == 200, body
        assert self.http.sock is self.sock, "the server closed the connection after the refusal"

    def close(self) -> None:
        self.http.close()


@pytest.fixture()
def conn(server: Server) -> Iterator[Conn]:
    c = Conn(server)
    yield c
    c.close()


def _raw(srv: Server, data: bytes, wait: float = 20.0) -> tuple[bytes, float]:
    """Send bytes on a fresh connection: what comes back before the server closes it, and when."""
    t0 = time.monotonic()
    with socket.create_connection(_address(srv), timeout=wait) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out, time.monotonic() - t0


def _split(answer: bytes) -> tuple[int, str, Any]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), head.decode("latin-1").lower(), json.loads(body)


def _fresh_connection_serves(srv: Server) -> None:
    c = Conn(srv)
    try:
        c.still_serves()
    finally:
        c.close()


# --- huge lists: counted first, answered at once, a small answer -----------------------------------


def test_v2_rows_over_the_batch_limit_are_refused_on_the_declared_shape(conn: Conn) -> None:
    path, body = HUGE["v2 offsets"]
    t0 = time.monotonic()
    status, _, answer = conn.post(path, body)
    assert time.monotonic() - t0 < 2.0  # was 4.4 s: every row was built and validated first
    assert status == 400
    assert set(answer) == {"error"}
    assert "at most 256 rows" in answer["error"] and "99999" in answer["error"]
    assert "split" in answer["error"]
    conn.still_serves()


@pytest.mark.parametrize("path", ["/v1/models/small/predict", "/v1/predict"])
def test_v1_inputs_over_the_batch_limit_are_refused_on_their_count(conn: Conn, path: str) -> None:
    raw = json.dumps({"inputs": [{}] * N}).encode()
    t0 = time.monotonic()
    status, _, answer = conn.request("POST", path, raw, JSON)
    assert time.monotonic() - t0 < 2.0  # was about 3 s and an 11.5 MB answer
    assert status == 422
    assert len(json.dumps(answer)) < 1000
    assert answer["detail"] == [
        {
            "loc": ["body", "inputs"],
            "msg": f"at most 256 inputs per request, got {N}: split them into several requests",
            "type": "too_long",
        }
    ]
    conn.still_serves()


def test_field_errors_are_capped_with_a_count_of_the_rest(conn: Conn) -> None:
    status, _, answer = conn.post("/v1/models/small/predict", {"inputs": [{}] * 256})
    assert status == 422
    detail = answer["detail"]
    assert len(detail) == 21
    assert all("exactly one of `text` or `features`" in d["msg"] for d in detail[:20])
    assert detail[-1] == {"loc": ["body"], "msg": "and 236 more errors", "type": "too_many_errors"}
    conn.still_serves()


def test_out_of_range_indices_on_many_rows_are_capped(conn: Conn) -> None:
    rows = [{"features": {"indices": [999] * 100, "values": [1.0] * 100}}] * 256
    status, _, answer = conn.post("/v1/models/small/predict", {"inputs": rows})
    assert status == 422
    detail = answer["detail"]
    assert len(detail) == 21 and "index 999 is out of range" in detail[0]["msg"]
    assert detail[-1]["msg"] == f"and {256 * 5 - 20} more errors"  # five named per input at most
    conn.still_serves()


def test_a_long_list_of_bad_values_reports_its_first(conn: Conn) -> None:
    body = {"inputs": [{"features": {"indices": [-1] * 50_000, "values": [1.0] * 50_000}}]}
    status, _, answer = conn.post("/v1/models/small/predict", body)
    assert status == 422
    assert [d["loc"] for d in answer["detail"]] == [["body", "inputs", 0, "features", "indices", 0]]
    conn.still_serves()


def test_healthz_is_not_stalled_while_huge_requests_are_refused(server: Server) -> None:
    """The event loop answers /healthz promptly while each huge request is refused, and while four are."""
    waits: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        c = Conn(server)
        try:
            while not stop.is_set():
                t0 = time.perf_counter()
                status, _, _ = c.request("GET", "/healthz")
                waits.append(time.perf_counter() - t0)
                assert status == 200
                time.sleep(0.005)
        finally:
            c.close()

    def send(path: str, raw: bytes) -> None:
        c = Conn(server)
        try:
            status, _, _ = c.request("POST", path, raw, JSON)
            assert status in (400, 422)
        finally:
            c.close()

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        time.sleep(0.2)
        bodies = [(path, json.dumps(body).encode()) for path, body in HUGE.values()]
        for path, raw in bodies:  # one at a time
            send(path, raw)
        senders = [threading.Thread(target=send, args=b) for b in [*bodies, bodies[0]]]  # four at once
        for t in senders:
            t.start()
        for t in senders:
            t.join()
        time.sleep(0.1)
    finally:
        stop.set()
        poller.join()
    assert len(waits) > 5
    assert max(waits) < 0.5, f"/healthz waited {max(waits):.3f} s"  # was 4.2 s; about 0.03 s now


# --- feature values: what /v1 takes is what V2 takes -----------------------------------------------


@pytest.mark.parametrize("value", [3e38, -3.4e38])
def test_values_that_overflow_float32_in_the_model_are_422(conn: Conn, value: float) -> None:
    body = {"inputs": [{"features": {"indices": [1, 2], "values": [value, value]}}]}
    status, _, answer = conn.post("/v1/models/small/predict", body)
    assert status == 422, answer
    (d,) = answer["detail"]
    assert d["loc"] == ["body", "inputs", 0, "features"]
    assert "overflows the model's float32 range" in d["msg"] and "scale" in d["msg"]
    conn.still_serves()


def test_a_value_past_float32_is_422_naming_it(conn: Conn) -> None:
    body = {"inputs": [{"features": {"indices": [1], "values": [1e39]}}]}
    status, _, answer = conn.post("/v1/models/small/predict", body)
    assert status == 422
    assert answer["detail"][0]["loc"] == ["body", "inputs", 0, "features", "values", 0]
    conn.still_serves()


@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_is_not_a_feature_value_on_v1_or_v2(conn: Conn, value: bool) -> None:
    v1 = {"inputs": [{"features": {"indices": [1], "values": [value]}}]}
    status, _, answer = conn.post("/v1/models/small/predict", v1)
    assert status == 422
    assert answer["detail"][0]["loc"] == ["body", "inputs", 0, "features", "values", 0]
    assert "valid number" in answer["detail"][0]["msg"]
    v2 = {
        "inputs": [
            {"name": "indices", "shape": [1], "datatype": "INT64", "data": [1]},
            {"name": "values", "shape": [1], "datatype": "FP32", "data": [value]},
        ]
    }
    status, _, answer = conn.post("/v2/models/small/infer", v2)
    assert status == 400
    assert answer == {"error": f"input 'values': element 0 is {value!r}, not a finite number"}
    # integers are still numbers
    ints = {"inputs": [{"features": {"indices": [1], "values": [2]}}]}
    status, _, _ = conn.post("/v1/models/small/predict", ints)
    assert status == 200
    conn.still_serves()


# --- size limits in the protocol's shape -------------------------------------------------------------


@pytest.mark.parametrize(("path", "key"), [("/v2/models/small/infer", "error"), ("/v1/predict", "detail")])
def test_a_body_over_the_limit_is_413_in_the_protocol_shape(server: Server, path: str, key: str) -> None:
    c = Conn(server)
    try:
        status, headers, answer = c.request("POST", path, b"[" + b"0," * (600 << 10) + b"0]", JSON)
    finally:
        c.close()
    assert status == 413
    assert answer == {key: "request body over the limit of 1048576 bytes"}
    assert headers["connection"] == "close"  # the unread rest of the body cannot be parsed as a request
    _fresh_connection_serves(server)


@pytest.mark.parametrize(("path", "key"), [("/v2/models/small/infer", "error"), ("/healthz", "detail")])
@pytest.mark.parametrize("size", [100 << 10, 8 << 20])
def test_headers_over_the_limit_are_431_and_the_connection_closed(
    server: Server, path: str, key: str, size: int
) -> None:
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Big: ".encode() + b"a" * size + b"\r\n\r\n"
    answer, took = _raw(server, request)
    status, head, body = _split(answer)
    assert status == 431
    assert "connection: close" in head
    assert set(body) == {key}
    assert "over the limit of 65536 bytes" in body[key] and "fewer or smaller headers" in body[key]
    assert took < 10
    _fresh_connection_serves(server)


def test_many_headers_over_the_limit_are_431(server: Server) -> None:
    lines = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(1000))
    answer, _ = _raw(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + lines + b"\r\n")
    assert _split(answer)[0] == 431


def test_headers_under_the_limit_are_served(conn: Conn) -> None:
    status, _, _ = conn.request("GET", "/healthz", headers={"X-Big": "a" * (48 << 10)})
    assert status == 200
    conn.still_serves()


# --- a body that trickles in: a total deadline --------------------------------------------------------


@pytest.fixture(scope="module")
def strict(model_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with a 2 s body deadline (and a 1 KiB/s minimum rate) and a 1 s header deadline."""
    work = tmp_path_factory.mktemp("strict")
    copy_version(model_store, work / "models", "small", "1")
    env = {"OVEX_BODY_DEADLINE_S": "2", "OVEX_BODY_MIN_RATE": "1024", "OVEX_HEADER_TIMEOUT_S": "1"}
    srv = start_server(work / "models", work, env)
    yield srv
    stop_server(srv)


@pytest.mark.parametrize(("path", "key"), [("/v1/predict", "detail"), ("/v2/models/small/infer", "error")])
def test_a_trickled_body_is_408_at_its_deadline(strict: Server, path: str, key: str) -> None:
    """One byte every 0.3 s never trips the 30 s silence timeout; the total deadline (2 s plus 100 bytes
    at 1 KiB/s) ends it."""
    body = b" " * 100
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(body)}\r\n\r\n"
    t0 = time.monotonic()
    with socket.create_connection(_address(strict), timeout=20) as s:
        s.sendall(head.encode())
        answer = b""
        for i in range(len(body)):
            try:
                s.sendall(body[i : i + 1])
            except OSError:  # closed after answering
                break
            time.sleep(0.3)
            s.setblocking(False)
            try:
                answer += s.recv(65536)
            except BlockingIOError:
                pass
            finally:
                s.setblocking(True)
            if answer:
                break
        took = time.monotonic() - t0
        s.settimeout(5)
        while chunk := s.recv(65536):
            answer += chunk
    status, head_text, answer_body = _split(answer)
    assert status == 408
    assert "connection: close" in head_text
    assert set(answer_body) == {key}
    assert "did not all arrive within 2.1 s" in answer_body[key] and "faster" in answer_body[key]
    assert 1.9 < took < 5
    _fresh_connection_serves(strict)


def test_a_trickled_upload_is_408_and_logs_no_error(strict: Server) -> None:
    """The upload reads its body itself: the deadline holds there too, with no error in the log."""
    part = b'--zz\r\nContent-Disposition: form-data; name="file"; filename="a.txt"\r\n\r\n'
    head = (
        f"POST /v1/datasets?name=trickled HTTP/1.1\r\nHost: x\r\nX-API-Key: {API_KEY}\r\n"
        "Content-Type: multipart/form-data; boundary=zz\r\nContent-Length: 300\r\n\r\n"
    ).encode()
    t0 = time.monotonic()
    with socket.create_connection(_address(strict), timeout=20) as s:
        s.sendall(head + part)
        s.settimeout(0.3)
        answer = b""
        while not answer and time.monotonic() - t0 < 10:
            try:
                s.sendall(b"a")
                answer = s.recv(65536)
            except TimeoutError:
                pass
            except OSError:
                break
        took = time.monotonic() - t0
        s.settimeout(5)
        with contextlib.suppress(OSError):  # the rest of the answer, to the close
            while answer and (chunk := s.recv(65536)):
                answer += chunk
    status, _, body = _split(answer)
    assert status == 408 and "did not all arrive within 2.29 s" in body["detail"]
    assert took < 5
    assert "unhandled" not in strict.log() and "Traceback" not in strict.log()


def test_a_body_sent_steadily_within_the_deadline_is_served(strict: Server) -> None:
    raw = json.dumps(GOOD).encode()
    head = "POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(raw)}\r\nConnection: close\r\n\r\n"
    with socket.create_connection(_address(strict), timeout=20) as s:
        s.sendall(head.encode())
        for piece in (raw[:20], raw[20:]):
            s.sendall(piece)
            time.sleep(0.5)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert _split(answer)[0] == 200


def test_unfinished_headers_under_v2_get_the_v2_shape(strict: Server) -> None:
    answer, took = _raw(strict, b"POST /v2/models/small/infer HTTP/1.1\r\nHost: x\r\n")
    status, _, body = _split(answer)
    assert status == 408
    assert body == {"error": "the request headers did not arrive within 1 s"}
    assert took < 10
