"""Property tests for the sparse maps: distributions, the entmax oracle, top-k exactness, O(d) thresholds,
and gradients against finite differences."""

from __future__ import annotations

import entmax
import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from trainer.sparse_maps import (
    evsoftmax,
    evsoftmax_log_torch,
    evsoftmax_threshold,
    evsoftmax_threshold_linear,
    evsoftmax_topk,
    evsoftmax_torch,
    linear_head_means,
    normalize_topk,
    softmax,
    softmax_topk,
    sparsemax,
    sparsemax_topk,
    sparsemax_topk_report,
    sparsemax_torch,
)

SETTINGS = settings(max_examples=60, deadline=None)

# Values drawn from a small pool give many ties; the scale spreads them from tiny to huge.
_pool = st.sampled_from([-3.0, -1.0, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0])
_free = st.floats(-5.0, 5.0, allow_nan=False)
_scale = st.sampled_from([1e-3, 1.0, 10.0, 1e6, 1e15])


@st.composite
def score_batches(draw: st.DrawFn, min_k: int = 1, max_k: int = 12, huge: bool = True) -> np.ndarray:
    n = draw(st.integers(1, 5))
    k = draw(st.integers(min_k, max_k))
    elems = st.one_of(_pool, _free) if draw(st.booleans()) else _pool
    z = draw(hnp.arrays(np.float64, (n, k), elements=elems)) * draw(_scale)
    if huge and draw(st.booleans()):
        # plant ±huge entries (same magnitude, so ties among them too)
        mask = draw(hnp.arrays(np.int8, (n, k), elements=st.sampled_from([-1, 0, 0, 0, 1])))
        z = np.where(mask == 1, 1e30, np.where(mask == -1, -1e30, z))
    return z


def _assert_distribution(p: np.ndarray) -> None:
    assert np.all(p >= 0.0)
    np.testing.assert_allclose(p.sum(axis=-1), 1.0, atol=1e-9)


@SETTINGS
@given(score_batches())
def test_every_map_returns_a_distribution(z: np.ndarray) -> None:
    for fn in (sparsemax, evsoftmax, softmax):
        _assert_distribution(fn(z))
    t = torch.from_numpy(z)
    _assert_distribution(sparsemax_torch(t).numpy())
    _assert_distribution(evsoftmax_torch(t).numpy())
    _assert_distribution(evsoftmax_torch(t, eps=1e-3).numpy())


@SETTINGS
@given(score_batches())
def test_sparsemax_matches_entmax_oracle(z: np.ndarray) -> None:
    oracle = entmax.sparsemax(torch.from_numpy(z), dim=-1).numpy()
    np.testing.assert_allclose(sparsemax(z), oracle, atol=1e-6)
    np.testing.assert_allclose(sparsemax_torch(torch.from_numpy(z)).numpy(), oracle, atol=1e-6)
    z32 = z.astype(np.float32)
    oracle32 = entmax.sparsemax(torch.from_numpy(z32), dim=-1).numpy()
    np.testing.assert_allclose(sparsemax_torch(torch.from_numpy(z32)).numpy(), oracle32, atol=1e-6)


def test_sparsemax_absent_entries_and_infinities() -> None:
    inf = np.inf
    z = np.array([[-inf, 2.0, -inf, 1.0], [inf, 1.0, 2.0, inf], [-inf, -inf, -inf, -inf]])
    p = sparsemax(z)
    np.testing.assert_allclose(p[0], [0, 1, 0, 0])
    np.testing.assert_allclose(p[1], [0.5, 0, 0, 0.5])
    np.testing.assert_allclose(p[2], 0.0)  # nothing present: no distribution, all zeros
    pt = sparsemax_torch(torch.tensor(z[:1]))
    np.testing.assert_allclose(pt.numpy()[0], [0, 1, 0, 0])
    with pytest.raises(ValueError, match="NaN"):
        sparsemax(np.array([[1.0, np.nan]]))


@st.composite
def topk_cases(draw: st.DrawFn) -> tuple[np.ndarray, int, np.ndarray]:
    z = draw(score_batches(min_k=2, max_k=14, huge=False))
    k = draw(st.integers(1, z.shape[1]))
    slack = draw(hnp.arrays(np.float64, (z.shape[0],), elements=st.sampled_from([0.0, 0.0, 1e-9, 0.3, 5.0])))
    return z, k, slack


@settings(max_examples=150, deadline=None)
@given(topk_cases())
def test_sparsemax_topk_flag_is_never_wrong(case: tuple[np.ndarray, int, np.ndarray]) -> None:
    z, k, slack = case
    zs = -np.sort(-z, axis=1)
    top = zs[:, :k]
    bound = zs[:, k] + slack if k < z.shape[1] else np.full(z.shape[0], -np.inf)
    full = sparsemax(zs)
    probs, exact = sparsemax_topk(top, bound)
    _assert_distribution(probs)
    np.testing.assert_array_equal(probs, sparsemax(top))  # one threshold serves probabilities and flag
    rep = sparsemax_topk_report(top, bound, n_labels=z.shape[1])
    np.testing.assert_array_equal(rep.exact, exact)
    for i in range(z.shape[0]):
        rest = full[i, k:].sum()
        assert rest <= rep.rest_mass_bound[i] + 1e-9
        if exact[i]:
            assert rest == 0.0
            np.testing.assert_allclose(probs[i], full[i, :k], atol=1e-12)
        # not needlessly pessimistic: a clear gap between τ and the bound is certified
        support = probs[i] > 0
        tau = top[i, support][0] - probs[i, support][0]
        if bound[i] < tau - 1e-6 * (1 + abs(tau)):
            assert exact[i]
    # no bound known (graph index): never exact
    _, exact_none = sparsemax_topk(top, None)
    assert not exact_none.any()


def test_sparsemax_topk_with_infinite_and_absent_scores() -> None:
    inf = np.inf
    top = np.array([[inf, 3.0, -inf], [2.0, 1.9, -inf], [-inf, -inf, -inf], [inf, inf, 1.0]])
    probs, exact = sparsemax_topk(top, np.array([5.0, 0.0, -inf, inf]))
    np.testing.assert_array_equal(probs, sparsemax(top))
    assert list(exact) == [True, True, False, False]


def test_sparsemax_topk_ties_at_threshold_are_conservative() -> None:
    # τ of [1, 1] is 0.5; a left-out score of exactly 0.5 gets 0 — true, but the flag stays conservative.
    _, exact = sparsemax_topk(np.array([[1.0, 1.0], [1.0, 1.0]]), np.array([0.5, 0.4]))
    assert list(exact) == [False, True]


@SETTINGS
@given(st.integers(1, 6), st.integers(2, 40), st.integers(1, 8), st.integers(0, 2**31 - 1))
def test_evsoftmax_threshold_linear_equals_mean_of_all_scores(
    n: int, n_labels: int, d: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(n_labels, d)) * rng.choice([0.01, 1.0, 100.0])
    b = rng.normal(size=n_labels)
    h = rng.normal(size=(n, d))
    scores = h @ w.T + b
    w_mean, b_mean = linear_head_means(w, b)
    t_fast = evsoftmax_threshold_linear(h, w_mean, b_mean)
    np.testing.assert_allclose(t_fast, scores.mean(axis=1), rtol=1e-9, atol=1e-9 * np.abs(scores).max())
    expected = np.minimum(scores.mean(axis=1), scores.max(axis=1))
    np.testing.assert_allclose(evsoftmax_threshold(scores), expected)


@settings(max_examples=150, deadline=None)
@given(topk_cases())
def test_evsoftmax_topk_flag_and_rest_bound(case: tuple[np.ndarray, int, np.ndarray]) -> None:
    z, k, slack = case
    zs = -np.sort(-z, axis=1)
    n_labels = z.shape[1]
    top = zs[:, :k]
    bound = zs[:, k] + slack if k < n_labels else np.full(z.shape[0], -np.inf)
    t = evsoftmax_threshold(zs)
    full = evsoftmax(zs)
    rep = evsoftmax_topk(top, t, bound, n_labels)
    _assert_distribution(rep.probs)
    for i in range(z.shape[0]):
        rest = full[i, k:].sum()
        assert rest <= rep.rest_mass_bound[i] + 1e-9
        if rep.exact[i]:
            assert rest == 0.0
            np.testing.assert_allclose(rep.probs[i], full[i, :k], atol=1e-12)
        # not needlessly pessimistic: everything left out clearly below t, nothing listed near it
        margin = 1e-6 * (1 + max(abs(t[i]), np.abs(top[i]).max()))
        if bound[i] < t[i] - margin and np.abs(top[i] - t[i]).min() > margin:
            assert rep.exact[i]
    assert not evsoftmax_topk(top, t, None, n_labels + 1).exact.any()


@settings(max_examples=100, deadline=None)
@given(topk_cases())
def test_softmax_topk_rest_bound(case: tuple[np.ndarray, int, np.ndarray]) -> None:
    z, k, slack = case
    assume(np.abs(z).max() < 1e10)
    zs = -np.sort(-z, axis=1)
    n_labels = z.shape[1]
    bound = zs[:, k] + slack if k < n_labels else np.full(z.shape[0], -np.inf)
    rep = softmax_topk(zs[:, :k], bound, n_labels)
    _assert_distribution(rep.probs)
    full = softmax(zs)
    assert np.all(full[:, k:].sum(axis=1) <= rep.rest_mass_bound + 1e-9)
    assert np.array_equal(rep.exact, np.full(z.shape[0], k == n_labels))
    np.testing.assert_allclose(1.0 - rep.rest_mass_bound, 1.0 - rep.rest_mass_bound.clip(0, 1))


def test_normalize_topk_dispatch() -> None:
    top = np.array([[2.0, 1.0, 0.0]])
    assert normalize_topk("sparsemax", top, np.array([-1.0]), 10).exact[0]
    assert not normalize_topk("softmax", top, np.array([-1.0]), 10).exact[0]
    assert normalize_topk("evsoftmax", top, np.array([-1.0]), 10, threshold=np.array([0.5])).exact[0]
    with pytest.raises(ValueError, match="threshold"):
        normalize_topk("evsoftmax", top, None, 10)
    with pytest.raises(ValueError, match="unknown"):
        normalize_topk("entmax15", top, None, 10)


def test_sparsemax_gradients_match_finite_differences() -> None:
    gen = torch.Generator().manual_seed(0)
    for shape in [(3, 5), (2, 4, 7), (1, 1)]:
        z = (torch.randn(*shape, generator=gen, dtype=torch.float64) * 2).requires_grad_()
        assert torch.autograd.gradcheck(sparsemax_torch, (z,), check_forward_ad=True)
        assert torch.autograd.gradgradcheck(sparsemax_torch, (z,))
    z = torch.randn(4, 6, generator=gen, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: sparsemax_torch(x, dim=0), (z,))


def test_sparsemax_jacobian_is_closed_form_not_sort_fallback() -> None:
    z = torch.tensor([[0.9, 0.5, -1.0, 0.3]], dtype=torch.float64, requires_grad=True)
    p = sparsemax_torch(z)
    assert p.grad_fn is not None and "Sparsemax" in type(p.grad_fn).__name__
    jac = torch.autograd.functional.jacobian(sparsemax_torch, z)[0, :, 0, :]
    s = (p[0] > 0).to(torch.float64).detach()
    expected = torch.diag(s) - torch.outer(s, s) / s.sum()
    torch.testing.assert_close(jac, expected)


def test_absent_entries_get_zero_gradient() -> None:
    z = torch.tensor([[1.0, -torch.inf, 0.8]], dtype=torch.float64, requires_grad=True)
    (sparsemax_torch(z) * torch.tensor([[1.0, 5.0, -2.0]], dtype=torch.float64)).sum().backward()
    assert z.grad is not None and torch.isfinite(z.grad).all() and z.grad[0, 1] == 0.0


def test_evsoftmax_eps_gradients_match_finite_differences() -> None:
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(3, 6, generator=gen, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: evsoftmax_log_torch(x, eps=1e-3), (z,))
    # ε-form with ε → 0 approaches the hard ev-softmax
    hard = evsoftmax(z.detach().numpy())
    soft = evsoftmax_torch(z.detach(), eps=1e-12).numpy()
    np.testing.assert_allclose(soft, hard, atol=1e-9)
