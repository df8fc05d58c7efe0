"""Row-wise Adam: updates only the rows a step touched, so optimizer cost is O(rows touched · width).

Each row keeps its own step count for bias correction (a label seen for the first time at step 10^5 gets
a normal-sized first step, not the inflated one a global count would give). Dense parameters use the same
code with `rows=None`. Weight decay is decoupled (AdamW-style) and applied lazily to touched rows only.
The first and second moments of a row sit side by side (`mv[r] = [m_r; v_r]`), so a step reads and writes
them with one gather and one scatter. State is a flat dict of tensors: checkpoints go straight to safetensors.
On the CPU both optimizers run as fused kernels (`trainer.row_kernels`); the torch code below is the same
update for other devices and for builds without numba. Row ids of one step must be distinct.
"""

from __future__ import annotations

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
        return n_rows, grad.reshape(n_rows if rows is None else rows.numel(), -1)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return dict(self.state)

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        self.state = {k: v.clone() for k, v in tensors.items()}


class RowAdam(_RowOptimizer):
    def __init__(self, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8) -> None:
        super().__init__()
        self.beta1, self.beta2, self.eps = beta1, beta2, eps

    def _ensure(self, name: str, param: torch.Tensor) -> None:
        if f"{name}.mv" not in self.state:
            rows = param.reshape(param.shape[0] if param.dim() > 0 else 1, -1)
            self.state[f"{name}.mv"] = torch.zeros(rows.shape[0], 2, rows.shape[1], device=param.device)
            self.state[f"{name}.t"] = torch.zeros(rows.shape[0], dtype=torch.float32, device=param.device)

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
        mv_all, t_all = self.state[f"{name}.mv"], self.state[f"{name}.t"]
        b1, b2 = self.beta1, self.beta2
        n_rows, g = self._as_rows(param, grad, rows)
        if row_kernels.usable(param, mv_all, t_all, g):
            ids = torch.arange(n_rows) if rows is None else rows
            row_kernels.adam_rows(
                param.reshape(n_rows, -1), mv_all, t_all, ids, g,
                lr, b1, b2, self.eps, weight_decay,
            )
            return
        if rows is None:
            t = t_all.add_(1.0)
            mv = mv_all
        else:
            t = t_all.index_select(0, rows).add_(1.0)
            t_all.index_copy_(0, rows, t)
            mv = mv_all.index_select(0, rows)
        m, v = mv[:, 0], mv[:, 1]
        m.lerp_(g, 1.0 - b1)
        v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
        if rows is not None:
            mv_all.index_copy_(0, rows, mv)
        # (m/bc1) / (sqrt(v/bc2) + eps) = m / ((sqrt(v) + eps·sqrt(bc2)) · bc1/sqrt(bc2))
        sqrt_bc2 = torch.sqrt(1.0 - torch.pow(b2, t))
        bc1 = 1.0 - torch.pow(b1, t)
        denom = v.sqrt().add_((self.eps * sqrt_bc2).unsqueeze(1)).mul_((bc1 / (lr * sqrt_bc2)).unsqueeze(1))
        update = m.div(denom)
        if weight_decay > 0.0:
            flat = param.reshape(n_rows, -1)
            current = flat if rows is None else flat.index_select(0, rows)
            update.add_(current, alpha=lr * weight_decay)
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
