"""A continual job on two ranks (`params.nproc_per_node`): a model sharded to train can grow over the API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.jobs.conftest import Backend
from tests.jobs.test_continual_jobs import _grown, _labels, _tree_digest


def test_a_continual_job_runs_on_two_ranks(make_server: Any, synth_files: dict[str, Path],
                                           tmp_path: Path) -> None:
    srv = make_server(Backend("sqlite"))
    job_id, v1, before, _ = _grown(srv, synth_files, tmp_path, "wide", {"epochs": 4, "nproc_per_node": 2})
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
