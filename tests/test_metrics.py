"""Metrics against hand-computed cases, plus properties that must hold for any ranking."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from trainer.metrics import (
    evaluate_topk,
    hits,
    ndcg_at_k,
    precision_at_k,
    propensities,
    psp_at_k,
)

# Three rows, four labels. Row 0 true {0, 2}; row 1 has no labels; row 2 true {1}.
Y = sp.csr_matrix(np.array([[1, 0, 1, 0], [0, 0, 0, 0], [0, 1, 0, 0]], dtype=np.float32))
TOP = np.array([[2, 1, 0], [0, 1, 2], [3, 1, -1]])


def test_hits_marks_true_labels_and_ignores_padding() -> None:
    assert hits(TOP, Y).tolist() == [[True, False, True], [False, False, False], [False, True, False]]


def test_precision_by_hand() -> None:
    # row 0: hits at ranks 1 and 3; row 1: none (no labels -> 0); row 2: hit at rank 2
    assert precision_at_k(TOP, Y, 1) == pytest.approx((1 + 0 + 0) / 3)
    assert precision_at_k(TOP, Y, 3) == pytest.approx((2 / 3 + 0 + 1 / 3) / 3)
    # k beyond the predicted columns: the missing slots are misses and P@5 still divides by 5
    assert precision_at_k(TOP, Y, 5) == pytest.approx((2 / 5 + 0 + 1 / 5) / 3)


def test_ndcg_by_hand() -> None:
    row0 = (1 + 1 / math.log2(4)) / (1 + 1 / math.log2(3))  # hits at ranks 1, 3; two true labels
    row2 = (1 / math.log2(3)) / 1.0  # hit at rank 2; one true label
    assert ndcg_at_k(TOP, Y, 3) == pytest.approx((row0 + 0 + row2) / 3)
    assert ndcg_at_k(TOP, Y, 1) == pytest.approx((1 + 0 + 0) / 3)


def test_propensities_by_hand() -> None:
    # 4 rows; label counts [3, 1, 0]
    Yt = sp.csr_matrix(np.array([[1, 0, 0], [1, 1, 0], [1, 0, 0], [0, 0, 0]]))
    A, B = 0.55, 1.5
    C = (math.log(4) - 1) * (B + 1) ** A
    expected = [1 / (1 + C * (n + B) ** -A) for n in (3, 1, 0)]
    assert propensities(Yt).tolist() == pytest.approx(expected)
    # rarer labels have smaller propensity
    p = propensities(Yt)
    assert p[0] > p[1] > p[2]


def test_psp_by_hand() -> None:
    prop = np.array([0.5, 0.25, 0.8, 0.9])
    # row 0 true {0 (1/p=2), 2 (1/p=1.25)}; row 2 true {1 (1/p=4)}
    # P@1 top: row0 -> 2 (hit, 1.25), row2 -> 3 (miss). best@1: row0 max(2, 1.25)=2, row2 4.
    assert psp_at_k(TOP, Y, prop, 1) == pytest.approx(1.25 / (2 + 4))
    # @3: gained row0 1.25 + 2, row2 4; best row0 2 + 1.25, row2 4 -> 1
    assert psp_at_k(TOP, Y, prop, 3) == pytest.approx(1.0)


def test_evaluate_topk_keys_and_values() -> None:
    prop = np.array([0.5, 0.25, 0.8, 0.9])
    out = evaluate_topk(TOP, Y, prop)
    assert list(out) == ["p@1", "p@3", "p@5", "ndcg@1", "ndcg@3", "ndcg@5", "psp@1", "psp@3", "psp@5"]
    assert out["p@3"] == pytest.approx(precision_at_k(TOP, Y, 3))
    assert "psp@1" not in evaluate_topk(TOP, Y)


def test_bad_inputs_are_rejected() -> None:
    with pytest.raises(ValueError, match="shape"):
        precision_at_k(TOP[:2], Y, 1)
    with pytest.raises(ValueError, match="label id 7"):
        precision_at_k(np.array([[7], [0], [0]]), Y, 1)
    with pytest.raises(ValueError, match="integer"):
        precision_at_k(TOP.astype(float), Y, 1)
    with pytest.raises(ValueError, match="propensities"):
        psp_at_k(TOP, Y, np.ones(3), 1)


# ----------------------------------------------------------------------------- properties


@st.composite
def ranking_case(draw: st.DrawFn) -> tuple[np.ndarray, sp.csr_matrix, np.ndarray]:
    n = draw(st.integers(1, 8))
    n_labels = draw(st.integers(1, 12))
    dense = np.array(draw(st.lists(st.lists(st.booleans(), min_size=n_labels, max_size=n_labels),
                                   min_size=n, max_size=n)), dtype=np.float32)
    k = draw(st.integers(1, n_labels))
    top = np.array([draw(st.permutations(range(n_labels)))[:k] for _ in range(n)], dtype=np.int64)
    prop = np.array(draw(st.lists(st.floats(0.05, 1.0), min_size=n_labels, max_size=n_labels)))
    return top, sp.csr_matrix(dense), prop


def _reference(top: np.ndarray, dense: np.ndarray, k: int) -> tuple[float, float]:
    """Plain-loop P@k and nDCG@k, written independently of the vectorised code."""
    ps, ns = [], []
    for i in range(dense.shape[0]):
        rel = [1.0 if j < top.shape[1] and dense[i, top[i, j]] else 0.0 for j in range(k)]
        ps.append(sum(rel) / k)
        dcg = sum(r / math.log2(j + 2) for j, r in enumerate(rel))
        ideal = sum(1 / math.log2(j + 2) for j in range(min(k, int(dense[i].sum()))))
        ns.append(dcg / ideal if ideal else 0.0)
    return float(np.mean(ps)), float(np.mean(ns))


@settings(max_examples=150, deadline=None)
@given(case=ranking_case(), k=st.sampled_from([1, 3, 5]))
def test_metrics_match_reference_and_are_bounded(case: tuple[np.ndarray, sp.csr_matrix, np.ndarray],
                                                 k: int) -> None:
    top, Yc, prop = case
    p, n = precision_at_k(top, Yc, k), ndcg_at_k(top, Yc, k)
    rp, rn = _reference(top, Yc.toarray(), k)
    assert p == pytest.approx(rp) and n == pytest.approx(rn)
    s = psp_at_k(top, Yc, prop, k)
    for v in (p, n, s):
        assert 0.0 <= v <= 1.0 + 1e-12


@settings(max_examples=100, deadline=None)
@given(case=ranking_case(), k=st.sampled_from([1, 3, 5]))
def test_perfect_ranking_scores_one_on_labelled_rows(case: tuple[np.ndarray, sp.csr_matrix, np.ndarray],
                                                     k: int) -> None:
    _, Yc, prop = case
    dense = Yc.toarray()
    keep = dense.sum(axis=1) > 0
    assume(keep.any())  # rows without labels score 0 by convention: nothing to rank
    dense = dense[keep]
    # true labels first, rarest (smallest propensity) first, then the rest
    top = np.array([np.lexsort((prop, -r)) for r in dense])
    Yk = sp.csr_matrix(dense)
    assert ndcg_at_k(top, Yk, k) == pytest.approx(1.0)
    assert psp_at_k(top, Yk, prop, k) == pytest.approx(1.0)
    # P@k is 1 exactly when every row has at least k labels
    expected_p = float(np.mean(np.minimum(dense.sum(axis=1), k) / k))
    assert precision_at_k(top, Yk, k) == pytest.approx(expected_p)


@settings(max_examples=100, deadline=None)
@given(case=ranking_case(), k=st.sampled_from([1, 3, 5]), p=st.floats(0.1, 1.0))
def test_psp_with_equal_propensities_is_hits_over_attainable(
        case: tuple[np.ndarray, sp.csr_matrix, np.ndarray], k: int, p: float) -> None:
    """With one propensity for all labels, PSP@k = total hits / total attainable hits min(k, |y|)."""
    top, Yc, _ = case
    prop = np.full(Yc.shape[1], p)
    attainable = np.minimum(np.diff(Yc.indptr), k).sum()
    expected = hits(top, Yc, k).sum() / attainable if attainable else 0.0
    assert psp_at_k(top, Yc, prop, k) == pytest.approx(expected)


def test_top_from_lists_cuts_and_pads_ranked_lists() -> None:
    from trainer.metrics import top_from_lists

    top = top_from_lists([[4, 2, 9, 1, 7, 3], [5], []], 5)
    assert top.dtype == np.int64 and top.tolist() == [[4, 2, 9, 1, 7], [5, -1, -1, -1, -1], [-1] * 5]
    y = sp.csr_matrix(np.array([[0, 0, 0, 0, 0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 1, 0, 0, 0, 0],
                                [1, 0, 0, 0, 0, 0, 0, 0, 0, 0]]))
    assert hits(top, y).tolist()[0] == [False, False, False, False, True]  # padding never matches
    assert top_from_lists([], 3).shape == (0, 3)
