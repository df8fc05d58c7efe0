"""Fuzz every operation of the OpenAPI schema with schemathesis against a live server, with the admin key:
no 5xx, responses conform (status, content type, body schema). The job event stream is fuzzed too (its
header and path) and driven once more on a real, ended job, so its stream runs to its end.

Bounded (a few examples per operation) so it stays around a minute. Driven through schemathesis' Python
API with hypothesis directly (its pytest plugin does not load under this pytest version).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.service.conftest import API_KEY, Server, copy_version, start_server, stop_server

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
KEY = {"X-API-Key": API_KEY}


@pytest.fixture(scope="module")
def fuzz_server(model_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Its own server: the fuzzer holds the admin key, so it may change what it finds."""
    work = tmp_path_factory.mktemp("fuzz")
    copy_version(model_store, work / "models", "small", "1")
    srv = start_server(work / "models", work)
    yield srv
    stop_server(srv)


def _ended_job(srv: Server) -> str:
    """A dataset and a job that ended (cancelled while queued: no worker runs in this server)."""
    with srv.client(headers=KEY) as c:
        ds = c.post("/v1/datasets", files={"file": ("d.txt", b"2 3 2\n0 0:1.0\n1 1:1.0 2:0.5\n")})
        assert ds.status_code in (200, 201), ds.text
        job = c.post("/v1/jobs", json={"model": "fz", "train_dataset": ds.json()["id"]}).json()["id"]
        assert c.post(f"/v1/jobs/{job}/cancel").json()["state"] == "cancelled"
        return str(job)


def test_every_operation_conforms(fuzz_server: Server) -> None:
    job = _ended_job(fuzz_server)
    schema = schemathesis.openapi.from_url(fuzz_server.base + "/openapi.json")
    seen: dict[str, Any] = {}
    for result in schema.get_all_operations():
        op = result.ok()  # type: ignore[union-attr]
        seen[f"{op.method.upper()} {op.path}"] = op

        @given(case=op.as_strategy())
        @settings(
            max_examples=8,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def run(case: Any) -> None:
            case.call_and_validate(base_url=fuzz_server.base, headers=KEY, checks=CHECKS)

        run()
    assert {"POST /v1/models/{name}/predict", "POST /v1/predict", "GET /v1/jobs/{job_id}/events"} <= set(seen)
    assert {"DELETE /v1/datasets/{dataset_id}", "DELETE /v1/jobs/{job_id}"} <= set(seen)

    events = seen["GET /v1/jobs/{job_id}/events"]
    for last in (None, "0", "1", "9223372036854775807"):
        headers = {**KEY, **({"Last-Event-ID": last} if last else {})}
        case = events.Case(path_parameters={"job_id": job}, headers=headers)
        response = case.call_and_validate(base_url=fuzz_server.base, checks=CHECKS)
        assert response.status_code == 200 and "cancelled" in response.text, response.text
