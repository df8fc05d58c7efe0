"""`ensemble` through the API: a job trains its members and activates one model of their full width; a
value it cannot train is a 422 naming `params.ensemble`, with nothing queued."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jobs.conftest import TINY_PARAMS as TINY
from tests.jobs.conftest import Server, sqlite_server


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with sqlite_server(tmp_path_factory.mktemp("ens-jobs")) as s:
        yield s


def test_a_job_trains_an_ensemble_and_refuses_what_cannot_be_one(srv: Server, tmp_path: Path) -> None:
    from trainer.artifact import load_artifact
    from trainer.synth import write_synth

    write_synth(tmp_path / "rows.txt", 30, 200, 300, seed=2)
    rows = srv.upload(tmp_path / "rows.txt")["id"]
    n_jobs = len(srv.client.get("/v1/jobs").json()["jobs"])
    refused = (({"ensemble": 0}, "greater than or equal to 1"), ({"ensemble": 9}, "less than or equal"),
               ({"ensemble": 2, "encoder": "mlp", "hidden": 1}, "needs encoder 'linear'"))
    for bad, says in refused:
        r = srv.client.post("/v1/jobs", json={"model": "ens", "train_dataset": rows,
                                              "params": {**TINY, **bad}})
        assert r.status_code == 422 and says in r.text, r.text
        assert r.json()["detail"][0]["loc"][:2] == ["body", "params"], r.text
    assert len(srv.client.get("/v1/jobs").json()["jobs"]) == n_jobs  # nothing queued
    job_id = srv.submit({"model": "ens", "train_dataset": rows, "params": {**TINY, "ensemble": 3},
                         "activate": True})
    assert srv.final_state(job_id) == "succeeded", srv.log_tail()
    job = srv.wait(job_id, lambda j: j["activated"], 60, "activation")
    assert job["params"]["ensemble"] == 3
    loaded = load_artifact(srv.models_dir / "ens" / str(job["model_version"]))
    assert loaded.dim == 3 * TINY["dim"] and loaded.params.ensemble == 3
    assert srv.client.get("/v1/models/ens").json()["dim"] == 3 * TINY["dim"]
    features = {"indices": [1, 7], "values": [1.0, 0.5]}
    r = srv.client.post("/v1/models/ens/predict", json={"inputs": [{"features": features}], "top_k": 3})
    assert r.status_code == 200 and len(r.json()["predictions"][0]["labels"]) == 3, r.text
