"""A continual job on two ranks (`params.nproc_per_node`): a model sharded to train can grow over the API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.jobs.conftest import Backend
from tests.jobs.test_continual_jobs import _first_version, _labels, _old_rows, _tree_digest


def test_a_continual_job_runs_on_two_ranks(make_server: Any, synth_files: dict[str, Path],
                                           tmp_path: Path) -> None:
    srv = make_server(Backend("sqlite"))
    old = srv.upload(_old_rows(synth_files["train"], tmp_path / "old.txt"))
    new = srv.upload(synth_files["train"])
    test = srv.upload(synth_files["test"])
    v1, before = _first_version(srv, "wide", old["id"], epochs=6)
    job_id = srv.submit({"model": "wide", "train_dataset": new["id"], "test_dataset": test["id"],
                         "base": {}, "params": {"epochs": 4, "nproc_per_node": 2}, "activate": True})
    assert srv.final_state(job_id) == "succeeded", srv.log_tail()
    job = srv.job(job_id)
    assert job["model_version"] == "2" and job["params"]["nproc_per_node"] == 2
    metrics = job["progress"]["metrics"]
    assert metrics["new.rows"] > 0 and metrics["new.p@1"] > 0.2, metrics
    assert _tree_digest(v1) == before  # the base, file by file
    names = _labels(srv.models_dir / "wide" / "2" / "labels.txt")
    assert names[:32] == _labels(v1 / "labels.txt") and names == [str(i) for i in range(40)]
    r = srv.client.post("/v1/models/wide/predict",
                        json={"inputs": [{"features": {"indices": [1, 2], "values": [1.0, 1.0]}}]})
    assert r.status_code == 200 and r.json()["version"] == "2", r.text
