"""Hard negatives (`trainer.hard_negatives`): mining, the candidates a step takes, the bound they keep
(checked by enumerating every draw on a small K), a run that learns with them, and the two options
through `TrainParams`, `ovex train` and the jobs API."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from service.cli import main
from tests.jobs.conftest import Server, sqlite_server
from trainer import hard_negatives as hn
from trainer.artifact import load_artifact
from trainer.data import Dataset, write_xc
from trainer.errors import TrainingCancelled
from trainer.hard_negatives import HardNegatives, hard_columns, mine_neighbours
from trainer.hooks import QuietHooks
from trainer.losses import CandidateBatch, Candidates, masked_negative_pairs, ove_loss, sampled_candidates
from trainer.negatives import SampledNegatives
from trainer.params import TrainParams
from trainer.synth import synth_dataset
from trainer.train import train

# ------------------------------------------------------------------------------------ mining


def _clustered(n_clusters: int, per: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Label rows around `n_clusters` random directions, and each label's cluster."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_clusters, d))
    cluster = np.repeat(np.arange(n_clusters), per)
    return centres[cluster] + 0.05 * rng.standard_normal((cluster.size, d)), cluster


def test_mining_finds_each_labels_nearest_others_and_skips_labels_not_asked() -> None:
    w, cluster = _clustered(20, 5, 16, seed=0)
    queries = np.arange(0, 100, 2)
    table = mine_neighbours(w * np.random.default_rng(1).uniform(0.1, 10, (100, 1)), queries, 4)
    assert table.shape == (100, 4)
    asked = table[queries]
    assert (asked != queries[:, None]).all()  # never itself
    assert (cluster[asked] == cluster[queries][:, None]).all()  # its 4 cluster mates, whatever the norms
    assert (table[1::2] == -1).all()  # labels without rows are not queried


def test_mining_past_the_exact_size_uses_an_index_that_finds_the_same_neighbours(
        monkeypatch: pytest.MonkeyPatch) -> None:
    w, cluster = _clustered(60, 6, 24, seed=2)
    queries = np.arange(w.shape[0])
    exact = mine_neighbours(w, queries, 5)
    monkeypatch.setattr(hn, "EXACT_UP_TO", 50)
    approx = mine_neighbours(w, queries, 5)
    assert (cluster[approx] == cluster[:, None]).mean() > 0.95
    same = np.mean([len(set(a) & set(e)) / 5 for a, e in zip(approx, exact, strict=True)])
    assert same > 0.9, same


def test_a_label_with_fewer_others_than_asked_is_padded() -> None:
    table = mine_neighbours(np.eye(3), np.arange(3), 5)
    assert (table[:, :2] >= 0).all() and (table[:, 2:] == -1).all()


# ------------------------------------------------------------------------------------ candidates


class _Fixed:
    """A sampler that draws the given labels with the given log weights (to enumerate every draw)."""

    kind = "uniform"

    def __init__(self, k: int, ids: list[int], logw: list[float]) -> None:
        self.n_labels = k
        self.generator = torch.Generator().manual_seed(0)
        self.ids = torch.tensor(ids, dtype=torch.long)
        self.logw = torch.tensor(logw, dtype=torch.float32)

    def draw(self, m: int, device: torch.device | str = "cpu") -> SampledNegatives:
        return SampledNegatives(self.ids, self.logw, m)


def _labels(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    ptr = torch.tensor([0, *np.cumsum([len(r) for r in rows]).tolist()], dtype=torch.long)
    return ptr, torch.tensor([y for r in rows for y in sorted(r)], dtype=torch.long)


def _hard_candidates(rows: list[list[int]], table: np.ndarray, k: int, ids: list[int], logw: list[float],
                     m: int, group: int) -> Candidates:
    ptr, ind = _labels(rows)
    cand = sampled_candidates(ptr, ind, _Fixed(k, ids, logw), m, group)  # type: ignore[arg-type]
    cand.masked = torch.stack(masked_negative_pairs(cand))
    hard_columns(cand, torch.from_numpy(table)[ind], ind)
    return cand


def _loss(cand: Candidates, full: torch.Tensor) -> float:
    """The step's loss with every score read from a full [B, K] matrix."""
    n = cand.n_sampled
    assert cand.hard_cols is not None
    batch = CandidateBatch(
        cand=cand, scores=full[:, cand.label_ids[:n]], h=full.new_zeros(full.shape[0], 1),
        pos_scores=full[cand.pos_rows, cand.label_ids[cand.pos_cols]],
        hard_scores=full[cand.pos_rows.unsqueeze(1), cand.label_ids[cand.hard_cols]],
    )
    return float(ove_loss(batch))


def _exact(full: torch.Tensor, rows: list[list[int]]) -> tuple[float, float]:
    """(mean over pairs of −log p(y|x) with the row's other positives left out, of the OVE sum)."""
    nll, ove = [], []
    for b, pos in enumerate(rows):
        neg = torch.tensor([m for m in range(full.shape[1]) if m not in pos], dtype=torch.long)
        for y in pos:
            z = full[b, neg] - full[b, y]
            nll.append(float(torch.log1p(torch.exp(z).sum())))
            ove.append(float(torch.nn.functional.softplus(z).sum()))
    return float(np.mean(nll)), float(np.mean(ove))


def test_hard_columns_reuse_sampled_ones_append_the_rest_and_leave_positives_out() -> None:
    k = 10
    table = np.full((k, 3), -1, dtype=np.int64)
    table[2] = [5, 7, 3]  # 3 is the row's other positive: never its negative
    table[3] = [2, 9, 8]  # 2 likewise; 9 is sampled, 8 is not
    cand = _hard_candidates([[2, 3]], table, k, [1, 5, 9], [math.log(k / 3)] * 3, 3, 1)
    ids = cand.label_ids.tolist()
    assert len(ids) == len(set(ids)) and set(ids) == {1, 5, 9, 2, 3, 7, 8}
    assert cand.hard_keep is not None and cand.hard_cols is not None and cand.masked is not None
    assert cand.hard_keep.tolist() == [[True, True, False], [False, True, True]]
    got = [[ids[c] for c, keep in zip(cols, keeps, strict=True) if keep]
           for cols, keeps in zip(cand.hard_cols.tolist(), cand.hard_keep.tolist(), strict=True)]
    assert got == [[5, 7], [9, 8]]
    # (pair, sampled column): pair 0 leaves 5 to its hard group, pair 1 leaves 9
    masked = {(p, ids[j]) for p, j in cand.masked.t().tolist()}
    assert masked == {(0, 5), (1, 9)}


def test_the_columns_a_step_adds_do_not_grow_with_the_label_count() -> None:
    """At most k hard columns a positive pair, whatever K (the step stays flat in K)."""
    for k in (1_000, 1_000_000):
        rng = np.random.default_rng(0)
        rows = [[int(y)] for y in rng.integers(0, k, 64)]
        table = rng.integers(0, k, (k, 8))
        cand = _hard_candidates(rows, table, k, sorted(set(rng.integers(0, k, 32).tolist())),
                                [0.0] * len(set(rng.integers(0, k, 32).tolist())), 32, 1)
        assert cand.label_ids.numel() <= 32 + 64 + 64 * 8


def test_hard_negatives_change_nothing_when_every_label_is_sampled() -> None:
    hard = HardNegatives(5, 2, 1)
    hard.table = torch.tensor([[1, 2]] * 5)
    ptr, ind = _labels([[0], [3]])
    cand = sampled_candidates(ptr, ind, _Fixed(5, [0, 1, 2, 3, 4], [0.0] * 5), 5, 5)  # type: ignore[arg-type]
    hard.extend(cand, ind)
    assert cand.hard_cols is None and cand.label_ids.numel() == 5
    assert not HardNegatives(5, 2, 1, negatives=5).due(1, 1)  # and nothing is mined for it
    assert HardNegatives(5, 2, 1, negatives=4).due(1, 1)


# ------------------------------------------------------------------------------------ the bound

_ROWS = st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=2, unique=True), min_size=1, max_size=3)


def _table(k: int, width: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    table = np.stack([rng.permutation([m for m in range(k) if m != y])[:width] for y in range(k)])
    table[rng.random(table.shape) < 0.2] = -1  # some pairs have fewer
    return table.astype(np.int64)


@settings(max_examples=25, deadline=None)
@given(rows=_ROWS, m=st.integers(1, 4), width=st.integers(1, 3), seed=st.integers(0, 10_000))
def test_uniform_pairs_with_hard_negatives_are_unbiased_for_the_ove_bound(
        rows: list[list[int]], m: int, width: int, seed: int) -> None:
    """G = 1: the mean over every M-subset of K (each as likely) is the one-vs-each sum itself."""
    k = 6
    full = torch.randn(len(rows), k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    table = _table(k, width, seed)
    draws = [_loss(_hard_candidates(rows, table, k, list(s), [math.log(k / m)] * m, m, 1), full)
             for s in itertools.combinations(range(k), m)]
    nll, ove = _exact(full, rows)
    assert np.mean(draws) == pytest.approx(ove, rel=1e-5, abs=1e-7)
    assert np.mean(draws) >= nll - 1e-7


@settings(max_examples=25, deadline=None)
@given(rows=_ROWS, width=st.integers(1, 3), seed=st.integers(0, 10_000))
def test_unigram_pairs_with_hard_negatives_are_unbiased_for_the_ove_bound(
        rows: list[list[int]], width: int, seed: int) -> None:
    """G = 1, M = 2 i.i.d. draws from an uneven proposal: every ordered pair of draws, by its probability."""
    k, m = 6, 2
    gen = torch.Generator().manual_seed(seed)
    full = torch.randn(len(rows), k, generator=gen, dtype=torch.float64)
    q = np.random.default_rng(seed).uniform(0.2, 1.0, k)
    q /= q.sum()
    table = _table(k, width, seed)
    expect = 0.0
    for draw in itertools.product(range(k), repeat=m):
        ids, counts = np.unique(draw, return_counts=True)
        logw = (np.log(counts) - math.log(m) - np.log(q[ids])).tolist()
        cand = _hard_candidates(rows, table, k, ids.tolist(), logw, m, 1)
        expect += float(np.prod(q[list(draw)])) * _loss(cand, full)
    assert expect == pytest.approx(_exact(full, rows)[1], rel=1e-5, abs=1e-7)


@settings(max_examples=25, deadline=None)
@given(rows=_ROWS, m=st.integers(2, 4), width=st.integers(1, 3), seed=st.integers(0, 10_000))
def test_grouped_with_hard_negatives_stays_a_bound_between_softmax_and_ove(
        rows: list[list[int]], m: int, width: int, seed: int) -> None:
    """G = M (one sampled group, so no order to average over): the mean over every M-subset lies between
    −log p(y|x) and the one-vs-each sum, and with every label sampled it is −log p exactly."""
    k = 6
    full = torch.randn(len(rows), k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2
    table = _table(k, width, seed)
    draws = [_loss(_hard_candidates(rows, table, k, list(s), [math.log(k / m)] * m, m, m), full)
             for s in itertools.combinations(range(k), m)]
    nll, ove = _exact(full, rows)
    assert nll - 1e-7 <= np.mean(draws) <= ove + 1e-7


# ------------------------------------------------------------------------------------ a run learns

K, D = 300, 600


@pytest.fixture(scope="module")
def data() -> tuple[Dataset, Dataset]:
    return synth_dataset(K, D, 4000, seed=5), synth_dataset(K, D, 600, seed=5, part=1)


def test_a_run_with_hard_negatives_learns_and_mines_every_few_epochs(
        data: tuple[Dataset, Dataset], monkeypatch: pytest.MonkeyPatch) -> None:
    mined: list[int] = []
    refresh = HardNegatives.refresh

    def counted(self: HardNegatives, head: torch.Tensor, counts: np.ndarray) -> None:
        mined.append(1)
        refresh(self, head, counts)

    monkeypatch.setattr(HardNegatives, "refresh", counted)
    base: dict[str, Any] = {"dim": 32, "epochs": 5, "batch_size": 100, "negatives": 32, "group_size": 16,
                            "seed": 1}
    with_hard = train(TrainParams(**base, hard_negatives=8, hard_every=2), *data, out_dir=None,
                      hooks=QuietHooks())
    assert len(mined) == 2  # epochs 2 and 4 (1-based): mined from a trained head, every 2 epochs
    plain = train(TrainParams(**base), *data, out_dir=None, hooks=QuietHooks())
    assert with_hard.metrics["p@1"] > 0.5, with_hard.metrics
    assert with_hard.metrics["p@1"] >= plain.metrics["p@1"] - 0.03, (with_hard.metrics, plain.metrics)
    assert with_hard.final_loss != plain.final_loss  # the option changed the computation


def test_a_resumed_run_keeps_the_mined_table(data: tuple[Dataset, Dataset], tmp_path: Path) -> None:
    """Stopped in its last epoch and resumed from a checkpoint, the run ends where the whole run did: the
    checkpoint holds the table mined at that epoch's start (without it the rest would train without)."""
    params = TrainParams(dim=16, epochs=3, batch_size=200, negatives=16, group_size=8, hard_negatives=4,
                         seed=2, dropout=0.2)
    whole = train(params, data[0], None, out_dir=tmp_path / "whole", hooks=QuietHooks())
    steps = whole.steps

    class StopAt(QuietHooks):
        calls = 0

        def should_stop(self) -> bool:
            self.calls += 1
            return self.calls > steps - 4  # in the last epoch, after the checkpoint at steps - 6

    ckpt = tmp_path / "ckpt"
    with pytest.raises(TrainingCancelled):
        train(params, data[0], None, out_dir=None, hooks=StopAt(), checkpoint_dir=ckpt, checkpoint_every=3)
    resumed = train(params, data[0], None, out_dir=tmp_path / "resumed", hooks=QuietHooks(),
                    checkpoint_dir=ckpt, checkpoint_every=3)
    assert resumed.resumed_from_step is not None and resumed.resumed_from_step > steps * 2 // 3
    a, b = load_artifact(tmp_path / "whole"), load_artifact(tmp_path / "resumed")
    np.testing.assert_allclose(a.head_weight, b.head_weight, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------ the options


def test_params_defaults_round_trip_and_refusals() -> None:
    assert (TrainParams().hard_negatives, TrainParams().hard_every) == (0, 1)
    given_ = TrainParams(hard_negatives=16, hard_every=2)
    back = TrainParams.from_json_dict(json.loads(json.dumps(given_.to_json_dict())))
    assert (back.hard_negatives, back.hard_every) == (16, 2)
    old = TrainParams().to_json_dict()
    del old["hard_negatives"], old["hard_every"]  # saved before the fields: no hard negatives
    assert TrainParams.from_json_dict(old).hard_negatives == 0
    bad: dict[str, Any]
    for bad in ({"hard_negatives": -1}, {"hard_negatives": 5000}, {"hard_every": 0}):
        with pytest.raises(ValidationError) as refused:
            TrainParams.model_validate(bad)
        assert [e["loc"] for e in refused.value.errors()] == [(next(iter(bad)),)]
    with pytest.raises(ValidationError, match="hard_negatives 8 needs loss 'ove'"):
        TrainParams(hard_negatives=8, loss="softmax")
    with pytest.raises(ValidationError, match="nproc_per_node 1"):
        TrainParams(hard_negatives=8, nproc_per_node=2)


FAST = ["--dim", "8", "--batch-size", "100", "--negatives", "16", "--group-size", "8", "--epochs", "2",
        "--quiet"]


@pytest.fixture(scope="module")
def xc_file(tmp_path_factory: pytest.TempPathFactory, data: tuple[Dataset, Dataset]) -> Path:
    path = tmp_path_factory.mktemp("hard") / "train.txt"
    write_xc(path, data[0].X, data[0].Y)
    return path


def test_cli_flags_reach_the_saved_params_and_a_bad_value_is_named(
        xc_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m"
    assert main(["train", "--train", str(xc_file), "--out", str(out), "--hard-negatives", "4",
                 "--hard-every", "2", *FAST]) == 0
    saved = json.loads((out / "config.json").read_text())["params"]
    assert (saved["hard_negatives"], saved["hard_every"]) == (4, 2)
    assert main(["train", "--train", str(xc_file), "--out", str(tmp_path / "n"), "--hard-negatives", "-3",
                 *FAST]) == 2
    err = capsys.readouterr().err
    assert "--hard-negatives: Input should be greater than or equal to 0" in err, err
    assert "Traceback" not in err and not (tmp_path / "n").exists()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with sqlite_server(tmp_path_factory.mktemp("hard_srv")) as server:
        yield server


def test_a_job_trains_with_hard_negatives_and_a_bad_value_gets_a_422(srv: Server, xc_file: Path) -> None:
    data = srv.upload(xc_file)["id"]
    tiny: dict[str, Any] = {"dim": 8, "epochs": 2, "batch_size": 100, "negatives": 16, "group_size": 8}
    job_id = srv.submit({"model": "hard", "train_dataset": data,
                         "params": {**tiny, "hard_negatives": 4, "hard_every": 1}})
    job = srv.wait(job_id, lambda j: j["state"] == "succeeded", 240, "the job to succeed")
    assert (job["params"]["hard_negatives"], job["params"]["hard_every"]) == (4, 1)
    config = json.loads((srv.models_dir / "hard" / str(job["model_version"]) / "config.json").read_text())
    assert config["params"]["hard_negatives"] == 4
    for params, loc, says in (({"hard_negatives": -1}, ["body", "params", "hard_negatives"], "greater than"),
                              ({"hard_every": 0}, ["body", "params", "hard_every"], "greater than"),
                              ({"hard_negatives": 4, "loss": "softmax"}, None, "needs loss 'ove'")):
        r = srv.client.post("/v1/jobs", json={"model": "m", "train_dataset": data, "params": params})
        assert r.status_code == 422, r.text
        assert says in r.text and (loc is None or any(e["loc"] == loc for e in r.json()["detail"])), r.text
