"""The training loop: featurize, sample, score candidates, update touched rows, evaluate, checkpoint.

`train(...)` is the one entry point for the CLI, the job worker and the benchmarks; callers observe and
stop it through `TrainHooks`. Checkpoints (safetensors + JSON, never pickle) hold model, optimizer and RNG
state plus the position in the epoch, so a resumed run continues the same step sequence.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp
import torch

from trainer import metrics as xc_metrics
from trainer.ahead import made_ahead
from trainer.artifact import prepare_out_dir
from trainer.capacity import check_fits
from trainer.checkpoints import load_checkpoint, save_checkpoint
from trainer.collectives import RankGroup, in_launched_rank, join_group, rank_device
from trainer.continual import (
    WarmStart,
    check_out_dir,
    row_fingerprints,
    split_metrics,
    warm_start,
)
from trainer.data import Dataset, check_compatible, label_counts, label_names_of, unseen_labels_note
from trainer.errors import ParamsError, TrainingCancelled
from trainer.hard_negatives import HardNegatives
from trainer.label_shards import (
    LabelShard,
    check_shardable,
    shard_bounds,
    shard_candidates,
    shard_softmax_loss,
    shard_topk,
)
from trainer.label_tower import (
    LabelTower,
    SubsetSampler,
    TextRows,
    check_usable,
    fade_weights,
    has_label_tower,
    load_tower_gain,
    load_tower_tensors,
    materialized,
    read_stored_texts,
    save_tower,
    tower_of,
)
from trainer.losses import (
    CandidateBatch,
    Candidates,
    LossSpec,
    get_loss,
    masked_negative_pairs,
    pair_weights,
    row_pair_weights,
)
from trainer.model import ModelShape, XCModel
from trainer.negatives import NegativeSampler
from trainer.optim import RowAdagrad, RowAdam
from trainer.params import TrainParams
from trainer.transfer import to_device

log = logging.getLogger("ovex.train")

EVAL_K = 5
PROGRESS_EVERY_S = 0.5


@dataclass
class Progress:
    epoch: int  # 1-based epoch in progress (or just finished)
    epochs: int
    step: int  # global steps done
    steps_total: int
    examples_per_s: float
    loss: float
    metrics: dict[str, float] | None = None  # set after an evaluation


class TrainHooks(Protocol):
    def on_progress(self, progress: Progress) -> None: ...

    def on_log(self, message: str) -> None: ...

    def should_stop(self) -> bool: ...


class LoggingHooks:
    """Default hooks: messages to the `ovex.train` logger, never stop."""

    def on_progress(self, progress: Progress) -> None:
        pass

    def on_log(self, message: str) -> None:
        log.info(message)

    def should_stop(self) -> bool:
        return False


class QuietHooks(LoggingHooks):
    """Hooks that say nothing: benchmarks and sweeps print one summary line per run instead."""

    def on_log(self, message: str) -> None:
        pass


class _Muted(QuietHooks):
    """Another rank's view of the caller's hooks: rank 0 alone reports, every rank obeys a stop."""

    def __init__(self, hooks: TrainHooks) -> None:
        self.hooks = hooks

    def should_stop(self) -> bool:
        return self.hooks.should_stop()


@dataclass
class TrainResult:
    out_dir: Path | None
    metrics: dict[str, float]
    steps: int
    epochs: int
    seconds: float
    examples_per_s: float
    final_loss: float
    resumed_from_step: int | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    best_epoch: int | None = None  # with params.valid_fraction > 0: the epoch whose weights were kept
    metrics_valid_p1: float | None = None  # P@1 of that epoch on the held-out training rows


# ------------------------------------------------------------------------------------ model selection


def split_validation(n_rows: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fit rows, validation rows) of the TRAINING set, a seeded random split.

    Model selection must never look at the test split, so the rows that pick the epoch are carved from
    the training data; the split depends only on (n_rows, fraction, seed), so a resumed run and a rerun
    hold out the same rows. At least one row stays on each side.
    """
    if not 0.0 < fraction < 1.0:
        raise ParamsError(f"valid_fraction must be in (0, 1), got {fraction}")
    if n_rows < 2:
        raise ParamsError("valid_fraction needs at least 2 training rows")
    n_val = min(n_rows - 1, max(1, round(n_rows * fraction)))
    perm = np.random.default_rng([seed, 0x5EED]).permutation(n_rows)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


class BestEpoch:
    """Keeps the weights of the epoch with the best validation score (early stopping / model selection).

    Why: how long to train is the regularisation that differs most between data sets (exact softmax
    peaks after 3-4 epochs on Corel5k and over-fits afterwards, Bibtex keeps improving for 15+), and a
    held-out score is a rule that transfers to unseen data where a per-set epoch count would not.
    Ties keep the earlier epoch (fewer steps, the less fitted model). `stale` counts the evaluations
    since the last improvement, for `patience`.
    """

    def __init__(self) -> None:
        self.epoch = 0  # 1-based; 0 = nothing recorded yet
        self.score = -math.inf
        self.stale = 0
        self.state: dict[str, torch.Tensor] = {}

    def update(self, epoch: int, score: float, model: torch.nn.Module) -> bool:
        """Record `epoch`'s validation score; copy the weights if it is the best so far."""
        if self.epoch == 0 or score > self.score:
            self.epoch, self.score, self.stale = epoch, score, 0
            self.state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            return True
        self.stale += 1
        return False

    def restore(self, model: torch.nn.Module) -> None:
        if self.state:
            model.load_state_dict(self.state)

    def meta(self) -> dict[str, Any]:
        return {"best_epoch": self.epoch, "best_score": self.score, "best_stale": self.stale}

    def load(self, meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        self.epoch = int(meta.get("best_epoch", 0))
        self.score = float(meta.get("best_score", -math.inf))
        self.stale = int(meta.get("best_stale", 0))
        self.state = {k[len("best.") :]: v for k, v in tensors.items() if k.startswith("best.")}


def tune_malloc() -> None:
    """Keep freed buffers in the heap (glibc): each step allocates the same few MB-sized tensors, and
    returning them to the OS every time makes the next step pay page faults (measured 5-10x slower ops)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 * 1024 * 1024)  # M_MMAP_THRESHOLD: serve blocks up to 32 MiB from the heap
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: do not hand the heap top back eagerly
        libc.mallopt(-2, 64 * 1024 * 1024)  # M_TOP_PAD
    except (OSError, AttributeError):
        pass


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ParamsError("--device cuda requested but no CUDA device is available")
    return torch.device(name)


def steps_made_ahead(device: torch.device, group: RankGroup) -> bool:
    """Whether a run's steps have their host part made ahead on a thread (`trainer.ahead`): on a GPU,
    where it overlaps the device part; not with ranks, whose collectives must stay in step order."""
    return device.type == "cuda" and group.world == 1


def lr_at(params: TrainParams, step: int, total: int) -> float:
    """Linear warmup, then cosine / linear decay to 0 (or constant)."""
    warm = int(params.warmup * total)
    if step < warm:
        return params.lr * (step + 1) / warm
    if params.schedule == "constant":
        return params.lr
    frac = (step - warm) / max(total - warm, 1)
    if params.schedule == "linear":
        return params.lr * max(0.0, 1.0 - frac)
    return params.lr * 0.5 * (1.0 + math.cos(math.pi * min(frac, 1.0)))


# ------------------------------------------------------------------------------------ featurizing


def fit_featurizer(params: TrainParams, ds: Dataset) -> Any:
    """Fit the featurizer the params ask for on the training set (saved with the model)."""
    from trainer.featurize import Featurizer

    return Featurizer.fit(
        ds,
        tfidf=params.tfidf,
        l2=params.l2,
        hash_size=params.hash_size or None,
        max_vocab=params.max_vocab,
        min_df=params.min_df,
        ngrams=params.ngrams,
    )


def _as_csr32(x: sp.spmatrix) -> sp.csr_matrix:
    out = sp.csr_matrix(x, dtype=np.float32)
    out.sort_indices()
    return out


# ------------------------------------------------------------------------------------ the step


class EpochData:
    """One epoch's shuffled CSR as host tensors, sliced by row ranges (no per-row Python); each step
    sends its slice's tensors to the training device (`trainer.transfer`)."""

    def __init__(self, x: sp.csr_matrix, y: sp.csr_matrix, perm: np.ndarray,
                 weights: np.ndarray | None = None) -> None:
        xp, yp = x[perm], y[perm]
        # per-row loss weights in epoch order (a continual run's replayed rows), or None: all equal
        self.row_weight = None if weights is None else torch.from_numpy(weights)
        self.x_ptr_np = np.asarray(xp.indptr, dtype=np.int64)
        self.y_ptr_np = np.asarray(yp.indptr, dtype=np.int64)
        self.x_ptr = torch.from_numpy(self.x_ptr_np)
        self.x_ind = torch.from_numpy(np.asarray(xp.indices, dtype=np.int64))
        self.x_val = torch.from_numpy(np.asarray(xp.data, dtype=np.float32))
        self.y_ptr = torch.from_numpy(self.y_ptr_np)
        self.y_ind = torch.from_numpy(np.asarray(yp.indices, dtype=np.int64))


@dataclass
class StepInputs:
    """What a step computes on, indices worked out on the host: this rank's rows as distinct input
    features (`features`, the table rows it gathers) with each non-zero's place among them, and the
    candidate columns of the whole batch."""

    features: torch.Tensor  # int64 [U]
    inverse: torch.Tensor  # int64 [nnz]: index into `features` of each non-zero
    offsets: torch.Tensor  # int64 [rows]: first non-zero of each row
    values: torch.Tensor  # float32 [nnz]
    cand: Candidates
    owned: torch.Tensor  # int64 [P_r]: the positive pairs whose label this rank owns (`ShardCandidates`)
    # with a label tower: the candidate labels' texts, their non-zeros indexing `features` too
    text_inverse: torch.Tensor | None = None
    text_offsets: torch.Tensor | None = None
    text_values: torch.Tensor | None = None
    text_mask: torch.Tensor | None = None  # float [C]: the candidate's share of its tower row (0: no text)


def _product(a: torch.Tensor, b: torch.Tensor, low: bool) -> torch.Tensor:
    """a @ b.T, in bfloat16 when `low` (float32 out; the backward's two products are in bfloat16 too)."""
    if not low:
        return a @ b.T
    return (a.to(torch.bfloat16) @ b.to(torch.bfloat16).T).float()


class Stepper:
    """Holds model, optimizer, sampler and loss; `step(epoch, i, j, lr)` trains on rows [i, j).

    The same step runs alone or as one of R ranks (`trainer.label_shards` derives it): the model holds
    the label rows of `shard`, [i, j) is the global batch, split across ranks for the encoder, and the
    collectives of `group` are identities when it has one rank.
    """

    def __init__(
        self,
        model: XCModel,
        spec: LossSpec,
        params: TrainParams,
        sampler: NegativeSampler,
        group: RankGroup | None = None,
        shard: LabelShard | None = None,
    ) -> None:
        self.model = model
        self.spec = spec
        self.params = params
        self.sampler = sampler
        self.group = group or RankGroup()
        self.shard = shard or LabelShard(0, model.shape.n_labels, model.shape.n_labels)
        self.optim = RowAdam()  # dense parameters, and the tables unless params.optimizer says otherwise
        self.table_optim: RowAdam | RowAdagrad = RowAdagrad() if params.optimizer == "adagrad" else self.optim
        self.exhaustive = spec.needs_all_labels
        self.dense = model.dense_parameters()
        self.best = BestEpoch()  # used when params.valid_fraction > 0; saved with checkpoints
        self.head_lr: torch.Tensor | None = None  # per-label lr multiplier of the head (continual runs)
        self.hard: HardNegatives | None = None  # with params.hard_negatives: the mined table

    def step(self, ep: EpochData, i: int, j: int, lr: float) -> torch.Tensor:
        """One SGD step on rows [i, j); returns the loss as a 0-d tensor on the training device (reading
        it waits for the step: on a GPU the caller reads it only now and then)."""
        return self.learn(self.inputs(ep, i, j), lr)

    def inputs(self, ep: EpochData, i: int, j: int) -> StepInputs:
        """The step's index work, on the host, then sent to the device in a few packed copies."""
        params, group, device = self.params, self.group, self.model.head.device
        # this rank encodes its slice of the global batch [i, j); h of the whole batch is gathered
        per = -(-(j - i) // group.world)
        li, lj = min(j, i + group.rank * per), min(j, i + (group.rank + 1) * per)
        a, b = int(ep.x_ptr_np[li]), int(ep.x_ptr_np[lj])
        ya, yb = int(ep.y_ptr_np[i]), int(ep.y_ptr_np[j])
        y_ind, y_ptr = ep.y_ind[ya:yb], ep.y_ptr[i : j + 1] - ya
        if self.exhaustive:  # every label is a column: the [B, K] masks are made on the device
            moved = to_device({"y_ind": y_ind, "y_ptr": y_ptr}, device)
            y_ind, y_ptr = moved["y_ind"], moved["y_ptr"]
            sc = shard_candidates(y_ptr, y_ind, self.shard, None, 0, 1)
        else:
            groups = params.group_size if self.spec.grouped else 1
            sc = shard_candidates(y_ptr, y_ind, self.shard, self.sampler, params.negatives, groups)
            sc.cand.masked = torch.stack(masked_negative_pairs(sc.cand))
            if self.hard is not None:  # one rank: the pairs' labels are its columns' ids
                self.hard.extend(sc.cand, y_ind)
        cand = sc.cand
        x_ind = ep.x_ind[a:b]
        tower = tower_of(self.model)
        text: dict[str, torch.Tensor] = {}
        if tower is not None:  # the candidates' texts share the step's gather of input rows
            t_ind, text["text_offsets"], text["text_values"] = tower.texts.gather(cand.label_ids)
            text["text_mask"] = tower.step_weight.index_select(0, cand.label_ids.cpu())
            if tower.detach:  # the texts read the whole table without a gradient: ids as they are
                features, inverse = torch.unique(x_ind, return_inverse=True)
                text["text_inverse"] = t_ind
            else:
                features, inverse = torch.unique(torch.cat([x_ind, t_ind]), return_inverse=True)
                inverse, text["text_inverse"] = inverse[: x_ind.numel()], inverse[x_ind.numel() :]
        else:
            features, inverse = torch.unique(x_ind, return_inverse=True)
        if params.label_weighting == "row":
            cand.pair_weight = row_pair_weights(cand)
        if ep.row_weight is not None:
            weights = ep.row_weight[i:j].to(cand.pos_rows.device)
            cand.pair_weight = _reweighted(pair_weights(cand), weights, cand.pos_rows)
        moved = to_device({"features": features, "inverse": inverse, "offsets": ep.x_ptr[li:lj] - a,
                           "values": ep.x_val[a:b], "owned": sc.owned, **text,
                           **{f"cand.{k}": v for k, v in cand.tensors().items()}}, device)
        cand = cand.with_tensors({k[len("cand."):]: v for k, v in moved.items() if k.startswith("cand.")})
        return StepInputs(moved["features"], moved["inverse"], moved["offsets"], moved["values"], cand,
                          moved["owned"], **{k: moved[k] for k in text})

    def learn(self, inp: StepInputs, lr: float) -> torch.Tensor:
        """The step's device part: encode, score, backward, update the touched rows; the loss."""
        model, params, group, cand = self.model, self.params, self.group, inp.cand
        low = params.precision == "bf16"
        e_rows = model.input_weight.index_select(0, inp.features).requires_grad_()
        h = model.encode_tensors(inp.inverse, inp.offsets, inp.values, table=e_rows)
        n_pairs = cand.pos_rows.numel()
        if group.world > 1:
            per = -(-cand.n_rows // group.world)
            h = group.gather_rows(torch.cat([h, h.new_zeros(per - h.shape[0], h.shape[1])]))[: cand.n_rows]
        rows: torch.Tensor | None = None
        if self.exhaustive:
            head_rows = model.head.detach().requires_grad_()
        else:
            rows = cand.label_ids
            head_rows = model.head.index_select(0, rows).requires_grad_()
        used_rows = head_rows  # the rows scored: the free part, plus the tower's rows from the labels' texts
        h_aug = torch.cat([h, h.new_ones(h.shape[0], 1)], dim=1)
        tower = tower_of(model)
        apart: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        if tower is not None and inp.text_inverse is not None:
            assert inp.text_offsets is not None and inp.text_values is not None and inp.text_mask is not None
            t = tower.embed(model, model.input_weight if tower.detach else e_rows, inp.text_inverse,
                            inp.text_offsets, inp.text_values, inp.text_mask)
            if tower.apart:
                apart = (tower.scorer(h.detach()), t, head_rows[:, -1].detach())
            else:  # ⟨[h, 1, γ·h·Pᵀ], [v, b, z]⟩ = ⟨h, v + γ·z·P⟩ + b
                used_rows = torch.cat([head_rows, t], dim=1)
                h_aug = torch.cat([h_aug, tower.scorer(h)], dim=1)
        own_rows = cand.pos_rows.index_select(0, inp.owned)
        own_cols = cand.pos_cols.index_select(0, inp.owned)
        if self.spec.sampled_scores_only and not self.exhaustive:
            # score only the sampled columns; f_y by row-wise dot products (P·d, not B·C·d)
            scores = _product(h_aug, used_rows[: cand.n_sampled], low)
            own = (h_aug.index_select(0, own_rows) * used_rows.index_select(0, own_cols)).sum(1)
        else:
            scores = _product(h_aug, used_rows, low)
            own = scores[own_rows, own_cols]
        # f_y of every pair: each scored by the rank owning its label, summed over ranks
        pos_scores = own
        if group.world > 1:
            pos_scores = group.sum(own.new_zeros(n_pairs).index_copy(0, inp.owned, own))
        hard_scores = None
        if cand.hard_cols is not None:  # each pair's hard columns: P·k dot products, not a [B, C] product
            picked = used_rows.index_select(0, cand.hard_cols.reshape(-1)).view(*cand.hard_cols.shape, -1)
            hard_scores = torch.bmm(picked, h_aug.index_select(0, cand.pos_rows).unsqueeze(2)).squeeze(2)
        extra: dict[str, torch.Tensor] = {}
        for name, table in model.extra.items():
            picked = table.detach() if rows is None else table.index_select(0, rows)
            extra[name] = picked.requires_grad_()
        batch = CandidateBatch(cand=cand, scores=scores, h=h, extra=extra, pos_scores=pos_scores,
                               hard_scores=hard_scores)
        loss = shard_softmax_loss(batch, group) if params.loss == "softmax" else self.spec.fn(batch)
        if apart is not None:  # the tower alone scores the same candidates (with their biases, held)
            loss = loss + self._tower_loss(cand, h, *apart, own_rows, own_cols, low)
        for p in self.dense.values():
            p.grad = None
        loss.backward()

        wd = params.weight_decay
        opt = self.table_optim
        assert e_rows.grad is not None and head_rows.grad is not None
        uf = inp.features
        if group.world > 1:  # the replicated encoder: gradients summed over ranks
            uf, e_grad = group.sum_sparse_rows(uf, e_rows.grad)
            self._sum_dense_grads()
        else:
            e_grad = e_rows.grad
        opt.step("input", model.input_weight, e_grad, lr, rows=uf, weight_decay=wd)
        with _row_lr(self.head_lr, [model.head, *model.extra.values()], rows):
            opt.step("head", model.head, head_rows.grad, lr, rows=rows, weight_decay=wd)
            for name, t in extra.items():
                if t.grad is not None:
                    opt.step(f"extra.{name}", model.extra[name], t.grad, lr, rows=rows, weight_decay=wd)
        dense_lr = lr * params.dense_lr / params.lr  # same schedule, its own peak
        for name, p in self.dense.items():
            if p.grad is not None:
                self.optim.step(name, p, p.grad, dense_lr)
        return group.sum_(loss.detach().clone())  # each rank's share: the sum is the step's loss

    def _tower_loss(self, cand: Candidates, h: torch.Tensor, hp: torch.Tensor, z: torch.Tensor,
                    bias: torch.Tensor, own_rows: torch.Tensor, own_cols: torch.Tensor,
                    low: bool) -> torch.Tensor:
        """The loss of the tower scoring the step's candidates by ⟨γ·h·Pᵀ, z⟩ + b, with h and b held: it
        learns only the map and gain, as a scorer of labels from their texts alone."""
        n = cand.n_sampled if self.spec.sampled_scores_only else z.shape[0]
        scores = _product(hp, z[:n], low) + bias[:n]
        own = (hp.index_select(0, own_rows) * z.index_select(0, own_cols)).sum(1)
        own = own + bias.index_select(0, own_cols)
        return self.spec.fn(CandidateBatch(cand=cand, scores=scores, h=h.detach(), pos_scores=own))

    def _sum_dense_grads(self) -> None:
        """One all-reduce for every dense gradient (a parameter no rank's loss reached gets zeros)."""
        params = list(self.dense.values())
        if not params:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = self.group.sum_(torch.cat([g.reshape(-1) for g in grads]))
        start = 0
        for p in params:
            p.grad = flat[start : start + p.numel()].view_as(p)
            start += p.numel()


class StepLosses:
    """The steps' losses, read from the device in batches: on a GPU, reading a loss waits for its step,
    so they are kept as tensors and read together at each report (on the CPU, at once). A non-finite
    loss is refused with its step either way."""

    def __init__(self, eager: bool) -> None:
        self.eager = eager
        self.ema = float("nan")  # exponential moving average of the step losses
        self.total = 0.0  # Σ loss · rows over this epoch's steps read so far
        self._pending: list[tuple[int, torch.Tensor, int]] = []

    def new_epoch(self) -> None:
        self.read()
        self.total = 0.0

    def add(self, step: int, value: torch.Tensor, rows: int) -> None:
        self._pending.append((step, value, rows))
        if self.eager:
            self.read()

    def read(self) -> float:
        """The moving average, the pending losses folded in first."""
        if self._pending:
            values = torch.stack([v for _, v, _ in self._pending]).tolist()
            for (step, _, rows), value in zip(self._pending, values, strict=True):
                if not math.isfinite(value):
                    raise ParamsError(f"loss became {value} at step {step}; lower --lr")
                self.total += value * rows
                self.ema = value if math.isnan(self.ema) else 0.95 * self.ema + 0.05 * value
            self._pending.clear()
        return self.ema


def _reweighted(pw: torch.Tensor, row_weight: torch.Tensor, pos_rows: torch.Tensor) -> torch.Tensor:
    """Pair weights times their row's weight, rescaled to the same total (the step size stays that of an
    unweighted batch; only the balance between its rows changes)."""
    w = pw * row_weight.index_select(0, pos_rows).to(pw.dtype)
    return w * (pw.sum() / w.sum().clamp_min(1e-30))


@contextlib.contextmanager
def _row_lr(scale: torch.Tensor | None, tables: list[torch.Tensor],
            rows: torch.Tensor | None) -> Iterator[None]:
    """Scale the optimizer's move of each touched row of `tables` by `scale[row]`: a per-row learning rate.

    Why this way: a row-wise Adam (or Adagrad) move, catch-up included, is linear in the learning rate, so
    scaling the displacement is exactly that row's step at `scale` × lr, without a per-row lr in the kernels.
    """
    if scale is None:
        yield
        return
    ids = torch.arange(tables[0].shape[0], device=tables[0].device) if rows is None else rows
    s = scale.index_select(0, ids)
    scaled = s != 1.0
    ids, s = ids[scaled], s[scaled].unsqueeze(1)  # only rows whose move changes are kept aside
    before = [t.index_select(0, ids) for t in tables]
    yield
    with torch.no_grad():
        for t, b in zip(tables, before, strict=True):
            t.index_copy_(0, ids, torch.lerp(b, t.index_select(0, ids), s.to(t.dtype)))


# ------------------------------------------------------------------------------------ checkpoints

# ------------------------------------------------------------------------------------ evaluation


def evaluate_model(
    model: XCModel,
    x: sp.csr_matrix,
    y: sp.csr_matrix,
    prop: np.ndarray | None,
    shard: LabelShard | None = None,
    group: RankGroup | None = None,
    new_labels: np.ndarray | None = None,
) -> dict[str, float]:
    """P@k etc. of the exact top-k over all labels (merged over the ranks' shards when sharded); with
    `new_labels` (a continual run) also on new-label and old-label rows apart."""
    if shard is None or group is None:
        top, _ = model.topk(x, EVAL_K)
    else:
        top, _ = shard_topk(model, x, EVAL_K, shard, group)
    out = xc_metrics.evaluate_topk(top, y, prop)
    if new_labels is not None:
        out.update(split_metrics(top, y, new_labels, prop))
    return out


# ------------------------------------------------------------------------------------ train


def train(
    params: TrainParams,
    train_ds: Dataset,
    test_ds: Dataset | None = None,
    *,
    out_dir: str | Path | None,
    hooks: TrainHooks | None = None,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int = 0,
    base: str | Path | None = None,
    base_name: str | None = None,
    replay_ds: Dataset | None = None,
    label_texts: list[tuple[str, str]] | None = None,
) -> TrainResult:
    """Train on `train_ds`, evaluate on `test_ds` every `params.eval_every` epochs, write the artifact.

    With `params.nproc_per_node > 1` this starts that many ranks here (`trainer.launch`) and returns rank
    0's result; inside ranks started by torchrun (or by that launcher) it is one rank of the run.

    With `base` (a model directory) the run continues that model (trainer.continual): its featurizer,
    encoder and head, labels matched by name, new ones appended; parameters the caller did not set come
    from the base. `replay_ds` (e.g. the base's training set) adds rows to replay; `base_name` is how
    errors name the base (default: its path).

    With `params.valid_fraction > 0` a seeded share of the training rows is held out (featurizer and
    model never train on it), scored after every epoch, and the weights of the best epoch by P@1 on
    it are the ones saved and reported; `test_ds` is only ever reported, never used to decide. With
    `params.refit` as well, a second run on all training rows stops at that epoch (same schedule) and
    is the one saved: the held-out rows then only choose how long to train, and are not lost.

    With `label_texts` ((name, text) pairs, `trainer.label_texts.read_label_texts`) every named label joins
    the label space, with training rows or not, and the model learns a label tower (`trainer.label_tower`);
    a base trained with label texts keeps its tower and texts, the given ones added (a name's new text
    replaces its old one).
    """
    hooks = hooks or LoggingHooks()
    if replay_ds is not None and base is None:
        raise ParamsError("replay_ds needs a base model (it holds rows the base trained on)")
    if out_dir is not None:  # before any step: a wrong output directory should not cost a run
        if base is not None:
            check_out_dir(out_dir, base)
        prepare_out_dir(Path(out_dir))
    if params.nproc_per_node > 1 and not in_launched_rank():
        from trainer.launch import train_on_ranks

        return train_on_ranks(params, train_ds, test_ds, out_dir=out_dir, hooks=hooks,
                              checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                              base=base, base_name=base_name, replay_ds=replay_ds)
    texts: dict[str, str] | None = None
    if label_texts or (base is not None and has_label_tower(Path(base))):
        texts = {} if base is None else read_stored_texts(Path(base))
        texts.update(label_texts or [])
        check_usable(train_ds.is_text, get_loss(params.loss).needs_all_labels, params.nproc_per_node)
        train_ds = with_labels(train_ds, list(texts))
    warm: WarmStart | None = None
    if base is not None:
        warm, train_ds, test_ds = warm_start(base, train_ds, test_ds, base_name=base_name,
                                             replay_ds=replay_ds, params=params)
        assert warm.params is not None
        params = warm.params
        hooks.on_log(f"continuing {warm.name}: {warm.n_base_labels} labels, "
                     f"{len(warm.label_names) - warm.n_base_labels} new")
    if test_ds is not None:  # before any step (on each rank): a refit scores it only after a selection run
        test_ds = check_compatible(train_ds, test_ds)
        note = unseen_labels_note(test_ds, "the test set")
        if note:
            hooks.on_log(note)
    if params.valid_fraction > 0 and params.refit:
        ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
        # the selection run never sees the test split, not even to report it
        select = _fit(params, train_ds, None, out_dir=None, hooks=hooks, warm=warm,
                      checkpoint_dir=None if ckpt is None else ckpt / "select",
                      checkpoint_every=checkpoint_every, texts=texts)
        assert select.best_epoch is not None and select.metrics_valid_p1 is not None
        hooks.on_log(f"refit on all {train_ds.n_rows} training rows, stop after epoch {select.best_epoch}")
        refit = params.model_copy(
            update={"valid_fraction": 0.0, "refit": False, "patience": 0, "stop_epoch": select.best_epoch}
        )
        result = _fit(refit, train_ds, test_ds, out_dir=out_dir, hooks=hooks, warm=warm,
                      checkpoint_dir=None if ckpt is None else ckpt / "refit",
                      checkpoint_every=checkpoint_every, artifact_params=params,
                      extra_summary={"best_epoch": float(select.best_epoch),
                                     "valid_p@1": float(select.metrics_valid_p1)}, texts=texts)
        result.best_epoch = select.best_epoch
        result.metrics_valid_p1 = select.metrics_valid_p1
        result.history = [{**h, "phase": "select"} for h in select.history] + result.history
        result.seconds += select.seconds
        return result
    return _fit(params, train_ds, test_ds, out_dir=out_dir, hooks=hooks, warm=warm,
                checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every, texts=texts)


def with_labels(ds: Dataset, names: list[str]) -> Dataset:
    """`ds` in a label space that also holds `names` (those it lacks appended, without rows)."""
    own = label_names_of(ds)
    known = set(own)
    extra = [n for n in names if n not in known]
    if not extra:
        return ds if ds.label_names is not None else replace(ds, label_names=own)
    width = len(own) + len(extra)
    y = sp.csr_matrix(ds.Y)
    Y = sp.csr_matrix((y.data, y.indices, y.indptr), shape=(ds.n_rows, width))
    return replace(ds, Y=Y, n_labels=width, label_names=own + extra)


def _attach_tower(model: XCModel, featurizer: Any, names: list[str], texts: dict[str, str],
                  counts: np.ndarray, params: TrainParams, warm: WarmStart | None) -> LabelTower:
    """Give `model` its label tower. Labels with a text and no rows start with no free part; a base's
    labels keep their served rows: their free part is the base's row less the tower's."""
    rows = TextRows.from_csr(featurizer.transform_texts([texts.get(n, "") for n in names], "<label texts>"))
    text_only = rows.has_text.numpy() & (np.asarray(counts) <= 0)
    gain = params.label_tower_gain
    tower = LabelTower(rows, gain, text_only, model.shape.dim,
                       weight=fade_weights(counts, params.label_tower_fade),
                       detach=params.label_tower_detach, apart=params.label_tower_mode == "apart")
    if warm is not None and has_label_tower(warm.base.path):  # the base's tower, as it was trained
        with torch.no_grad():
            tower.gain.fill_(load_tower_gain(warm.base.path))
            tower.proj.copy_(load_tower_tensors(warm.base.path)["proj"])
    tower = tower.to(model.head.device)
    d = model.shape.dim
    with torch.no_grad():
        if warm is not None:
            k0 = warm.n_base_labels
            model.head[:k0, :d] -= tower.all_rows(model)[:k0].to(model.head.dtype)
        only = torch.from_numpy(text_only).to(model.head.device)
        model.head[only] = 0.0
    model.tower = tower
    return tower


def _fit(
    params: TrainParams,
    train_ds: Dataset,
    test_ds: Dataset | None,
    *,
    out_dir: str | Path | None,
    hooks: TrainHooks,
    checkpoint_dir: str | Path | None,
    checkpoint_every: int,
    artifact_params: TrainParams | None = None,
    extra_summary: dict[str, float] | None = None,
    warm: WarmStart | None = None,
    texts: dict[str, str] | None = None,
) -> TrainResult:
    """One training run (the body of `train`); the artifact records `artifact_params` when given."""
    tune_malloc()
    t_start = time.perf_counter()
    device = resolve_device(params.device)
    group = join_group(device)
    device = rank_device(device, group)
    check_shardable(params.loss, group.world)
    if not group.is_main:
        hooks = _Muted(hooks)
    torch.manual_seed(params.seed)  # the dense layers' init: the same on every rank
    spec = get_loss(params.loss)
    if train_ds.n_labels == 0:
        raise ParamsError(f"{train_ds.path or 'the training set'}: no labels (L=0), nothing to learn")
    # before anything label- or feature-sized is allocated: a header's L or D may be far past what fits
    # (a warm start checked the grown model before making its label names)
    if warm is None:
        check_fits(train_ds, params, device, ranks=group.world, extra_heads=len(spec.extra_heads))

    valid_ds: Dataset | None = None
    if params.valid_fraction > 0:
        fit_rows, valid_rows = split_validation(train_ds.n_rows, params.valid_fraction, params.seed)
        valid_ds = train_ds.take(valid_rows)
        train_ds = train_ds.take(fit_rows)
    if warm is not None:
        featurizer = warm.featurizer_for(train_ds)  # the fit rows' words: before replay rows join them
        train_ds = warm.training_rows(train_ds)
        if warm.forgets():
            hooks.on_log(f"warning: no training or replay row is one {warm.name} trained on: none of its "
                         "rows is replayed, so labels learned from them will be forgotten (give the base's "
                         "training rows with --replay-data; over the API, base.replay_dataset)")
    else:
        featurizer = fit_featurizer(params, train_ds)
    x = _as_csr32(featurizer.transform(train_ds))
    y = _as_csr32(train_ds.Y)
    n, k = x.shape[0], train_ds.n_labels
    if n == 0:
        raise ParamsError("the training set has no rows")
    xt = yt = None
    if test_ds is not None:  # in the training label space (train() checked it), plus its unseen labels
        xt, yt = _as_csr32(featurizer.transform(test_ds)), _as_csr32(test_ds.Y)
    xv = yv = None
    if valid_ds is not None:
        xv, yv = _as_csr32(featurizer.transform(valid_ds)), _as_csr32(valid_ds.Y)
    # over the test set's labels too: one the model lacks is scored as a label without training rows
    width = k if yt is None else max(k, yt.shape[1])
    prop = xc_metrics.propensities(sp.csr_matrix((y.data, y.indices, y.indptr), shape=(n, width)))
    label_names = train_ds.label_names or [str(i) for i in range(k)]

    shape = ModelShape(
        n_features=int(featurizer.n_features),
        n_labels=k,
        dim=params.dim,
        encoder=params.encoder,
        hidden=params.hidden,
        pieces=params.pieces,
        dropout=params.dropout,
        extra_heads=spec.extra_heads,
    )
    shard = shard_bounds(k, group.world, group.rank)
    # a warm start overwrites the big tables, so only its new rows are drawn (init_model)
    model = XCModel(
        shape,
        init_scale=params.init_scale,
        seed=params.seed,
        init=warm is None,
        label_rows=(shard.lo, shard.hi),
    )
    model = model.to(device)
    new_labels = None
    if warm is not None:
        warm.init_model(model, x, y, params.new_label_init, params.seed, lo=shard.lo)
        new_labels = warm.new_labels
    model.train()
    if group.world > 1:
        torch.manual_seed(params.seed + group.rank)  # dropout: each rank masks its own rows
    all_counts = label_counts(y)
    counts = all_counts[shard.lo : shard.hi]
    # every row the model has trained on, a base's included: a label of none has no free part to learn
    model_counts = all_counts if warm is None else warm.artifact_stats(y)[0]
    tower = None
    if texts is not None:
        tower = _attach_tower(model, featurizer, label_names, texts, model_counts, params, warm)
    # rank 0 keeps the stream of a one-process run; other ranks draw their own
    seed = params.seed + 1 + 7919 * group.rank
    # a continual run oversamples its new labels with rows as negatives
    focus, share = None, 0.0
    if warm is not None:
        focus, share = warm.learning(counts, shard.lo), params.new_label_negatives
        if group.world > 1:
            share = _shard_focus_share(share, focus, int(warm.learning(all_counts).sum()), shard)
    sampler: Any = NegativeSampler(shard.size, params.sampler, params.alpha, counts, seed=seed, focus=focus,
                                   focus_share=share)
    if tower is not None and tower.text_only.any():  # text-only labels are never sampled as negatives
        keep = np.flatnonzero(~tower.text_only)
        sampler = SubsetSampler(NegativeSampler(
            keep.size, params.sampler, params.alpha, counts[keep], seed=seed,
            focus=None if focus is None else focus[keep], focus_share=share), keep)
    stepper = Stepper(model, spec, params, sampler, group, shard)
    if params.hard_negatives > 0:
        if tower is not None:
            raise ParamsError("hard_negatives does not train with label texts yet; set hard_negatives 0")
        stepper.hard = HardNegatives(k, params.hard_negatives, params.hard_every, params.seed)
    if focus is not None:
        stepper.head_lr = WarmStart.label_lr(focus, params.new_label_lr, device)

    bs = params.batch_size
    ahead = steps_made_ahead(device, group)
    n_epoch = n if warm is None else warm.epoch_size(params.replay)  # rows trained on per epoch
    lr_scale = 1.0 if warm is None else params.continual_lr
    steps_per_epoch = math.ceil(n_epoch / bs)
    total = steps_per_epoch * params.epochs
    step, start_epoch, start_pos = 0, 0, 0
    resumed: int | None = None
    ckpt_path = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if ckpt_path is not None:
        meta = load_checkpoint(ckpt_path, stepper)
        if meta is not None:
            step, start_epoch, start_pos = int(meta["step"]), int(meta["epoch"]), int(meta["pos"])
            resumed = step
            hooks.on_log(f"resumed from step {step}")
    hooks.on_log(
        f"training {params.loss} on {n_epoch} rows per epoch, {shape.n_features} features, {k} labels; "
        f"d={params.dim}, {total} steps on {device}"
        + (f", {group.world} ranks of {shard.size} labels each" if group.world > 1 else "")
    )

    bar = _progress_bar(total, step) if group.is_main else None
    history: list[dict[str, Any]] = []
    last_metrics: dict[str, float] = {}
    losses = StepLosses(eager=device.type == "cpu")
    train_time = 0.0
    examples = 0
    last_report = 0.0
    epochs_run = start_epoch
    best = stepper.best
    last_epoch = params.stop_epoch or params.epochs  # the schedule stays that of params.epochs
    try:
        for epoch in range(start_epoch, last_epoch):
            if xv is not None and params.patience > 0 and best.epoch > 0 and best.stale >= params.patience:
                break  # resumed after the patience ran out
            perm = (np.random.default_rng([params.seed, epoch]).permutation(n) if warm is None
                    else warm.epoch_rows(params.seed, epoch, params.replay))
            ep = EpochData(x, y, perm, None if warm is None else warm.epoch_weights(perm, params.replay))
            t_epoch = time.perf_counter()
            epoch_examples = 0
            losses.new_epoch()
            pos0 = start_pos if epoch == start_epoch else 0
            # mined from the trained head: a continual run's at once, a fresh run's after its first epoch
            first_mining = 0 if warm is not None else 1
            if stepper.hard is not None and pos0 == 0 and stepper.hard.due(epoch, first_mining):
                stepper.hard.refresh(model.head, model_counts)
            def rows(pos: int) -> tuple[int, int]:
                return pos * bs, min(n_epoch, (pos + 1) * bs)

            def inputs_at(pos: int, ep: EpochData = ep) -> StepInputs:
                return stepper.inputs(ep, *rows(pos))

            with made_ahead(inputs_at, range(pos0, steps_per_epoch), stepper.sampler.get_state,
                            threaded=ahead) as made_steps:
                for made in made_steps:
                    if hooks.should_stop():
                        raise TrainingCancelled(f"training stopped at step {step}")
                    i, j = rows(made.pos)
                    losses.add(step, stepper.learn(made.inputs, lr_at(params, step, total) * lr_scale), j - i)
                    step += 1
                    epoch_examples += j - i
                    if bar is not None:
                        bar.update(1)
                    now = time.perf_counter()
                    if now - last_report > PROGRESS_EVERY_S:
                        last_report = now
                        loss_ema = losses.read()
                        rate = epoch_examples / max(time.perf_counter() - t_epoch, 1e-9)
                        if bar is not None:
                            bar.set_postfix(loss=f"{loss_ema:.4f}", epoch=epoch + 1)
                        hooks.on_progress(Progress(epoch + 1, params.epochs, step, total, rate, loss_ema))
                    if ckpt_path is not None and checkpoint_every > 0 and step % checkpoint_every == 0:
                        save_checkpoint(ckpt_path, stepper, step, epoch, made.pos + 1,
                                        {"loss": losses.read()}, sampler_state=made.sampler_state)
            losses.read()  # on a GPU: waits for the epoch's last step
            dt = time.perf_counter() - t_epoch
            train_time += dt
            examples += epoch_examples
            rate = epoch_examples / max(dt, 1e-9)
            mean_loss = losses.total / max(epoch_examples, 1)
            record: dict[str, Any] = {"epoch": epoch + 1, "loss": mean_loss, "examples_per_s": rate}
            evaluated = None
            is_last = epoch + 1 == last_epoch
            due = params.eval_every > 0 and (epoch + 1) % params.eval_every == 0
            if xt is not None and yt is not None and (due or is_last):
                with materialized(model, model_counts):
                    evaluated = evaluate_model(model, xt, yt, prop, shard, group, new_labels)
                last_metrics = evaluated
                record["metrics"] = evaluated
            if xv is not None and yv is not None:
                with materialized(model, model_counts):
                    valid = evaluate_model(model, xv, yv, None, shard, group)
                record["valid"] = valid
                best.update(epoch + 1, valid["p@1"], model)
            history.append(record)
            epochs_run = epoch + 1
            msg = f"epoch {epoch + 1}/{params.epochs} loss {mean_loss:.4f} {rate:,.0f} examples/s"
            if "valid" in record:
                msg += f" valid p@1 {record['valid']['p@1']:.4f} (best: epoch {best.epoch})"
            if evaluated:
                msg += " " + " ".join(f"{key} {evaluated[key]:.4f}" for key in ("p@1", "p@3", "p@5"))
            hooks.on_log(msg)
            hooks.on_progress(Progress(epoch + 1, params.epochs, step, total, rate, mean_loss, evaluated))
            if xv is not None and params.patience > 0 and best.stale >= params.patience:
                hooks.on_log(f"early stop: no better validation p@1 for {best.stale} epochs")
                break
    finally:
        if bar is not None:
            bar.close()

    best_epoch: int | None = None
    if xv is not None and best.epoch > 0:
        best_epoch = best.epoch
        if best.epoch != epochs_run or not history or "metrics" not in history[-1]:
            best.restore(model)
            if xt is not None and yt is not None:
                with materialized(model, model_counts):
                    last_metrics = evaluate_model(model, xt, yt, prop, shard, group, new_labels)
        hooks.on_log(f"kept the weights of epoch {best.epoch} (valid p@1 {best.score:.4f})")
    seconds = time.perf_counter() - t_start
    overall_rate = examples / max(train_time, 1e-9)
    final_loss = history[-1]["loss"] if history else losses.read()
    summary = dict(last_metrics)
    if best_epoch is not None:
        summary.update({"best_epoch": float(best_epoch), "valid_p@1": float(best.score)})
    summary.update(extra_summary or {})
    summary.update(
        {
            "train_loss": float(final_loss),
            "examples_per_s": float(overall_rate),
            "train_seconds": float(seconds),
            "steps": float(step),
        }
    )
    out_path: Path | None = None
    if out_dir is not None:
        counts, n_rows, hashes = (label_counts(y), n, row_fingerprints(train_ds)) if warm is None \
            else warm.artifact_stats(y)
        with materialized(model, model_counts) as scale:
            extra = None if tower is None or texts is None or scale is None else \
                functools.partial(save_tower, tower=tower, scale=scale, names=label_names, texts=texts)
            out_path = _save_model(
                Path(out_dir), stepper, featurizer, label_names, artifact_params or params, summary,
                counts, n_rows, hashes, extra,
            )
        hooks.on_log(f"model written to {out_path}")
    return TrainResult(
        out_dir=out_path,
        metrics=last_metrics,
        steps=step,
        epochs=epochs_run,
        seconds=seconds,
        examples_per_s=overall_rate,
        final_loss=float(final_loss),
        resumed_from_step=resumed,
        history=history,
        best_epoch=best_epoch,
        metrics_valid_p1=float(best.score) if best_epoch is not None else None,
    )


def _shard_focus_share(share: float, focus: np.ndarray, n_focus: int, shard: LabelShard) -> float:
    """The focus share of one shard's negatives that gives its focus labels the draws one process would:
    `share` of all M draws go to the `n_focus` focus labels, this shard's `focus.sum()` of them get their
    part, and the shard draws about M·size/K negatives in all."""
    if n_focus == 0:
        return 0.0
    return min(1.0, share * int(focus.sum()) / n_focus * shard.n_labels / shard.size)


def _save_model(
    out: Path,
    stepper: Stepper,
    featurizer: Any,
    label_names: list[str],
    params: TrainParams,
    summary: dict[str, float],
    counts: np.ndarray,
    n_rows: int,
    row_hashes: np.ndarray | None,
    extra_files: Callable[[Path], None] | None = None,
) -> Path:
    """The artifact, in one format whatever the number of ranks; with several, every rank writes its
    label rows into the one weights file (`trainer.merged_weights`) and rank 0 writes the rest."""
    from trainer.artifact import artifact_tensors, save_artifact
    from trainer.merged_weights import write_merged_weights

    group, shard, model = stepper.group, stepper.shard, stepper.model
    if group.world == 1:
        return save_artifact(out, model, featurizer, label_names, params, summary,
                             label_counts=counts, n_train_rows=n_rows, row_hashes=row_hashes,
                             extra_files=extra_files)
    if group.is_main:
        def write(file: Path, tensors: dict[str, torch.Tensor]) -> dict[str, list[int]]:
            return write_merged_weights(file, tensors, shard, group)

        path = save_artifact(out, model, featurizer, label_names, params, summary,
                             label_counts=counts, n_train_rows=n_rows, row_hashes=row_hashes,
                             write_weights=write)
    else:
        write_merged_weights(None, artifact_tensors(model, counts, str(out), row_hashes), shard, group)
        path = out
    group.barrier()  # every rank returns once the model directory is in place
    return path


def _progress_bar(total: int, initial: int) -> Any:
    """A tqdm bar on stderr only when it is a terminal (logs stay clean in jobs and CI)."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="step", file=sys.stderr, dynamic_ncols=True)
