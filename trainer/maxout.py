"""Maxout hidden layers (Goodfellow et al. 2013): each unit is the max of k linear pieces.

A maxout unit learns its own convex piecewise-linear activation; the paper pairs it with dropout on the
layer's input, which is what `Maxout` does (dropout → affine map to out·k → max over the k pieces).
"""

from __future__ import annotations

import torch
from torch import nn


class Maxout(nn.Module):
    """[B, in_dim] → [B, out_dim]: dropout on the input, then max over `pieces` affine maps per unit."""

    def __init__(self, in_dim: int, out_dim: int, pieces: int, dropout: float = 0.0) -> None:
        super().__init__()
        if pieces < 1:
            raise ValueError(f"maxout pieces must be >= 1, got {pieces}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.in_dim, self.out_dim, self.pieces = in_dim, out_dim, pieces
        self.drop = nn.Dropout(dropout)
        # pieces of one unit are adjacent columns: output column u·k + j is piece j of unit u
        self.linear = nn.Linear(in_dim, out_dim * pieces)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.linear(self.drop(x))
        return z.view(*z.shape[:-1], self.out_dim, self.pieces).amax(dim=-1)

    def extra_repr(self) -> str:
        return f"in_dim={self.in_dim}, out_dim={self.out_dim}, pieces={self.pieces}"
