"""`ensemble` N: N models trained from seeds seed..seed+N-1, saved as one model N·dim wide whose scores are
the members' sum; what it refuses, how it reports progress and stops, and a continual run from it."""

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

from tests.test_train import Recorder
from trainer.artifact import load_artifact
from trainer.data import Dataset
from trainer.ensemble import merge_models
from trainer.errors import ParamsError, TrainingCancelled
from trainer.logit_adjust import bias_shift
from trainer.model import ModelShape, XCModel
from trainer.params import MAX_SEED, TrainParams
from trainer.synth import synth_dataset
from trainer.train import train

K, D = 50, 300
SMALL: dict[str, Any] = {"dim": 16, "epochs": 2, "batch_size": 100, "negatives": 16, "eval_every": 0,
                         "device": "cpu"}


@pytest.fixture(scope="module")
def data() -> tuple[Dataset, Dataset]:
    return synth_dataset(K, D, 800, seed=3), synth_dataset(K, D, 200, seed=3, part=1)


@pytest.fixture(scope="module")
def trained(data: tuple[Dataset, Dataset], tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """An ensemble of 2 from seed 5 and the two runs of seeds 5 and 6 it should equal, side by side."""
    root = tmp_path_factory.mktemp("ensemble")
    tr, te = data
    rec = Recorder()
    result = train(TrainParams(**SMALL, seed=5, ensemble=2), tr, te, out_dir=root / "ens", hooks=rec,
                   checkpoint_dir=root / "ckpt", checkpoint_every=5)
    for seed in (5, 6):
        train(TrainParams(**SMALL, seed=seed), tr, None, out_dir=root / f"s{seed}")
    return {"root": root, "result": result, "recorder": rec}


def test_the_saved_model_scores_the_sum_of_its_members(trained: dict[str, object],
                                                       data: tuple[Dataset, Dataset]) -> None:
    root = trained["root"]
    assert isinstance(root, Path)
    ens, a, b = (load_artifact(root / n) for n in ("ens", "s5", "s6"))
    assert ens.dim == 2 * SMALL["dim"] and ens.params.dim == SMALL["dim"] and ens.params.ensemble == 2
    assert ens.params.seed == 5 and ens.metrics["ensemble"] == 2.0
    x = a.featurizer.transform(data[1])
    # each member saved its biases logit-adjusted; the merged model carries the shift once
    assert a.label_counts is not None
    once = bias_shift(a.label_counts, ens.params.logit_shift(label_texts=False))
    assert np.abs(once).max() > 0.1
    np.testing.assert_allclose(ens.scores(x), a.scores(x) + b.scores(x) - once, rtol=1e-5, atol=1e-4)
    # the test-set metrics are the merged model's own
    top, _ = ens.topk(x, 1)
    y = sp.csr_matrix(data[1].Y)
    p1 = float(np.mean([y[i, top[i, 0]] for i in range(y.shape[0])]))
    assert ens.metrics["p@1"] == pytest.approx(p1)
    # the members trained beside the model, in a directory that is gone; their checkpoints each in its own
    assert not (root / ".ens.members").exists()
    assert sorted(p.name for p in (root / "ckpt").iterdir()) == ["member-0", "member-1"]


def test_progress_rises_once_over_every_members_steps(trained: dict[str, object]) -> None:
    rec = trained["recorder"]
    assert isinstance(rec, Recorder)
    steps = [p.step for p in rec.progress]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    totals = {p.steps_total for p in rec.progress}
    assert len(totals) == 1 and steps[-1] == totals.pop()
    assert {p.epochs for p in rec.progress} == {2 * SMALL["epochs"]}
    assert rec.progress[-1].epoch == 2 * SMALL["epochs"]
    assert any(m.startswith("member 2/2: ") for m in rec.logs)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 4), d=st.integers(1, 6), k=st.integers(1, 7), f=st.integers(1, 9),
       seed=st.integers(0, 10_000))
def test_merged_scores_are_the_sum_of_member_scores(n: int, d: int, k: int, f: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    shape = ModelShape(n_features=f, n_labels=k, dim=d)
    members = []
    for i in range(n):
        m = XCModel(shape, seed=seed + i).eval()
        with torch.no_grad():
            m.input_bias.copy_(torch.randn(d, generator=gen))
            m.head.copy_(torch.randn(k, d + 1, generator=gen))
        members.append(m)
    x = sp.random(5, f, density=0.5, format="csr", dtype=np.float32, random_state=seed)
    merged = merge_models(iter(members), n)
    assert merged.shape.dim == n * d
    with torch.no_grad():
        want = sum(m.score(m.encode(x)) for m in members)
        got = merged.score(merged.encode(x))
    assert isinstance(want, torch.Tensor)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_merge_refuses_members_that_do_not_sum() -> None:
    a = XCModel(ModelShape(n_features=4, n_labels=3, dim=2))
    with pytest.raises(ValueError, match="differ"):
        merge_models([a, XCModel(ModelShape(n_features=5, n_labels=3, dim=2))], 2)
    with pytest.raises(ValueError, match="1 ensemble members for 2"):
        merge_models([a], 2)
    mlp = XCModel(ModelShape(n_features=4, n_labels=3, dim=2, encoder="mlp", hidden=1))
    with pytest.raises(ValueError, match="linear"):
        merge_models([mlp, mlp], 2)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"encoder": "mlp", "hidden": 1}, "needs encoder 'linear'"),
        ({"loss": "dropmax"}, "extra heads"),
        ({"nproc_per_node": 2}, "nproc_per_node 1"),
        ({"valid_fraction": 0.1}, "add refit"),
        ({"dim": 8192, "ensemble": 3}, "24576 wide"),
        ({"seed": MAX_SEED}, "lower seed"),
        ({"ensemble": 0}, "greater than or equal to 1"),
        ({"ensemble": 9}, "less than or equal to 8"),
    ],
)
def test_params_refuse_what_cannot_be_an_ensemble(fields: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        TrainParams.model_validate({"ensemble": 2, **fields})


def test_round_trips_and_older_params_read_as_one_model() -> None:
    p = TrainParams(ensemble=3)
    assert TrainParams.from_json_dict(p.to_json_dict()).ensemble == 3
    old = p.to_json_dict()
    del old["ensemble"]
    assert TrainParams.from_json_dict(old).ensemble == 1
    TrainParams(ensemble=2, valid_fraction=0.1, refit=True)  # each member selects and refits on all rows


def test_a_base_or_label_texts_is_refused_before_anything_is_written(
    data: tuple[Dataset, Dataset], trained: dict[str, object], tmp_path: Path
) -> None:
    root = trained["root"]
    assert isinstance(root, Path)
    with pytest.raises(ParamsError, match="cannot continue a base model"):
        train(TrainParams(**SMALL, ensemble=2), data[0], None, out_dir=tmp_path / "m", base=root / "s5")
    with pytest.raises(ParamsError, match="label texts"):
        train(TrainParams(**SMALL, ensemble=2), data[0], None, out_dir=tmp_path / "m",
              label_texts=[("0", "w1 w2")])
    assert list(tmp_path.iterdir()) == []


def test_a_stop_in_the_second_member_leaves_neither_model_nor_members(
    data: tuple[Dataset, Dataset], tmp_path: Path
) -> None:
    member_steps = SMALL["epochs"] * -(-data[0].n_rows // SMALL["batch_size"])
    with pytest.raises(TrainingCancelled):
        train(TrainParams(**SMALL, ensemble=2), data[0], None, out_dir=tmp_path / "m",
              hooks=Recorder(stop_after=member_steps + 2))
    assert not (tmp_path / "m").exists()
    assert list(tmp_path.iterdir()) == []
    # a killed run's members (no `finally` ran) are cleared by the next run to that model
    (tmp_path / ".m.members" / "member-0").mkdir(parents=True)
    (tmp_path / ".m.members" / "member-0" / "weights.safetensors").write_bytes(b"partial")
    train(TrainParams(**{**SMALL, "epochs": 1}, ensemble=2), data[0], None, out_dir=tmp_path / "m")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_a_model_saved_from_an_ensemble_continues_as_one_model_of_its_width(
    data: tuple[Dataset, Dataset], trained: dict[str, object], tmp_path: Path
) -> None:
    root = trained["root"]
    assert isinstance(root, Path)
    result = train(TrainParams(epochs=1, device="cpu", eval_every=0), data[0], None, out_dir=tmp_path / "c",
                   base=root / "ens")
    assert result.out_dir is not None
    cont = load_artifact(tmp_path / "c")
    assert cont.dim == 2 * SMALL["dim"] and cont.params.dim == 2 * SMALL["dim"] and cont.params.ensemble == 1
    with pytest.raises(ParamsError, match="differs from the base model's dim=32"):
        train(TrainParams(dim=16, epochs=1, device="cpu"), data[0], None, out_dir=tmp_path / "d",
              base=root / "ens")


def test_cli_trains_an_ensemble_and_says_what_to_fix(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli import main
    from trainer.synth import write_synth

    rows = tmp_path / "rows.txt"
    write_synth(rows, 20, 100, 200, seed=1)
    assert main(["train", "--train", str(rows), "--out", str(tmp_path / "m"), "--ensemble", "2", "--dim", "8",
                 "--epochs", "1", "--device", "cpu", "--quiet"]) == 0
    loaded = load_artifact(tmp_path / "m")
    assert loaded.dim == 16 and loaded.params.ensemble == 2
    assert main(["train", "--train", str(rows), "--out", str(tmp_path / "m2"), "--ensemble", "2",
                 "--encoder", "mlp", "--hidden", "1", "--quiet"]) != 0
    assert "ensemble 2 needs encoder 'linear'" in capsys.readouterr().err
    assert not (tmp_path / "m2").exists()
