"""The int8 scan extended by appended rows (labels added by text): its certificate never lies.

`append_rows` puts each new row in its nearest cell and widens that cell's radius instead of running
k-means again; every answer the scan marks exact must then equal exact scoring, on every path of the scan
(one worker or several, compiled kernel or numpy), for any head and any appended rows — rows far from
every centroid, duplicates of old rows, zero rows, huge or tiny norms.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import service.serving.quantized_scan as quantized_scan
from service.serving.quantized_scan import append_rows, build_cells, quantize_head
from service.serving.retrieval import (
    QuantizedScanner,
    RetrievalConfig,
    build_retriever,
    extend_int8_cache,
    fingerprint,
)
from tests.service.test_retrieval import adversarial_heads

Case = tuple[np.ndarray, np.ndarray, np.ndarray]


@st.composite
def appended(draw: st.DrawFn, d: int, w0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows a label tower may give: around the old ones, far from all of them, copies, zeros."""
    m = draw(st.integers(1, 80))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    w = rng.normal(size=(m, d)) * 10.0 ** rng.integers(-3, 4, size=(m, 1))
    far = rng.random(m) < 0.2
    w[far] *= 1e3
    copies = rng.random(m) < 0.2
    w[copies] = w0[rng.integers(0, len(w0), int(copies.sum()))]
    w[rng.random(m) < 0.1] = 0.0
    b = rng.normal(size=m) * 10.0 ** rng.integers(-2, 3)
    return w.astype(np.float32), b.astype(np.float32)


def _certified_answers_are_exact(top: object, full: np.ndarray, k: int) -> int:
    """Every answer flagged exact (nothing left out can beat the k-th returned) is the exact top k;
    the bound covers every label not returned. Returns how many answers were flagged."""
    n_labels = full.shape[1]
    flagged = 0
    for i in range(full.shape[0]):
        ids = top.ids[i][top.ids[i] >= 0]  # type: ignore[attr-defined]
        scores = top.scores[i][: len(ids)]  # type: ignore[attr-defined]
        bound = top.bound[i]  # type: ignore[attr-defined]
        left = np.setdiff1d(np.arange(n_labels), ids)
        if len(left):
            assert full[i, left].max() <= bound
        kk = min(k, n_labels)
        scale = 1e-5 * (1 + np.abs(full[i]).max())
        np.testing.assert_allclose(scores, full[i, ids], rtol=1e-5, atol=scale)
        if bound <= scores[kk - 1]:  # the exactness certificate, as the sparse maps read it
            flagged += 1
            want = np.sort(full[i])[::-1][:kk]
            np.testing.assert_allclose(np.sort(full[i, ids[:kk]])[::-1], want, rtol=1e-5, atol=scale)
    return flagged


@settings(max_examples=80, deadline=None)
@given(
    data=st.data(),
    case=adversarial_heads(),
    k=st.integers(1, 12),
    reach=st.sampled_from([None, 1.0]),
    nlist=st.sampled_from([1, 3, 16]),
    workers=st.sampled_from([1, 2, 3]),
    compiled=st.booleans(),
)
def test_certificate_holds_after_rows_are_appended(
    data: st.DataObject, case: Case, k: int, reach: float | None, nlist: int, workers: int, compiled: bool
) -> None:
    w0, b0, h = case
    w1, b1 = data.draw(appended(w0.shape[1], w0))
    cells = build_cells(w0, b0, nlist)
    head, cells2 = append_rows(quantize_head(w0, b0, cells.order), cells, w1, b1)
    w, b = np.vstack([w0, w1]), np.concatenate([b0, b1])
    assert sorted(cells2.order.tolist()) == list(range(len(w)))
    # every row lies within its cell's radius: the cell bound holds for every query
    for c in range(cells2.nlist):
        members = cells2.order[cells2.offsets[c] : cells2.offsets[c + 1]]
        x = np.hstack([w[members], b[members, None]]).astype(np.float64)
        dist = np.linalg.norm(x - cells2.centroids[c].astype(np.float64), axis=1)
        assert (dist <= cells2.radius[c]).all()
    scanner = QuantizedScanner(head, cells2, w, b, workers=workers)
    with pytest.MonkeyPatch.context() as mp:
        if not compiled:
            mp.setattr(quantized_scan, "_numba_available", lambda: False)
        top = scanner.search(h, k, reach=reach)
    full = h.astype(np.float64) @ w.T.astype(np.float64) + b.astype(np.float64)
    _certified_answers_are_exact(top, full, k)
    # and the queries that match an appended row best: the new label must be found
    hq = np.vstack([w1[:3], h]).astype(np.float32)
    top = scanner.search(hq, k)
    full = hq.astype(np.float64) @ w.T.astype(np.float64) + b.astype(np.float64)
    _certified_answers_are_exact(top, full, k)


def test_extended_cache_is_loaded_and_certifies_as_a_built_one(tmp_path: Path) -> None:
    """The cache written for the new head is the one the service loads (its fingerprint matches), and
    it certifies answers about as often as a cache built from scratch."""
    rng = np.random.default_rng(3)
    centers = rng.normal(size=(30, 24))
    w0 = (centers[rng.integers(0, 30, 6000)] + 0.3 * rng.normal(size=(6000, 24))).astype(np.float32)
    b0 = (0.2 * rng.normal(size=6000)).astype(np.float32)
    w1 = (centers[rng.integers(0, 30, 300)] + 0.3 * rng.normal(size=(300, 24))).astype(np.float32)
    b1 = (0.2 * rng.normal(size=300)).astype(np.float32)
    cfg = RetrievalConfig(kind="int8")
    base, new = tmp_path / "1", tmp_path / "2"
    base.mkdir()
    new.mkdir()
    build_retriever(w0, b0, cfg, base, None)  # type: ignore[arg-type]
    before = {p: p.read_bytes() for p in (base / "index" / "int8").iterdir()}
    w, b = np.vstack([w0, w1]), np.concatenate([b0, b1])
    assert extend_int8_cache(base, w0, b0, new, w, b, cfg)
    assert {p: p.read_bytes() for p in (base / "index" / "int8").iterdir()} == before
    loaded = build_retriever(w, b, cfg, new, None)  # type: ignore[arg-type]
    assert isinstance(loaded, QuantizedScanner) and loaded.n_labels == len(w)
    assert (new / "index" / "int8" / "meta.json").read_text().count(fingerprint(w, b, new)) == 1
    h = (w[rng.integers(0, len(w), 64)] + 0.3 * rng.normal(size=(64, 24))).astype(np.float32)
    full = h.astype(np.float64) @ w.T.astype(np.float64) + b.astype(np.float64)
    flagged = _certified_answers_are_exact(loaded.search(h, 5), full, 5)
    assert flagged >= 60
    # a base without a cache built from its own head: nothing written, the caller builds instead
    other = tmp_path / "3"
    other.mkdir()
    assert not extend_int8_cache(new, w0, b0, other, w, b, cfg)
    assert not (other / "index").exists()
