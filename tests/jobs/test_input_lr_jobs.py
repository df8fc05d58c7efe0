"""`input_lr` through the API: a job's value reaches the saved model's parameters; one out of bounds is a 422
naming `params.input_lr`, with nothing queued."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jobs.conftest import TINY_PARAMS, Server, assert_params_refused, sqlite_server


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with sqlite_server(tmp_path_factory.mktemp("input-lr-jobs")) as s:
        yield s


def test_a_job_saves_its_input_lr_and_refuses_a_value_out_of_bounds(srv: Server, tmp_path: Path) -> None:
    from trainer.artifact import load_artifact
    from trainer.synth import write_synth

    write_synth(tmp_path / "rows.txt", 30, 200, 300, seed=2)
    body = {"model": "ilr", "train_dataset": srv.upload(tmp_path / "rows.txt")["id"], "params": TINY_PARAMS}
    assert_params_refused(srv, body, "input_lr", (-0.5, 11, "fast"))
    job_id = srv.submit({**body, "params": {**TINY_PARAMS, "input_lr": 0.003}})
    assert srv.final_state(job_id) == "succeeded", srv.log_tail()
    job = srv.client.get(f"/v1/jobs/{job_id}").json()
    assert job["params"]["input_lr"] == 0.003
    assert load_artifact(srv.models_dir / "ilr" / str(job["model_version"])).params.input_lr == 0.003
