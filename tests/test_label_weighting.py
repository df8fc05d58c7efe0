"""`label_weighting="row"`: every row with positives weighs the same, shared equally by its positives."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.losses import (
    CandidateBatch,
    exhaustive_candidates,
    ove_loss,
    ove_subset_loss,
    row_pair_weights,
    softmax_loss,
)


def _labels(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    ptr = torch.tensor([0, *np.cumsum([len(r) for r in rows]).tolist()], dtype=torch.long)
    ind = torch.tensor([y for r in rows for y in sorted(r)], dtype=torch.long)
    return ptr, ind


def _pair_nll(s: torch.Tensor, row: list[int], y: int, ove: bool) -> float:
    """−log p(y|x) (softmax over y and the row's non-positives) or its OVE bound, by plain loops."""
    negs = [m for m in range(s.shape[0]) if m not in row]
    if ove:
        return sum(math.log1p(math.exp(float(s[m] - s[y]))) for m in negs)
    return -float(s[y]) + math.log(math.exp(float(s[y])) + sum(math.exp(float(s[m])) for m in negs))


@settings(max_examples=40, deadline=None)
@given(k=st.integers(3, 8), data=st.data())
def test_row_weighting_is_mean_over_rows_of_mean_over_positives(k: int, data: st.DataObject) -> None:
    rows = [
        sorted(data.draw(st.sets(st.integers(0, k - 1), min_size=0, max_size=k - 1)))
        for _ in range(data.draw(st.integers(1, 5)))
    ]
    if not any(rows):
        rows[0] = [0]
    seed = data.draw(st.integers(0, 10_000))
    s = torch.randn(len(rows), k, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * 2
    cand = exhaustive_candidates(*_labels(rows), k)
    cand.pair_weight = row_pair_weights(cand, torch.float64)
    w = cand.pair_weight
    assert math.isclose(float(w.sum()), 1.0, rel_tol=1e-9)
    batch = CandidateBatch(cand=cand, scores=s, h=s.new_zeros(len(rows), 1))
    nonempty = [(b, r) for b, r in enumerate(rows) if r]
    for ove, fn in ((True, ove_loss), (False, softmax_loss)):
        want = sum(sum(_pair_nll(s[b], r, y, ove) for y in r) / len(r) for b, r in nonempty) / len(nonempty)
        assert math.isclose(float(fn(batch)), want, rel_tol=1e-7, abs_tol=1e-9)
    # eq. 6 lies between the two under the same weighting
    assert float(softmax_loss(batch)) <= float(ove_subset_loss(batch)) + 1e-9 <= float(ove_loss(batch)) + 2e-9


def test_row_weighting_differs_from_pair_mean_when_rows_have_unequal_label_counts() -> None:
    rows = [[0], [1, 2, 3]]
    s = torch.tensor([[3.0, 0.0, 0.0, 0.0, 0.0], [0.0, -2.0, -2.0, -2.0, 1.0]], dtype=torch.float64)
    cand = exhaustive_candidates(*_labels(rows), 5)
    pair_mean = float(ove_loss(CandidateBatch(cand=cand, scores=s, h=s.new_zeros(2, 1))))
    cand.pair_weight = row_pair_weights(cand, torch.float64)
    assert cand.pair_weight.tolist() == [0.5, 1 / 6, 1 / 6, 1 / 6]
    row_mean = float(ove_loss(CandidateBatch(cand=cand, scores=s, h=s.new_zeros(2, 1))))
    assert row_mean < pair_mean  # the easy single-label row now counts as much as the hard 3-label row
