"""Bad input to /v1/datasets and /v1/jobs against a real server: each case its own clear 4xx, and nothing
is queued or stored afterwards."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.jobs.conftest import API_KEY, Backend, Server

BUDGET = 1 << 20  # 1 MiB: a dim-16 model of the tiny data fits (~70 KB), dim 4096 does not
UPLOAD_LIMIT = 200_000  # the tiny training file (~150 KB) fits


@pytest.fixture(scope="module")
def srv(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(
        tmp_path_factory.mktemp("bad"),
        backend,
        embedded_worker=False,
        extra_env={"OVEX_MEMORY_BUDGET_BYTES": str(BUDGET), "OVEX_MAX_UPLOAD_BYTES": str(UPLOAD_LIMIT)},
    )
    server.start()
    yield server
    server.stop()


def _detail(r: httpx.Response) -> list[dict[str, Any]]:
    detail = r.json()["detail"]
    assert isinstance(detail, list), detail
    return detail


def _locs(r: httpx.Response) -> list[list[Any]]:
    return [d["loc"] for d in _detail(r)]


def _nothing_queued(srv: Server) -> None:
    assert srv.client.get("/v1/jobs").json()["jobs"] == []
    jobs_dir = srv.data_dir / "jobs"
    assert not jobs_dir.exists() or not any(jobs_dir.iterdir())


def _stored_files(srv: Server) -> set[str]:
    d = srv.data_dir / "datasets"
    return {p.name for p in d.iterdir()} if d.exists() else set()


def test_api_key_missing_or_wrong(srv: Server, train_id: str, synth_files: dict[str, Path]) -> None:
    body = {"model": "m", "train_dataset": train_id}
    anon = httpx.Client(base_url=srv.base, timeout=30)
    wrong = httpx.Client(base_url=srv.base, headers={"X-API-Key": API_KEY + "x"}, timeout=30)
    try:
        for client, code in ((anon, 401), (wrong, 403)):
            assert client.post("/v1/jobs", json=body).status_code == code
            with open(synth_files["test"], "rb") as fh:
                assert client.post("/v1/datasets", files={"file": ("t.txt", fh)}).status_code == code
            assert client.post("/v1/jobs/job_x/cancel").status_code == code
        assert anon.post("/v1/jobs", json=body).json()["detail"].startswith("missing API key")
    finally:
        anon.close()
        wrong.close()
    _nothing_queued(srv)
    assert train_id in {d["id"] for d in srv.client.get("/v1/datasets").json()["datasets"]}


def test_unknown_dataset(srv: Server, train_id: str) -> None:
    r = srv.client.post("/v1/jobs", json={"model": "m", "train_dataset": "ds_nope"})
    assert r.status_code == 404 and _locs(r) == [["body", "train_dataset"]], r.text
    assert "ds_nope" in _detail(r)[0]["msg"]
    r = srv.client.post("/v1/jobs", json={"model": "m", "train_dataset": train_id, "test_dataset": "ds_gone"})
    assert r.status_code == 404 and _locs(r) == [["body", "test_dataset"]], r.text
    assert srv.client.get("/v1/datasets/ds_nope").status_code == 404
    _nothing_queued(srv)


@pytest.mark.parametrize(
    ("patch", "loc"),
    [
        ({"model": 5}, ["body", "model"]),
        ({"model": "../etc"}, ["body", "model"]),
        ({"train_dataset": 12}, ["body", "train_dataset"]),
        ({"activate": "yes"}, ["body", "activate"]),
        ({"params": [1, 2]}, ["body", "params"]),
        ({"out_dir": "/tmp/x"}, ["body", "out_dir"]),  # a job never names a path
        ({"params": {"epochs": "many"}}, ["body", "params", "epochs"]),
        ({"params": {"dim": 1.5}}, ["body", "params", "dim"]),
        ({"params": {"encoder": "transformer"}}, ["body", "params", "encoder"]),
        ({"params": {"no_such_option": 1}}, ["body", "params", "no_such_option"]),
    ],
)
def test_wrong_types(srv: Server, train_id: str, patch: dict[str, Any], loc: list[Any]) -> None:
    r = srv.client.post("/v1/jobs", json={"model": "m", "train_dataset": train_id, **patch})
    assert r.status_code == 422, r.text
    assert loc in _locs(r), r.text
    _nothing_queued(srv)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"epochs": 0}, "epochs"),
        ({"dim": 0}, "dim"),
        ({"lr": -0.1}, "lr"),
        ({"negatives": 0}, "negatives"),
        ({"dropout": 1.0}, "dropout"),
        ({"batch_size": -1}, "batch_size"),
        ({"loss": "no-such-loss"}, "loss"),
        ({"nproc_per_node": (os.cpu_count() or 1) + 1}, "nproc_per_node"),  # more ranks than cores
    ],
)
def test_out_of_range_params(srv: Server, train_id: str, params: dict[str, Any], field: str) -> None:
    r = srv.client.post("/v1/jobs", json={"model": "m", "train_dataset": train_id, "params": params})
    assert r.status_code == 422, r.text
    assert ["body", "params", field] in _locs(r), r.text
    _nothing_queued(srv)


def test_over_memory_budget(srv: Server, train_id: str) -> None:
    r = srv.client.post("/v1/jobs", json={"model": "m", "train_dataset": train_id, "params": {"dim": 4096}})
    assert r.status_code == 422, r.text
    err = _detail(r)[0]
    assert err["type"] == "memory_budget" and err["budget_bytes"] == BUDGET
    assert err["need_bytes"] > BUDGET
    assert "40 labels × 4096 dims" in err["msg"] and "1.0 MiB" in err["msg"], err["msg"]
    _nothing_queued(srv)


def test_invalid_uploads_store_nothing(
    srv: Server, train_id: str, synth_files: dict[str, Path], tmp_path: Path
) -> None:
    before_rows = srv.client.get("/v1/datasets").json()["datasets"]
    before_files = _stored_files(srv)

    with open(synth_files["bad"], "rb") as fh:  # label id 7 with L=5 on line 4
        r = srv.client.post("/v1/datasets", files={"file": ("bad.txt", fh)})
    assert r.status_code == 422, r.text
    err = _detail(r)[0]
    assert err["loc"] == ["body", "file"] and err["line"] == 4 and err["msg"].startswith("bad.txt:4:"), err

    jsonl = tmp_path / "broken.jsonl"
    jsonl.write_text('{"text": "a b", "labels": ["x"]}\n{"text": 3}\n')
    with open(jsonl, "rb") as fh:
        r = srv.client.post("/v1/datasets", files={"file": ("broken.jsonl", fh)})
    assert r.status_code == 422 and _detail(r)[0]["line"] == 2, r.text

    r = srv.client.post("/v1/datasets", files={"file": ("empty.txt", b"")})
    assert r.status_code == 422, r.text

    r = srv.client.post("/v1/datasets", files={"other": ("x.txt", b"1 1 1\n0 0:1\n")})
    assert r.status_code == 422 and "no `file` part" in _detail(r)[0]["msg"], r.text

    r = srv.client.post("/v1/datasets", json={"file": "1 1 1\n0 0:1\n"})
    assert r.status_code == 415, r.text

    big = b"x" * (UPLOAD_LIMIT + 10_000)
    r = srv.client.post("/v1/datasets", files={"file": ("big.txt", big)})
    assert r.status_code == 413, r.text

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is enforced while streaming
        boundary = b"b0undary"
        yield (
            b"--" + boundary + b'\r\nContent-Disposition: form-data; name="file"; filename="big.txt"\r\n\r\n'
        )
        for _ in range(30):
            yield b"y" * 10_000
        yield b"\r\n--" + boundary + b"--\r\n"

    r = srv.client.post(
        "/v1/datasets", content=chunks(), headers={"content-type": "multipart/form-data; boundary=b0undary"}
    )
    assert r.status_code == 413, r.text

    assert srv.client.get("/v1/datasets").json()["datasets"] == before_rows
    assert _stored_files(srv) == before_files
    uploads = srv.data_dir / "uploads"
    assert not uploads.exists() or not any(uploads.iterdir())
    _nothing_queued(srv)


def test_unknown_job(srv: Server) -> None:
    for method, path in (
        ("GET", "/v1/jobs/job_nope"),
        ("GET", "/v1/jobs/job_nope/logs"),
        ("GET", "/v1/jobs/job_nope/events"),
        ("POST", "/v1/jobs/job_nope/cancel"),
    ):
        r = srv.client.request(method, path)
        assert r.status_code == 404, (path, r.text)
    assert srv.client.get("/v1/jobs", params={"state": "bogus"}).status_code == 422


def test_test_set_that_does_not_fit(srv: Server, train_id: str, synth_files: dict[str, Path]) -> None:
    wide = srv.upload(synth_files["wide"])["id"]
    r = srv.client.post("/v1/jobs", json={"model": "m", "train_dataset": train_id, "test_dataset": wide})
    assert r.status_code == 422 and _locs(r) == [["body", "test_dataset"]], r.text
    assert "features 400 > 300" in _detail(r)[0]["msg"]
    text = srv.upload(synth_files["train_jsonl"])
    assert text["features"] is None and text["labels"] == 40
    r = srv.client.post(
        "/v1/jobs", json={"model": "m", "train_dataset": train_id, "test_dataset": text["id"]}
    )
    assert r.status_code == 422 and "jsonl" in _detail(r)[0]["msg"], r.text
    _nothing_queued(srv)


def test_fuzzed_requests_with_the_key_never_5xx(srv: Server, train_id: str) -> None:
    """schemathesis over the jobs/datasets operations, authenticated: no 5xx, answers match the schema.
    (Last in this module: a fuzzed request may legitimately create a record.)"""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
    ]
    schema = schemathesis.openapi.from_url(srv.base + "/openapi.json")
    seen = []
    statuses: list[int] = []
    for result in schema.get_all_operations():
        op = result.ok()  # type: ignore[union-attr]
        if not op.path.startswith(("/v1/jobs", "/v1/datasets")):
            continue
        seen.append(f"{op.method.upper()} {op.path}")

        @given(case=op.as_strategy())
        @settings(
            max_examples=25,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def run(case: Any) -> None:
            response = case.call_and_validate(
                base_url=srv.base, headers={"X-API-Key": API_KEY}, checks=checks
            )
            statuses.append(response.status_code)

        run()
    assert len(statuses) >= 5 * len(seen) and not any(s in (401, 403) for s in statuses), statuses
    assert "POST /v1/jobs" in seen and "POST /v1/datasets" in seen and "POST /v1/jobs/{job_id}/cancel" in seen
