"""Continual training (`train --init-from`): label ids stable by name, new labels appended and learned,
rows the base saw replayed, vocabulary growth, and clear errors for a base that does not fit the data."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from service.cli import main
from trainer.artifact import load_artifact
from trainer.continual import WarmStart, continual_params, row_fingerprints, split_metrics
from trainer.data import Dataset, read_jsonl, write_xc
from trainer.errors import DataFormatError, ParamsError
from trainer.featurize import Featurizer
from trainer.hooks import QuietHooks
from trainer.logit_adjust import bias_shift
from trainer.params import TrainParams
from trainer.synth import synth_dataset
from trainer.train import train

FAST = {"dim": 32, "batch_size": 64, "negatives": 16, "group_size": 4}


def _params(**kw: object) -> TrainParams:
    return TrainParams(**{**FAST, **kw})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def planted() -> tuple[Dataset, Dataset]:
    return synth_dataset(30, 200, 1500, seed=4), synth_dataset(30, 200, 400, seed=4, part=1)


def _old_part(ds: Dataset, n_old: int) -> Dataset:
    """Rows whose labels are all < n_old, in a label space of n_old labels (an older, smaller data set)."""
    y = sp.csr_matrix(ds.Y)
    rows = np.flatnonzero(np.asarray(y[:, n_old:].sum(axis=1)).ravel() == 0)
    sub = ds.take(rows)
    return Dataset(Y=sp.csr_matrix(sub.Y[:, :n_old]), n_features=ds.n_features, n_labels=n_old, X=sub.X)


def test_xc_ids_stay_put_and_new_labels_are_learned(planted: tuple[Dataset, Dataset], tmp_path: Path) -> None:
    tr, te = planted
    old = _old_part(tr, 24)
    train(_params(seed=1), old, None, out_dir=tmp_path / "v1", hooks=QuietHooks())
    v1 = load_artifact(tmp_path / "v1")
    result = train(_params(seed=1), tr, te, out_dir=tmp_path / "v2", hooks=QuietHooks(), base=tmp_path / "v1")
    v2 = load_artifact(tmp_path / "v2")
    assert v2.label_names == [str(i) for i in range(30)]  # XC names are ids; new ones appended in id order
    assert v2.label_names[:24] == v1.label_names
    assert v2.n_features == v1.n_features
    # old rows the continual run never moved past the base's: the base's head is where it started
    assert result.metrics["new.rows"] > 0 and result.metrics["old.rows"] > 0
    assert result.metrics["new.p@1"] > 0.5, result.metrics  # labels 24-29 learned (chance ~0.1)
    assert result.metrics["old.p@1"] > 0.5, result.metrics
    # every row the base trained on is remembered; the grown model remembers both
    assert v1.row_hashes is not None and v2.row_hashes is not None
    assert np.isin(row_fingerprints(old), v1.row_hashes).all()
    assert np.isin(row_fingerprints(tr), v2.row_hashes).all()
    assert v2.config["n_train_rows"] == tr.n_rows
    assert v2.label_counts is not None
    np.testing.assert_array_equal(v2.label_counts, np.bincount(tr.Y.indices, minlength=30))


def test_jsonl_labels_match_by_name_and_new_words_extend_the_vocabulary(tmp_path: Path) -> None:
    base_rows = [{"text": f"alpha beta doc{i}", "labels": ["a"]} for i in range(20)]
    base_rows += [{"text": f"gamma delta doc{i}", "labels": ["b", "c"]} for i in range(20)]
    new_rows = [{"text": f"omega zeta doc{i}", "labels": ["d"]} for i in range(20)]
    new_rows += [{"text": f"gamma delta doc{i}", "labels": ["c", "e"]} for i in range(20)]
    new_rows += [{"text": f"alpha beta doc{i}", "labels": ["a"]} for i in range(20)]
    for name, rows in (("base.jsonl", base_rows), ("new.jsonl", new_rows)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    train(_params(epochs=8, batch_size=8), read_jsonl(tmp_path / "base.jsonl"), None, out_dir=tmp_path / "v1",
          hooks=QuietHooks())
    v1 = load_artifact(tmp_path / "v1")
    assert v1.label_names == ["a", "b", "c"]
    train(_params(epochs=8, batch_size=8), read_jsonl(tmp_path / "new.jsonl"), None, out_dir=tmp_path / "v2",
          hooks=QuietHooks(), base=tmp_path / "v1")
    v2 = load_artifact(tmp_path / "v2")
    assert v2.label_names == ["a", "b", "c", "d", "e"]  # new names in order of first appearance
    assert v2.featurizer.vocab is not None and v1.featurizer.vocab is not None
    assert {"omega", "zeta"} <= set(v2.featurizer.vocab) and "omega" not in v1.featurizer.vocab
    assert all(v2.featurizer.vocab[t] == i for t, i in v1.featurizer.vocab.items())  # old columns kept
    x = v2.featurizer.transform_texts(["omega zeta doc3"])
    top, _ = v2.topk(x, 1)
    assert v2.label_names[int(top[0, 0])] == "d"  # learned through the new words only


@pytest.mark.parametrize("refit", [False, True])
def test_held_out_rows_add_no_words_to_the_vocabulary(tmp_path: Path, refit: bool) -> None:
    """With valid_fraction the vocabulary grows from the rows trained on only: a word of a held-out row
    would otherwise get a column (and idf) from the very rows that judge the model. A refit trains on
    every row, and its model (the one saved) has every row's words."""
    from trainer.train import split_validation

    rows = [{"text": f"alpha beta doc{i}", "labels": ["a"]} for i in range(20)]
    (tmp_path / "base.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    train(_params(epochs=1, min_df=1), read_jsonl(tmp_path / "base.jsonl"), None, out_dir=tmp_path / "v1",
          hooks=QuietHooks())
    new = [{"text": f"gamma only{i}", "labels": ["a" if i % 2 else "b"]} for i in range(20)]
    (tmp_path / "new.jsonl").write_text("".join(json.dumps(r) + "\n" for r in new))
    params = _params(epochs=1, valid_fraction=0.25, refit=refit)
    train(params, read_jsonl(tmp_path / "new.jsonl"), None, out_dir=tmp_path / "v2", hooks=QuietHooks(),
          base=tmp_path / "v1")
    vocab = load_artifact(tmp_path / "v2").featurizer.vocab
    assert vocab is not None and "gamma" in vocab
    fit_rows, valid_rows = split_validation(20, 0.25, params.seed)
    assert all(f"only{i}" in vocab for i in fit_rows)
    held_out = [f"only{i}" for i in valid_rows]
    assert all(w in vocab for w in held_out) if refit else not any(w in vocab for w in held_out)


def test_extended_vocabulary_featurizes_old_texts_exactly_as_before() -> None:
    texts = ["red green blue", "green blue", "red red yellow", "blue sky"]
    f = Featurizer.fit(Dataset(Y=sp.csr_matrix((4, 1)), n_features=0, n_labels=1, texts=texts), min_df=1)
    g = f.extended(["purple red", "purple sky sky", "orange"])
    assert g.n_features == f.n_features + 2 and f.vocab is not None and g.vocab is not None
    assert list(g.vocab)[f.n_features:] == ["purple", "orange"]  # by df, then name
    old = f.transform_texts(texts)
    new = g.transform_texts(texts)
    np.testing.assert_array_equal(new[:, : f.n_features].toarray(), old.toarray())
    assert new[:, f.n_features:].nnz == 0
    assert f.n_features == 5  # the base featurizer itself is untouched
    hashed = Featurizer.fit(Dataset(Y=sp.csr_matrix((4, 1)), n_features=0, n_labels=1, texts=texts),
                            hash_size=64)
    assert hashed.extended(["purple"]) is hashed


def test_resume_trains_all_rows_for_more_epochs(planted: tuple[Dataset, Dataset], tmp_path: Path) -> None:
    tr, te = planted
    first = train(_params(epochs=2), tr, te, out_dir=tmp_path / "v1", hooks=QuietHooks())
    more = train(_params(epochs=2), tr, te, out_dir=tmp_path / "v2", hooks=QuietHooks(), base=tmp_path / "v1")
    assert more.steps == first.steps  # every row seen by the base: a resume trains on all of them
    assert more.metrics["p@1"] >= first.metrics["p@1"] - 0.02
    assert more.metrics["new.rows"] == 0


def test_epoch_rows_hold_every_new_row_and_a_replay_sample() -> None:
    warm = WarmStart(base=None, name="b", label_names=[], featurizer=None)
    warm.seen = np.array([True] * 70 + [False] * 30)
    rows = warm.epoch_rows(seed=0, epoch=0, replay=1.0)
    assert len(rows) == warm.epoch_size(1.0) == 60 and len(set(rows.tolist())) == 60
    assert set(range(70, 100)) <= set(rows.tolist())
    other = warm.epoch_rows(seed=0, epoch=1, replay=1.0)
    assert set(rows.tolist()) != set(other.tolist())  # a fresh replay sample each epoch
    assert warm.epoch_size(5.0) == 100 and warm.epoch_size(0.0) == 30


def test_replayed_rows_stand_for_the_seen_rows_left_out() -> None:
    warm = WarmStart(base=None, name="b", label_names=[], featurizer=None)
    warm.seen = np.array([True] * 70 + [False] * 30)
    rows = warm.epoch_rows(seed=0, epoch=0, replay=1.0)
    w = warm.epoch_weights(rows, replay=1.0)
    assert w is not None and w.shape == rows.shape
    np.testing.assert_allclose(w[rows < 70], 70 / 30)  # 30 of the 70 seen rows stand for all 70
    np.testing.assert_allclose(w[rows >= 70], 1.0)
    assert float(w.sum()) == pytest.approx(100.0)  # the epoch weighs as much as every row once
    assert warm.epoch_weights(warm.epoch_rows(0, 0, 5.0), replay=5.0) is None  # every seen row is in
    assert warm.epoch_weights(warm.epoch_rows(0, 0, 0.0), replay=0.0) is None  # none is


def test_new_label_lr_is_the_step_at_that_learning_rate() -> None:
    """Scaling a row's move (`_row_lr`) equals a row-wise Adam step at the scaled lr, catch-up included."""
    from trainer.optim import RowAdam
    from trainer.step import _row_lr

    gen = torch.Generator().manual_seed(0)
    start = torch.randn(6, 4, generator=gen)
    grads = [torch.randn(3, 4, generator=gen) for _ in range(3)]
    ids = [torch.tensor([0, 2, 4]), torch.tensor([1, 2, 5]), torch.tensor([0, 3, 4])]  # rows skip steps
    scale = torch.tensor([1.0, 3.0, 1.0, 3.0, 0.5, 3.0])
    scaled, plain = start.clone(), {r: start.clone() for r in (1.0, 3.0, 0.5)}
    opt_scaled, opts = RowAdam(), {r: RowAdam() for r in plain}
    for g, rows in zip(grads, ids, strict=True):
        with _row_lr(scale, [scaled], rows):
            opt_scaled.step("head", scaled, g, 0.1, rows=rows)
        for r, table in plain.items():
            opts[r].step("head", table, g, 0.1 * r, rows=rows)
    for row in range(6):
        torch.testing.assert_close(scaled[row], plain[float(scale[row])][row], rtol=1e-5, atol=1e-6)


def test_a_continual_run_peaks_at_continual_lr_times_the_learning_rates(
        planted: tuple[Dataset, Dataset], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step of a continual run is at `continual_lr` × the base's rate, decaying by `continual_schedule`;
    a fresh run's peak is `lr` itself."""
    from trainer import train as train_mod

    seen: list[float] = []
    step = train_mod.Stepper.step

    def record(self: train_mod.Stepper, ep: train_mod.EpochData, i: int, j: int, lr: float) -> float:
        seen.append(lr)
        return step(self, ep, i, j, lr)

    monkeypatch.setattr(train_mod.Stepper, "step", record)
    tr, _ = planted
    train(_params(seed=1, epochs=2), _old_part(tr, 24), None, out_dir=tmp_path / "v1", hooks=QuietHooks())
    assert max(seen) == pytest.approx(0.01)
    seen.clear()
    train(_params(seed=1, continual_lr=1.5), tr, None, out_dir=tmp_path / "v2", hooks=QuietHooks(),
          base=tmp_path / "v1")
    assert max(seen) == pytest.approx(0.015)
    linear = _params(schedule="linear")  # the continual run's default decay, not the base's cosine
    assert seen == pytest.approx([1.5 * train_mod.lr_at(linear, s, len(seen)) for s in range(len(seen))])
    assert load_artifact(tmp_path / "v2").params.lr == 0.01  # recorded unscaled: a next run scales it once


def test_continual_params_take_the_base_and_refuse_a_different_architecture() -> None:
    base = TrainParams(dim=64, lr=0.02, epochs=9)
    p = continual_params(base, TrainParams(seed=5), "m")
    assert (p.dim, p.lr, p.seed, p.epochs) == (64, 0.02, 5, p.continual_epochs)
    assert (p.schedule, base.schedule) == (p.continual_schedule, "cosine")
    assert continual_params(base, TrainParams(epochs=4, dim=64), "m").epochs == 4
    assert continual_params(base, TrainParams(schedule="constant"), "m").schedule == "constant"
    # a base under other defaults
    old = TrainParams(dim=64, continual_epochs=5, replay=0.5, new_label_lr=1.0, continual_lr=3.0,
                      continual_schedule="constant")
    p = continual_params(old, TrainParams(), "m")
    now = TrainParams()
    assert (p.epochs, p.replay, p.new_label_lr, p.continual_lr, p.schedule) == (
        now.continual_epochs, now.replay, now.new_label_lr, now.continual_lr, now.continual_schedule)
    assert p.lr == old.lr  # the multiplier applies at run time: generations of continual runs do not compound
    assert continual_params(old, TrainParams(replay=0.5), "m").replay == 0.5
    with pytest.raises(ParamsError, match=r"m: dim=32 differs from the base model's dim=64"):
        continual_params(base, TrainParams(dim=32), "m")


def test_split_metrics_separate_rows_with_new_labels() -> None:
    y = sp.csr_matrix(np.array([[1, 0, 0], [0, 0, 1], [0, 0, 0], [1, 0, 1]], dtype=np.float32))
    top = np.array([[0, 1], [2, 0], [1, 0], [1, 2]])
    out = split_metrics(top, y, np.array([False, False, True]), None)
    assert out["new.rows"] == 2 and out["old.rows"] == 1
    assert out["old.p@1"] == 1.0 and out["new.p@1"] == 0.5


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 9), min_size=0, max_size=4, unique=True), min_size=1, max_size=12),
       st.permutations(list(range(10))), st.integers(0, 10**6))
def test_fingerprints_follow_label_names_not_ids(rows: list[list[int]], perm: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = sp.random(len(rows), 20, density=0.3, format="csr", dtype=np.float32, random_state=rng)
    y = sp.csr_matrix((np.ones(sum(map(len, rows)), np.float32), [i for r in rows for i in r],
                       np.cumsum([0] + [len(r) for r in rows])), shape=(len(rows), 10))
    names = [f"n{i}" for i in range(10)]
    ds = Dataset(Y=y, n_features=20, n_labels=10, X=x, label_names=names)
    inv = np.argsort(perm)  # label i moves to id perm[i]
    y2 = sp.csr_matrix((y.data, np.asarray(perm)[y.indices], y.indptr), shape=y.shape)
    ds2 = Dataset(Y=y2, n_features=20, n_labels=10, X=x, label_names=[names[int(j)] for j in inv])
    np.testing.assert_array_equal(row_fingerprints(ds), row_fingerprints(ds2))
    if x.nnz:
        x3 = x.copy()
        x3.data[0] += 1.0
        ds3 = Dataset(Y=y, n_features=20, n_labels=10, X=x3, label_names=names)
        changed = np.flatnonzero(row_fingerprints(ds3) != row_fingerprints(ds))
        row = int(np.searchsorted(x.indptr, 0, side="right")) - 1
        assert changed.tolist() == [row]


def test_mean_init_points_new_rows_at_their_examples(
    planted: tuple[Dataset, Dataset], tmp_path: Path
) -> None:
    tr, _ = planted
    train(_params(), _old_part(tr, 24), None, out_dir=tmp_path / "v1", hooks=QuietHooks())
    from trainer.continual import warm_start
    from trainer.model import XCModel

    warm, ds, _ = warm_start(tmp_path / "v1", tr, None)
    ds = warm.training_rows(ds)
    x = sp.csr_matrix(warm.featurizer.transform(ds), dtype=np.float32)
    shape = load_artifact(tmp_path / "v1").model.shape
    model = XCModel(replace(shape, n_labels=30), init=False)
    warm.init_model(model, x, ds.Y, "mean", seed=0)
    h = model.encode(x).double()
    y = sp.csr_matrix(ds.Y)
    old_rows = model.head[:24].double()
    median_norm = float(old_rows[:, :32].norm(dim=1).median())
    pairs = [(r, lab) for lab in range(24) for r in y[:, lab].nonzero()[0]]
    target = float(torch.stack([h[r] @ old_rows[lab, :32] + old_rows[lab, 32] for r, lab in pairs]).median())
    for label in range(24, 30):
        rows = torch.from_numpy(y[:, label].nonzero()[0])
        mean = h[rows].mean(0)
        w = model.head[label, :32].double()
        assert float(torch.nn.functional.cosine_similarity(w, mean, dim=0)) > 0.999
        # positives score about what trained labels give theirs, never via a row longer than theirs
        scores = h[rows] @ w + float(model.head[label, 32])
        assert float(w.norm()) <= median_norm + 1e-4
        assert float(scores.mean()) <= target + 1e-3
        assert float(w.norm()) >= median_norm - 1e-4 or abs(float(scores.mean()) - target) < 1e-3
    base = load_artifact(tmp_path / "v1")
    # the base's rows as it learned them: its saved biases less their logit adjustment
    assert base.label_counts is not None
    learned = base.model.head.clone()
    shift = bias_shift(base.label_counts, base.params.logit_shift(label_texts=False))
    learned[:, -1] -= torch.from_numpy(shift)
    torch.testing.assert_close(model.head[:24], learned)
    torch.testing.assert_close(model.input_weight, base.model.input_weight)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service.cli", *args], capture_output=True, text=True,
                          timeout=300, check=False)


def test_cli_init_from_and_its_errors(planted: tuple[Dataset, Dataset], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    tr, te = planted
    old = _old_part(tr, 24)
    write_xc(tmp_path / "old.txt", old.X, old.Y)
    write_xc(tmp_path / "all.txt", tr.X, tr.Y)
    write_xc(tmp_path / "test.txt", te.X, te.Y)
    fast = ["--dim", "32", "--batch-size", "64", "--negatives", "16", "--group-size", "4", "--quiet"]
    assert main(["train", "--train", str(tmp_path / "old.txt"), "--out", str(tmp_path / "v1"), *fast]) == 0
    assert main(["train", "--init-from", str(tmp_path / "v1"), "--train", str(tmp_path / "all.txt"),
                 "--test", str(tmp_path / "test.txt"), "--out", str(tmp_path / "v2"), "--quiet"]) == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"new.p@1", "old.p@1", "p@1"} <= set(metrics)
    assert load_artifact(tmp_path / "v2").params.dim == 32  # taken from the base

    # the refusals, through the same `main` in this process (what the command runs; no second interpreter)
    def refused(*args: str) -> str:
        assert main(["train", *args]) == 2
        return capsys.readouterr().err

    wide = tmp_path / "wide.txt"
    write_xc(wide, sp.hstack([tr.X, sp.csr_matrix((tr.n_rows, 5))]).tocsr(), tr.Y)
    v1, out = str(tmp_path / "v1"), str(tmp_path / "x")
    err = refused("--init-from", v1, "--train", str(wide), "--out", out)
    assert err.startswith(f"error: {wide}:1: declares D=205 features but the base model "), err

    text = tmp_path / "t.jsonl"
    text.write_text('{"text": "hello there", "labels": ["a"]}\n')
    err = refused("--init-from", v1, "--train", str(text), "--out", out)
    assert f"error: {text}:1: holds texts (JSONL) but the base model" in err, err

    err = refused("--init-from", str(tmp_path / "v1"), "--train", str(tmp_path / "all.txt"), "--dim", "64",
                  "--out", str(tmp_path / "x"))
    assert "dim=64 differs from the base model's dim=32" in err, err

    err = refused("--init-from", str(tmp_path / "nope"), "--train", str(tmp_path / "all.txt"), "--out",
                  str(tmp_path / "x"))
    assert err.startswith(f"error: {tmp_path / 'nope'}: not a model directory"), err
    assert not (tmp_path / "x").exists()


class _Log(QuietHooks):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def on_log(self, message: str) -> None:
        self.lines.append(message)


def _base_of_one_label(tmp_path: Path, other: str) -> None:
    """b.jsonl (label 'a' only), its model v1, and `other`: a row of 'a' and a row of 'zzz'."""
    rows = [{"text": f"alpha beta doc{i}", "labels": ["a"]} for i in range(10)]
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / other).write_text('{"text": "alpha beta", "labels": ["a"]}\n'
                                  '{"text": "alpha", "labels": ["zzz"]}\n')
    train(_params(epochs=1), read_jsonl(tmp_path / "b.jsonl"), None, out_dir=tmp_path / "v1",
          hooks=QuietHooks())


def test_a_test_label_the_grown_model_lacks_counts_as_a_miss(tmp_path: Path) -> None:
    """A JSONL test label neither the base nor the new data has is never predicted: the run goes on with a
    warning, and the rows carrying it score as misses (among the new-label rows, not the old ones)."""
    _base_of_one_label(tmp_path, "t.jsonl")
    hooks = _Log()
    result = train(_params(epochs=1), read_jsonl(tmp_path / "b.jsonl"), read_jsonl(tmp_path / "t.jsonl"),
                   out_dir=tmp_path / "v2", hooks=hooks, base=tmp_path / "v1")
    assert (f"warning: the test set {tmp_path / 't.jsonl'} holds 1 label(s) the model has not trained on, "
            "on 1 of its 2 rows: the model never predicts them, so they count as misses") in hooks.lines
    m = result.metrics
    assert m["p@1"] == 0.5 and m["ndcg@1"] == 0.5  # one label in the model: row 1 hits, row 2 cannot
    assert (m["old.rows"], m["old.p@1"], m["new.rows"], m["new.p@1"]) == (1.0, 1.0, 1.0, 0.0)
    assert load_artifact(tmp_path / "v2").label_names == ["a"]  # the test label is not added to the model


def test_a_replay_label_the_grown_model_lacks_is_refused_before_training(tmp_path: Path) -> None:
    """Replay rows are rows the base trained on: one whose label neither the base nor the new data has
    is refused before the first step, with where it is and what to do instead."""
    _base_of_one_label(tmp_path, "r.jsonl")
    hooks = _Log()
    why = r"\(nor in the training data\): replay rows are rows the base trained on; rows of a new label go"
    where = r"r.jsonl:2: label 'zzz' is not in the model's label set "
    with pytest.raises(DataFormatError, match=where + why):
        train(_params(epochs=1), read_jsonl(tmp_path / "b.jsonl"), None, out_dir=tmp_path / "v2",
              hooks=hooks, base=tmp_path / "v1", replay_ds=read_jsonl(tmp_path / "r.jsonl"))
    assert not any(m.startswith("epoch") for m in hooks.lines) and not (tmp_path / "v2").exists()


def test_a_base_without_fingerprints_treats_every_row_as_new(
    planted: tuple[Dataset, Dataset], tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    tr, _ = planted
    small = tr.take(np.arange(300))
    train(_params(epochs=1), small, None, out_dir=tmp_path / "v1", hooks=QuietHooks())
    weights = tmp_path / "v1" / "weights.safetensors"
    tensors = load_file(str(weights))
    del tensors["stats.row_hashes"]  # as written before fingerprints existed
    save_file(tensors, str(weights))
    assert load_artifact(tmp_path / "v1").row_hashes is None
    again = train(_params(epochs=2), small, None, out_dir=tmp_path / "v2", hooks=QuietHooks(),
                  base=tmp_path / "v1")
    assert again.steps == 2 * 5  # 300 rows in batches of 64, all of them new to the base
    assert load_artifact(tmp_path / "v2").config["n_train_rows"] == 600  # counted again: it cannot tell


def test_replay_data_needs_a_base(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--train", "x.txt", "--replay-data", "y.txt", "--out", str(tmp_path / "m")]) == 2
    assert "--replay-data needs --init-from" in capsys.readouterr().err


def test_new_labels_with_rows_are_oversampled_as_negatives() -> None:
    """A focused uniform draw: M distinct sorted labels, `focus_share` of them from the focus set, every one
    weighing K/M; without a focus (or at share 0) the draws are those of the plain uniform sampler."""
    from trainer.negatives import NegativeSampler

    k, m = 1000, 64
    focus = np.zeros(k, dtype=bool)
    focus[::50] = True  # 20 labels: fewer than the share asks for, so all of them are drawn
    few = NegativeSampler(k, "uniform", seed=3, focus=focus, focus_share=0.5).draw(m)
    assert set(np.flatnonzero(focus)) <= set(few.ids.tolist()) and few.ids.numel() == m
    focus[::5] = True  # 200 labels
    neg = NegativeSampler(k, "uniform", seed=3, focus=focus, focus_share=0.25).draw(m)
    ids = neg.ids.numpy()
    assert ids.size == m and np.all(np.diff(ids) > 0)
    assert int(focus[ids].sum()) == 16
    np.testing.assert_allclose(neg.log_weight.numpy(), np.log(k / m), rtol=1e-6)
    plain = NegativeSampler(k, "uniform", seed=3).draw(m)
    unfocused = NegativeSampler(k, "uniform", seed=3, focus=focus, focus_share=0.0).draw(m)
    assert torch.equal(plain.ids, unfocused.ids)
    assert focus[plain.ids.numpy()].sum() < 16  # uniform draws reach the 20 % focus set less often
    every = NegativeSampler(k, "uniform", seed=3, focus=focus, focus_share=0.25).draw(k)
    assert torch.equal(every.ids, torch.arange(k))  # M ≥ K: every label once, as before


def test_only_new_labels_with_rows_get_the_new_label_rate() -> None:
    """`new_label_lr` and the negative focus go to new labels that have a positive row in this run."""
    warm = WarmStart(base=None, name="b", label_names=[str(i) for i in range(5)], featurizer=None,
                     new_labels=np.array([False, False, True, True, True]))
    counts = np.array([3.0, 0.0, 2.0, 0.0, 1.0])
    np.testing.assert_array_equal(warm.learning(counts), [False, False, True, False, True])
    scale = warm.label_lr(warm.learning(counts), 3.0, torch.device("cpu"))
    assert scale is not None and scale.tolist() == [1.0, 1.0, 3.0, 1.0, 3.0]
    no_rows = warm.learning(np.array([3.0, 1.0, 0.0, 0.0, 0.0]))
    assert warm.label_lr(no_rows, 3.0, torch.device("cpu")) is None
