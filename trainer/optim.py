"""Row-wise Adam: updates only the rows a step touched, so optimizer cost is O(rows touched · width).

Each row keeps its own step count for bias correction (a label seen for the first time at step 10^5 gets
a normal-sized first step, not the inflated one a global count would give). Dense parameters use the same
code with `rows=None`. Weight decay is decoupled (AdamW-style) and applied lazily to touched rows only.
State is a flat dict of tensors so checkpoints go straight to safetensors.
"""

from __future__ import annotations

import torch


class RowAdam:
    def __init__(self, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8) -> None:
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.state: dict[str, torch.Tensor] = {}

    def _ensure(self, name: str, param: torch.Tensor) -> None:
        if f"{name}.m" not in self.state:
            self.state[f"{name}.m"] = torch.zeros_like(param)
            self.state[f"{name}.v"] = torch.zeros_like(param)
            n_rows = param.shape[0] if param.dim() > 0 else 1
            self.state[f"{name}.t"] = torch.zeros(n_rows, dtype=torch.float32, device=param.device)

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
        m_all, v_all, t_all = self.state[f"{name}.m"], self.state[f"{name}.v"], self.state[f"{name}.t"]
        b1, b2 = self.beta1, self.beta2
        if rows is None:
            t_all.add_(1.0)
            m_all.mul_(b1).add_(grad, alpha=1 - b1)
            v_all.mul_(b2).addcmul_(grad, grad, value=1 - b2)
            t = t_all if param.dim() > 1 else t_all[0]
            m, v = m_all, v_all
        else:
            t = t_all.index_select(0, rows).add_(1.0)
            t_all.index_copy_(0, rows, t)
            m = m_all.index_select(0, rows).mul_(b1).add_(grad, alpha=1 - b1)
            v = v_all.index_select(0, rows).mul_(b2).addcmul_(grad, grad, value=1 - b2)
            m_all.index_copy_(0, rows, m)
            v_all.index_copy_(0, rows, v)
        bc1 = 1.0 - torch.pow(b1, t)
        bc2 = 1.0 - torch.pow(b2, t)
        if param.dim() > 1:
            shape = (-1,) + (1,) * (param.dim() - 1)
            bc1, bc2 = bc1.reshape(shape), bc2.reshape(shape)
        update = (m / bc1) / ((v / bc2).sqrt_().add_(self.eps))
        if weight_decay > 0.0:
            current = param if rows is None else param.index_select(0, rows)
            update.add_(current, alpha=weight_decay)
        if rows is None:
            param.sub_(update * lr)
        else:
            param.index_add_(0, rows, update, alpha=-lr)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return dict(self.state)

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        self.state = {k: v.clone() for k, v in tensors.items()}
