"""`input_lr` through the API: a job's value reaches the saved model's parameters; one out of bounds is a 422
naming `params.input_lr`, with nothing queued."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jobs.conftest import Server, sqlite_server

TINY = {"dim": 8, "batch_size": 64, "negatives": 16, "epochs": 1, "eval_every": 0}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with sqlite_server(tmp_path_factory.mktemp("input-lr-jobs")) as s:
        yield s


def test_a_job_saves_its_input_lr_and_refuses_a_value_out_of_bounds(srv: Server, tmp_path: Path) -> None:
    from trainer.artifact import load_artifact
    from trainer.synth import write_synth

    write_synth(tmp_path / "rows.txt", 30, 200, 300, seed=2)
    rows = srv.upload(tmp_path / "rows.txt")["id"]
    n_jobs = len(srv.client.get("/v1/jobs").json()["jobs"])
    for bad in (-0.5, 11, "fast"):
        r = srv.client.post("/v1/jobs", json={"model": "ilr", "train_dataset": rows,
                                              "params": {**TINY, "input_lr": bad}})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"][:3] == ["body", "params", "input_lr"], r.text
    assert len(srv.client.get("/v1/jobs").json()["jobs"]) == n_jobs  # nothing queued
    job_id = srv.submit({"model": "ilr", "train_dataset": rows, "params": {**TINY, "input_lr": 0.003}})
    assert srv.final_state(job_id) == "succeeded", srv.log_tail()
    job = srv.client.get(f"/v1/jobs/{job_id}").json()
    assert job["params"]["input_lr"] == 0.003
    assert load_artifact(srv.models_dir / "ilr" / str(job["model_version"])).params.input_lr == 0.003
