"""The requests a probe of the jobs API found holes with, replayed against a real `ovex serve`: each now
gets a clear 4xx (or a clean stream), leaks no server path, and leaves nothing stored behind."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.jobs.conftest import API_KEY, Backend, Server

READ_KEY = "test-read-key"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(
        tmp_path_factory.mktemp("holes"),
        Backend("sqlite"),
        embedded_worker=False,  # jobs stay queued: nothing here needs one to run
        extra_env={"OVEX_READ_KEY": READ_KEY, "OVEX_BODY_TIMEOUT_S": "1", "OVEX_HEADER_TIMEOUT_S": "1"},
    )
    server.start()
    yield server
    server.stop()


def _stored(srv: Server) -> set[str]:
    return {
        str(p.relative_to(srv.data_dir))
        for sub in ("datasets", "uploads")
        if (srv.data_dir / sub).exists()
        for p in (srv.data_dir / sub).iterdir()
    }


def _fds(srv: Server) -> int:
    assert srv.proc is not None
    return len(os.listdir(f"/proc/{srv.proc.pid}/fd"))


def _raw(srv: Server, head: bytes, body: bytes = b"", wait: float = 10.0) -> bytes:
    """Send bytes on a fresh connection; what the server answers before it closes (or `wait` passes)."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=wait) as s:
        s.sendall(head + body)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            pass
        return out


def _no_paths(srv: Server, text: str) -> None:
    for secret in (str(srv.root), str(srv.data_dir), str(srv.models_dir), "Traceback", "/site-packages/"):
        assert secret not in text, (secret, text)


def test_deeply_nested_jsonl_line_is_a_422_naming_the_line(srv: Server, train_id: str) -> None:
    before = _stored(srv)
    line = '{"text":"a","labels":["x"],"id":' + "[" * 1000 + "]" * 1000 + "}\n"
    body = '{"text": "b c", "labels": ["y"]}\n' + line
    r = srv.client.post("/v1/datasets", files={"file": ("deep.jsonl", body.encode())})
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["line"] == 2 and err["msg"].startswith("deep.jsonl:2:") and "nested" in err["msg"], err
    assert _stored(srv) == before


def test_last_event_id_past_int64_is_a_422(srv: Server, train_id: str) -> None:
    job = srv.submit({"model": "m", "train_dataset": train_id})
    for bad in ("9223372036854775808", "-1", "abc", "1e3"):
        r = srv.client.get(f"/v1/jobs/{job}/events", headers={"Last-Event-ID": bad})
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["detail"][0]["loc"] == ["header", "last-event-id"]
    # the largest id is a clean stream: nothing after it yet, the job still queued
    with srv.client.stream(
        "GET", f"/v1/jobs/{job}/events", headers={"Last-Event-ID": "9223372036854775807"}, timeout=5
    ) as r:
        assert r.status_code == 200
        assert next(r.iter_lines()).startswith(": ovex job events")


def test_dropped_event_streams_release_their_handles(srv: Server, train_id: str) -> None:
    job = srv.submit({"model": "m", "train_dataset": train_id})

    def drop(n: int) -> None:
        for _ in range(n):
            with (
                httpx.Client(base_url=srv.base, timeout=10) as c,
                c.stream("GET", f"/v1/jobs/{job}/events") as r,
            ):
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data:"):  # the first event (queued) came: drop the stream
                        break

    def settled() -> int:  # streams notice a gone client at their next poll
        time.sleep(1.0)
        return _fds(srv)

    drop(30)
    first = settled()
    drop(30)
    second = settled()
    assert second <= first + 2, (first, second)


@pytest.mark.parametrize(
    ("params", "field", "words"),
    [
        ({"seed": 2**70}, "seed", "less than or equal"),
        ({"epochs": "3"}, "epochs", "valid integer"),
        ({"epochs": True}, "epochs", "valid integer"),
        ({"max_vocab": 10**12}, "max_vocab", "less than or equal"),
        ({"batch_size": 10**6}, "batch_size", "less than or equal"),
        ({"batch_size": -1}, "batch_size", "greater than or equal to 0"),
        ({"negatives": 10**6}, "negatives", "less than or equal"),
    ],
)
def test_params_are_bounded_and_strictly_typed(
    srv: Server, train_id: str, params: dict[str, Any], field: str, words: str
) -> None:
    r = srv.client.post("/v1/jobs", json={"model": "m", "train_dataset": train_id, "params": params})
    assert r.status_code == 422, r.text
    errs = [e for e in r.json()["detail"] if e["loc"] == ["body", "params", field]]
    assert errs and words in errs[0]["msg"], r.text


def test_nan_is_named_nan(srv: Server, train_id: str) -> None:
    body = '{"model": "m", "train_dataset": "' + train_id + '", "params": {"lr": NaN}}'
    r = srv.client.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["loc"] == ["body", "params", "lr"] and "NaN" in err["msg"], err


def test_budget_names_the_param_behind_the_largest_term(srv: Server, synth_files: dict[str, Path]) -> None:
    text = srv.upload(synth_files["train_jsonl"])["id"]
    r = srv.client.post(
        "/v1/jobs", json={"model": "m", "train_dataset": text, "params": {"max_vocab": 1 << 26}}
    )
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["loc"] == ["body", "params", "max_vocab"] and err["type"] == "memory_budget", err


def test_cut_short_multipart_is_refused_and_stores_nothing(srv: Server) -> None:
    before = _stored(srv)
    body = (
        b"--b0undary\r\n"
        b'Content-Disposition: form-data; name="file"; filename="t.txt"\r\n\r\n'
        b"2 3 2\n0 0:1.0\n1 1:1.0\n"
    )  # no closing boundary, and the Content-Length says exactly this much
    r = srv.client.post(
        "/v1/datasets", content=body, headers={"content-type": "multipart/form-data; boundary=b0undary"}
    )
    assert r.status_code == 400 and "closing boundary" in r.text, r.text
    assert _stored(srv) == before


def test_client_gone_mid_upload_is_no_server_error(srv: Server) -> None:
    log = srv.root / "server.log"
    size_before = log.stat().st_size
    head = (
        f"POST /v1/datasets HTTP/1.1\r\nHost: x\r\nX-API-Key: {API_KEY}\r\n"
        "Content-Type: multipart/form-data; boundary=b0undary\r\nContent-Length: 100000\r\n\r\n"
    ).encode()
    part = b'--b0undary\r\nContent-Disposition: form-data; name="file"; filename="t.txt"\r\n\r\n2 3 2\n'
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(head + part)
        time.sleep(0.3)
    time.sleep(0.5)
    assert srv.client.get("/healthz").status_code == 200
    tail = log.read_bytes()[size_before:].decode(errors="replace")
    assert "Traceback" not in tail and "unhandled error" not in tail, tail
    assert not any((srv.data_dir / "uploads").iterdir())


def test_stalled_body_is_timed_out(srv: Server) -> None:
    head = (
        f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nX-API-Key: {API_KEY}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    ).encode()
    before = _fds(srv)
    t0 = time.monotonic()
    answer = _raw(srv, head, b'{"model": ', wait=20)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert time.monotonic() - t0 < 15  # OVEX_BODY_TIMEOUT_S=1: far below the 20 s we would wait
    assert _fds(srv) <= before + 1


@pytest.mark.parametrize(
    "sent",
    [b"", b"GET /healthz HTTP/1.1\r\nHost: x\r\n", b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /hea"],
    ids=["nothing", "headers unfinished", "second request unfinished"],
)
def test_stalled_headers_are_timed_out(srv: Server, sent: bytes) -> None:
    """A connection that never finishes a request's headers is answered 408 and closed; one that sends
    nothing is closed without an answer it did not ask for."""
    before = _fds(srv)
    t0 = time.monotonic()
    answer = _raw(srv, sent, wait=20)
    assert time.monotonic() - t0 < 15  # OVEX_HEADER_TIMEOUT_S=1: far below the 20 s we would wait
    if sent:
        assert answer.endswith(b'{"detail":"the request headers did not arrive within 1 s"}'), answer[-300:]
    else:
        assert answer == b""
    assert answer.count(b"HTTP/1.1 200") == sent.count(b"\r\n\r\n")  # a finished request was answered
    assert _fds(srv) <= before + 1


def test_headers_sent_slowly_within_the_deadline_are_served(srv: Server) -> None:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        for piece in (b"GET /healthz HTTP/1.1\r\n", b"Host: x\r\n", b"Connection: close\r\n\r\n"):
            s.sendall(piece)
            time.sleep(0.3)
        answer = s.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


def test_no_response_shows_a_server_path(srv: Server, train_id: str) -> None:
    srv.models_dir.mkdir(exist_ok=True)
    broken = srv.models_dir / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "config.json").write_text("{not json")
    answers = [
        srv.client.get("/v1/models/broken"),
        srv.client.get("/v1/models/nope"),
        srv.client.post("/v1/models/broken/versions/7/activate"),
        srv.client.post("/v1/models/broken/versions/1/activate"),
        srv.client.post("/v1/predict", json={"inputs": [{"text": "a"}]}),
    ]
    assert answers[1].status_code == 404 and answers[2].status_code == 404, answers[2].text
    assert answers[3].status_code == 409, answers[3].text
    for r in answers:
        _no_paths(srv, r.text)


def test_read_key_guards_logs_and_datasets_and_bearer_works(srv: Server, train_id: str) -> None:
    job = srv.submit({"model": "m", "train_dataset": train_id})
    anon = httpx.Client(base_url=srv.base, timeout=10)
    reader = httpx.Client(base_url=srv.base, timeout=10, headers={"Authorization": f"Bearer {READ_KEY}"})
    admin = httpx.Client(base_url=srv.base, timeout=10, headers={"Authorization": f"Bearer {API_KEY}"})
    try:
        for path in (f"/v1/jobs/{job}/logs", f"/v1/datasets/{train_id}", "/v1/datasets"):
            assert anon.get(path).status_code == 401, path
            assert anon.get(path, headers={"X-API-Key": "nope"}).status_code == 403, path
            assert reader.get(path).status_code == 200, path
            assert admin.get(path).status_code == 200, path
        assert "state: queued" in reader.get(f"/v1/jobs/{job}/logs").text
        # open reads stay open; predictions are open by default
        assert anon.get(f"/v1/jobs/{job}").status_code == 200
        assert anon.post("/v1/predict", json={"inputs": [{"text": "a"}]}).status_code != 401
        # the read key cannot mutate; the admin key as a bearer token can
        r = reader.post(f"/v1/jobs/{job}/cancel")
        assert r.status_code == 403 and "admin key" in r.text, r.text
        assert admin.post(f"/v1/jobs/{job}/cancel").status_code == 202
        assert anon.post(f"/v1/jobs/{job}/cancel").status_code == 401
        assert anon.post(f"/v1/jobs/{job}/cancel", headers={"Authorization": "Basic eDp5"}).status_code == 401
    finally:
        for c in (anon, reader, admin):
            c.close()


def test_lists_page_with_cursors(srv: Server, train_id: str, synth_files: dict[str, Path]) -> None:
    srv.upload(synth_files["test"])  # two datasets at least, whichever tests ran before
    made = [srv.submit({"model": "pager", "train_dataset": train_id}) for _ in range(5)]
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"model": "pager", "limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = srv.client.get("/v1/jobs", params=params).json()
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(made))
    r = srv.client.get("/v1/jobs", params={"cursor": "garbage!"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "cursor"], r.text
    page = srv.client.get("/v1/datasets", params={"limit": 1}).json()
    assert len(page["datasets"]) == 1 and page["next_cursor"]
    rest = srv.client.get("/v1/datasets", params={"cursor": page["next_cursor"]}).json()
    assert page["datasets"][0]["id"] not in {d["id"] for d in rest["datasets"]}
    # a cursor names its listing: a datasets cursor is refused by the jobs listing, and the reverse
    r = srv.client.get("/v1/jobs", params={"cursor": page["next_cursor"]})
    assert r.status_code == 422 and "listing of jobs" in r.json()["detail"][0]["msg"], r.text
    jobs_page = srv.client.get("/v1/jobs", params={"limit": 1}).json()
    r = srv.client.get("/v1/datasets", params={"cursor": jobs_page["next_cursor"]})
    assert r.status_code == 422 and "listing of datasets" in r.json()["detail"][0]["msg"], r.text


def test_job_params_schema_is_train_params(srv: Server) -> None:
    spec = srv.client.get("/openapi.json").json()
    body_ref = spec["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    body = spec["components"]["schemas"][body_ref["$ref"].rsplit("/", 1)[1]]
    params_ref = body["properties"]["params"].get("$ref") or body["properties"]["params"]["allOf"][0]["$ref"]
    params = spec["components"]["schemas"][params_ref.rsplit("/", 1)[1]]
    from trainer.params import MAX_BATCH, MAX_SEED, TrainParams

    assert set(params["properties"]) == set(TrainParams.model_fields)
    assert params["additionalProperties"] is False
    assert params["properties"]["batch_size"]["maximum"] == MAX_BATCH
    assert params["properties"]["seed"]["maximum"] == MAX_SEED
    assert params["properties"]["encoder"]["enum"] == ["linear", "mlp", "maxout"]
