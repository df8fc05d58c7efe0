"""`ove-norm`: OVE terms with each positive pair's total gradient capped at the pair's weight."""

from __future__ import annotations

import numpy as np
import torch

from trainer.losses import CandidateBatch, exhaustive_candidates, ove_loss, ove_normalized_loss


def _labels(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    ptr = torch.tensor([0, *np.cumsum([len(r) for r in rows]).tolist()], dtype=torch.long)
    ind = torch.tensor([y for r in rows for y in sorted(r)], dtype=torch.long)
    return ptr, ind


ROWS = [[2], [0, 5], [6], [1, 3, 4]]


def _grad(fn: object, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = s.clone().requires_grad_()
    cand = exhaustive_candidates(*_labels(ROWS), s.shape[1])
    value = fn(CandidateBatch(cand, x, x.new_zeros(s.shape[0], 1)))  # type: ignore[operator]
    value.backward()
    assert x.grad is not None
    return value.detach(), x.grad


def test_equals_ove_where_no_pair_pulls_more_than_its_weight() -> None:
    s = torch.full((len(ROWS), 7), -8.0, dtype=torch.float64)
    for b, pos in enumerate(ROWS):
        s[b, pos] = 8.0  # positives far above: Σ_m σ(f_m − f_y) ≪ 1 for every pair
    v_norm, g_norm = _grad(ove_normalized_loss, s)
    v_ove, g_ove = _grad(ove_loss, s)
    assert torch.allclose(v_norm, v_ove) and torch.allclose(g_norm, g_ove)


def test_hard_pairs_pull_at_most_their_weight() -> None:
    torch.manual_seed(0)
    s = torch.randn(len(ROWS), 30, dtype=torch.float64)
    for b, pos in enumerate(ROWS):
        s[b, pos] = -6.0  # positives far below: plain OVE pulls each pair by ~29 times its weight
    _, g_norm = _grad(ove_normalized_loss, s)
    _, g_ove = _grad(ove_loss, s)
    n_pairs = sum(len(r) for r in ROWS)
    for b, pos in enumerate(ROWS):
        for y in pos:
            assert abs(g_norm[b, y].item() + 1.0 / n_pairs) < 1e-9
            assert g_ove[b, y].item() < -20.0 / n_pairs
    # the negatives keep OVE's shape: proportional to σ(f_m − f_y) within a single-label row
    z = torch.sigmoid(s[0] - s[0, 2])
    z[2] = 0.0
    ratio = g_norm[0] / z.clamp(min=1e-300)
    ratio = ratio[torch.arange(30) != 2]
    assert torch.allclose(ratio, ratio[0].expand_as(ratio))
