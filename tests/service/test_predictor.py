"""The predictor in-process: gated (DropMax) heads are scored exactly, including the ev-softmax mean;
the `exact` flag holds against full scoring on every retrieval backend and normalization."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from service.serving.predictor import InputRow, Normalization, Options, Predictor, Query
from service.serving.registry import load_served
from service.serving.retrieval import ExactScorer, RetrievalConfig, build_retriever
from service.settings import Settings
from trainer.artifact import load_artifact
from trainer.sparse_maps import evsoftmax, softmax, sparsemax


@pytest.fixture(scope="module")
def dropmax_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.params import TrainParams
    from trainer.synth import synth_dataset
    from trainer.train import train

    out = tmp_path_factory.mktemp("dm") / "dm" / "1"
    ds = synth_dataset(120, 300, 600, seed=4)
    params = TrainParams(loss="dropmax", dim=16, epochs=1, negatives=32, batch_size=128, device="cpu",
                         eval_every=0)
    train(params, ds, None, out_dir=out)
    return out


def _rows(n: int, n_features: int) -> list[InputRow]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        idx = rng.choice(n_features, size=10, replace=False).astype(np.int64)
        out.append(InputRow(indices=idx, values=rng.uniform(0.5, 2, 10).astype(np.float32)))
    return out


def test_dropmax_head_is_served_with_its_gate(dropmax_model: Path, tmp_path: Path) -> None:
    loaded = load_artifact(dropmax_model)
    assert "dropmax" in loaded.model.extra
    served = load_served("dm", "1", dropmax_model, Settings(models_dir=tmp_path, data_dir=tmp_path))
    assert served.retrieval == "exact"
    rows = _rows(6, loaded.n_features)
    x = sp.vstack([sp.csr_matrix((r.values, (np.zeros(10, int), r.indices)), shape=(1, loaded.n_features))
                   for r in rows]).tocsr()
    full = loaded.scores(loaded.featurizer.transform_sparse(x)).astype(np.float64)
    queries = [Query(rows, Options(top_k=120, normalization="sparsemax")),
            Query(rows, Options(top_k=120, normalization="evsoftmax")),
            Query(rows, Options(top_k=5, normalization="none"))]
    sm, ev, none = served.predictor.predict_queries_safe(queries)
    assert not isinstance(sm, Exception) and not isinstance(ev, Exception) and not isinstance(none, Exception)
    for r, row in enumerate(full):
        want = sparsemax(row)
        got = {lb.id: lb.prob for lb in sm[r].labels}
        assert set(got) == set(np.flatnonzero(want > 0).tolist()) and sm[r].certified
        for i, p in got.items():
            assert p == pytest.approx(want[i], abs=1e-5)
        want_ev = evsoftmax(row)  # threshold: the mean of the gated scores, not the linear formula
        got_ev = {lb.id: lb.prob for lb in ev[r].labels}
        assert set(got_ev) == set(np.flatnonzero(want_ev > 0).tolist()) and ev[r].certified
        for i, p in got_ev.items():
            assert p == pytest.approx(want_ev[i], abs=1e-5)
        np.testing.assert_allclose([lb.score for lb in none[r].labels], np.sort(row)[::-1][:5], atol=1e-4)


# ------------------------------------------------------------------------------------------------
# the exact flag, every backend and normalization, against full scoring


@dataclass
class _Head:
    """A linear head with no encoder: enough of `ServableModel` for `predict_encoded`."""

    head_weight: np.ndarray
    head_bias: np.ndarray
    featurizer: Any = None

    @property
    def label_names(self) -> list[str]:
        return [f"l{i}" for i in range(len(self.head_bias))]

    @property
    def n_labels(self) -> int:
        return len(self.head_bias)

    @property
    def n_features(self) -> int:
        return self.dim

    @property
    def dim(self) -> int:
        return int(self.head_weight.shape[1])

    def encode(self, x: sp.csr_matrix) -> np.ndarray:
        return np.asarray(x.todense(), dtype=np.float32)


def _predictors(tmp: Path, seed: int) -> tuple[np.ndarray, np.ndarray, list[Predictor]]:
    rng = np.random.default_rng(seed)
    k, d = 1500, 12
    centres = rng.normal(size=(12, d))
    w = (centres[rng.integers(0, 12, k)] + 0.5 * rng.normal(size=(k, d))).astype(np.float32)
    b = (0.5 * rng.normal(size=k) - rng.random(k) * (rng.random(k) < 0.2) * 5).astype(np.float32)
    model = _Head(w, b)
    exact = ExactScorer(w, b, block_rows=512)
    preds = [Predictor(model, exact, exact)]
    for kind in ("int8", "flat", "ivf", "hnsw"):
        # one cell of 16 probed: IVF misses labels, so a bound too low would show as a wrong "exact"
        cfg = RetrievalConfig(kind=kind, ivf_nlist=16, ivf_nprobe=1, hnsw_m=8)  # type: ignore[arg-type]
        retr = build_retriever(w, b, cfg, tmp / kind, exact)
        assert retr.kind == kind
        preds.append(Predictor(model, retr, exact))
    return w, b, preds


@pytest.fixture(scope="module")
def predictors(tmp_path_factory: pytest.TempPathFactory) -> tuple[np.ndarray, np.ndarray, list[Predictor]]:
    tmp = tmp_path_factory.mktemp("heads")
    for kind in ("int8", "flat", "ivf", "hnsw"):
        (tmp / kind).mkdir()
    return _predictors(tmp, seed=21)


def _full(norm: str, z: np.ndarray) -> np.ndarray | None:
    if norm == "sparsemax":
        return sparsemax(z)
    if norm == "evsoftmax":
        return evsoftmax(z)
    if norm == "softmax":
        return softmax(z)
    return None


# what a query can ask of every predictor: rows near some label's row at a sharpness, k, normalization
QUERIES = {"seed": st.integers(0, 10_000), "sharp": st.sampled_from([0.2, 1.0, 4.0, 20.0]),
           "top_k": st.integers(1, 40),
           "norm": st.sampled_from(["sparsemax", "evsoftmax", "softmax", "none"]), "ask_exact": st.booleans()}


@settings(max_examples=30, deadline=None)
@given(**QUERIES)
def test_exact_flag_never_lies(
    predictors: tuple[np.ndarray, np.ndarray, list[Predictor]],
    seed: int, sharp: float, top_k: int, norm: Normalization, ask_exact: bool,
) -> None:
    w, b, preds = predictors
    rng = np.random.default_rng(seed)
    h = (w[rng.integers(0, len(w), 5)] + 0.5 * rng.normal(size=(5, w.shape[1]))).astype(np.float32)
    h *= np.float32(sharp)
    full = h.astype(np.float64) @ w.T.astype(np.float64) + b
    certified = 0
    for pred in preds:
        rows = pred.predict_encoded(h, [Options(top_k, norm, ask_exact)] * len(h))
        for r, row in enumerate(rows):
            if pred.retriever.kind == "hnsw" and not ask_exact and norm != "softmax":
                assert not row.certified  # a graph walk bounds nothing
            if ask_exact or pred.retriever.kind == "exact":
                assert row.certified  # every label was scored
            if pred.retriever.kind == "int8" and norm == "sparsemax":
                assert row.certified  # all that may reach the support (within 1 of the best) was re-scored
            if not row.certified:
                continue
            certified += 1
            z = full[r]
            tol = 1e-4 * (1 + np.abs(z).max())
            got = {lb.id: lb for lb in row.labels}
            want = _full(norm, z)
            if want is None:  # plain top-k: the best scores, best first
                best = np.sort(z)[::-1][: len(got)]
                np.testing.assert_allclose([lb.score for lb in row.labels], best, atol=tol)
                assert len(got) == min(top_k, len(z))
                continue
            listed = np.flatnonzero(want > tol)
            order = listed[np.argsort(-z[listed])][:top_k]
            # every label with real mass among the top_k is listed, with its full-distribution probability
            assert set(order.tolist()) <= set(got)
            for i, lb in got.items():
                assert lb.prob == pytest.approx(want[i], abs=1e-4)
    assert certified > 0


def test_an_evsoftmax_score_within_float32_rounding_of_the_threshold_is_never_certified(
    predictors: tuple[np.ndarray, np.ndarray, list[Predictor]],
) -> None:
    """The index path's scores are float32 and its threshold the O(d) mean in float64: a returned score
    that float32 rounding could have put on either side of the threshold leaves the support unknown."""
    from service.serving.retrieval import TopK

    pred = next(p for p in predictors[2] if p.retriever.kind == "int8")
    thr = np.array([10.0, 10.0])
    near = np.float32(10.0) + np.float32(2e-6)  # a few float32 ulps above the threshold
    far = np.float32(11.0)
    top = TopK(ids=np.array([[0, 1], [0, 1]], np.int64),
               scores=np.array([[far, near], [far, 9.0]], np.float32), bound=np.array([5.0, 5.0]))
    ambiguous, clear = pred._finish(top, "evsoftmax", thr)
    assert not ambiguous.certified
    assert clear.certified


def _without_labels(norm: str, z: np.ndarray, gone: list[int]) -> dict[int, float] | None:
    """The full distribution over the labels not excluded (ev-softmax: the threshold stays the mean of
    all K scores), by label id; None for a plain top-k."""
    keep = np.setdiff1d(np.arange(len(z)), gone)
    zk = z[keep]
    if norm == "none":
        return None
    if norm == "sparsemax":
        p = sparsemax(zk)
    elif norm == "softmax":
        p = softmax(zk)
    else:
        support = zk >= z.mean()
        e = np.where(support, np.exp(zk - zk[support].max()), 0.0)
        p = e / e.sum()
    return {int(i): float(v) for i, v in zip(keep, p, strict=True)}


@settings(max_examples=30, deadline=None)
@given(**QUERIES, n_gone=st.integers(1, 3))
def test_excluded_labels_are_never_answered_and_the_exact_flag_still_holds(
    predictors: tuple[np.ndarray, np.ndarray, list[Predictor]],
    seed: int, sharp: float, top_k: int, norm: Normalization, ask_exact: bool, n_gone: int,
) -> None:
    """A row's excluded labels (its twins) are left out on every path, the answer is the full answer over
    the other labels, and a certified answer is exactly that (the row's best labels are the ones left
    out, the hardest case for the bound)."""
    w, b, preds = predictors
    rng = np.random.default_rng(seed)
    h = (w[rng.integers(0, len(w), 5)] + 0.5 * rng.normal(size=(5, w.shape[1]))).astype(np.float32)
    h *= np.float32(sharp)
    full = h.astype(np.float64) @ w.T.astype(np.float64) + b
    gone = [np.argsort(-z)[:n_gone].tolist() if r % 2 == 0 else [] for r, z in enumerate(full)]
    certified = 0
    for pred in preds:
        rows = pred.predict_encoded(h, [Options(top_k, norm, ask_exact)] * len(h), gone)
        for r, row in enumerate(rows):
            got = {lb.id: lb for lb in row.labels}
            assert not set(got) & set(gone[r])
            if ask_exact or pred.retriever.kind == "exact":
                assert row.certified
            if not row.certified:
                continue
            certified += 1
            z = full[r]
            tol = 1e-4 * (1 + np.abs(z).max())
            want = _without_labels(norm, z, gone[r])
            if want is None:
                rest = np.delete(z, gone[r])
                np.testing.assert_allclose([lb.score for lb in row.labels], np.sort(rest)[::-1][: len(got)],
                                           atol=tol)
                assert len(got) == min(top_k, len(rest))
                continue
            listed = [i for i, p in sorted(want.items(), key=lambda t: -z[t[0]]) if p > tol][:top_k]
            assert set(listed) <= set(got)
            for i, lb in got.items():
                assert lb.prob == pytest.approx(want[i], abs=1e-4), (norm, pred.retriever.kind, ask_exact)
    assert certified > 0
