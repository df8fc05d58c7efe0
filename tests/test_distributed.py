"""The label-sharded step: unbiased by enumeration, exact with all negatives, and real ranks on loopback.

Multi-rank tests start 2 ranks with the trainer's own launcher (torch's elastic launcher, gloo on
127.0.0.1) and compare with the same step run in this process as one rank.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.distributed as dist

from tests.test_losses import _labels, direct_ove_bound, direct_softmax_nll
from trainer.collectives import join_group, launch, rank_device
from trainer.errors import ParamsError
from trainer.label_shards import LabelShard, shard_bounds, shard_candidates
from trainer.losses import CandidateBatch, get_loss, ove_loss
from trainer.model import ModelShape, XCModel
from trainer.negatives import NegativeSampler, SampledNegatives
from trainer.optim import RowAdagrad
from trainer.params import TrainParams
from trainer.step import EpochData, Stepper


class FixedDraw(NegativeSampler):
    """A sampler whose next draw is set by the test: enumeration visits every outcome with its law."""

    def __init__(self, n_labels: int, kind: str, counts: np.ndarray | None = None) -> None:
        super().__init__(n_labels, kind, 0.75, counts)
        self.outcome: list[int] = []

    def draw(self, m: int, device: torch.device | str = "cpu") -> SampledNegatives:
        draws = torch.tensor(self.outcome, dtype=torch.int64)
        if self.kind == "uniform":
            ids = torch.sort(draws).values
            logw = torch.full((ids.numel(),), math.log(self.n_labels / m))
        else:
            ids, counts = torch.unique(draws, return_counts=True)
            logw = torch.log(counts.float()) - math.log(m) - self.log_q(ids)
        return SampledNegatives(ids=ids, log_weight=logw, n_draws=m)


def _sharded_ove(
    scores: torch.Tensor,
    rows: list[list[int]],
    shards: list[LabelShard],
    samplers: Sequence[NegativeSampler],
    m: int,
    group: int,
) -> float:
    """Σ over shards of each rank's loss, as the step computes it (scores from a full [B, K] matrix)."""
    ptr, ind = _labels(rows)
    pos = scores[torch.repeat_interleave(torch.arange(len(rows)), ptr[1:] - ptr[:-1]), ind]
    total = 0.0
    for shard, sampler in zip(shards, samplers, strict=True):
        sc = shard_candidates(ptr, ind, shard, sampler, m, group)
        cols = shard.lo + sc.cand.label_ids[: sc.cand.n_sampled]
        batch = CandidateBatch(cand=sc.cand, scores=scores[:, cols], h=scores.new_zeros(len(rows), 1),
                               pos_scores=pos)
        total += ove_loss(batch).item()
    return total


ROWS = [[2], [0, 5], [6, 1], [3]]
K = 7


@pytest.mark.parametrize("kind", ["uniform", "unigram"])
def test_sharded_ove_estimate_is_unbiased_by_enumeration(kind: str) -> None:
    """Every rank's draws enumerated with their probabilities: the mean of Σ_r loss_r is the OVE bound,
    the value one rank's estimate has as its mean."""
    torch.manual_seed(3)
    s = torch.randn(len(ROWS), K, dtype=torch.float64) * 2
    counts = np.array([5.0, 0.0, 2.0, 9.0, 1.0, 0.0, 3.0])
    m, world = 4, 2
    shards = [shard_bounds(K, world, r) for r in range(world)]
    samplers = [FixedDraw(sh.size, kind, counts[sh.lo : sh.hi] if kind == "unigram" else None)
                for sh in shards]

    def outcomes(shard: LabelShard, sampler: NegativeSampler) -> list[tuple[tuple[int, ...], float]]:
        mr = shard.negatives(m)
        if kind == "uniform":
            subsets = list(itertools.combinations(range(shard.size), mr))
            return [(sub, 1.0 / len(subsets)) for sub in subsets]
        q = torch.exp(sampler.log_q(torch.arange(shard.size))).double().numpy()
        return [(t, float(np.prod(q[list(t)]))) for t in itertools.product(range(shard.size), repeat=mr)]

    expected = 0.0
    both = itertools.product(outcomes(shards[0], samplers[0]), outcomes(shards[1], samplers[1]))
    for (a, pa), (b, pb) in both:
        samplers[0].outcome, samplers[1].outcome = list(a), list(b)
        expected += pa * pb * _sharded_ove(s, ROWS, shards, samplers, m, 1)
    assert expected == pytest.approx(direct_ove_bound(s, ROWS).item(), rel=1e-6)


def test_sharded_grouped_ove_has_the_expectation_of_a_bound_within_shards() -> None:
    """G > 1: the mean of Σ_r loss_r is Σ_r (K_r/M_r) Σ_groups E[log(1 + a_g)] over random groups of each
    shard (enumerated), a bound between −log p and OVE; the step's estimates average to it."""
    torch.manual_seed(5)
    k, m, group, world = 9, 6, 2, 2
    s = torch.randn(len(ROWS), k, dtype=torch.float64) * 2
    shards = [shard_bounds(k, world, r) for r in range(world)]
    expected_pairs = []
    for b, pos in enumerate(ROWS):
        for y in pos:
            acc = 0.0
            for sh in shards:
                mr = sh.negatives(m)
                for size in [min(group, mr - start) for start in range(0, mr, group)]:
                    subs = list(itertools.combinations(range(sh.lo, sh.hi), size))
                    acc += sh.size / mr * sum(
                        math.log1p(sum(math.exp(float(s[b, j] - s[b, y])) for j in sub if j not in pos))
                        for sub in subs
                    ) / len(subs)
            expected_pairs.append(acc)
    expected = float(np.mean(expected_pairs))
    assert direct_softmax_nll(s, ROWS).item() < expected < direct_ove_bound(s, ROWS).item()
    samplers = [NegativeSampler(sh.size, "uniform", seed=20 + i) for i, sh in enumerate(shards)]
    draws = [_sharded_ove(s, ROWS, shards, samplers, m, group) for _ in range(3000)]
    mean, sem = float(np.mean(draws)), float(np.std(draws) / math.sqrt(len(draws)))
    assert abs(mean - expected) < 5 * sem, (mean, expected, sem)


def test_shards_cover_the_labels_and_split_the_negatives() -> None:
    for k, world in [(7, 2), (10, 3), (5, 5), (1000, 7)]:
        shards = [shard_bounds(k, world, r) for r in range(world)]
        assert shards[0].lo == 0 and shards[-1].hi == k
        assert all(a.hi == b.lo for a, b in itertools.pairwise(shards))
        assert max(sh.size for sh in shards) - min(sh.size for sh in shards) <= 1
        assert sum(sh.negatives(k) for sh in shards) == k  # M ≥ K: every label once


# ------------------------------------------------------------------------------------ real ranks

N_ROWS, N_FEAT, N_LAB = 10, 25, 11


def _toy() -> tuple[sp.csr_matrix, sp.csr_matrix]:
    rng = np.random.default_rng(0)
    x = sp.random(N_ROWS, N_FEAT, density=0.3, format="csr", random_state=1, dtype=np.float32)
    y = sp.lil_matrix((N_ROWS, N_LAB), dtype=np.float32)
    for i in range(N_ROWS):
        for j in rng.choice(N_LAB, size=int(rng.integers(1, 4)), replace=False):
            y[i, j] = 1.0
    return sp.csr_matrix(x), sp.csr_matrix(y)


class RecordingAdagrad(RowAdagrad):
    """Adagrad that keeps each step's gradients by table row (global label ids for the head)."""

    def __init__(self, lo: int) -> None:
        super().__init__()
        self.lo = lo
        self.seen: list[dict[str, dict[int, np.ndarray]]] = []

    def step(self, name: str, param: torch.Tensor, grad: torch.Tensor, lr: float,
             rows: torch.Tensor | None = None, weight_decay: float = 0.0) -> None:
        ids = torch.arange(param.shape[0]) if rows is None else rows
        offset = self.lo if name == "head" else 0
        if name == "input":
            self.seen.append({})
        lines, ids = grad.reshape(len(ids), -1).cpu(), ids.cpu()
        self.seen[-1][name] = {int(i) + offset: g.numpy().copy() for i, g in zip(ids, lines, strict=True)}
        super().step(name, param, grad, lr, rows, weight_decay)


def run_steps(options: dict[str, Any], device: str = "cpu") -> dict[str, Any]:
    """Three steps of the real Stepper on the toy data, as this process's rank; returns what it saw."""
    torch.set_num_threads(1)
    params = TrainParams(dim=6, dropout=0.0, batch_size=N_ROWS, optimizer="adagrad", precision="fp32",
                         **options)
    group = join_group(torch.device(device))
    dev = rank_device(torch.device(device), group)
    shard = shard_bounds(N_LAB, group.world, group.rank)
    x, y = _toy()
    shape = ModelShape(n_features=N_FEAT, n_labels=N_LAB, dim=6, encoder="mlp", hidden=1, dropout=0.0)
    torch.manual_seed(0)  # the hidden layer's init, as train() seeds it on every rank
    model = XCModel(shape, init_scale=1.0, seed=3, label_rows=(shard.lo, shard.hi)).to(dev)
    sampler = NegativeSampler(shard.size, "uniform", seed=9)
    stepper = Stepper(model, get_loss(params.loss), params, sampler, group, shard)
    stepper.table_optim = RecordingAdagrad(shard.lo)
    ep = EpochData(x, y, np.arange(N_ROWS))
    losses = [float(stepper.step(ep, 0, N_ROWS, 0.05)) for _ in range(3)]
    hidden = {k: v.detach().cpu().numpy().copy() for k, v in model.hidden.state_dict().items()}
    return {"rank": group.rank, "losses": losses, "grads": stepper.table_optim.seen, "hidden": hidden,
            "input": model.input_weight.detach().cpu().numpy().copy(),
            "backend": dist.get_backend() if group.world > 1 else None, "device": str(model.head.device)}


EXACT_CASES: dict[str, dict[str, Any]] = {
    "softmax": {"loss": "softmax"},
    "ove-all-negatives": {"loss": "ove", "negatives": 1000, "group_size": 1},
}


def run_steps_all_ranks(out: str, device: str = "cpu") -> None:
    for name, options in EXACT_CASES.items():
        result = run_steps(options, device)
        box = np.array([result], dtype=object)
        np.save(Path(out) / f"{name}-rank{result['rank']}.npy", box, allow_pickle=True)


def test_two_ranks_give_the_loss_and_gradients_of_one(tmp_path: Path) -> None:
    """With every label a candidate the sharded step is exact: 2 ranks' losses, head and encoder
    gradients and updated weights equal one process's to float rounding, step after step (exact softmax,
    and OVE over all negatives)."""
    launch(2, run_steps_all_ranks, (str(tmp_path),), run_id="test-exact")
    _same_as_one_rank(tmp_path, "cpu", "gloo")


# NCCL runs one rank a GPU; this machine's CI has none, so the test says so rather than passing
NO_TWO_GPUS = (
    "no CUDA device (torch.cuda.is_available() is False): the NCCL path of 2 ranks cannot run here"
    if not torch.cuda.is_available()
    else f"NCCL runs one rank a GPU: 2 ranks need 2 CUDA devices, found {torch.cuda.device_count()}"
)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason=NO_TWO_GPUS)
def test_two_ranks_on_nccl_give_the_loss_and_gradients_of_one_gpu(tmp_path: Path) -> None:
    """The same exact-step comparison with the ranks on two GPUs: the group is NCCL, every tensor a
    collective sees is on the rank's own GPU, and the results equal one GPU's."""
    launch(2, run_steps_all_ranks, (str(tmp_path), "cuda"), run_id="test-nccl")
    _same_as_one_rank(tmp_path, "cuda", "nccl")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason=NO_TWO_GPUS)
@pytest.mark.timeout(600)
def test_training_on_two_gpus_writes_the_model_of_one(tmp_path: Path) -> None:
    """`train` with device cuda on 2 ranks (NCCL): checkpoints, the merged artifact and the sharded
    top-k run from GPU tensors; the model loads and scores like a one-GPU model of the same data."""
    from trainer.artifact import load_artifact
    from trainer.metrics import evaluate_topk
    from trainer.synth import synth_dataset
    from trainer.train import train

    tr, te = synth_dataset(300, 500, 3000, seed=5), synth_dataset(300, 500, 300, seed=5, part=1)
    base = TrainParams(dim=32, epochs=3, device="cuda", seed=1, dropout=0.0)  # all negatives: exact steps
    p1 = {}
    for ranks in (1, 2):
        out = tmp_path / f"r{ranks}"
        params = base.model_copy(update={"nproc_per_node": ranks})
        res = train(params, tr, te, out_dir=out, checkpoint_dir=tmp_path / f"ckpt{ranks}", checkpoint_every=5)
        loaded = load_artifact(out)
        top, _ = loaded.topk(loaded.featurizer.transform(te), 5)
        p1[ranks] = evaluate_topk(top, te.Y, None)["p@1"]
        assert abs(p1[ranks] - res.metrics["p@1"]) < 1e-6
        assert list(loaded.model.head.shape) == [300, 33]
    assert p1[2] > p1[1] - 0.03, p1


@pytest.mark.parametrize(("device", "backend"), [("cuda", "nccl"), ("cpu", "gloo")])
def test_a_rank_joins_with_nccl_on_its_own_gpu_when_it_trains_on_cuda(
    monkeypatch: pytest.MonkeyPatch, device: str, backend: str
) -> None:
    """Runs without a GPU: the choice itself. A rank of a CUDA run joins the group with NCCL and takes the
    GPU of its local rank (so every tensor it hands a collective is there); a CPU rank joins with gloo."""
    calls: dict[str, Any] = {}
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda b, **_: calls.__setitem__("backend", b))
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: calls.__setitem__("gpu", i))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    threads = torch.get_num_threads()
    try:
        group = join_group(torch.device(device))
        assert (group.rank, group.world, group.local_rank) == (1, 2, 1)
        assert calls == ({"backend": "nccl", "gpu": 1} if device == "cuda" else {"backend": "gloo"})
        want = torch.device("cuda", 1) if device == "cuda" else torch.device("cpu")
        assert rank_device(torch.device(device), group) == want
        if device == "cuda":  # a machine with fewer GPUs than local ranks: refused before NCCL is started
            calls.clear()
            monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
            with pytest.raises(ParamsError, match="needs CUDA device 1, but this machine has 1"):
                join_group(torch.device("cuda"))
            assert calls == {}
    finally:
        torch.set_num_threads(threads)


def _same_as_one_rank(tmp_path: Path, device: str, backend: str) -> None:
    for name, options in EXACT_CASES.items():
        one = run_steps(options, device)
        ranks = [np.load(tmp_path / f"{name}-rank{r}.npy", allow_pickle=True)[0] for r in range(2)]
        for r in ranks:
            assert r["backend"] == backend
            assert r["device"] == (f"cuda:{r['rank']}" if device == "cuda" else "cpu")
            np.testing.assert_allclose(r["losses"], one["losses"], rtol=1e-5)
            np.testing.assert_allclose(r["input"], one["input"], rtol=1e-5, atol=1e-6)
            for key, value in one["hidden"].items():
                np.testing.assert_allclose(r["hidden"][key], value, rtol=1e-4, atol=1e-6)
        for step in range(3):
            merged = {**ranks[0]["grads"][step]["head"], **ranks[1]["grads"][step]["head"]}
            assert sorted(merged) == list(range(N_LAB))
            for label, g in one["grads"][step]["head"].items():
                np.testing.assert_allclose(merged[label], g, rtol=1e-4, atol=1e-6)
            for r in ranks:  # the replicated input table: the same summed gradient on every rank
                assert sorted(r["grads"][step]["input"]) == sorted(one["grads"][step]["input"])
                for row, g in one["grads"][step]["input"].items():
                    np.testing.assert_allclose(r["grads"][step]["input"][row], g, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------------------------ checkpoints


def test_a_checkpoint_reshards_to_any_number_of_ranks(tmp_path: Path) -> None:
    """A one-rank checkpoint read by each rank of two: its rows of the head and of their optimizer
    state, the replicated tables whole, and the step position."""
    from trainer.checkpoints import load_checkpoint, save_checkpoint
    from trainer.collectives import RankGroup

    x, y = _toy()
    params = TrainParams(dim=6, dropout=0.0, batch_size=N_ROWS, negatives=4)
    shape = ModelShape(n_features=N_FEAT, n_labels=N_LAB, dim=6)

    def stepper(group: RankGroup) -> Stepper:
        shard = shard_bounds(N_LAB, group.world, group.rank)
        model = XCModel(shape, seed=3, label_rows=(shard.lo, shard.hi))
        sampler = NegativeSampler(shard.size, "uniform", seed=9)
        return Stepper(model, get_loss("ove"), params, sampler, group, shard)

    full = stepper(RankGroup())
    ep = EpochData(x, y, np.arange(N_ROWS))
    for _ in range(3):
        full.step(ep, 0, N_ROWS, 0.05)
    save_checkpoint(tmp_path, full, 3, 0, 1, {})
    for rank in range(2):
        part = stepper(RankGroup(rank, 2))
        meta = load_checkpoint(tmp_path, part)
        assert meta is not None and meta["step"] == 3 and meta["world"] == 1
        lo, hi = part.shard.lo, part.shard.hi
        torch.testing.assert_close(part.model.head, full.model.head[lo:hi])
        torch.testing.assert_close(part.model.input_weight, full.model.input_weight)
        for key in ("head.mv", "head.last"):
            torch.testing.assert_close(part.optim.state[key], full.optim.state[key][lo:hi])
        torch.testing.assert_close(part.optim.state["head.step"], full.optim.state["head.step"])


def _rank_pids(proc: Any) -> dict[int, int]:
    """Local rank -> pid of the workers the launcher spawned under `proc`, in the order it started them
    (a worker sets its RANK variables after exec, so /proc shows none)."""
    import psutil

    workers = [
        c for c in psutil.Process(proc.pid).children(recursive=True)
        if any("spawn_main" in part for part in c.cmdline())
    ]
    workers.sort(key=lambda c: (c.create_time(), c.pid))
    return {rank: c.pid for rank, c in enumerate(workers)}


def _wait_for_checkpoint(ckpt: Path, after: int, proc: Any, timeout: float = 240.0) -> int:
    import json
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        latest = ckpt / "latest.json"
        if latest.exists():
            step = int(json.loads(latest.read_text())["step"])
            if step > after:
                return step
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    raise AssertionError("no new checkpoint in time")


@pytest.mark.timeout(900)  # three launches of real processes; minutes on a loaded machine
def test_a_killed_rank_fails_the_run_and_it_resumes_on_another_number_of_ranks(tmp_path: Path) -> None:
    """Real kills: rank 1 of 2 killed mid-run fails the run with a clear error; the run resumes from its
    sharded checkpoint on 1 rank (re-shard 2 -> 1), is killed again, and finishes on 2 ranks (1 -> 2)."""
    import os
    import subprocess
    import sys

    from trainer.synth import write_synth

    train_path, test_path = tmp_path / "train.txt", tmp_path / "test.txt"
    write_synth(train_path, 40, 300, 2000, seed=2, test_path=test_path, test_rows=300)
    ckpt, out = tmp_path / "ckpt", tmp_path / "model"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def start(nproc: int) -> subprocess.Popen[str]:
        cmd = [sys.executable, "-m", "service.cli", "train", "--train", str(train_path),
               "--test", str(test_path), "--out", str(out), "--checkpoint-dir", str(ckpt),
               "--checkpoint-every", "10",
               "--nproc-per-node", str(nproc), "--dim", "16", "--epochs", "4", "--batch-size", "64",
               "--negatives", "16", "--group-size", "4", "--eval-every", "0"]
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    procs: list[subprocess.Popen[str]] = []

    def start_tracked(nproc: int) -> subprocess.Popen[str]:
        procs.append(start(nproc))
        return procs[-1]

    try:
        _kill_resume_finish(start_tracked, ckpt, out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def _kill_resume_finish(start: Any, ckpt: Path, out: Path) -> None:
    import json
    import os
    import signal

    from trainer.artifact import load_artifact

    proc = start(2)
    killed_at = _wait_for_checkpoint(ckpt, 10, proc)
    pids = _rank_pids(proc)
    assert sorted(pids) == [0, 1], pids
    os.kill(pids[1], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "rank 1 of 2 failed" in err, err[-2000:]
    assert not out.exists()
    latest = json.loads((ckpt / "latest.json").read_text())["checkpoint"]
    manifest = json.loads((ckpt / latest / "manifest.json").read_text())
    assert manifest["world"] == 2 and [s["hi"] for s in manifest["shards"]] == [20, 40]
    assert manifest["step"] >= killed_at

    proc = start(1)
    resumed_at = _wait_for_checkpoint(ckpt, manifest["step"], proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert resumed_at > manifest["step"]

    proc = start(2)
    stdout, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-3000:]
    assert "resumed from step" in err
    model = load_artifact(out)
    assert model.n_labels == 40
    assert json.loads(stdout.strip().splitlines()[-1])["p@1"] > 0.5


# ------------------------------------------------------------------------- train(..., nproc_per_node=2)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


class StopAfter:
    """Hooks of the caller of `train`: collect what the ranks report, ask to stop after some progress."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.logs: list[str] = []
        self.progress: list[Any] = []
        self.stop_after = stop_after

    def on_progress(self, progress: Any) -> None:
        self.progress.append(progress)

    def on_log(self, message: str) -> None:
        self.logs.append(message)

    def should_stop(self) -> bool:
        return self.stop_after is not None and len(self.progress) >= self.stop_after


@pytest.mark.skipif(not (DATA / "bibtex_train.txt").exists(), reason="needs ../shared/data (Bibtex)")
@pytest.mark.timeout(900)  # two Bibtex trainings, one on 2 launched ranks
def test_two_ranks_reach_one_ranks_precision_on_bibtex(tmp_path: Path) -> None:
    """The default parameters: 2 ranks (the same global batch, the label head sharded) land within 1 point
    of P@1 of one process; the caller's hooks see rank 0's epochs, and the merged artifact loads."""
    from trainer.artifact import load_artifact
    from trainer.data import read_dataset
    from trainer.train import train

    train_ds = read_dataset(DATA / "bibtex_train.txt")
    test_ds = read_dataset(DATA / "bibtex_test.txt", label_names=train_ds.label_names)
    one = train(TrainParams(), train_ds, test_ds, out_dir=None)
    hooks = StopAfter()
    two = train(TrainParams(nproc_per_node=2), train_ds, test_ds, out_dir=tmp_path / "m", hooks=hooks)
    assert abs(two.metrics["p@1"] - one.metrics["p@1"]) <= 0.01, (one.metrics["p@1"], two.metrics["p@1"])
    assert two.steps == one.steps
    assert any("2 ranks of 80 labels" in m for m in hooks.logs), hooks.logs
    assert [p.epoch for p in hooks.progress if p.metrics is not None] == list(range(1, 8))
    loaded = load_artifact(tmp_path / "m")
    assert loaded.n_labels == 159 and loaded.head_weight.shape == (159, 512)
    x = loaded.featurizer.transform(test_ds)
    top, _ = loaded.topk(x, 1)
    from trainer.metrics import evaluate_topk

    assert evaluate_topk(top, sp.csr_matrix(test_ds.Y, dtype=np.float32), None)["p@1"] == pytest.approx(
        two.metrics["p@1"]
    )


def test_a_stop_request_stops_every_rank(tmp_path: Path) -> None:
    """The caller's should_stop() (a job cancel) reaches the ranks: TrainingCancelled, no artifact."""
    from trainer.errors import TrainingCancelled
    from trainer.synth import synth_dataset
    from trainer.train import train

    ds = synth_dataset(30, 200, 3000, seed=1)
    params = TrainParams(dim=8, epochs=200, batch_size=32, negatives=8, group_size=4, nproc_per_node=2)
    hooks = StopAfter(stop_after=2)
    with pytest.raises(TrainingCancelled):
        train(params, ds, None, out_dir=tmp_path / "m", hooks=hooks)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("budget", [1 << 23, 1 << 12, 3000])
def test_topk_in_label_slices_is_the_exact_topk(budget: int) -> None:
    """Many labels: blocks of rows scored against slices of the head keep a running top-k that equals the
    top-k of the full score matrix (what evaluation of a 10^7-label shard relies on)."""
    model = XCModel(ModelShape(n_features=40, n_labels=5000, dim=6), seed=1)
    with torch.no_grad():
        model.head.normal_()
    x = sp.random(300, 40, density=0.2, format="csr", dtype=np.float32, random_state=0)
    ids, vals = model.topk(x, 7, budget=budget)
    want_v, want_i = torch.topk(model.score(model.encode(x)), 7, dim=1)
    np.testing.assert_array_equal(ids, want_i.numpy())
    np.testing.assert_allclose(vals, want_v.numpy(), rtol=1e-6)
