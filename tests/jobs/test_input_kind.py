"""A model's input kind is fixed by its first version: a job that would publish a text version of a model
whose versions take sparse features (or the reverse) is refused, when it is submitted and, for jobs queued
before the model had a version, when it would publish."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jobs.conftest import Server, sqlite_server

PARAMS = {"epochs": 1, "dim": 16}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with sqlite_server(tmp_path_factory.mktemp("input_kind")) as server:
        yield server


def _done(srv: Server, job_id: str) -> dict[str, object]:
    return srv.wait(job_id, lambda j: j["state"] in ("succeeded", "failed"), 180, "the job to end")


def test_submitting_another_kind_is_a_conflict(srv: Server, synth_files: dict[str, Path]) -> None:
    xc = srv.upload(synth_files["train"])["id"]
    text = srv.upload(synth_files["train_jsonl"])["id"]
    first = _done(srv, srv.submit({"model": "feat", "train_dataset": xc, "params": PARAMS}))
    assert first["state"] == "succeeded", first

    r = srv.client.post("/v1/jobs", json={"model": "feat", "train_dataset": text, "params": PARAMS})
    assert r.status_code == 409, r.text
    [err] = r.json()["detail"]
    assert err["loc"] == ["body", "model"] and err["input_kind"] == "sparse"
    assert "'feat' takes sparse features" in err["msg"] and f"dataset {text} is text" in err["msg"]
    assert "new model" in err["msg"]
    assert srv.client.get("/v1/jobs", params={"model": "feat"}).json()["jobs"][0]["id"] == first["id"]
    # the worker that ran it is named opaquely: no host name or process id in what a client reads
    assert str(first["worker"]).startswith("worker-"), first
    logs = srv.client.get(f"/v1/jobs/{first['id']}/logs").text
    assert "worker-" in logs and socket.gethostname() not in logs and socket.gethostname() not in str(first)

    # the same kind is a next version, and another name is a new model
    again = _done(srv, srv.submit({"model": "feat", "train_dataset": xc, "params": PARAMS}))
    assert again["state"] == "succeeded" and again["model_version"] == "2", again
    other = _done(srv, srv.submit({"model": "words", "train_dataset": text, "params": PARAMS}))
    assert other["state"] == "succeeded", other
    r = srv.client.post("/v1/jobs", json={"model": "words", "train_dataset": xc, "params": PARAMS})
    assert r.status_code == 409 and "'words' takes text" in r.text, r.text


def test_queued_before_the_first_version_fails_at_publish(srv: Server, synth_files: dict[str, Path]) -> None:
    xc = srv.upload(synth_files["train"])["id"]
    text = srv.upload(synth_files["train_jsonl"])["id"]
    # both accepted while "race" has no version; the worker runs them one after the other
    a = srv.submit({"model": "race", "train_dataset": xc, "params": PARAMS})
    b = srv.submit({"model": "race", "train_dataset": text, "params": PARAMS})
    first, second = _done(srv, a), _done(srv, b)
    assert first["state"] == "succeeded", first
    assert second["state"] == "failed", second
    assert "'race' takes sparse features (XC data) since its version 1" in str(second["error"]), second
    versions = sorted(p.name for p in (srv.models_dir / "race").iterdir() if not p.name.startswith("."))
    assert versions == ["1"]
