"""`ove-log`: log(1 + OVE bound) per positive pair — value, bound, gradient shape, and that it trains."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer.losses import LOSSES, CandidateBatch, exhaustive_candidates, ove_log_loss, ove_loss
from trainer.params import TrainParams
from trainer.synth import synth_dataset
from trainer.train import QuietHooks, train

ROWS = [[2], [0, 5], [6], [1, 3, 4]]


def _labels(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    ptr = torch.tensor([0, *np.cumsum([len(r) for r in rows]).tolist()], dtype=torch.long)
    ind = torch.tensor([y for r in rows for y in sorted(r)], dtype=torch.long)
    return ptr, ind


def _batch(s: torch.Tensor, rows: list[list[int]]) -> CandidateBatch:
    cand = exhaustive_candidates(*_labels(rows), s.shape[1])
    return CandidateBatch(cand, s, s.new_zeros(s.shape[0], 1))


def _per_pair(s: torch.Tensor, rows: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(OVE_p, exact NLL_p) for every positive pair, written as plain loops."""
    out = []
    for b, pos in enumerate(rows):
        neg = [m for m in range(s.shape[1]) if m not in pos]
        for y in pos:
            ove = torch.log1p(torch.exp(s[b, neg] - s[b, y])).sum()
            nll = -(s[b, y] - torch.logsumexp(s[b, [y, *neg]], 0))
            out.append((ove, nll))
    return out


def test_value_is_mean_log1p_of_the_pair_bounds_and_bounds_log1p_nll() -> None:
    torch.manual_seed(0)
    for scale in (0.1, 1.0, 5.0):
        s = torch.randn(len(ROWS), 9, dtype=torch.float64) * scale
        pairs = _per_pair(s, ROWS)
        got = ove_log_loss(_batch(s, ROWS))
        assert torch.allclose(got, torch.stack([torch.log1p(o) for o, _ in pairs]).mean())
        assert got >= torch.stack([torch.log1p(n) for _, n in pairs]).mean() - 1e-12


def test_gradient_is_the_ove_gradient_divided_by_one_plus_the_bound() -> None:
    torch.manual_seed(1)
    rows = [[3]]
    s = torch.randn(1, 12, dtype=torch.float64)
    s[0, 3] = -4.0  # a hard pair: OVE_p is large
    a = s.clone().requires_grad_()
    ove_log_loss(_batch(a, rows)).backward()
    b = s.clone().requires_grad_()
    value = ove_loss(_batch(b, rows))
    value.backward()
    assert a.grad is not None and b.grad is not None
    assert torch.allclose(a.grad, b.grad / (1.0 + value.detach()))
    assert abs(a.grad[0, 3].item()) < 1.0 < abs(b.grad[0, 3].item())


@pytest.mark.parametrize("loss", ["ove-log", "ove-norm"])
def test_registered_sampled_and_trains(loss: str) -> None:
    spec = LOSSES[loss]
    assert spec.sampled_scores_only and not spec.needs_all_labels
    tr, te = synth_dataset(40, 300, 600, seed=2), synth_dataset(40, 300, 200, seed=2, part=1)
    params = TrainParams(loss=loss, dim=16, epochs=3, batch_size=64, negatives=16, eval_every=0)
    result = train(params, tr, te, out_dir=None, hooks=QuietHooks())
    assert result.metrics["p@1"] > 0.3
