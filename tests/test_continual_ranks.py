"""Continual training on several ranks: a model that needed its head sharded to train can also grow.

Each rank holds a shard of the grown label space; it must start its rows exactly as one process would
(base rows copied, new rows drawn or mean-started the same), its new labels must get the share of the
sampled negatives one process gives them, and the run must write one model that keeps every old label's
id and leaves the base untouched. Two ranks run on loopback (gloo).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_continual import _cli, _old_part, _params
from trainer.artifact import load_artifact
from trainer.continual import warm_start
from trainer.data import Dataset, write_xc
from trainer.hooks import QuietHooks
from trainer.label_shards import shard_bounds
from trainer.model import XCModel
from trainer.synth import synth_dataset
from trainer.train import _shard_focus_share, train


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Dataset, Dataset]:
    """A base trained on the rows of labels 0-23 of a planted 30-label set, and the full set."""
    tr, te = synth_dataset(30, 200, 1500, seed=4), synth_dataset(30, 200, 400, seed=4, part=1)
    base = tmp_path_factory.mktemp("ranks") / "v1"
    train(_params(), _old_part(tr, 24), None, out_dir=base, hooks=QuietHooks())
    return base, tr, te


def _digest(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("how", ["mean", "random"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_each_rank_starts_its_rows_as_one_process_would(
    grown: tuple[Path, Dataset, Dataset], how: str, ranks: int
) -> None:
    base, tr, _ = grown
    warm, ds, _ = warm_start(base, tr, None)
    ds = warm.training_rows(ds)
    x = sp.csr_matrix(warm.featurizer.transform(ds), dtype=np.float32)
    shape = replace(load_artifact(base).model.shape, n_labels=30)
    whole = XCModel(shape, init=False)
    warm.init_model(whole, x, ds.Y, how, seed=3)
    for rank in range(ranks):
        shard = shard_bounds(30, ranks, rank)
        part = XCModel(shape, init=False, label_rows=(shard.lo, shard.hi))
        warm.init_model(part, x, ds.Y, how, seed=3, lo=shard.lo)
        torch.testing.assert_close(part.head, whole.head[shard.lo : shard.hi], rtol=0, atol=0)
        torch.testing.assert_close(part.input_weight, whole.input_weight, rtol=0, atol=0)


@settings(max_examples=300, deadline=None)
@given(k=st.integers(65, 600), ranks=st.integers(2, 8), share=st.floats(0.05, 0.5),
       spread=st.floats(0.05, 0.6), tail=st.booleans(), seed=st.integers(0, 999))
def test_shards_give_new_labels_the_draws_one_process_gives_them(
    k: int, ranks: int, share: float, spread: float, tail: bool, seed: int
) -> None:
    """Summed over the shards, the focus labels get `share` of the M negatives, as on one rank, whether
    they are spread over the label space or appended at its end (as a continual run's new labels are)."""
    if tail:
        focus = np.arange(k) >= k - max(1, round(spread * k))
    else:
        focus = np.random.default_rng(seed).random(k) < spread
    if not focus.any() or focus.all():
        return
    m = 64  # negatives of one step (M < K), split across shards in proportion to their rows
    drawn, capped = 0.0, False
    for rank in range(ranks):
        shard = shard_bounds(k, ranks, rank)
        own = focus[shard.lo : shard.hi]
        s = _shard_focus_share(share, own, int(focus.sum()), shard)
        assert 0.0 <= s <= 1.0
        capped |= s == 1.0
        drawn += min(float(own.sum()), s * shard.negatives(m))
    one = min(float(focus.sum()), share * m)
    if capped:  # a shard of focus labels only: it draws nothing else, and no more than one process would
        assert drawn <= one + ranks
    else:
        assert drawn == pytest.approx(one, abs=ranks)


def test_two_ranks_grow_the_model_one_rank_grows(
    grown: tuple[Path, Dataset, Dataset], tmp_path: Path
) -> None:
    """With every label a negative, ungrouped, and no dropout, a step is the same on any number of ranks
    (`docs/distributed.md`): two ranks must then write one rank's model, to float rounding, keep every
    old label's id and leave the base untouched."""
    base, tr, te = grown
    before = _digest(base)
    exact = {"negatives": 64, "group_size": 1, "dropout": 0.0, "precision": "fp32"}  # bf16 rounds by shape
    one = train(_params(**exact), tr, te, out_dir=tmp_path / "one", hooks=QuietHooks(), base=base)
    two = train(_params(**exact, nproc_per_node=2), tr, te, out_dir=tmp_path / "two", hooks=QuietHooks(),
                base=base)
    assert _digest(base) == before  # the base is only ever read
    m1, m2 = load_artifact(tmp_path / "one").model, load_artifact(tmp_path / "two").model
    torch.testing.assert_close(m2.head, m1.head, rtol=0, atol=1e-5)
    torch.testing.assert_close(m2.input_weight, m1.input_weight, rtol=0, atol=1e-5)
    assert load_artifact(tmp_path / "two").label_names[:24] == load_artifact(base).label_names
    assert two.metrics["new.rows"] == one.metrics["new.rows"] > 0
    assert two.metrics["new.p@1"] > 0.5 and two.metrics["new.p@1"] == pytest.approx(one.metrics["new.p@1"])
    # the written model scores as the run reported
    grown_model = load_artifact(tmp_path / "two")
    top, _ = grown_model.topk(grown_model.featurizer.transform(te), 1)
    hits = np.asarray(sp.csr_matrix(te.Y)[np.arange(te.n_rows), top[:, 0]]).ravel() > 0
    assert float(hits.mean()) == pytest.approx(two.metrics["p@1"], abs=1e-6)


def test_the_cli_grows_a_model_on_two_ranks_and_refuses_a_conflict_before_starting_them(
    grown: tuple[Path, Dataset, Dataset], tmp_path: Path
) -> None:
    base, tr, te = grown
    write_xc(tmp_path / "all.txt", tr.X, tr.Y)
    write_xc(tmp_path / "test.txt", te.X, te.Y)
    proc = _cli("train", "--init-from", str(base), "--train", str(tmp_path / "all.txt"), "--test",
                str(tmp_path / "test.txt"), "--out", str(tmp_path / "v2"), "--nproc-per-node", "2", "--quiet")
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert metrics["new.p@1"] > 0.5, metrics
    assert load_artifact(tmp_path / "v2").label_names[:24] == load_artifact(base).label_names
    # the base's loss and dim hold for every rank: a conflict is refused in the caller, no rank started
    proc = _cli("train", "--init-from", str(base), "--train", str(tmp_path / "all.txt"), "--out",
                str(tmp_path / "v3"), "--nproc-per-node", "2", "--dim", "64")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"error: {base}: dim=64 differs from the base model's dim=32; a continual run "
                           "keeps the base's dim (leave it out)\n"), proc.stderr
    assert not (tmp_path / "v3").exists()
