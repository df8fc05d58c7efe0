"""Retrieval backends: returned scores are exact, bounds are never optimistic, caches round-trip."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import service.serving.quantized_scan as quantized_scan
import service.serving.retrieval as retrieval
from service.cli import build_parser
from service.serving.quantized_scan import (
    build_cells,
    quantize_head,
    quantize_query,
    query_levels,
    scan_cells,
    score_bounds,
)
from service.serving.retrieval import (
    ExactScorer,
    FlatRetriever,
    QuantizedScanner,
    RetrievalConfig,
    build_retriever,
    choose_kind,
    fingerprint,
)
from service.settings import RETRIEVAL_KINDS, IndexKind, Settings
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


def _no_build(*args: object, **kwargs: object) -> None:
    raise AssertionError("the cached index should have been loaded, not rebuilt")


def test_ivf_recall_and_cache_round_trip(ivf_setup: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    w, b, exact, retr, art = ivf_setup
    h = _queries(w, 50, seed=9)
    truth = exact.search(h, 10).ids
    got = retr.search(h, 10).ids
    recall = np.mean([len(set(g) & set(t)) / 10 for g, t in zip(got, truth, strict=True)])
    assert recall >= 0.85
    cache = art / "index" / "ivf"
    assert (cache / "index.faiss").is_file() and (cache / "meta.json").is_file()
    cfg = RetrievalConfig(kind="ivf", ivf_nlist=64, recall_target=0.9)
    with monkeypatch.context() as m:  # a second load must read the cache: building would raise
        m.setattr(retrieval, "_build_ivf", _no_build)
        again = build_retriever(w, b, cfg, art, exact)
    assert again.nprobe == retr.nprobe
    assert again.search(h, 10).ids.tolist() == got.tolist()


def test_stale_index_is_rebuilt_not_served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A head changed in place (same shape) must never be served through the old index's bounds."""
    w, b = _head(3000, 8, seed=12)
    cfg = RetrievalConfig(kind="ivf", ivf_nlist=16, recall_target=0.9)
    build_retriever(w, b, cfg, tmp_path, ExactScorer(w, b))
    w2 = w.copy()
    w2[::10] += 3.0  # rows the fingerprint samples (every row here: K < 2048)
    assert fingerprint(w2, b) != fingerprint(w, b)
    builds: list[int] = []
    real_build = retrieval._build_ivf

    def counting(*args: Any, **kwargs: Any) -> Any:
        builds.append(1)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(retrieval, "_build_ivf", counting)
    stale = build_retriever(w2, b, cfg, tmp_path, ExactScorer(w2, b))
    assert builds == [1]
    # the rebuilt bounds hold for the new head
    h = _queries(w2, 20, seed=13)
    full = h.astype(np.float64) @ w2.T.astype(np.float64) + b
    top = stale.search(h, 5, nprobe=1)
    for i in range(len(h)):
        left = np.setdiff1d(np.arange(len(w2)), top.ids[i])
        assert full[i, left].max() <= top.bound[i]
    # and a rewritten weights file invalidates a cache even when the sampled rows agree
    (tmp_path / "weights.safetensors").write_bytes(b"x")
    assert fingerprint(w2, b, tmp_path) != fingerprint(w2, b)


def test_int8_cache_is_read_not_rebuilt_and_refused_when_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w, b = _head(2000, 24, seed=14)
    (tmp_path / "weights.safetensors").write_bytes(b"v1")
    first = build_retriever(w, b, RetrievalConfig(kind="int8"), tmp_path, ExactScorer(w, b))
    assert (tmp_path / "index" / "int8" / "codes.npy").is_file()
    with monkeypatch.context() as m:
        m.setattr(retrieval, "quantize_head", _no_build)
        again = build_retriever(w, b, RetrievalConfig(kind="int8"), tmp_path, ExactScorer(w, b))
    assert isinstance(again, QuantizedScanner)
    assert isinstance(again.head.scale, np.memmap) and not isinstance(again.head.codes, np.memmap)
    h = _queries(w, 5, seed=15)
    assert again.search(h, 7).ids.tolist() == first.search(h, 7).ids.tolist()
    (tmp_path / "weights.safetensors").write_bytes(b"v2 with other bytes")  # new file, same rows
    calls: list[int] = []
    real = retrieval.quantize_head
    monkeypatch.setattr(retrieval, "quantize_head", lambda *a, **k: calls.append(1) or real(*a, **k))
    build_retriever(w, b, RetrievalConfig(kind="int8"), tmp_path, ExactScorer(w, b))
    assert calls == [1]


@pytest.mark.parametrize("kind", ["int8", "ivf", "hnsw"])
def test_a_build_calls_check_and_a_raising_check_abandons_it(tmp_path: Path, kind: str) -> None:
    """What lets a cancelled training job stop while it builds its serving index: the builder calls
    `check` as it goes, and an exception from it leaves no cache behind (the next load builds it)."""
    w, b = _head(3000, 24, seed=16)
    cfg = RetrievalConfig(kind=kind)  # type: ignore[arg-type]
    calls: list[int] = []
    built = tmp_path / "built"
    built.mkdir()
    build_retriever(w, b, cfg, built, ExactScorer(w, b), check=lambda: calls.append(1))
    assert calls and (built / "index" / kind / "meta.json").is_file()

    class Stop(Exception):
        pass

    def stop() -> None:
        raise Stop

    stopped = tmp_path / "stopped"
    stopped.mkdir()
    with pytest.raises(Stop):
        build_retriever(w, b, cfg, stopped, ExactScorer(w, b), check=stop)
    assert not (stopped / "index" / kind / "meta.json").exists()
    # and the abandoned build is no obstacle: the next one builds and serves
    again = build_retriever(w, b, cfg, stopped, ExactScorer(w, b))
    h = _queries(w, 3, seed=17)
    assert again.search(h, 5).ids.shape == (3, 5)


def _build_in_child(artifact: str, out: str, start: Any) -> None:
    """A separate process starting on the artifact, as a serving worker does; records whether it built.
    The build is slowed so that, unguarded, every process would find the cache missing."""
    w, b = _head(3000, 24, seed=21)
    calls: list[int] = []
    real = retrieval.quantize_head

    def slow(*a: Any, **k: Any) -> Any:
        calls.append(1)
        time.sleep(0.5)
        return real(*a, **k)

    retrieval.quantize_head = slow  # type: ignore[assignment]
    start.wait()
    build_retriever(w, b, RetrievalConfig(kind="int8"), Path(artifact), ExactScorer(w, b))
    Path(out).write_text(str(len(calls)))


def test_workers_starting_together_build_an_uncached_index_once(tmp_path: Path) -> None:
    (tmp_path / "weights.safetensors").write_bytes(b"v1")
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(3)
    procs = [
        ctx.Process(target=_build_in_child, args=(str(tmp_path), str(tmp_path / f"built-{i}"), start))
        for i in range(3)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert sorted(int((tmp_path / f"built-{i}").read_text()) for i in range(3)) == [0, 0, 1]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 40), nprobe=st.integers(1, 64))
def test_ivf_sparsemax_flag_is_never_wrong(ivf_setup: tuple, seed: int, k: int, nprobe: int) -> None:
    w, b, _, retr, _ = ivf_setup
    h = _queries(w, 4, seed=seed) * np.float32(1 + seed % 5)  # sharper queries → smaller supports
    top = retr.search(h, k, nprobe=nprobe)
    probs, exact = sparsemax_topk(top.scores.astype(np.float64), top.bound)
    full = sparsemax(h.astype(np.float64) @ w.T.astype(np.float64) + b)
    if nprobe >= 64:  # every cell probed: a row is certified whenever its whole support is in its top k
        assert exact[(full > 0).sum(axis=1) < k].all()  # (a support of exactly k may tie with the next)
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


# ------------------------------------------------------------------------------------------------
# the int8 scan: its bound must hold for any head, and its answers are the exact ones


@st.composite
def adversarial_heads(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Heads a trained model can produce and a sloppy bound would miss: huge or tiny row norms, rows
    with one dominant weight (a coarse int8 scale), duplicated rows (exact ties), zero rows,
    strongly negative biases; queries of any scale."""
    seed = draw(st.integers(0, 2**31 - 1))
    k = draw(st.integers(2, 300))
    d = draw(st.integers(1, 40))
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(k, d)) * 10.0 ** rng.integers(-3, 4, size=(k, 1))
    spikes = rng.random(k) < 0.2
    w[spikes, rng.integers(0, d, spikes.sum())] *= 1000.0
    w[rng.random(k) < 0.1] = 0.0
    dup = rng.integers(0, k, k // 4)
    w[rng.integers(0, k, k // 4)] = w[dup]
    b = rng.normal(size=k) * 10.0 ** rng.integers(-2, 3)
    b[rng.random(k) < 0.3] -= 1e3
    h = rng.normal(size=(draw(st.integers(1, 6)), d)) * 10.0 ** draw(st.integers(-3, 3))
    return w.astype(np.float32), b.astype(np.float32), h.astype(np.float32)


@settings(max_examples=60, deadline=None)
@given(case=adversarial_heads())
def test_int8_bound_holds_for_adversarial_heads(case: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    w, b, h = case
    lower, upper = score_bounds(quantize_head(w, b), h)
    full = h.astype(np.float64) @ w.T.astype(np.float64) + b.astype(np.float64)
    assert (lower.astype(np.float64) <= full).all()
    assert (full <= upper.astype(np.float64)).all()


@settings(max_examples=60, deadline=None)
@given(case=adversarial_heads(), k=st.integers(1, 8), reach=st.sampled_from([None, 0.5, 1.0]))
def test_int8_scan_keeps_everything_that_reaches_its_floor(
    case: tuple[np.ndarray, np.ndarray, np.ndarray], k: int, reach: float | None
) -> None:
    """The kernel's floor (k-th best lower bound, or best − reach) rises as it scans; whatever it ends
    at, every label scanned and dropped has an upper bound below it, and at least k labels reach it."""
    w, b, h = case
    head = quantize_head(w, b)
    offsets = np.array([0, len(w) // 2, len(w)], dtype=np.int64)
    full = h.astype(np.float64) @ w.T.astype(np.float64) + b.astype(np.float64)
    for i in range(len(h)):
        s = scan_cells(head, offsets, quantize_query(h[i]), np.array([1, 0]), np.full(2, np.inf), k, reach)
        assert s.stop == 2 and len(s.heap) == min(k, len(w))
        assert (s.lower <= full[i, s.pos]).all() and (full[i, s.pos] <= s.upper).all()
        if len(s.heap) < k:
            continue
        floor = float(s.heap.min())
        if reach is not None:
            floor = min(floor, s.best - reach - 1e-4 * (1 + abs(s.best)))
        dropped = np.setdiff1d(np.arange(len(w)), s.pos)
        assert s.skipped < floor or not len(dropped)
        assert (full[i, dropped] <= s.skipped).all()
        assert (s.upper >= floor).sum() >= k


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    d=st.sampled_from([1, 3, 64, 1031, 1040, 4096]),
    spread=st.integers(0, 30),
)
def test_int8_bound_holds_for_queries_their_int16_codes_round_badly(seed: int, d: int, spread: int) -> None:
    """The scan rounds the query to int16 codes scaled by its largest entry: one huge entry among tiny
    ones leaves the rest as rounding, which the bound must carry; wide queries lower the code range so
    the integer sums cannot overflow."""
    rng = np.random.default_rng(seed)
    w = (rng.normal(size=(50, d)) * 10.0 ** rng.integers(-2, 3, size=(50, 1))).astype(np.float32)
    w[0] = 127.0  # every code at its extreme, so an overflowing sum would show
    b = rng.normal(size=50).astype(np.float32)
    h = rng.normal(size=(3, d)) * 10.0 ** -rng.integers(0, spread + 1, size=(3, d))
    h[0] = np.sign(h[0]) * 1e-30  # tiny: no codes at all
    h[1, 0] = 1e6
    h[2] = np.where(rng.random(d) < 0.5, 1.0, -1.0)  # every code at ±Q
    h = h.astype(np.float32)
    lower, upper = score_bounds(quantize_head(w, b), h)
    full = h.astype(np.float64) @ w.T.astype(np.float64) + b.astype(np.float64)
    assert (lower.astype(np.float64) <= full).all() and (full <= upper.astype(np.float64)).all()
    assert d * 127 * query_levels(d) < 2**31
    q = quantize_query(h[2])
    assert np.abs(q.p).max() == query_levels(d)  # ±1: every code at ±Q, rounded only through t
    assert q.slack <= 127 * np.sqrt(d) * q.norm * 1e-6


def _scanner(w: np.ndarray, b: np.ndarray, nlist: int, workers: int | None = 1) -> QuantizedScanner:
    cells = build_cells(w, b, nlist)
    return QuantizedScanner(quantize_head(w, b, cells.order), cells, w, b, workers=workers)


@settings(max_examples=80, deadline=None)
@given(
    case=adversarial_heads(),
    k=st.integers(1, 12),
    reach=st.sampled_from([None, 1.0]),
    nlist=st.sampled_from([1, 3, 16]),
    workers=st.sampled_from([1, 2, 3]),
    compiled=st.booleans(),
)
def test_int8_search_returns_the_exact_top_k(
    case: tuple[np.ndarray, np.ndarray, np.ndarray],
    k: int,
    reach: float | None,
    nlist: int,
    workers: int,
    compiled: bool,
) -> None:
    """Every path of the scan: one worker or cells dealt between several (each with its own floor), the
    compiled kernel or the numpy fallback."""
    w, b, h = case
    scanner = _scanner(w, b, nlist, workers)
    with pytest.MonkeyPatch.context() as m:
        if not compiled:
            m.setattr(quantized_scan, "_numba_available", lambda: False)
        top = scanner.search(h, k, reach=reach)
    full = h.astype(np.float64) @ w.T.astype(np.float64) + b.astype(np.float64)
    for i in range(len(h)):
        ids = top.ids[i][top.ids[i] >= 0]
        assert len(ids) >= min(k, len(w)) and len(set(ids.tolist())) == len(ids)
        left = np.setdiff1d(np.arange(len(w)), ids)
        if len(left):
            assert full[i, left].max() <= top.bound[i]  # the bound covers every label not returned
        else:
            assert np.isneginf(top.bound[i])
        scale = 1e-5 * (1 + np.abs(full[i]).max())
        np.testing.assert_allclose(top.scores[i][: len(ids)], full[i, ids], rtol=1e-5, atol=scale)
        # best first, and the k-th returned is as good as the k-th overall (ties may swap ids)
        kth = np.sort(full[i])[::-1][min(k, len(w)) - 1]
        assert full[i, ids[: min(k, len(w))]].min() >= kth - scale
        if reach is not None:  # everything that may lie within `reach` of the best was returned
            assert full[i, left].max(initial=-np.inf) <= full[i].max() - reach + scale


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), sharp=st.floats(0.3, 30.0))
def test_int8_sparsemax_flag_is_never_wrong_and_usually_set(seed: int, sharp: float) -> None:
    w, b = _head(3000, 16, seed=seed % 7)
    h = _queries(w, 6, seed=seed) * np.float32(sharp)
    scanner = _scanner(w, b, 40)
    top = scanner.search(h, 10, reach=1.0)
    probs, exact = sparsemax_topk(top.scores.astype(np.float64), top.bound)
    assert exact.all()  # every label that could reach the support was re-scored
    full = sparsemax(h.astype(np.float64) @ w.T.astype(np.float64) + b)
    for i in range(len(h)):
        want = np.zeros(len(w))
        ids = top.ids[i]
        want[ids[ids >= 0]] = probs[i][ids >= 0]
        np.testing.assert_allclose(want, full[i], atol=1e-4 * (1 + sharp))
    assert scanner.scanned < len(w) * len(h)  # the cell bounds skipped some cells


def test_auto_chooses_by_the_bytes_a_query_reads() -> None:
    cfg = RetrievalConfig()
    assert choose_kind(1000, 128, cfg) == "exact"
    assert choose_kind(100_000, 512, cfg) == "int8"
    assert choose_kind(1_000_000, 128, cfg) == "int8"
    assert choose_kind(10, 2, RetrievalConfig(kind="hnsw")) == "hnsw"


def test_the_config_takes_its_defaults_and_kinds_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The retrieval part of the settings has one home: a bare config is the config of bare settings
    (the lone scan's threads included), and the flag, the setting and the config accept the same kinds."""
    for name in [k for k in os.environ if k.startswith("OVEX_")]:
        monkeypatch.delenv(name)
    assert RetrievalConfig() == RetrievalConfig.from_settings(Settings())
    assert RetrievalConfig().lone_scan_threads == Settings().lone_scan_threads
    given = Settings(retrieval="ivf", ivf_nlist=7, index_recall_target=0.5, lone_scan_threads=3)
    assert RetrievalConfig.from_settings(given) == RetrievalConfig(
        kind="ivf", ivf_nlist=7, recall_target=0.5, lone_scan_threads=3
    )
    assert ("auto", *get_args(IndexKind)) == RETRIEVAL_KINDS
    for kind in RETRIEVAL_KINDS:
        assert build_parser().parse_args(["serve", "--retrieval", kind]).retrieval == kind
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--retrieval", "annoy"])


def test_a_lone_query_shares_its_scan_and_a_batch_scans_one_query_per_thread() -> None:
    """Split a large head's scan only for a search of one query (a request that came alone: the other
    cores are idle); split or not, the answer is the same."""
    rng = np.random.default_rng(5)
    n, d = 9000, 512  # codes over the size worth splitting
    w = rng.normal(size=(n, d)).astype(np.float32)
    b = rng.normal(size=n).astype(np.float32)
    cells = build_cells(w, b, 64)
    head = quantize_head(w, b, cells.order)
    assert head.codes.nbytes >= QuantizedScanner.SPLIT_MIN_BYTES
    scanner = QuantizedScanner(head, cells, w, b, lone_workers=3)
    assert scanner._n_workers(1) == 3 and scanner._n_workers(2) == 1
    h = rng.normal(size=(2, d)).astype(np.float32)
    alone = scanner.search(h[:1], 10)
    single = QuantizedScanner(head, cells, w, b, lone_workers=1).search(h[:1], 10)
    assert alone.ids.tolist() == single.ids.tolist() and alone.bound.tolist() == single.bound.tolist()
    few = build_cells(w[:100], b[:100], 4)
    small_head = quantize_head(w[:100], b[:100], few.order)
    small = QuantizedScanner(small_head, few, w[:100], b[:100], lone_workers=3)
    assert small._n_workers(1) == 1  # a small head costs a second thread more than it saves
    scanner.read_share = 0.1  # the cell bounds prune: the split would only slow the floors down
    assert scanner._n_workers(1) == 1
    for _ in range(30):  # queries that read the whole head bring it back
        scanner._one(h[0], cells.bounds(h[:1])[0], 10, None, 1)
    assert scanner.read_share > QuantizedScanner.SPLIT_MIN_READ and scanner._n_workers(1) == 3

