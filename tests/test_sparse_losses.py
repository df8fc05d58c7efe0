"""Sparsemax loss and ε-ev-softmax NLL: values against textbook formulas, gradients, candidate-set use."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from trainer.losses import CandidateBatch, exhaustive_candidates, get_loss, sampled_candidates
from trainer.negatives import NegativeSampler
from trainer.sparse_losses import evsoftmax_loss, sparsemax_loss, sparsemax_loss_rows
from trainer.sparse_maps import evsoftmax_log_torch, sparsemax_torch


def _textbook_sparsemax_loss(z: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    p = sparsemax_torch(z)
    s = p > 0
    tau = (z[s] - p[s])[0]
    return -(q * z).sum() + 0.5 * ((z[s] ** 2).sum() - s.sum() * tau**2) + 0.5 * (q**2).sum()


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(np.float64, st.integers(2, 9), elements=st.floats(-4, 4, allow_nan=False)),
    st.integers(0, 2**31 - 1),
)
def test_sparsemax_loss_value_and_gradient(z_np: np.ndarray, seed: int) -> None:
    rng = np.random.default_rng(seed)
    one_hot = np.eye(z_np.size)[rng.integers(z_np.size)]
    q_np = rng.dirichlet(np.ones(z_np.size)) if rng.random() < 0.5 else one_hot
    z = torch.tensor(z_np, requires_grad=True)
    q = torch.tensor(q_np)
    loss = sparsemax_loss_rows(z.unsqueeze(0), q.unsqueeze(0))[0]
    torch.testing.assert_close(loss, _textbook_sparsemax_loss(z.detach(), q), atol=1e-9, rtol=1e-9)
    assert float(loss) >= -1e-12
    loss.backward()
    assert z.grad is not None
    torch.testing.assert_close(z.grad, sparsemax_torch(z.detach()) - q, atol=1e-12, rtol=0)


def test_sparsemax_loss_is_zero_at_a_margin_and_shift_invariant() -> None:
    z = torch.tensor([[3.0, 1.5, -2.0]], dtype=torch.float64)
    q = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    assert float(sparsemax_loss_rows(z, q)[0]) == 0.0  # margin ≥ 1: sparsemax(z) = q
    z2 = torch.tensor([[0.2, 0.1, -0.3]], dtype=torch.float64)
    torch.testing.assert_close(sparsemax_loss_rows(z2, q), sparsemax_loss_rows(z2 + 1e6, q))


def _batch(y_rows: list[list[int]], n_labels: int, d: int = 4, seed: int = 0) -> CandidateBatch:
    ind = torch.tensor([i for r in y_rows for i in r], dtype=torch.int64)
    ptr = torch.tensor(np.cumsum([0] + [len(r) for r in y_rows]), dtype=torch.int64)
    cand = exhaustive_candidates(ptr, ind, n_labels)
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(len(y_rows), d, generator=gen, dtype=torch.float64)
    w = torch.randn(n_labels, d + 1, generator=gen, dtype=torch.float64)
    scores = torch.cat([h, torch.ones(len(y_rows), 1, dtype=torch.float64)], 1) @ w.T
    return CandidateBatch(cand=cand, scores=scores.requires_grad_(), h=h)


def test_sparsemax_loss_exhaustive_is_mean_of_row_losses() -> None:
    batch = _batch([[0, 3], [2], []], n_labels=6)
    got = sparsemax_loss(batch)
    q = torch.zeros(2, 6, dtype=torch.float64)
    q[0, [0, 3]] = 0.5
    q[1, 2] = 1.0
    want = torch.stack([_textbook_sparsemax_loss(batch.scores[i].detach(), q[i]) for i in range(2)]).mean()
    torch.testing.assert_close(got.detach(), want)
    got.backward()
    assert batch.scores.grad is not None
    assert torch.all(batch.scores.grad[2] == 0)  # a row without labels contributes nothing


def test_evsoftmax_loss_exhaustive_matches_direct_nll() -> None:
    batch = _batch([[1], [4], [0, 2]], n_labels=7, seed=3)
    got = evsoftmax_loss(batch, eps=1e-3)
    s = batch.scores.detach()
    nlls = []
    for b, labels in enumerate([[1], [4], [0, 2]]):
        t = s[b].mean()
        for y in labels:
            others = [lab for lab in labels if lab != y]
            keep = torch.ones(7, dtype=torch.bool)
            keep[others] = False
            logits = s[b] + torch.log((s[b] >= t).to(s.dtype) + 1e-3)
            logits = torch.where(keep, logits, torch.tensor(-torch.inf, dtype=s.dtype))
            nlls.append(torch.logsumexp(logits, 0) - logits[y])
    torch.testing.assert_close(got.detach(), torch.stack(nlls).mean())
    # single-label rows: the same as evsoftmax_log_torch over the row
    one = _batch([[5]], n_labels=7, seed=4)
    direct = -evsoftmax_log_torch(one.scores.detach(), eps=1e-3)[0, 5]
    torch.testing.assert_close(evsoftmax_loss(one, eps=1e-3).detach(), direct)


def test_evsoftmax_loss_gradient_matches_finite_differences() -> None:
    batch = _batch([[1], [4, 5]], n_labels=8, seed=5)
    scores = batch.scores.detach().clone().requires_grad_()

    def fn(s: torch.Tensor) -> torch.Tensor:
        return evsoftmax_loss(CandidateBatch(cand=batch.cand, scores=s, h=batch.h), eps=1e-2)

    assert torch.autograd.gradcheck(fn, (scores,))


def test_sampled_losses_are_finite_and_move_the_positive_up() -> None:
    gen = torch.Generator().manual_seed(0)
    k, d = 50, 8
    sampler = NegativeSampler(k, "uniform", seed=1)
    ptr = torch.tensor([0, 2, 3, 3])
    ind = torch.tensor([3, 7, 11])
    cand = sampled_candidates(ptr, ind, sampler, 10)
    h = torch.randn(3, d, generator=gen)
    for name in ("sparsemax", "evsoftmax"):
        scores = torch.randn(3, cand.label_ids.numel(), generator=gen).requires_grad_()
        loss = get_loss(name).fn(CandidateBatch(cand=cand, scores=scores, h=h))
        assert torch.isfinite(loss)
        loss.backward()
        assert scores.grad is not None and torch.isfinite(scores.grad).all()
        if name == "evsoftmax":  # per positive pair: descending the loss raises each positive's score
            assert torch.all(scores.grad[cand.pos_rows, cand.pos_cols] <= 0)
        else:  # gradient (p − q)/rows: each row sums to 0, the single-label row's positive goes up
            torch.testing.assert_close(scores.grad.sum(dim=1), torch.zeros(3), atol=1e-6, rtol=0)
            assert float(scores.grad[1, cand.pos_cols[2]]) <= 0


def test_sparsemax_pairs_loss_matches_per_pair_textbook_and_masks_other_positives() -> None:
    batch = _batch([[0, 3], [2]], n_labels=6, seed=7)
    got = get_loss("sparsemax-pairs").fn(batch)
    s = batch.scores.detach()
    want = []
    for b, y, other in [(0, 0, [3]), (0, 3, [0]), (1, 2, [])]:
        keep = [j for j in range(6) if j not in other]
        q = torch.zeros(len(keep), dtype=torch.float64)
        q[keep.index(y)] = 1.0
        want.append(_textbook_sparsemax_loss(s[b, keep], q))
    torch.testing.assert_close(got.detach(), torch.stack(want).mean())
    got.backward()
    assert batch.scores.grad is not None and torch.isfinite(batch.scores.grad).all()
