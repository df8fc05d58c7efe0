"""`logit_adjust` τ: the saved biases are the learned ones plus τ·log n_k and nothing else changes; every
evaluation scores the model as saved; a continual run takes its base's shift off before it learns, and an
ensemble takes it once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from trainer.artifact import load_artifact
from trainer.data import Dataset
from trainer.hooks import QuietHooks
from trainer.logit_adjust import adjusted, bias_shift
from trainer.model import ModelShape, XCModel
from trainer.params import LOGIT_ADJUST, TrainParams
from trainer.synth import synth_dataset
from trainer.train import train

K, D, TAU = 40, 300, -0.5
SMALL: dict[str, Any] = {"dim": 16, "epochs": 2, "batch_size": 100, "negatives": 16, "eval_every": 1,
                         "device": "cpu", "seed": 3}


@pytest.fixture(scope="module")
def data() -> tuple[Dataset, Dataset]:
    return synth_dataset(K, D, 800, seed=3), synth_dataset(K, D, 200, seed=3, part=1)


@pytest.fixture(scope="module")
def root(data: tuple[Dataset, Dataset], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same run without and with the adjustment, alone and as ensembles of 2."""
    out = tmp_path_factory.mktemp("logit-adjust")
    for name, extra in (("plain", {"logit_adjust": 0.0}), ("adj", {"logit_adjust": TAU}),
                        ("ens", {"ensemble": 2, "logit_adjust": 0.0}),
                        ("ens-adj", {"ensemble": 2, "logit_adjust": TAU})):
        train(TrainParams(**SMALL, **extra), data[0], data[1], out_dir=out / name)
    return out


def _shift(model_dir: Path) -> np.ndarray:
    counts = load_artifact(model_dir).label_counts
    assert counts is not None and len(set(counts.tolist())) > 3  # labels of many frequencies
    return bias_shift(counts, TAU)


@pytest.mark.parametrize(("plain", "adj"), [("plain", "adj"), ("ens", "ens-adj")])
def test_the_saved_biases_carry_the_shift_once_and_nothing_else_moves(root: Path, plain: str,
                                                                      adj: str) -> None:
    a, b = load_artifact(root / plain), load_artifact(root / adj)
    assert b.params.logit_adjust == TAU and a.params.logit_adjust == 0.0
    torch.testing.assert_close(b.model.input_weight, a.model.input_weight, rtol=0, atol=0)
    torch.testing.assert_close(b.model.head[:, :-1], a.model.head[:, :-1], rtol=0, atol=0)
    np.testing.assert_allclose(b.head_bias - a.head_bias, _shift(root / adj), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["adj", "ens-adj"])
def test_the_reported_metrics_are_the_saved_models_own(root: Path, data: tuple[Dataset, Dataset],
                                                        name: str) -> None:
    m = load_artifact(root / name)
    top, _ = m.topk(m.featurizer.transform(data[1]), 1)
    y = sp.csr_matrix(data[1].Y)
    p1 = float(np.mean([y[i, top[i, 0]] for i in range(y.shape[0])]))
    assert m.metrics["p@1"] == pytest.approx(p1)


def test_a_continual_run_learns_from_the_learned_biases_not_the_shifted(
    root: Path, data: tuple[Dataset, Dataset], tmp_path: Path
) -> None:
    again = TrainParams(epochs=1, eval_every=0, device="cpu", logit_adjust=0.0)
    for name in ("plain", "adj"):
        train(again, data[0], None, out_dir=tmp_path / name, base=root / name)
    a, b = load_artifact(tmp_path / "plain"), load_artifact(tmp_path / "adj")
    torch.testing.assert_close(b.model.head, a.model.head, rtol=1e-4, atol=1e-4)
    # left out, the base's τ carries over (a field of the objective) and is applied once
    train(TrainParams(epochs=1, eval_every=0, device="cpu"), data[0], None, out_dir=tmp_path / "kept",
          base=root / "adj")
    kept = load_artifact(tmp_path / "kept")
    assert kept.params.logit_adjust == TAU
    np.testing.assert_allclose(kept.head_bias - a.head_bias, _shift(tmp_path / "kept"), rtol=1e-4, atol=1e-4)


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 30), lo=st.integers(0, 10), tau=st.floats(-2.0, 2.0),
       seed=st.integers(0, 2**31 - 1))
def test_adjusted_shifts_the_rows_held_and_restores_them_bit_for_bit(k: int, lo: int, tau: float,
                                                                      seed: int) -> None:
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 1000, size=lo + k + 5)
    model = XCModel(ModelShape(n_features=7, n_labels=k, dim=4), seed=seed)
    with torch.no_grad():
        model.head[:, -1] = torch.from_numpy(rng.normal(size=k).astype(np.float32))
    learned = model.head.detach().clone()
    with adjusted(model, counts, tau, lo):
        want = learned[:, -1].numpy() + tau * np.log(np.maximum(counts[lo : lo + k], 1))
        np.testing.assert_allclose(model.head[:, -1].detach().numpy(), want, rtol=1e-5, atol=1e-5)
        assert torch.equal(model.head[:, :-1], learned[:, :-1])
    assert torch.equal(model.head, learned)


def test_bounds_and_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli import main
    from trainer.synth import write_synth

    for bad in (-2.5, 2.5, float("nan")):
        with pytest.raises(ValidationError, match="logit_adjust"):
            TrainParams(logit_adjust=bad)
    saved = TrainParams(logit_adjust=-0.3).model_dump_json()
    assert TrainParams.model_validate_json(saved).logit_adjust == -0.3
    rows = tmp_path / "rows.txt"
    write_synth(rows, 20, 100, 200, seed=1)
    assert main(["train", "--train", str(rows), "--out", str(tmp_path / "m"), "--logit-adjust", "-0.3",
                 "--dim", "8", "--epochs", "1", "--device", "cpu", "--quiet"]) == 0
    assert load_artifact(tmp_path / "m").params.logit_adjust == -0.3
    assert main(["train", "--train", str(rows), "--out", str(tmp_path / "m2"), "--logit-adjust", "3",
                 "--quiet"]) != 0
    assert "--logit-adjust: Input should be less than or equal to 2" in capsys.readouterr().err
    assert not (tmp_path / "m2").exists()


def test_params_saved_before_the_shift_existed_read_as_unshifted() -> None:
    """A model saved before `logit_adjust` existed has unshifted biases: a continual run must not take the
    default's shift off them, so its missing field reads as 0, not as unset."""
    assert TrainParams.from_json_dict({"epochs": 3}).logit_adjust == 0.0
    unset = TrainParams.from_json_dict(TrainParams().to_json_dict())
    assert unset.logit_adjust is None and unset.logit_shift(label_texts=False) == LOGIT_ADJUST < 0.0


def test_unset_the_shift_is_the_default_without_label_texts_and_none_with_them() -> None:
    unset = TrainParams()
    assert unset.logit_shift(label_texts=False) == LOGIT_ADJUST and unset.logit_shift(label_texts=True) == 0.0
    for tau in (0.0, -0.3, 0.2):  # a value given is applied either way
        given = TrainParams(logit_adjust=tau)
        assert given.logit_shift(label_texts=False) == given.logit_shift(label_texts=True) == tau


def test_a_model_with_label_texts_is_unshifted_unless_asked(tmp_path: Path) -> None:
    """Trained with label texts and `logit_adjust` unset, the saved biases are the learned ones (the run
    with 0 to the bit); with a τ given they carry it, and a continual run of the unset one learns from
    them as saved."""
    from tests.test_twins import _params, taxonomy

    ds, texts = taxonomy(240, twins_are_labels=False)
    for name, extra in (("unset", {}), ("zero", {"logit_adjust": 0.0}), ("given", {"logit_adjust": TAU})):
        train(_params(**extra), ds, None, out_dir=tmp_path / name, hooks=QuietHooks(), label_texts=texts)
    unset, zero, given = (load_artifact(tmp_path / n) for n in ("unset", "zero", "given"))
    assert unset.params.logit_adjust is None
    torch.testing.assert_close(unset.model.head, zero.model.head, rtol=0, atol=0)
    assert given.label_counts is not None
    trained = given.label_counts > 0
    np.testing.assert_allclose((given.head_bias - zero.head_bias)[trained],
                               bias_shift(given.label_counts, TAU)[trained], rtol=1e-4, atol=1e-4)
    train(_params(epochs=1), ds, None, out_dir=tmp_path / "more", base=tmp_path / "unset", hooks=QuietHooks())
    assert load_artifact(tmp_path / "more").params.logit_adjust is None


def test_two_ranks_shift_the_rows_each_holds(tmp_path: Path) -> None:
    """Label-sharded ranks each shift their own rows by their labels' counts: the merged model is the
    unshifted one's with the biases shifted, and its metrics are its own."""
    ds, test = synth_dataset(30, 200, 600, seed=1), synth_dataset(30, 200, 150, seed=1, part=1)
    small = {"dim": 8, "epochs": 1, "batch_size": 64, "negatives": 8, "group_size": 4, "nproc_per_node": 2,
             "device": "cpu"}
    for name, tau in (("plain", 0.0), ("adj", TAU)):
        train(TrainParams(**small, logit_adjust=tau), ds, test, out_dir=tmp_path / name)
    a, b = load_artifact(tmp_path / "plain"), load_artifact(tmp_path / "adj")
    torch.testing.assert_close(b.model.head[:, :-1], a.model.head[:, :-1], rtol=0, atol=0)
    np.testing.assert_allclose(b.head_bias - a.head_bias, _shift(tmp_path / "adj"), rtol=1e-5, atol=1e-5)
    top, _ = b.topk(b.featurizer.transform(test), 1)
    y = sp.csr_matrix(test.Y)
    assert b.metrics["p@1"] == pytest.approx(float(np.mean([y[i, top[i, 0]] for i in range(y.shape[0])])))
