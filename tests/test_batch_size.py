"""`batch_size` 0 (the default): 256 rows a step, 512 once an epoch holds 64 batches of 512; a given size
is used as it is. A run steps by the batch its data gives; the artifact keeps the 0 asked for (a continual
run adapts it to its own epoch) and its metrics the batch used; the CLI takes 0 and refuses a negative size
naming the flag."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

import trainer.params as params_module
from trainer.artifact import load_artifact
from trainer.params import AUTO_BATCH_STEPS, LARGE_BATCH, MAX_BATCH, SMALL_BATCH, TrainParams
from trainer.synth import synth_dataset, write_synth
from trainer.train import train

SMALL: dict[str, Any] = {"dim": 8, "epochs": 2, "negatives": 8, "eval_every": 0, "device": "cpu"}


@given(st.integers(0, 10**8))
def test_zero_means_small_batches_for_small_epochs_and_large_ones_from_the_threshold(rows: int) -> None:
    auto = TrainParams()
    assert auto.batch_size == 0
    want = LARGE_BATCH if rows >= AUTO_BATCH_STEPS * LARGE_BATCH else SMALL_BATCH
    assert auto.batch_rows(rows) == want
    assert auto.batch_rows(None) == LARGE_BATCH  # the most it can mean: what memory is sized for


@given(st.integers(1, MAX_BATCH), st.one_of(st.none(), st.integers(0, 10**8)))
def test_a_given_batch_size_is_used_whatever_the_data(size: int, rows: int | None) -> None:
    assert TrainParams(batch_size=size).batch_rows(rows) == size


@pytest.mark.parametrize("threshold_steps", [AUTO_BATCH_STEPS, 1])
def test_a_run_steps_and_records_the_batch_its_epoch_size_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threshold_steps: int
) -> None:
    """1,000 rows: 256 a step under the real threshold; with the threshold lowered to one batch of 512
    rows, 512 a step (the same code path a 32,768-row set takes, at a test's size)."""
    monkeypatch.setattr(params_module, "AUTO_BATCH_STEPS", threshold_steps)
    ds = synth_dataset(20, 100, 1000, seed=2)
    batch = SMALL_BATCH if threshold_steps == AUTO_BATCH_STEPS else LARGE_BATCH
    result = train(TrainParams(**SMALL), ds, None, out_dir=tmp_path / "m")
    assert result.steps == math.ceil(1000 / batch) * SMALL["epochs"]
    saved = load_artifact(tmp_path / "m")
    assert saved.params.batch_size == 0 and saved.metrics["batch_size"] == batch


def test_refit_selects_and_refits_with_one_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The selection run's 900 rows and the refit's 1,000 straddle a lowered threshold of 950 rows: both
    runs train on the batch of the whole set, so the refit's epochs are the ones selection counted."""
    monkeypatch.setattr(params_module, "LARGE_BATCH", 475)
    monkeypatch.setattr(params_module, "AUTO_BATCH_STEPS", 2)
    ds = synth_dataset(20, 100, 1000, seed=2)
    p = TrainParams(**SMALL, valid_fraction=0.1, refit=True)
    result = train(p, ds, None, out_dir=tmp_path / "m")
    select = [h for h in result.history if h.get("phase") == "select"]
    assert len(select) == SMALL["epochs"]
    stop = int(result.best_epoch or 0)
    assert result.steps == math.ceil(1000 / 475) * stop
    saved = load_artifact(tmp_path / "m")
    assert saved.params.batch_size == 0 and saved.metrics["batch_size"] == 475


def test_a_continual_run_adapts_the_batch_to_its_own_epoch(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A base trained on 1,000 rows at 512 a step keeps 0: a continual run on 300 new rows steps by 256."""
    monkeypatch.setattr(params_module, "AUTO_BATCH_STEPS", 1)
    train(TrainParams(**SMALL), synth_dataset(20, 100, 1000, seed=2), None, out_dir=tmp_path / "base")
    assert load_artifact(tmp_path / "base").metrics["batch_size"] == LARGE_BATCH
    more = synth_dataset(20, 100, 300, seed=2, part=1)
    result = train(TrainParams(**SMALL), more, None, out_dir=tmp_path / "next", base=tmp_path / "base")
    saved = load_artifact(tmp_path / "next")
    assert saved.params.batch_size == 0 and saved.metrics["batch_size"] == SMALL_BATCH
    assert result.steps == math.ceil(300 / SMALL_BATCH) * SMALL["epochs"]


def test_the_cli_takes_zero_and_refuses_a_negative_size(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli import main

    rows = tmp_path / "train.txt"
    write_synth(rows, 10, 50, 300, seed=1)
    flags = ["--dim", "8", "--epochs", "1", "--negatives", "8", "--device", "cpu", "--quiet"]
    assert main(["train", "--train", str(rows), "--out", str(tmp_path / "m"), "--batch-size", "0",
                 *flags]) == 0
    assert load_artifact(tmp_path / "m").metrics["batch_size"] == SMALL_BATCH
    assert main(["train", "--train", str(rows), "--out", str(tmp_path / "bad"), "--batch-size", "-1",
                 *flags]) != 0
    assert "--batch-size: Input should be greater than or equal to 0" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_params_refuse_a_negative_size_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="batch_size"):
        TrainParams(batch_size=-1)
    assert TrainParams.from_json_dict({"batch_size": 0}).batch_size == 0
