"""Retrieval backends: returned scores are exact, bounds are never optimistic, caches round-trip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.retrieval import (
    ExactScorer,
    FlatRetriever,
    RetrievalConfig,
    build_retriever,
    fingerprint,
)
from trainer.sparse_maps import sparsemax, sparsemax_topk


def _head(k: int, d: int, seed: int, clusters: int = 20) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(clusters, d))
    w = (c[rng.integers(0, clusters, k)] + 0.4 * rng.normal(size=(k, d))).astype(np.float32)
    b = (0.5 * rng.normal(size=k)).astype(np.float32)
    return w, b


def _queries(w: np.ndarray, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (w[rng.integers(0, len(w), n)] + 0.5 * rng.normal(size=(n, w.shape[1]))).astype(np.float32)


@pytest.fixture(scope="module")
def ivf_setup(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    w, b = _head(6000, 12, seed=3)
    exact = ExactScorer(w, b, block_rows=1024)
    art = tmp_path_factory.mktemp("artifact")
    retr = build_retriever(w, b, RetrievalConfig(kind="ivf", ivf_nlist=64, recall_target=0.9), art, exact)
    return w, b, exact, retr, art


def test_exact_scorer_matches_dense_scores_across_blocks() -> None:
    w, b = _head(5000, 8, seed=1)
    h = _queries(w, 7, seed=2)
    top = ExactScorer(w, b, block_rows=1024).search(h, 12)
    full = h.astype(np.float64) @ w.T.astype(np.float64) + b
    order = np.sort(full, axis=1)[:, ::-1]
    np.testing.assert_allclose(top.scores, order[:, :12], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(top.bound, order[:, 12], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.take_along_axis(full, top.ids, 1), top.scores, rtol=1e-5, atol=1e-5)


def test_exact_scorer_log_mass_above_threshold() -> None:
    w, b = _head(3000, 8, seed=4)
    h = _queries(w, 5, seed=5)
    full = h.astype(np.float64) @ w.T.astype(np.float64) + b
    t = full.mean(axis=1)
    _, log_z = ExactScorer(w, b, block_rows=700).search_with_mass(h, 5, t)
    assert log_z is not None
    want = np.log(np.where(full >= t[:, None], np.exp(full), 0).sum(axis=1))
    np.testing.assert_allclose(log_z, want, rtol=1e-5)


def test_fewer_labels_than_k_pads_and_bound_is_minus_inf() -> None:
    w, b = _head(3, 4, seed=6, clusters=2)
    h = _queries(w, 2, seed=7)
    for retr in (ExactScorer(w, b), FlatRetriever(w, b)):
        top = retr.search(h, 5)
        assert (top.ids[:, 3:] == -1).all() and np.isneginf(top.scores[:, 3:]).all()
        assert np.isneginf(top.bound).all()


def test_ivf_bound_covers_every_label_left_out(ivf_setup: tuple) -> None:
    w, b, _, retr, _ = ivf_setup
    h = _queries(w, 40, seed=8)
    full = h.astype(np.float64) @ w.T.astype(np.float64) + b
    for nprobe in (1, 4, 64):
        top = retr.search(h, 10, nprobe=nprobe)
        for i in range(len(h)):
            left = np.ones(len(w), bool)
            left[top.ids[i][top.ids[i] >= 0]] = False
            assert full[i, left].max() <= top.bound[i]
            np.testing.assert_allclose(full[i, top.ids[i]], top.scores[i], rtol=1e-5, atol=1e-5)


def test_ivf_recall_and_cache_round_trip(ivf_setup: tuple) -> None:
    w, b, exact, retr, art = ivf_setup
    h = _queries(w, 50, seed=9)
    truth = exact.search(h, 10).ids
    got = retr.search(h, 10).ids
    recall = np.mean([len(set(g) & set(t)) / 10 for g, t in zip(got, truth, strict=True)])
    assert recall >= 0.85
    assert (art / "index" / "index.faiss").is_file() and (art / "index" / "meta.json").is_file()
    again = build_retriever(w, b, RetrievalConfig(kind="ivf", ivf_nlist=64, recall_target=0.9), art, exact)
    assert again.nprobe == retr.nprobe
    assert again.search(h, 10).ids.tolist() == got.tolist()
    # a different head (same shape) must not reuse the cache
    w2 = w.copy()
    w2[::10] += 1.0
    assert fingerprint(w2, b) != fingerprint(w, b)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 40), nprobe=st.integers(1, 64))
def test_ivf_sparsemax_flag_is_never_wrong(ivf_setup: tuple, seed: int, k: int, nprobe: int) -> None:
    w, b, _, retr, _ = ivf_setup
    h = _queries(w, 4, seed=seed) * np.float32(1 + seed % 5)  # sharper queries → smaller supports
    top = retr.search(h, k, nprobe=nprobe)
    probs, exact = sparsemax_topk(top.scores.astype(np.float64), top.bound)
    full = sparsemax(h.astype(np.float64) @ w.T.astype(np.float64) + b)
    for i in np.flatnonzero(exact):
        want = np.zeros(len(w))
        ids = top.ids[i]
        want[ids[ids >= 0]] = probs[i][ids >= 0]
        # scores are float32 (≈1e-6 relative), the reference float64: probabilities agree to ~1e-5·|score|
        np.testing.assert_allclose(want, full[i], atol=1e-4)
        assert set(np.flatnonzero(full[i] > 1e-4)) <= set(ids[ids >= 0].tolist())


def test_hnsw_is_never_certified(tmp_path: Path) -> None:
    w, b = _head(2000, 8, seed=10)
    retr = build_retriever(w, b, RetrievalConfig(kind="hnsw", hnsw_m=8), tmp_path, ExactScorer(w, b))
    h = _queries(w, 10, seed=11)
    top = retr.search(h, 5)
    assert np.isposinf(top.bound).all()
    truth = ExactScorer(w, b).search(h, 5).ids
    assert np.mean([len(set(g) & set(t)) / 5 for g, t in zip(top.ids, truth, strict=True)]) >= 0.8
