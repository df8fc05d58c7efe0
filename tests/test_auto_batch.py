"""`batch_size` 0, the default: a batch of 512 rows once an epoch holds `AUTO_BATCH_ROWS` rows, 256 below.
The rule is resolved by each run from the rows of its own epoch (a continual run's new and replayed rows);
the artifact records the 0, the run's summary the batch it took; a batch given is used as it is."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from service.cli import main
from service.training import budget
from trainer.artifact import load_artifact
from trainer.data import write_xc
from trainer.hooks import QuietHooks
from trainer.params import AUTO_BATCH_ROWS, AUTO_BATCHES, MAX_BATCH, TrainParams, auto_batch_size
from trainer.synth import synth_dataset
from trainer.train import train

TINY: dict[str, Any] = {"dim": 8, "negatives": 16, "group_size": 16, "eval_every": 0, "device": "cpu",
                        "seed": 3, "epochs": 1}


@given(rows=st.integers(1, 10**9), more=st.integers(0, 10**7))
@settings(max_examples=300, deadline=None)
def test_the_rule_takes_512_from_the_threshold_and_never_shrinks_with_more_rows(rows: int, more: int) -> None:
    batch = auto_batch_size(rows)
    assert batch in AUTO_BATCHES
    assert batch == (512 if rows >= AUTO_BATCH_ROWS else 256)
    assert auto_batch_size(rows + more) >= batch
    assert TrainParams().batch_for(rows) == batch


@given(batch=st.integers(1, MAX_BATCH), rows=st.integers(1, 10**9))
@settings(max_examples=100, deadline=None)
def test_a_batch_given_is_used_whatever_the_rows(batch: int, rows: int) -> None:
    assert TrainParams(batch_size=batch).batch_for(rows) == batch


def test_default_bounds_and_json_round_trip() -> None:
    assert TrainParams().batch_size == 0
    assert AUTO_BATCH_ROWS // AUTO_BATCHES[1] == 100  # an epoch of the larger batch still takes 100 steps
    for bad in (-1, MAX_BATCH + 1):
        with pytest.raises(ValidationError, match="batch_size"):
            TrainParams(batch_size=bad)
    for value in (0, 384):
        data = json.loads(json.dumps(TrainParams(batch_size=value).to_json_dict()))
        back = TrainParams.from_json_dict(data)
        assert back.batch_size == value
    # the memory budget of a job counts the largest batch the rule can take
    rule = budget.estimate(TrainParams(), labels=1000, features=5000)
    assert rule.bytes == budget.estimate(TrainParams(batch_size=max(AUTO_BATCHES)), 1000, 5000).bytes
    assert rule.bytes > budget.estimate(TrainParams(batch_size=AUTO_BATCHES[0]), 1000, 5000).bytes


def _summary(model: Path) -> dict[str, Any]:
    """What a run wrote beside its model: its metrics, steps and the batch it took."""
    return dict(json.loads((model / "metrics.json").read_text()))


class _Log(QuietHooks):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def on_log(self, msg: str) -> None:
        self.lines.append(msg)


@pytest.mark.parametrize("rows", [AUTO_BATCH_ROWS - 1, AUTO_BATCH_ROWS])
def test_a_run_takes_the_rule_of_its_rows_and_its_artifact_keeps_the_rule(tmp_path: Path, rows: int) -> None:
    ds = synth_dataset(20, 60, rows, seed=2)
    hooks = _Log()
    result = train(TrainParams(**TINY), ds, out_dir=tmp_path / "m", hooks=hooks)
    batch = 512 if rows >= AUTO_BATCH_ROWS else 256
    assert result.steps == math.ceil(rows / batch)
    said = f"{math.ceil(rows / batch)} steps (batch {batch}) on cpu"
    assert any(said in line for line in hooks.lines), hooks.lines
    loaded = load_artifact(tmp_path / "m")
    assert loaded.params.batch_size == 0  # the rule, for a continual run to resolve for its own epoch
    assert _summary(tmp_path / "m")["batch_size"] == batch


def test_a_continual_run_resolves_the_rule_for_its_own_epoch(tmp_path: Path) -> None:
    big = synth_dataset(20, 60, AUTO_BATCH_ROWS, seed=2)
    assert train(TrainParams(**TINY), big, out_dir=tmp_path / "v1", hooks=QuietHooks()).steps == 100
    # a continual run on rows the base has not seen: an epoch of those rows and their replayed share
    new = synth_dataset(20, 60, 3000, seed=9)
    train(TrainParams(**TINY), new, out_dir=tmp_path / "v2", hooks=QuietHooks(), base=tmp_path / "v1")
    assert _summary(tmp_path / "v2")["batch_size"] == 256
    assert load_artifact(tmp_path / "v2").params.batch_size == 0


def test_cli_takes_zero_and_refuses_a_negative_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ds = synth_dataset(10, 40, 300, seed=4)
    write_xc(tmp_path / "xc.txt", ds.X, ds.Y)
    flags = ["--dim", "8", "--negatives", "8", "--epochs", "1", "--quiet"]
    assert main(["train", "--train", str(tmp_path / "xc.txt"), "--out", str(tmp_path / "a"), *flags]) == 0
    assert main(["train", "--train", str(tmp_path / "xc.txt"), "--out", str(tmp_path / "b"), "--batch-size",
                 "100", *flags]) == 0
    capsys.readouterr()
    assert _summary(tmp_path / "a")["steps"] == 2  # 300 rows in batches of 256
    assert _summary(tmp_path / "b")["steps"] == 3
    assert json.loads((tmp_path / "b" / "config.json").read_text())["params"]["batch_size"] == 100
    code = main(["train", "--train", str(tmp_path / "xc.txt"), "--out", str(tmp_path / "c"), "--batch-size",
                 "-1", *flags])
    err = capsys.readouterr().err
    assert code == 2 and "--batch-size: Input should be greater than or equal to 0" in err, err
    assert not (tmp_path / "c").exists()


def test_a_job_keeps_the_rule_and_refuses_a_batch_out_of_bounds(tmp_path: Path) -> None:
    from tests.jobs.conftest import TINY_PARAMS, assert_params_refused, sqlite_server
    from trainer.synth import write_synth

    write_synth(tmp_path / "rows.txt", 30, 200, 300, seed=2)
    params = {k: v for k, v in TINY_PARAMS.items() if k != "batch_size"}
    (tmp_path / "srv").mkdir()
    with sqlite_server(tmp_path / "srv") as srv:
        body = {"model": "ab", "train_dataset": srv.upload(tmp_path / "rows.txt")["id"], "params": params}
        assert_params_refused(srv, body, "batch_size", (-1, MAX_BATCH + 1, "big"))
        job_id = srv.submit(body)
        assert srv.final_state(job_id) == "succeeded", srv.log_tail()
        job = srv.client.get(f"/v1/jobs/{job_id}").json()
        assert job["params"]["batch_size"] == 0
        saved = load_artifact(srv.models_dir / "ab" / str(job["model_version"]))
        summary = _summary(srv.models_dir / "ab" / str(job["model_version"]))
        assert saved.params.batch_size == 0 and summary["batch_size"] == 256
        assert summary["steps"] == 2  # 300 rows in batches of 256
