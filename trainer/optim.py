"""Row-wise optimizers: only the rows a step touched are updated (cost O(rows touched · width)).

Row-wise Adam follows dense Adam's trajectory. A row that got no gradient for s steps would still have
moved under dense Adam, by its decaying momentum: for a row seen once, about ten times the step it got
when seen, which is what lets rare labels of a 10^6-label model leave their initial scores (P@1 0.27 ->
0.56 in bench/scale.py). On its next touch a row gets those s steps in closed form (`catch_up_table`),
then its own step: the same result as dense Adam up to the learning rate of the missed steps (the
current one is used) and the eps term of those steps. Bias correction uses the global step count.
Weight decay is decoupled (AdamW-style), and a row's missed decay is applied on the same next touch.
Row-wise Adagrad needs no catch-up: a zero gradient does not move dense Adagrad.
The first and second moments of a row sit side by side (`mv[r] = [m_r; v_r]`), so a step reads and writes
them with one gather and one scatter. They are allocated, not zeroed: a row's moments are zeroed at its
first update (`last[r] == 0`), so the memory of rows a run never updates is never touched, which at 10^6
labels is most of a short continual run's head. State is a flat dict of tensors: checkpoints go straight
to safetensors (`state_tensors` zeroes the rows never updated first).
On the CPU both optimizers run as fused kernels (`trainer.row_kernels`); the torch code below is the same
update for other devices and for builds without numba. Row ids of one step must be distinct.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from trainer import row_kernels


class _RowOptimizer:
    """What both row-wise optimizers share: named state tensors (checkpointed as they are) and the view
    of a parameter as rows."""

    def __init__(self) -> None:
        self.state: dict[str, torch.Tensor] = {}

    @staticmethod
    def _as_rows(
        param: torch.Tensor, grad: torch.Tensor, rows: torch.Tensor | None
    ) -> tuple[int, torch.Tensor]:
        """(rows in `param`, the gradient as one line per updated row)."""
        n_rows = param.shape[0] if param.dim() > 0 else 1
        width = math.prod(param.shape[1:])  # not -1: a step may touch no row
        return n_rows, grad.reshape(n_rows if rows is None else rows.numel(), width)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return dict(self.state)

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        self.state = {k: v.clone() for k, v in tensors.items()}


CATCH_UP_STEPS = 30_000  # beyond this many steps Adam's bias correction is 1 to ~1e-13 (beta2 = 0.999)


@functools.cache
def catch_up_table(b1: float, b2: float) -> np.ndarray:
    """H[t] = Σ_{i≥1} r^i c(t+i), r = b1/√b2, c(t) = √(1 − b2^t)/(1 − b1^t), for t ≤ CATCH_UP_STEPS (the
    last entry also stands for every later t).

    Why: dense Adam moves a row that gets no gradient, from step t0 + 1 to t0 + s, by
    lr · m/√v · Σ_{i=1..s} r^i c(t0 + i) = lr · m/√v · (H[t0] − r^s H[t0 + s]); the table makes that O(1).
    """
    r = b1 / math.sqrt(b2)
    t = np.arange(1, CATCH_UP_STEPS + 1, dtype=np.float64)
    c = np.sqrt(1.0 - b2**t) / (1.0 - b1**t)  # c[i] = c(i + 1)
    h = np.empty(CATCH_UP_STEPS + 1)
    h[-1] = r / (1.0 - r)  # c = 1 from here on
    for i in range(CATCH_UP_STEPS - 1, -1, -1):
        h[i] = r * (c[i] + h[i + 1])
    return h


def _unzeroed(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """Memory for moments, allocated but not written (the pages of rows never updated stay untouched)."""
    return torch.empty(shape, device=like.device)


class RowAdam(_RowOptimizer):
    def __init__(self, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8) -> None:
        super().__init__()
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self._tables: dict[torch.device, torch.Tensor] = {}  # catch_up_table on each device (eager path)
        self._pending_zero: set[str] = set()  # names whose never-updated rows hold whatever memory held

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The state, never-updated rows' moments zeroed (in place, once: they are touched from then on)."""
        for name in self._pending_zero:
            self.state[f"{name}.mv"][self.state[f"{name}.last"] == 0] = 0.0
        self._pending_zero.clear()
        return super().state_tensors()

    def _ensure(self, name: str, param: torch.Tensor) -> None:
        if f"{name}.mv" not in self.state:
            rows = param.reshape(param.shape[0] if param.dim() > 0 else 1, -1)
            # not zeroed here: each row is at its first update (see the module's docstring)
            self.state[f"{name}.mv"] = _unzeroed((rows.shape[0], 2, rows.shape[1]), param)
            self._pending_zero.add(name)
            # the global step at which each row was last updated (0 = never) and the global step count
            self.state[f"{name}.last"] = torch.zeros(rows.shape[0], dtype=torch.float64, device=param.device)
            self.state[f"{name}.step"] = torch.zeros(1, dtype=torch.float64)

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Also reads checkpoints of the earlier format (per-row update counts `.t`, no catch-up): every
        row seen counts as updated at the last step, so resuming drops only their pending momentum."""
        tensors = dict(tensors)
        for key in [k for k in tensors if k.endswith(".t")]:
            name, t = key[:-2], tensors.pop(key)
            if f"{name}.last" not in tensors:
                step = float(t.max()) if t.numel() else 0.0
                tensors[f"{name}.last"] = torch.where(t > 0, step, 0.0).to(torch.float64)
                tensors[f"{name}.step"] = torch.tensor([step], dtype=torch.float64)
        super().load_state_tensors(tensors)
        for key in [k for k in self.state if k.endswith(".step")]:  # read every step: stays on the host
            self.state[key] = self.state[key].cpu()
        self._pending_zero.clear()

    @torch.no_grad()
    def step(
        self,
        name: str,
        param: torch.Tensor,
        grad: torch.Tensor,
        lr: float,
        rows: torch.Tensor | None = None,
        weight_decay: float = 0.0,
    ) -> None:
        """Update `param[rows]` (all of `param` when rows is None) given the gradient of those rows."""
        self._ensure(name, param)
        mv_all, last_all, count = (self.state[f"{name}.{k}"] for k in ("mv", "last", "step"))
        step = float(count.add_(1.0))
        b1, b2 = self.beta1, self.beta2
        table = catch_up_table(b1, b2)
        n_rows, g = self._as_rows(param, grad, rows)
        if row_kernels.usable(param, mv_all, g):
            ids = torch.arange(n_rows) if rows is None else rows
            row_kernels.adam_rows(
                param.reshape(n_rows, -1), mv_all, last_all, ids, g, table, step,
                lr, b1, b2, self.eps, weight_decay,
            )
            return
        flat = param.reshape(n_rows, -1)
        if rows is None:
            last, mv, current = last_all.clone(), mv_all, flat
            last_all.fill_(step)
        else:
            last, mv, current = (t.index_select(0, rows) for t in (last_all, mv_all, flat))
            last_all.index_fill_(0, rows, step)
        # first update of these rows: their moments start at zero (a select, not a masked write, which
        # would wait for the device to count the rows)
        mv = torch.where((last == 0).view(-1, 1, 1), 0.0, mv)
        m, v = mv[:, 0], mv[:, 1]
        # the steps this row missed (zero gradient): momentum keeps moving it, moments and weights decay
        missed = (step - 1.0 - last).clamp_(min=0.0)
        h = self._tables.get(param.device)
        if h is None:
            h = self._tables[param.device] = torch.as_tensor(table, device=param.device)
        top = len(table) - 1
        coef = h[last.clamp(max=top).long()] - torch.pow(b1 / math.sqrt(b2), missed) * h[
            (last + missed).clamp(max=top).long()
        ]
        update = m / (v.sqrt() + self.eps) * (lr * coef).to(m.dtype).unsqueeze(1)
        if weight_decay > 0.0:  # the missed decay, applied after the moves (they come early in the gap)
            decay = torch.pow(1.0 - lr * weight_decay, missed).to(m.dtype).unsqueeze(1)
            update.mul_(decay).add_(current * (1.0 - decay))
        m.mul_(torch.pow(b1, missed).to(m.dtype).unsqueeze(1))
        v.mul_(torch.pow(b2, missed).to(m.dtype).unsqueeze(1))
        # this step's own update, bias-corrected by the global step count
        m.lerp_(g, 1.0 - b1)
        v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
        if rows is None:
            mv_all.copy_(mv)
        else:
            mv_all.index_copy_(0, rows, mv)
        sqrt_bc2 = math.sqrt(1.0 - b2**step)
        own = m / (v.sqrt() + self.eps * sqrt_bc2) * (lr * sqrt_bc2 / (1.0 - b1**step))
        if weight_decay > 0.0:
            own.add_(current - update, alpha=lr * weight_decay)
        update.add_(own)
        if rows is None:
            param.sub_(update.reshape(param.shape))
        else:
            param.index_add_(0, rows, update.reshape((-1, *param.shape[1:])), alpha=-1.0)


class RowAdagrad(_RowOptimizer):
    """Row-wise Adagrad: one accumulator per row (mean squared gradient), as used for huge embedding
    tables — the optimizer state and update cost are a few passes over the touched rows, not ten."""

    def __init__(self, eps: float = 1e-8, initial: float = 0.0) -> None:
        super().__init__()
        self.eps, self.initial = eps, initial

    @torch.no_grad()
    def step(
        self,
        name: str,
        param: torch.Tensor,
        grad: torch.Tensor,
        lr: float,
        rows: torch.Tensor | None = None,
        weight_decay: float = 0.0,
    ) -> None:
        n_rows, g = self._as_rows(param, grad, rows)
        key = f"{name}.acc"
        if key not in self.state:
            self.state[key] = torch.full((n_rows,), self.initial, dtype=torch.float32, device=param.device)
        acc_all = self.state[key]
        if row_kernels.usable(param, acc_all, g):
            ids = torch.arange(n_rows) if rows is None else rows
            row_kernels.adagrad_rows(param.reshape(n_rows, -1), acc_all, ids, g, lr, self.eps, weight_decay)
            return
        sq = torch.linalg.vector_norm(g, dim=1).square_().div_(g.shape[1])
        if rows is None:
            acc = acc_all.add_(sq)
        else:
            acc = acc_all.index_select(0, rows).add_(sq)
            acc_all.index_copy_(0, rows, acc)
        scale = acc.sqrt().add_(self.eps).reciprocal_().mul_(-lr).unsqueeze(1)
        update = g * scale
        if weight_decay > 0.0:
            flat = param.reshape(n_rows, -1)
            current = flat if rows is None else flat.index_select(0, rows)
            update.add_(current, alpha=-lr * weight_decay)
        if rows is None:
            param.add_(update.reshape(param.shape))
        else:
            param.index_add_(0, rows, update.reshape((-1, *param.shape[1:])))
