"""`logit_adjust` through the API: a job's value reaches the saved model's biases; one out of bounds is a 422
naming `params.logit_adjust`, with nothing queued."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.jobs.conftest import TINY_PARAMS as TINY
from tests.jobs.conftest import Server, assert_params_refused, sqlite_server


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with sqlite_server(tmp_path_factory.mktemp("adjust-jobs")) as s:
        yield s


def test_a_job_saves_the_adjusted_biases_and_refuses_a_value_out_of_bounds(srv: Server,
                                                                          tmp_path: Path) -> None:
    from trainer.artifact import load_artifact
    from trainer.synth import write_synth

    write_synth(tmp_path / "rows.txt", 30, 200, 300, seed=2)
    rows = srv.upload(tmp_path / "rows.txt")["id"]
    assert_params_refused(srv, {"model": "adj", "train_dataset": rows, "params": TINY}, "logit_adjust",
                          (-3, 2.5, "much"))
    versions = {}
    for tau in (0.0, -0.5):
        job_id = srv.submit({"model": "adj", "train_dataset": rows, "params": {**TINY, "logit_adjust": tau}})
        assert srv.final_state(job_id) == "succeeded", srv.log_tail()
        job = srv.client.get(f"/v1/jobs/{job_id}").json()
        assert job["params"]["logit_adjust"] == tau
        versions[tau] = load_artifact(srv.models_dir / "adj" / str(job["model_version"]))
    plain, adj = versions[0.0], versions[-0.5]
    assert adj.params.logit_adjust == -0.5 and adj.label_counts is not None
    want = -0.5 * np.log(np.maximum(adj.label_counts, 1))
    np.testing.assert_allclose(adj.head_bias - plain.head_bias, want, rtol=1e-5, atol=1e-5)
