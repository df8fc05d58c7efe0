"""OVE and friends: exactness with all negatives, unbiasedness, gradients, and the bound ordering."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.losses import (
    LOSSES,
    CandidateBatch,
    Candidates,
    exhaustive_candidates,
    ove_loss,
    ove_loss_reference,
    ove_subset_loss,
    sampled_candidates,
    softmax_loss,
)
from trainer.negatives import NegativeSampler


def _labels(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    ptr = torch.tensor([0, *np.cumsum([len(r) for r in rows]).tolist()], dtype=torch.long)
    ind = torch.tensor([y for r in rows for y in sorted(r)], dtype=torch.long)
    return ptr, ind


def _batch(cand: Candidates, full: torch.Tensor) -> CandidateBatch:
    """Scores of the candidate columns taken from a full [B, K] score matrix."""
    return CandidateBatch(cand=cand, scores=full[:, cand.label_ids], h=full.new_zeros(full.shape[0], 1))


def direct_ove_bound(scores: torch.Tensor, rows: list[list[int]]) -> torch.Tensor:
    """Mean over positive pairs of Σ_{m ∉ P_b} log(1 + exp(f_m − f_y)), written as plain loops."""
    terms = []
    k = scores.shape[1]
    for b, pos in enumerate(rows):
        for y in pos:
            acc = scores.new_zeros(())
            for m in range(k):
                if m not in pos:
                    acc = acc + torch.log1p(torch.exp(scores[b, m] - scores[b, y]))
            terms.append(acc)
    return torch.stack(terms).mean()


def direct_softmax_nll(scores: torch.Tensor, rows: list[list[int]]) -> torch.Tensor:
    terms = []
    for b, pos in enumerate(rows):
        neg = [m for m in range(scores.shape[1]) if m not in pos]
        for y in pos:
            logits = scores[b, [y, *neg]]
            terms.append(-(logits[0] - torch.logsumexp(logits, 0)))
    return torch.stack(terms).mean()


ROWS = [[2], [0, 5], [6], [1, 3, 4]]


def test_ove_with_all_negatives_equals_the_exact_bound() -> None:
    torch.manual_seed(0)
    s = torch.randn(len(ROWS), 7, dtype=torch.float64)
    cand = exhaustive_candidates(*_labels(ROWS), 7)
    got = ove_loss(_batch(cand, s))
    assert torch.allclose(got, direct_ove_bound(s, ROWS))
    assert torch.allclose(softmax_loss(_batch(cand, s)), direct_softmax_nll(s, ROWS))


def test_fused_ove_value_and_gradient_match_autograd_of_reference() -> None:
    torch.manual_seed(1)
    k = 50
    rows = [[1, 7], [3], [7, 20, 21], [], [49]]
    sampler = NegativeSampler(k, "unigram", 0.75, np.arange(k) % 7, seed=3)
    for _ in range(5):
        cand = sampled_candidates(*_labels(rows), sampler, 40)
        full = torch.randn(len(rows), k, dtype=torch.float64)
        s1 = full[:, cand.label_ids].clone().requires_grad_()
        s2 = s1.detach().clone().requires_grad_()
        h = full.new_zeros(len(rows), 1)
        a = ove_loss(CandidateBatch(cand, s1, h))
        b = ove_loss_reference(CandidateBatch(cand, s2, h))
        a.backward()
        b.backward()
        assert torch.allclose(a, b)
        assert s1.grad is not None and s2.grad is not None
        assert torch.allclose(s1.grad, s2.grad)


def test_sampled_ove_is_unbiased_for_the_full_bound() -> None:
    torch.manual_seed(2)
    k = 12
    s = torch.randn(len(ROWS), k, dtype=torch.float64)
    exact = direct_ove_bound(s, ROWS).item()
    for kind in ("uniform", "unigram"):
        sampler = NegativeSampler(k, kind, 0.75, np.arange(k) ** 2, seed=5)
        draws = [
            ove_loss(_batch(sampled_candidates(*_labels(ROWS), sampler, 5), s)).item() for _ in range(500)
        ]
        mean, sem = float(np.mean(draws)), float(np.std(draws) / math.sqrt(len(draws)))
        assert abs(mean - exact) < 5 * sem + 1e-9, (kind, mean, exact, sem)


def test_gradient_of_exhaustive_ove_matches_autograd_of_direct_formula() -> None:
    torch.manual_seed(3)
    s = torch.randn(len(ROWS), 7, dtype=torch.float64, requires_grad=True)
    cand = exhaustive_candidates(*_labels(ROWS), 7)
    ove_loss(_batch(cand, s)).backward()
    g1 = s.grad.clone() if s.grad is not None else None
    s.grad = None
    direct_ove_bound(s, ROWS).backward()
    assert g1 is not None and s.grad is not None
    assert torch.allclose(g1, s.grad)


def test_candidate_layout_sampled_first_positives_after() -> None:
    sampler = NegativeSampler(100, "uniform", seed=0)
    rows = [[5, 9], [9, 50]]
    cand = sampled_candidates(*_labels(rows), sampler, 30)
    ids = cand.label_ids.tolist()
    assert len(set(ids)) == len(ids)  # distinct columns
    assert ids[: cand.n_sampled] == sorted(ids[: cand.n_sampled])
    for r, c in zip(cand.pos_rows.tolist(), cand.pos_cols.tolist(), strict=True):
        assert ids[c] in rows[r] and bool(cand.pos_mask[r, c])
    assert int(cand.pos_mask.sum()) == 4
    assert {ids[c] for c in range(len(ids)) if cand.in_batch_pos[c]} == {5, 9, 50}


def _random_case(data: st.DataObject, k: int, scale: float) -> tuple[list[list[int]], torch.Tensor, int]:
    """1-4 rows with 1..K-1 positives each, and their scores (hypothesis draws the seed)."""
    n_rows = data.draw(st.integers(1, 4))
    rows = [
        sorted(data.draw(st.sets(st.integers(0, k - 1), min_size=1, max_size=max(1, k - 1))))
        for _ in range(n_rows)
    ]
    seed = data.draw(st.integers(0, 10_000))
    s = torch.randn(n_rows, k, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * scale
    return rows, s, seed


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(2, 9),
    data=st.data(),
    scale=st.floats(0.1, 8.0),
)
def test_bounds_are_ordered_softmax_le_subset_le_ove(k: int, data: st.DataObject, scale: float) -> None:
    """−log p ≤ eq.6 bound ≤ OVE bound (as losses), with all negatives, for any scores and label sets."""
    rows, s, _ = _random_case(data, k, scale)
    cand = exhaustive_candidates(*_labels(rows), k)
    b = _batch(cand, s)
    nll, sub, ove = softmax_loss(b).item(), ove_subset_loss(b).item(), ove_loss(b).item()
    direct = direct_ove_bound(s, rows).item()
    # where two bounds coincide (one negative a row), float64 rounding may order them either way: a
    # tolerance relative to their size, not an absolute one
    assert nll <= sub + 1e-9 * (1 + abs(sub))
    assert sub <= ove + 1e-9 * (1 + abs(ove))
    assert nll <= direct + 1e-9 * (1 + abs(direct))


def test_single_label_softmax_is_cross_entropy() -> None:
    torch.manual_seed(4)
    s = torch.randn(5, 11, dtype=torch.float64)
    y = [3, 0, 10, 3, 7]
    cand = exhaustive_candidates(*_labels([[v] for v in y]), 11)
    assert torch.allclose(softmax_loss(_batch(cand, s)), F.cross_entropy(s, torch.tensor(y)))


def test_registry_has_builtin_losses() -> None:
    assert {"ove", "ove-subset", "softmax"} <= set(LOSSES)
    assert LOSSES["softmax"].needs_all_labels and not LOSSES["ove"].needs_all_labels


# ------------------------------------------------------------------------------ grouped OVE (G > 1)


def _grouped_bound(scores: torch.Tensor, rows: list[list[int]], cols: list[int], group: int) -> torch.Tensor:
    """Mean over positive pairs of Σ_g log(1 + Σ_{m∈g, m∉P_b} e^{f_m − f_y}), groups = chunks of `cols`."""
    terms = []
    for b, pos in enumerate(rows):
        for y in pos:
            acc = scores.new_zeros(())
            for start in range(0, len(cols), group):
                neg = [m for m in cols[start : start + group] if m not in pos]
                if neg:
                    acc = acc + torch.log1p(torch.exp(scores[b, neg] - scores[b, y]).sum())
            terms.append(acc)
    return torch.stack(terms).mean()


@pytest.mark.parametrize(("group", "m"), [(2, 40), (3, 40), (8, 60), (64, 40)])
def test_grouped_ove_value_and_gradient_match_the_plain_formula(group: int, m: int) -> None:
    torch.manual_seed(5)
    k = 50
    rows = [[1, 7], [3], [7, 20, 21], [], [49]]
    sampler = NegativeSampler(k, "uniform", seed=3)
    for _ in range(4):
        cand = sampled_candidates(*_labels(rows), sampler, m, group_size=group)
        full = (torch.randn(len(rows), k, dtype=torch.float64) * 3).requires_grad_()
        got = ove_loss(_batch(cand, full))
        ids = cand.label_ids[: cand.n_sampled].tolist()
        scale = k / m if m < k else 1.0
        want = _grouped_bound(full, rows, ids, group) * scale
        (g1,) = torch.autograd.grad(got, full)
        (g2,) = torch.autograd.grad(want, full)
        assert torch.allclose(got, want)
        assert torch.allclose(g1, g2)
        ref = ove_loss_reference(_batch(cand, full))
        assert torch.allclose(got, ref)


@settings(max_examples=80, deadline=None)
@given(k=st.integers(2, 12), group=st.integers(2, 12), m=st.integers(1, 12), data=st.data(),
       scale=st.floats(0.1, 60.0), dtype=st.sampled_from([torch.float64, torch.float32]))
def test_grouped_ove_once_a_row_equals_the_sum_once_a_pair(
    k: int, group: int, m: int, data: st.DataObject, scale: float, dtype: torch.dtype
) -> None:
    """The grouped bound's value and both gradients, taken once a row (the path without hard negatives),
    equal the per-pair computation that hard negatives use, also for groups whose every column is a
    positive of the row (no term) and for margins of hundreds (no overflow)."""
    from trainer.losses import _OveGroupSum, _OveRowGroupSum, masked_negative_pairs

    rows, s, seed = _random_case(data, k, scale)
    cand = sampled_candidates(*_labels(rows), NegativeSampler(k, "uniform", seed=seed), m, group_size=group)
    n = cand.n_sampled
    scores = s[:, cand.label_ids].to(dtype)
    pos = scores[cand.pos_rows, cand.pos_cols]
    pw = torch.rand(cand.pos_rows.numel(), dtype=dtype, generator=torch.Generator().manual_seed(seed))
    c = k / min(m, k)
    hit = cand.pos_cols < n
    mask_p, mask_j = masked_negative_pairs(cand)
    out = []
    row_masks = (cand.pos_rows[hit], cand.pos_cols[hit])
    for fn, masks in ((_OveRowGroupSum, row_masks), (_OveGroupSum, (mask_p, mask_j))):
        neg, p = scores[:, :n].clone().requires_grad_(), pos.clone().requires_grad_()
        total = fn.apply(neg, p, cand.pos_rows, c, *masks, pw, group)
        out.append((total, *torch.autograd.grad(total * 1.5, (neg, p))))
    tol = {"rtol": 1e-9, "atol": 1e-9} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-4}
    for got, want in zip(out[0], out[1], strict=True):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, **tol)


def test_grouped_columns_are_a_random_order_of_the_sample_with_positives_mapped() -> None:
    sampler = NegativeSampler(100, "uniform", seed=0)
    rows = [[5, 9], [9, 50]]
    orders = set()
    for _ in range(5):
        cand = sampled_candidates(*_labels(rows), sampler, 30, group_size=4)
        ids = cand.label_ids.tolist()
        assert len(set(ids)) == len(ids) and cand.group_size == 4
        orders.add(ids[: cand.n_sampled] == sorted(ids[: cand.n_sampled]))
        for r, c in zip(cand.pos_rows.tolist(), cand.pos_cols.tolist(), strict=True):
            assert ids[c] in rows[r] and bool(cand.pos_mask[r, c])
        assert int(cand.pos_mask.sum()) == 4
    assert orders == {False}  # shuffled every time (30! orders: a sorted draw would be a bug)


def test_grouped_negatives_refuse_a_non_uniform_sampler() -> None:
    sampler = NegativeSampler(20, "unigram", 0.75, np.arange(20), seed=0)
    with pytest.raises(ValueError, match="uniform"):
        sampled_candidates(*_labels([[1]]), sampler, 5, group_size=2)


def test_one_group_holding_every_label_is_the_exact_softmax() -> None:
    torch.manual_seed(6)
    s = torch.randn(len(ROWS), 7, dtype=torch.float64)
    cand = sampled_candidates(*_labels(ROWS), NegativeSampler(7, "uniform", seed=1), 7, group_size=7)
    assert torch.allclose(ove_loss(_batch(cand, s)), direct_softmax_nll(s, ROWS))


@settings(max_examples=60, deadline=None)
@given(k=st.integers(2, 9), group=st.integers(1, 10), data=st.data(), scale=st.floats(0.1, 8.0))
def test_grouped_bound_lies_between_softmax_and_pairwise_ove(
    k: int, group: int, data: st.DataObject, scale: float
) -> None:
    """For every partition of the negatives: −log p ≤ Σ_g log(1 + a_g) ≤ Σ_m log(1 + a_m) (OVE)."""
    rows, s, seed = _random_case(data, k, scale)
    cand = sampled_candidates(*_labels(rows), NegativeSampler(k, "uniform", seed=seed), k, group_size=group)
    grouped = ove_loss(_batch(cand, s)).item()
    assert direct_softmax_nll(s, rows).item() <= grouped + 1e-9
    assert grouped <= direct_ove_bound(s, rows).item() + 1e-9


def test_sampled_grouped_ove_has_the_expected_value_of_a_bound() -> None:
    """Mean of the estimate = (K/M) Σ_chunks E[log(1 + a_g)] over random chunks, and it lies between
    −log p and the OVE bound (the docstring's concavity argument, checked by enumeration)."""
    torch.manual_seed(7)
    k, m, group = 8, 5, 2  # chunks of sizes 2, 2, 1
    rows = [[2], [0, 5], [6, 7]]
    s = torch.randn(len(rows), k, dtype=torch.float64) * 2
    sizes = [min(group, m - start) for start in range(0, m, group)]
    per_pair = []
    for b, pos in enumerate(rows):
        for y in pos:
            acc = 0.0
            for size in sizes:
                subsets = list(itertools.combinations(range(k), size))
                acc += sum(
                    math.log1p(sum(math.exp(float(s[b, j] - s[b, y])) for j in sub if j not in pos))
                    for sub in subsets
                ) / len(subsets)
            per_pair.append(acc * k / m)
    expected = float(np.mean(per_pair))
    assert direct_softmax_nll(s, rows).item() < expected < direct_ove_bound(s, rows).item()
    sampler = NegativeSampler(k, "uniform", seed=11)
    draws = [
        ove_loss(_batch(sampled_candidates(*_labels(rows), sampler, m, group_size=group), s)).item()
        for _ in range(3000)
    ]
    mean, sem = float(np.mean(draws)), float(np.std(draws) / math.sqrt(len(draws)))
    assert abs(mean - expected) < 5 * sem, (mean, expected, sem)


def test_the_positive_mask_made_on_demand_marks_only_pairs_with_a_column_here() -> None:
    """A rank's candidates list every pair of the batch, those of other ranks' labels with the column C;
    its [B, C] mask, made when first asked for, marks exactly its own pairs."""
    from trainer.label_shards import LabelShard, shard_candidates

    y_ptr = torch.tensor([0, 2, 3, 6, 6, 8])
    y_ind = torch.tensor([1, 7, 2, 0, 5, 9, 4, 8])
    shard = LabelShard(0, 6, 12)  # labels 0-5 are this rank's
    sc = shard_candidates(y_ptr, y_ind, shard, NegativeSampler(6, seed=2), 4, 1)
    cand = sc.cand
    assert cand.mask is None  # nothing made until asked
    c = cand.label_ids.numel()
    want = torch.zeros(5, c, dtype=torch.bool)
    for p in range(y_ind.numel()):
        row, label = int(cand.pos_rows[p]), int(y_ind[p])
        if label < 6:
            want[row, int((cand.label_ids == label).nonzero())] = True
        else:
            assert int(cand.pos_cols[p]) == c
    assert torch.equal(cand.pos_mask, want) and cand.pos_mask.shape == (5, c)
    assert cand.pos_mask is cand.mask  # made once
