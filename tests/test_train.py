"""The training loop on planted synthetic data: it learns, hooks see it, it stops, and it resumes."""

from __future__ import annotations

import math
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from trainer.artifact import load_artifact
from trainer.data import Dataset
from trainer.errors import TrainingCancelled
from trainer.hooks import Progress
from trainer.params import TrainParams
from trainer.synth import synth_dataset
from trainer.train import lr_at, train

K, D = 60, 400


@pytest.fixture(scope="module")
def data() -> tuple[Dataset, Dataset]:
    return synth_dataset(K, D, 1500, seed=4), synth_dataset(K, D, 300, seed=4, part=1)


class Recorder:
    def __init__(self, stop_after: int | None = None) -> None:
        self.progress: list[Progress] = []
        self.logs: list[str] = []
        self.stop_after = stop_after
        self.calls = 0

    def on_progress(self, progress: Progress) -> None:
        self.progress.append(progress)

    def on_log(self, message: str) -> None:
        self.logs.append(message)

    def should_stop(self) -> bool:
        self.calls += 1
        return self.stop_after is not None and self.calls > self.stop_after


def _params(**kw: object) -> TrainParams:
    base: dict[str, object] = {"dim": 32, "epochs": 3, "batch_size": 100, "negatives": 32}
    base.update(kw)
    return TrainParams(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("loss", ["ove", "ove-subset", "softmax"])
def test_learns_planted_labels_far_above_chance(
    data: tuple[Dataset, Dataset], tmp_path: Path, loss: str
) -> None:
    train_ds, test_ds = data
    rec = Recorder()
    result = train(_params(loss=loss), train_ds, test_ds, out_dir=tmp_path / "m", hooks=rec)
    chance = 1.0 / K * (train_ds.Y.nnz / train_ds.n_rows)
    assert result.metrics["p@1"] > max(0.3, 6 * chance), result.metrics
    assert result.steps == 3 * 15
    # per-epoch progress with metrics, and the loss went down
    evaluated = [p for p in rec.progress if p.metrics is not None]
    assert [p.epoch for p in evaluated] == [1, 2, 3]
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    assert any("epoch 3/3" in m for m in rec.logs)
    loaded = load_artifact(result.out_dir or "")
    assert loaded.metrics["p@1"] == pytest.approx(result.metrics["p@1"])


def test_each_step_is_reported_once_however_often_progress_is_due(
    data: tuple[Dataset, Dataset], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow step makes the timed report due on an epoch's last step, which the epoch's own report (with
    its metrics) also covers: a job's progress must still rise step by step, never repeat one."""
    import trainer.train as train_module

    monkeypatch.setattr(train_module, "PROGRESS_EVERY_S", -1.0)  # due after every step
    rec = Recorder()
    result = train(_params(epochs=2), data[0], None, out_dir=tmp_path / "m", hooks=rec)
    steps = [p.step for p in rec.progress]
    assert steps == list(range(1, result.steps + 1))
    assert [p.epoch for p in rec.progress if p.step in (15, 30)] == [1, 2]


def test_should_stop_cancels(data: tuple[Dataset, Dataset], tmp_path: Path) -> None:
    rec = Recorder(stop_after=4)
    with pytest.raises(TrainingCancelled, match=r"stopped at step 4$"):  # asked before every step
        train(_params(), data[0], None, out_dir=tmp_path / "m", hooks=rec)
    assert rec.calls == 5 and all(p.step <= 4 for p in rec.progress)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    "negatives", [{"sampler": "unigram", "group_size": 1}, {"sampler": "uniform", "group_size": 8}]
)
def test_checkpoint_resume_continues_the_same_run(
    data: tuple[Dataset, Dataset], tmp_path: Path, negatives: dict[str, object]
) -> None:
    """Grouped negatives shuffle the sampled columns with the sampler's generator: resuming restores it."""
    train_ds, _ = data
    params = _params(epochs=2, dropout=0.2, **negatives)
    full = train(params, train_ds, None, out_dir=tmp_path / "full", hooks=Recorder())

    ckpt = tmp_path / "ckpt"
    with pytest.raises(TrainingCancelled):
        train(params, train_ds, None, out_dir=None, hooks=Recorder(stop_after=22),
              checkpoint_dir=ckpt, checkpoint_every=10)
    assert (ckpt / "latest.json").exists()
    assert [p.name for p in ckpt.iterdir() if p.name.startswith("step-")] == ["step-000000020"]

    rec = Recorder()
    resumed = train(params, train_ds, None, out_dir=tmp_path / "m", hooks=rec,
                    checkpoint_dir=ckpt, checkpoint_every=10)
    assert resumed.resumed_from_step == 20
    assert "resumed from step 20" in rec.logs
    assert resumed.steps == full.steps == 30
    assert all(p.step > 20 for p in rec.progress)
    assert math.isfinite(resumed.final_loss)
    # same data order, same samples, same dropout masks: the resumed run ends where the full one did
    a, b = load_artifact(tmp_path / "full"), load_artifact(tmp_path / "m")
    np.testing.assert_allclose(a.head_weight, b.head_weight, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(a.model.input_weight.detach().numpy(), b.model.input_weight.detach().numpy(),
                               rtol=1e-4, atol=1e-5)


def test_lr_schedule_warms_up_and_decays() -> None:
    p = _params(lr=1.0, warmup=0.1)
    lrs = [lr_at(p, s, 100) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and max(lrs) == pytest.approx(1.0)
    assert lrs[9] == pytest.approx(1.0) and lrs[-1] < 0.01
    assert all(a >= b for a, b in pairwise(lrs[10:]))


@pytest.mark.parametrize("eager", [True, False])
def test_step_losses_fold_in_order_and_refuse_a_non_finite_loss_by_its_step(eager: bool) -> None:
    """Read at once (the CPU) or kept and read at a report (a GPU): the same moving average and epoch
    total, and a NaN or inf is refused naming the step it came from."""
    import torch

    from trainer.errors import ParamsError
    from trainer.step import StepLosses

    losses = StepLosses(eager=eager)
    for step, value in enumerate([2.0, 1.0, 4.0]):
        losses.add(step, torch.tensor(value), rows=10)
    assert losses.read() == pytest.approx(0.95 * (0.95 * 2.0 + 0.05 * 1.0) + 0.05 * 4.0)
    assert losses.total == pytest.approx(70.0)
    losses.new_epoch()
    assert losses.total == 0.0
    losses.add(3, torch.tensor(1.0), rows=5)
    refused = pytest.raises(ParamsError, match=r"loss became nan at step 4; lower --lr")
    if eager:
        with refused:
            losses.add(4, torch.tensor(float("nan")), rows=5)
        return
    losses.add(4, torch.tensor(float("nan")), rows=5)
    assert losses.total == 0.0  # nothing read yet
    with refused:
        losses.read()
