"""One training step and the state it keeps: the epoch's rows on the host (`EpochData`), a step's inputs
(`StepInputs`: its host part), the `Stepper` that holds model, optimizers, sampler and loss and learns from
them (its device part), the losses it folds (`StepLosses`) and the best epoch kept for model selection.
Checkpoints save and restore a `Stepper`; the loop (`trainer.train`) drives one."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from trainer.collectives import RankGroup
from trainer.errors import ParamsError
from trainer.hard_negatives import HardNegatives
from trainer.label_shards import LabelShard, shard_candidates, shard_softmax_loss
from trainer.label_tower import tower_of
from trainer.losses import (
    CandidateBatch,
    Candidates,
    LossSpec,
    masked_negative_pairs,
    pair_weights,
    row_pair_weights,
)
from trainer.model import XCModel, project_rows, project_table
from trainer.negatives import NegativeSampler
from trainer.optim import RowAdagrad, RowAdam
from trainer.params import TrainParams
from trainer.transfer import to_device


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

def _as_csr32(x: sp.spmatrix) -> sp.csr_matrix:
    out = sp.csr_matrix(x, dtype=np.float32)
    out.sort_indices()
    return out

class EpochData:
    """One epoch's shuffled CSR as host tensors, sliced by row ranges (no per-row Python); each step
    sends its slice's tensors to the training device (`trainer.transfer`)."""

    def __init__(self, x: sp.csr_matrix, y: sp.csr_matrix, perm: np.ndarray,
                 weights: np.ndarray | None = None, epoch: int = 0) -> None:
        self.epoch = epoch
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
    text_live: torch.Tensor | None = None  # int64: the columns whose texts are embedded (None: all)

def native_bf16() -> bool:
    """The CPU multiplies bfloat16 in hardware (AVX-512 BF16 or AMX): there a bf16 product takes less
    than half the float32 time; elsewhere it is emulated, and slower."""
    cpu = getattr(torch, "cpu", None)
    checks = [getattr(cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(bool(check()) for check in checks if callable(check))


def low_precision(precision: str, device: torch.device) -> bool:
    """Whether a step's score products run in bfloat16: `auto` takes them where they are native to a CPU;
    on a GPU the casts cost more kernels than the products save."""
    if precision == "auto":
        return device.type == "cpu" and native_bf16()
    return precision == "bf16"


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
        self.input_scale = 1.0  # the input table's lr as a multiple of the step's (train.input_lr_scale)
        self.head_lr: torch.Tensor | None = None  # per-label lr multiplier of the head (continual runs)
        self.hard: HardNegatives | None = None  # with params.hard_negatives: the mined table
        self.low_precision = low_precision(params.precision, model.head.device)

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
            # pairs read each pair's masked columns, made here on the host; a grouped bound masks once a
            # row (`ove_loss`), and hard negatives make theirs in `extend`
            if groups == 1:
                sc.cand.masked = torch.stack(masked_negative_pairs(sc.cand))
            if self.hard is not None:  # one rank: the pairs' labels are its columns' ids
                self.hard.extend(sc.cand, y_ind)
        cand = sc.cand
        x_ind = ep.x_ind[a:b]
        tower = tower_of(self.model)
        text: dict[str, torch.Tensor] = {}
        if tower is not None and tower.embeds_at(i // params.batch_size):
            # the candidates' texts share the step's gather of input rows
            live = tower.live_columns(cand.label_ids.numel(), params.seed, ep.epoch, i)
            embedded = cand.label_ids if live is None else cand.label_ids.cpu().index_select(0, live)
            t_ind, text["text_offsets"], text["text_values"] = tower.texts.gather(embedded)
            if live is not None:
                text["text_live"] = live
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
        low = self.low_precision
        tower = tower_of(model)
        texts: torch.Tensor | None = None  # the projection of the candidates' texts, with a label tower
        text_bags: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        if tower is not None and inp.text_inverse is not None:
            if inp.text_offsets is None or inp.text_values is None:
                raise AssertionError("a step's texts come with their offsets and values")
            text_bags = (inp.text_inverse, inp.text_offsets, inp.text_values)
        if tower is not None and text_bags is not None and not tower.detach:
            # one projection of the rows and texts together: one gradient of the gathered table rows
            t_inverse, t_offsets, t_values = text_bags
            e_rows = model.input_weight.index_select(0, inp.features).requires_grad_()
            both = project_rows(e_rows, torch.cat([inp.inverse, t_inverse]),
                                torch.cat([inp.offsets, t_offsets + inp.inverse.numel()]),
                                torch.cat([inp.values, t_values]))
            n_rows = inp.offsets.numel()
            h = model.drop(model.layers(both[:n_rows]))
            texts = both[n_rows:]
        else:
            projected, e_rows = project_table(model.input_weight, inp.features, inp.inverse, inp.offsets,
                                              inp.values)
            h = model.drop(model.layers(projected))
            if text_bags is not None:  # the texts read the whole table, without a gradient
                texts = project_rows(model.input_weight.detach(), *text_bags)
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
        apart: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        if tower is not None and texts is not None:
            assert inp.text_mask is not None
            if tower.apart:
                t = tower.embed(model, texts, inp.text_mask)
                apart = (tower.scorer(h.detach()), t, head_rows[:, -1].detach())
            else:  # w_k = v_k + γ·s_k·enc(text_k)·P
                t = tower.rows(model, texts, inp.text_mask, cand.label_ids, inp.text_live)
                d = model.shape.dim
                used_rows = torch.cat([head_rows[:, :d] + t, head_rows[:, d:]], dim=1)
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
        opt.step("input", model.input_weight, e_grad, lr * self.input_scale, rows=uf, weight_decay=wd)
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
