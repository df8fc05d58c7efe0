"""`input_lr`: the input table's own peak learning rate. By default (0) it is `lr` in runs of up to 512 steps
and `lr`·√(512/steps) in longer ones, unless the head has more than 64 trained labels per dimension, which
keeps `lr`; a value given is used as it is. The rate reaches the input table's
step and nothing else: the head's first step is the same whatever it is."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from trainer.artifact import load_artifact
from trainer.hooks import QuietHooks
from trainer.params import INPUT_LR_LABELS_PER_DIM, INPUT_LR_STEPS, TrainParams
from trainer.synth import synth_dataset
from trainer.train import input_lr_scale, train

TINY: dict[str, Any] = {"dim": 8, "negatives": 16, "eval_every": 0, "device": "cpu", "seed": 5}


@given(total=st.integers(1, 10**7), more=st.integers(0, 10**6), dim=st.integers(1, 4096),
       per_dim=st.integers(0, INPUT_LR_LABELS_PER_DIM))
@settings(max_examples=200, deadline=None)
def test_a_wide_head_s_table_is_at_lr_up_to_512_steps_then_falls_as_one_over_root_steps(
        total: int, more: int, dim: int, per_dim: int) -> None:
    params = TrainParams(dim=dim)
    labels = per_dim * dim  # at most 64 labels a dimension, the limit included
    scale = input_lr_scale(params, total, labels)
    assert 0.0 < scale <= 1.0
    assert scale >= input_lr_scale(params, total + more, labels)  # never rises with the run's length
    if total <= INPUT_LR_STEPS:
        assert scale == 1.0
    else:
        assert scale == pytest.approx(math.sqrt(INPUT_LR_STEPS / total), rel=1e-12)
        assert scale * scale * total == pytest.approx(INPUT_LR_STEPS, rel=1e-9)


@given(total=st.integers(1, 10**7), dim=st.integers(1, 4096), over=st.integers(1, 10**7))
@settings(max_examples=200, deadline=None)
def test_a_narrow_head_s_table_is_at_lr_whatever_the_length(total: int, dim: int, over: int) -> None:
    params = TrainParams(dim=dim)
    assert input_lr_scale(params, total, INPUT_LR_LABELS_PER_DIM * dim + over) == 1.0
    # at the limit itself the rule holds
    at_limit = input_lr_scale(params, total, INPUT_LR_LABELS_PER_DIM * dim)
    assert at_limit == min(1.0, math.sqrt(INPUT_LR_STEPS / total))


@given(lr=st.floats(1e-4, 1.0), input_lr=st.floats(1e-4, 10.0), total=st.integers(1, 10**7),
       labels=st.integers(0, 10**8))
@settings(max_examples=100, deadline=None)
def test_a_rate_given_is_used_whatever_the_length(lr: float, input_lr: float, total: int,
                                                  labels: int) -> None:
    params = TrainParams(lr=lr, input_lr=input_lr)
    assert input_lr_scale(params, total, labels) * lr == pytest.approx(input_lr, rel=1e-12)


def test_bounds_and_a_saved_model_keep_the_field() -> None:
    for bad in (-0.1, 10.5, float("nan")):
        with pytest.raises(ValidationError, match="input_lr"):
            TrainParams(input_lr=bad)
    assert TrainParams().input_lr == 0.0
    assert TrainParams.model_validate_json(TrainParams(input_lr=0.004).model_dump_json()).input_lr == 0.004
    # a model saved before the field existed reads back with the default rule
    old = TrainParams().model_dump()
    del old["input_lr"]
    assert TrainParams.model_validate(old).input_lr == 0.0


def _one_step(tmp_path: Path, name: str, input_lr: float) -> tuple[np.ndarray, np.ndarray]:
    """(input table, head) after one step on every row (warm-up takes no step of a one-step run)."""
    ds = synth_dataset(30, 200, 120, seed=4)
    train(TrainParams(**TINY, epochs=1, batch_size=120, input_lr=input_lr), ds, out_dir=tmp_path / name)
    model = load_artifact(tmp_path / name).model
    return model.input_weight.detach().numpy().copy(), model.head.detach().numpy().copy()


def test_the_rate_moves_the_input_table_alone(tmp_path: Path) -> None:
    # one Adam step moves a row by rate·g/(|g| + eps): the moves of 0.01, 0.005 and 0.0025 halve exactly
    w1, h1 = _one_step(tmp_path, "a", 0.01)
    w2, h2 = _one_step(tmp_path, "b", 0.005)
    w4, h4 = _one_step(tmp_path, "c", 0.0025)
    moved = np.abs(w1 - w2) > 0
    assert moved.sum() > 100  # the step touched many input rows
    np.testing.assert_allclose((w1 - w2)[moved], 2.0 * (w2 - w4)[moved], rtol=1e-3, atol=1e-7)
    np.testing.assert_array_equal(h1, h2)  # the head's step does not depend on the table's rate
    np.testing.assert_array_equal(h1, h4)


class _Logs(QuietHooks):
    def __init__(self) -> None:
        self.messages: list[str] = []

    def on_log(self, message: str) -> None:
        self.messages.append(message)


def test_a_long_run_takes_the_default_rule(tmp_path: Path) -> None:
    # 40 rows a step of 1 for 14 epochs: 560 steps, so the table runs at lr·√(512/560)
    ds = synth_dataset(12, 80, 40, seed=6)
    common = {**TINY, "epochs": 14, "batch_size": 1}
    hooks = _Logs()
    train(TrainParams(**common), ds, out_dir=tmp_path / "auto", hooks=hooks)
    said = "560 steps (batch 1) on cpu, the input table at 0.956x the lr"
    assert any(said in m for m in hooks.messages), hooks.messages
    explicit = 0.01 * math.sqrt(INPUT_LR_STEPS / 560)
    train(TrainParams(**common, input_lr=explicit), ds, out_dir=tmp_path / "explicit")
    train(TrainParams(**common, input_lr=0.01), ds, out_dir=tmp_path / "full")
    weights = [load_artifact(tmp_path / n).model.input_weight.detach().numpy() for n in
               ("auto", "explicit", "full")]
    np.testing.assert_allclose(weights[0], weights[1], rtol=1e-6, atol=1e-7)
    assert not np.allclose(weights[0], weights[2])


def test_a_long_run_of_a_narrow_head_keeps_the_table_at_lr(tmp_path: Path) -> None:
    # 600 steps of a head 1 wide over more than 64 trained labels: the table at lr, as with input_lr = lr
    ds = synth_dataset(400, 80, 200, seed=6)
    assert np.count_nonzero(np.bincount(ds.Y.indices)) > INPUT_LR_LABELS_PER_DIM
    common = {**TINY, "dim": 1, "epochs": 3, "batch_size": 1}
    hooks = _Logs()
    train(TrainParams(**common), ds, out_dir=tmp_path / "auto", hooks=hooks)
    assert any("600 steps (batch 1) on cpu" in m for m in hooks.messages), hooks.messages
    assert not any("the input table at" in m for m in hooks.messages)
    train(TrainParams(**common, input_lr=0.01), ds, out_dir=tmp_path / "full")
    weights = [load_artifact(tmp_path / n).model.input_weight.detach().numpy() for n in ("auto", "full")]
    np.testing.assert_array_equal(weights[0], weights[1])


def test_the_cli_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli import main
    from trainer.synth import write_synth

    rows = tmp_path / "rows.txt"
    write_synth(rows, 20, 100, 200, seed=1)
    assert main(["train", "--train", str(rows), "--out", str(tmp_path / "m"), "--input-lr", "0.004",
                 "--dim", "8", "--epochs", "1", "--device", "cpu", "--quiet"]) == 0
    assert load_artifact(tmp_path / "m").params.input_lr == 0.004
    assert main(["train", "--train", str(rows), "--out", str(tmp_path / "m2"), "--input-lr", "-1",
                 "--quiet"]) != 0
    assert "--input-lr: Input should be greater than or equal to 0" in capsys.readouterr().err
    assert not (tmp_path / "m2").exists()
