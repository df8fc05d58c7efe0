"""Model selection on held-out training rows (`valid_fraction`, `patience`): the split, the best-epoch
bookkeeping, and that training keeps the best epoch's weights without ever deciding on the test split."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from trainer import metrics as xc_metrics
from trainer.artifact import load_artifact
from trainer.data import Dataset
from trainer.errors import ParamsError
from trainer.hooks import QuietHooks, TrainHooks
from trainer.params import TrainParams
from trainer.step import BestEpoch
from trainer.synth import synth_dataset
from trainer.train import split_validation, train

K, D = 40, 300


@pytest.fixture(scope="module")
def data() -> tuple[Dataset, Dataset]:
    return synth_dataset(K, D, 600, seed=7), synth_dataset(K, D, 200, seed=7, part=1)


@pytest.fixture(scope="module")
def noisy(data: tuple[Dataset, Dataset]) -> Dataset:
    """The training rows with half of them given one random label: fitting them makes the held-out P@1
    peak and then fall, so the last epoch is not the best one."""
    train_ds = data[0]
    rng = np.random.default_rng(0)
    y = train_ds.Y.tolil()
    for i in rng.choice(train_ds.n_rows, train_ds.n_rows // 2, replace=False):
        y.rows[i], y.data[i] = [int(rng.integers(K))], [1.0]
    return dataclasses.replace(train_ds, Y=sp.csr_matrix(y))


# a high constant rate, no dropout and room to memorise: the noisy rows are fitted after a few epochs
OVERFIT: dict[str, object] = {"lr": 1.0, "schedule": "constant", "dropout": 0.0, "dim": 64}


def _params(**kw: object) -> TrainParams:
    # on the CPU wherever the tests run: they compare runs bit for bit, and a GPU's scatter-adds are not
    # bit-stable from run to run
    base: dict[str, object] = {
        "dim": 16, "epochs": 6, "batch_size": 64, "negatives": 16, "valid_fraction": 0.2, "eval_every": 0,
        "device": "cpu",
    }
    base.update(kw)
    return TrainParams(**base)  # type: ignore[arg-type]


def test_split_is_disjoint_complete_seeded_and_sized() -> None:
    fit, val = split_validation(1000, 0.1, seed=3)
    assert len(val) == 100 and len(fit) == 900
    assert np.intersect1d(fit, val).size == 0
    assert np.array_equal(np.sort(np.concatenate([fit, val])), np.arange(1000))
    fit2, val2 = split_validation(1000, 0.1, seed=3)
    assert np.array_equal(val, val2) and np.array_equal(fit, fit2)
    assert not np.array_equal(val, split_validation(1000, 0.1, seed=4)[1])
    # tiny sets keep at least one row on each side
    fit, val = split_validation(2, 0.01, seed=0)
    assert len(fit) == 1 and len(val) == 1
    with pytest.raises(ParamsError):
        split_validation(1, 0.1, seed=0)


def test_dataset_take_keeps_rows_and_spaces(data: tuple[Dataset, Dataset]) -> None:
    ds = data[0]
    rows = np.array([3, 1, 7])
    sub = ds.take(rows)
    assert sub.n_rows == 3 and sub.n_labels == ds.n_labels and sub.n_features == ds.n_features
    assert ds.X is not None and sub.X is not None
    assert abs(sub.X - ds.X[rows]).sum() == 0 and abs(sub.Y - ds.Y[rows]).sum() == 0


def test_best_epoch_keeps_the_best_weights_earliest_on_ties() -> None:
    model = torch.nn.Linear(2, 1)
    best = BestEpoch()
    for epoch, (score, fill) in enumerate([(0.2, 1.0), (0.5, 2.0), (0.5, 3.0), (0.4, 4.0)], start=1):
        with torch.no_grad():
            model.weight.fill_(fill)
        best.update(epoch, score, model)
    assert best.epoch == 2 and best.score == 0.5 and best.stale == 2
    best.restore(model)
    assert torch.all(model.weight == 2.0)
    again = BestEpoch()
    again.load(best.meta(), {f"best.{k}": v for k, v in best.state.items()})
    assert again.epoch == 2 and again.stale == 2 and torch.equal(again.state["weight"], best.state["weight"])


def _valid_p1_of_artifact(path: Path, train_ds: Dataset, params: TrainParams) -> float:
    _, val_rows = split_validation(train_ds.n_rows, params.valid_fraction, params.seed)
    val = train_ds.take(val_rows)
    lm = load_artifact(path)
    top, _ = lm.topk(lm.featurizer.transform(val), 5)
    return xc_metrics.precision_at_k(top, sp.csr_matrix(val.Y), 1)


def test_training_keeps_the_best_validation_epoch(
    data: tuple[Dataset, Dataset], noisy: Dataset, tmp_path: Path
) -> None:
    train_ds, test_ds = noisy, data[1]
    params = _params(**OVERFIT)
    result = train(params, train_ds, test_ds, out_dir=tmp_path / "m", hooks=QuietHooks())
    curve = [h["valid"]["p@1"] for h in result.history]
    assert len(curve) == params.epochs
    assert result.best_epoch == int(np.argmax(curve)) + 1  # argmax: first of equal maxima
    assert result.best_epoch < params.epochs  # so the weights had to be restored
    # the saved weights are the best epoch's: they score exactly that on the held-out rows
    assert _valid_p1_of_artifact(tmp_path / "m", train_ds, params) == pytest.approx(max(curve))
    saved = load_artifact(tmp_path / "m")
    assert saved.metrics["best_epoch"] == result.best_epoch
    # the reported test metrics are those of the kept weights
    top, _ = saved.topk(saved.featurizer.transform(test_ds), 5)
    assert result.metrics["p@1"] == pytest.approx(xc_metrics.precision_at_k(top, sp.csr_matrix(test_ds.Y), 1))
    assert saved.config["params"]["valid_fraction"] == 0.2


@pytest.mark.parametrize("refit", [False, True])
def test_selection_never_looks_at_the_test_split(
    data: tuple[Dataset, Dataset], tmp_path: Path, refit: bool
) -> None:
    train_ds, test_ds = data
    rng = np.random.default_rng(0)
    scrambled = Dataset(
        Y=sp.csr_matrix(test_ds.Y[rng.permutation(test_ds.n_rows)]),
        n_features=test_ds.n_features, n_labels=test_ds.n_labels, X=test_ds.X,
    )
    params = _params(lr=0.05, eval_every=1, refit=refit)
    a = train(params, train_ds, test_ds, out_dir=tmp_path / "a", hooks=QuietHooks())
    b = train(params, train_ds, scrambled, out_dir=tmp_path / "b", hooks=QuietHooks())
    c = train(params, train_ds, None, out_dir=tmp_path / "c", hooks=QuietHooks())
    assert a.best_epoch == b.best_epoch == c.best_epoch
    wa, wb, wc = (load_artifact(tmp_path / n).head_weight for n in "abc")
    assert np.array_equal(wa, wb) and np.array_equal(wa, wc)
    assert a.metrics["p@1"] != b.metrics["p@1"]  # the test labels did differ


def test_patience_stops_after_epochs_without_improvement(
    data: tuple[Dataset, Dataset], tmp_path: Path
) -> None:
    train_ds, _ = data
    params = _params(lr=0.05, epochs=12, patience=1)
    result = train(params, train_ds, None, out_dir=None, hooks=QuietHooks())
    curve = [h["valid"]["p@1"] for h in result.history]
    # ran until the first epoch that did not beat every earlier one, then stopped
    first_miss = next((e for e in range(1, len(curve)) if curve[e] <= max(curve[:e])), None)
    expected = params.epochs if first_miss is None else first_miss + 1
    assert result.epochs == len(curve) == expected
    assert result.best_epoch == int(np.argmax(curve)) + 1


class _StopAt:
    def __init__(self, calls: int) -> None:
        self.calls, self.limit = 0, calls

    def on_progress(self, progress: object) -> None:
        pass

    def on_log(self, message: str) -> None:
        pass

    def should_stop(self) -> bool:
        self.calls += 1
        return self.calls > self.limit


def test_resume_carries_the_best_epoch(data: tuple[Dataset, Dataset], tmp_path: Path) -> None:
    from trainer.errors import TrainingCancelled

    train_ds, _ = data
    params = _params(lr=0.05)
    full = train(params, train_ds, None, out_dir=tmp_path / "full", hooks=QuietHooks())
    ckpt = tmp_path / "ckpt"
    stopper: TrainHooks = _StopAt(calls=4 * 8 + 3)  # 8 steps per epoch: stop inside epoch 5
    with pytest.raises(TrainingCancelled):
        train(params, train_ds, None, out_dir=None, hooks=stopper, checkpoint_dir=ckpt, checkpoint_every=1)
    resumed = train(params, train_ds, None, out_dir=tmp_path / "res", hooks=QuietHooks(),
                    checkpoint_dir=ckpt, checkpoint_every=1)
    assert resumed.resumed_from_step is not None
    assert resumed.best_epoch == full.best_epoch
    w_full, w_res = (load_artifact(tmp_path / n).head_weight for n in ("full", "res"))
    np.testing.assert_allclose(w_full, w_res, rtol=1e-5, atol=1e-6)


def test_refit_trains_all_rows_up_to_the_selected_epoch(
    data: tuple[Dataset, Dataset], noisy: Dataset, tmp_path: Path
) -> None:
    train_ds, test_ds = noisy, data[1]
    params = _params(**OVERFIT, refit=True)
    result = train(params, train_ds, test_ds, out_dir=tmp_path / "refit", hooks=QuietHooks())
    assert result.best_epoch is not None and result.best_epoch < params.epochs
    assert result.epochs == result.best_epoch
    assert [h.get("phase") for h in result.history].count("select") == params.epochs
    # the same as asking for that epoch on all rows directly
    direct = params.model_copy(
        update={"valid_fraction": 0.0, "refit": False, "stop_epoch": result.best_epoch}
    )
    train(direct, train_ds, None, out_dir=tmp_path / "direct", hooks=QuietHooks())
    saved, ref = load_artifact(tmp_path / "refit"), load_artifact(tmp_path / "direct")
    np.testing.assert_array_equal(saved.head_weight, ref.head_weight)
    assert saved.config["n_train_rows"] == train_ds.n_rows
    # the artifact records what the user asked for, and what the selection found
    assert saved.params.refit and saved.params.valid_fraction == 0.2 and saved.params.stop_epoch == 0
    assert saved.metrics["best_epoch"] == result.best_epoch and "valid_p@1" in saved.metrics


def test_stop_epoch_must_be_within_epochs() -> None:
    with pytest.raises(ParamsError):
        TrainParams.from_json_dict({"epochs": 3, "stop_epoch": 4})
    assert TrainParams(epochs=3, stop_epoch=3).stop_epoch == 3
