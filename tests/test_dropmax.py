"""DropMax: the concrete relaxation, the objective's terms, sparse head gradients and predictive scores."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from trainer import dropmax
from trainer.dropmax import bernoulli_entropy, dropmax_loss, effective_scores, relaxed_bernoulli
from trainer.losses import CandidateBatch, exhaustive_candidates, get_loss, sampled_candidates
from trainer.model import ModelShape, XCModel
from trainer.negatives import NegativeSampler


def test_registered_with_its_retain_head() -> None:
    spec = get_loss("dropmax")
    assert spec.extra_heads == (dropmax.HEAD,)
    assert not spec.needs_all_labels


def test_relaxed_bernoulli_rounds_to_bernoulli_of_rho() -> None:
    # P(concrete sample > 1/2) = σ(logit) exactly, whatever the temperature
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([-2.0, 0.0, 1.5]).repeat(40000, 1)
    z = relaxed_bernoulli(logits, 0.5, generator=gen)
    assert torch.all((z >= 0) & (z <= 1))
    frac = (z > 0.5).double().mean(0)
    torch.testing.assert_close(frac, torch.sigmoid(logits[0]).double(), atol=0.01, rtol=0)
    # differentiable in the logits (reparameterised)
    lg = torch.zeros(5, requires_grad=True)
    relaxed_bernoulli(lg, 0.5).sum().backward()
    assert lg.grad is not None and torch.all(lg.grad > 0)


def test_bernoulli_entropy_is_stable_and_correct() -> None:
    g = torch.tensor([-50.0, -1.0, 0.0, 2.0, 50.0], dtype=torch.float64)
    p = torch.sigmoid(g)
    want = -(p * torch.log(p) + (1 - p) * torch.log1p(-p))
    got = bernoulli_entropy(g)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[1:4], want[1:4])
    assert abs(float(got[2]) - math.log(2)) < 1e-12


def test_effective_scores_are_softmax_of_rho_weighted_exponentials() -> None:
    f = torch.tensor([[1.0, 0.5, -1.0]], dtype=torch.float64)
    g = torch.tensor([[3.0, -2.0, 0.0]], dtype=torch.float64)
    p = torch.softmax(effective_scores(f, g), dim=1)
    rho = torch.sigmoid(g)
    want = rho * torch.exp(f) / (rho * torch.exp(f)).sum()
    torch.testing.assert_close(p, want)


def _batch(exhaustive: bool, seed: int = 0) -> tuple[CandidateBatch, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    k, d = 12, 5
    ptr = torch.tensor([0, 1, 3])
    ind = torch.tensor([2, 5, 9])
    if exhaustive:
        cand = exhaustive_candidates(ptr, ind, k)
    else:
        cand = sampled_candidates(ptr, ind, NegativeSampler(k, "uniform", seed=3), 6)
    h = torch.randn(2, d, generator=gen, dtype=torch.float64)
    head = torch.randn(cand.label_ids.numel(), d + 1, generator=gen, dtype=torch.float64)
    rows = (torch.randn(cand.label_ids.numel(), d + 1, generator=gen, dtype=torch.float64)).requires_grad_()
    scores = (torch.cat([h, torch.ones(2, 1, dtype=torch.float64)], 1) @ head.T).requires_grad_()
    return CandidateBatch(cand=cand, scores=scores, h=h, extra={dropmax.HEAD: rows}), rows


def test_objective_terms_without_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the concrete sample replaced by a fixed mask, the loss is the sum of the documented terms,
    each recomputed here from its definition."""
    batch, rows = _batch(exhaustive=True)
    mask = torch.zeros(2, 12, dtype=torch.float64)
    mask[0, [4, 7]] = 1.0  # a few retained non-targets

    def fixed(logits: torch.Tensor, temperature: float, generator: object = None) -> torch.Tensor:
        return mask

    monkeypatch.setattr(dropmax, "relaxed_bernoulli", fixed)
    got = dropmax_loss(batch)
    s = batch.scores.detach()
    g = (torch.cat([batch.h, torch.ones(2, 1, dtype=torch.float64)], 1) @ rows.detach().T)
    labels = [[2], [5, 9]]
    total = torch.zeros((), dtype=torch.float64)
    for b, ys in enumerate(labels):
        z = mask[b].clone()
        z[ys] = 1.0
        logit = s[b] + torch.log(z + dropmax.MASK_EPS)
        neg = torch.ones(12, dtype=torch.bool)
        neg[ys] = False
        for y in ys:
            total += torch.logaddexp(logit[y], torch.logsumexp(logit[neg], 0)) - logit[y]
            total += F.softplus(-g[b, y]) * (1 + dropmax.AUX_WEIGHT)  # KL (−log ρ_t) + aux on targets
        total += dropmax.AUX_WEIGHT * F.softplus(g[b, neg]).sum()
        total -= dropmax.ENTROPY_WEIGHT * bernoulli_entropy(g[b, neg]).sum()
    torch.testing.assert_close(got.detach(), total / 3)


def test_gradients_reach_scores_and_retain_rows_sampled() -> None:
    batch, rows = _batch(exhaustive=False, seed=1)
    loss = dropmax_loss(batch)
    assert torch.isfinite(loss)
    loss.backward()
    assert rows.grad is not None and torch.isfinite(rows.grad).all() and rows.grad.abs().sum() > 0
    assert batch.scores.grad is not None and torch.isfinite(batch.scores.grad).all()
    c = batch.cand
    # the retain logits of targets are pushed up (KL + auxiliary), so ρ_t → 1
    g = batch.h_aug().detach() @ rows.detach().T
    before = F.logsigmoid(g[c.pos_rows, c.pos_cols]).sum()
    after_rows = rows.detach() - 0.01 * rows.grad
    after = F.logsigmoid((batch.h_aug().detach() @ after_rows.T)[c.pos_rows, c.pos_cols]).sum()
    assert after > before


def test_model_scores_include_log_retain_probability() -> None:
    shape = ModelShape(n_features=6, n_labels=4, dim=3, extra_heads=(dropmax.HEAD,))
    model = XCModel(shape, seed=0)
    with torch.no_grad():
        model.extra[dropmax.HEAD].copy_(torch.randn(4, 4))
    h = torch.randn(2, 3)
    f = h @ model.head[:, :3].T + model.head[:, 3]
    g = h @ model.extra[dropmax.HEAD][:, :3].T + model.extra[dropmax.HEAD][:, 3]
    torch.testing.assert_close(model.score(h), f + F.logsigmoid(g))
    ids = torch.tensor([3, 1])
    torch.testing.assert_close(model.score(h, ids), (f + F.logsigmoid(g))[:, [3, 1]])
    assert np.isfinite(model.score(h).numpy()).all()


def test_pair_weights_uniform_equal_the_default_mean() -> None:
    """With one positive per row, uniform pair weights 1/P are exactly the default (mean over pairs)."""
    import dataclasses

    gen = torch.Generator().manual_seed(2)
    k, d = 9, 4
    cand = exhaustive_candidates(torch.tensor([0, 1, 2, 3]), torch.tensor([1, 4, 8]), k)
    h = torch.randn(3, d, generator=gen, dtype=torch.float64)
    scores = torch.randn(3, k, generator=gen, dtype=torch.float64)
    extra = {dropmax.HEAD: torch.randn(k, d + 1, generator=gen, dtype=torch.float64)}
    torch.manual_seed(5)
    base = dropmax_loss(CandidateBatch(cand=cand, scores=scores, h=h, extra=extra))
    weighted = dataclasses.replace(cand, pair_weight=torch.full((3,), 1.0 / 3, dtype=torch.float64))
    torch.manual_seed(5)
    same = dropmax_loss(CandidateBatch(cand=weighted, scores=scores, h=h, extra=extra))
    torch.testing.assert_close(same, base)
    skewed = dataclasses.replace(cand, pair_weight=torch.tensor([0.8, 0.1, 0.1], dtype=torch.float64))
    torch.manual_seed(5)
    other = dropmax_loss(CandidateBatch(cand=skewed, scores=scores, h=h, extra=extra))
    assert not torch.allclose(other, base)
