"""bench/label_texts.py's post-hoc scale of the text-only labels: as trained it is the model's own top 5,
without them the trained labels' alone, and more weight never lowers unseen hit@5; the best scale is the
highest hit that keeps P@1 and P@5."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.bench_scripts import load_bench
from trainer import metrics as xc_metrics

bench = load_bench("label_texts")


@dataclass
class _Model:
    head_weight: np.ndarray
    head_bias: np.ndarray
    label_counts: np.ndarray


def _top5(scores: np.ndarray) -> np.ndarray:
    return np.argsort(-scores, axis=1, kind="stable")[:, :5]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_the_scale_as_trained_is_the_models_top_5_and_zero_leaves_text_only_labels_out(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k, d, n = 60, 6, 40
    counts = rng.integers(0, 4, k)
    counts[counts == 0] = 1
    counts[: 2 + seed % 7] = 0  # from two labels known by their text alone (fewer than the top 5) to eight
    w = rng.normal(size=(k, d)).astype(np.float32)
    b = rng.normal(size=k).astype(np.float32)
    b[counts == 0] = np.float32(-0.3)  # as materialized: one bias for every text-only row
    h = rng.normal(size=(n, d)).astype(np.float32)
    y = sp.csr_matrix((rng.random((n, k)) < 0.08).astype(np.float32))
    to_shared = np.arange(k + 1, dtype=np.int64)
    to_shared[-1] = -1
    prop = xc_metrics.propensities(y)
    model = _Model(w, b, counts)
    scaled = bench.zero_shot_scales(model, h, to_shared, y, counts, [[] for _ in range(n)], prop)
    rows = {(r["a"], r["b"]): r for r in scaled}

    full = h @ w.T + b  # float32, as the benchmark scores
    as_trained = xc_metrics.evaluate_topk(_top5(full), y, prop)
    seen_only = xc_metrics.evaluate_topk(_top5(np.where(counts == 0, -np.inf, full)), y, prop)
    for key in ("p@1", "p@5", "psp@5"):
        assert abs(rows[(1.0, 0.0)][key] - as_trained[key]) < 1e-9
        assert abs(rows[(0.0, 0.0)][key] - seen_only[key]) < 1e-9
    # each row's best label left out (its twin, as served): the scale as trained is the top 5 of the rest
    best = np.argmax(full, axis=1)
    gone = [[int(best[r])] if r % 2 else [] for r in range(n)]
    without = bench.zero_shot_scales(model, h, to_shared, y, counts, gone, prop)
    masked = full.copy()
    masked[np.arange(n)[1::2], best[1::2]] = -np.inf
    want = xc_metrics.evaluate_topk(_top5(masked), y, prop)
    for key in ("p@1", "p@5"):
        assert abs(without[0][key] - want[key]) < 1e-9
    assert rows[(0.0, 0.0)]["unseen_hit@5"] == 0.0 or np.isnan(rows[(0.0, 0.0)]["unseen_hit@5"])
    # a larger bias shift at the same norm only lifts the text-only labels: their hit rate cannot fall
    hits = [r["unseen_hit@5"] for (a, _), r in sorted(rows.items()) if a == 1.0]
    assert len(hits) > 5
    if not np.isnan(hits[0]):
        assert all(x <= y_ + 1e-12 for x, y_ in itertools.pairwise(hits))


def test_a_model_without_text_only_labels_has_no_scales() -> None:
    counts = np.ones(5, np.int64)
    model = _Model(np.ones((5, 2), np.float32), np.zeros(5, np.float32), counts)
    assert bench.zero_shot_scales(model, np.ones((3, 2), np.float32), np.arange(6), sp.csr_matrix((3, 5)),
                                  counts, [[], [], []], np.ones(5)) == []


def _row(a: float, b: float, p1: float, p5: float, hit: float) -> dict[str, object]:
    return {"a": a, "b": b, **{k: {"mean": v, "std": 0.0} for k, v in
                               (("p@1", p1), ("p@5", p5), ("unseen_hit@5", hit))}}


def test_the_best_scale_is_the_highest_hit_that_keeps_p1_and_p5() -> None:
    bar = {"p@1": {"mean": 0.50, "std": 0.0}, "p@5": {"mean": 0.20, "std": 0.0}}
    rows = [_row(0.0, 0.0, 0.60, 0.30, 0.0),  # text-only labels left out: never the answer
            _row(1.0, 0.0, 0.55, 0.25, 0.30),
            _row(1.0, 1.0, 0.50, 0.20, 0.45),  # at the bar: kept
            _row(1.0, 2.0, 0.49, 0.25, 0.60),  # P@1 below
            _row(1.25, 0.0, 0.55, 0.19, 0.70)]  # P@5 below
    best = bench.best_scale(rows, bar)
    assert best is not None and (best["a"], best["b"]) == (1.0, 1.0)
    assert bench.best_scale(rows[3:], bar) is None
