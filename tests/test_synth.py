"""Synthetic data: deterministic, shaped as asked, and learnable (planted structure is recoverable)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import trainer.synth as synth_mod
from trainer.data import read_xc
from trainer.errors import ParamsError
from trainer.metrics import precision_at_k
from trainer.synth import SynthConfig, planted_prototypes, synth, synth_dataset, write_synth


def _same(a: sp.csr_matrix, b: sp.csr_matrix) -> bool:
    return a.shape == b.shape and (a != b).nnz == 0


def _l2(M: sp.spmatrix) -> sp.csr_matrix:
    M = sp.csr_matrix(M, dtype=np.float64)
    n = np.sqrt(np.asarray(M.multiply(M).sum(axis=1)).ravel())
    n[n == 0] = 1.0
    return sp.csr_matrix(sp.diags(1.0 / n) @ M)


def _top5(S: np.ndarray) -> np.ndarray:
    return np.argsort(-S, axis=1, kind="stable")[:, :5]


def test_deterministic_and_seed_sensitive() -> None:
    X1, Y1 = synth(200, 500, 300, seed=3)
    X2, Y2 = synth(200, 500, 300, seed=3)
    assert _same(X1, X2) and _same(Y1, Y2)
    X3, _ = synth(200, 500, 300, seed=4)
    assert not _same(X1, X3)
    Xt, _ = synth(200, 500, 300, seed=3, part=1)
    assert not _same(X1, Xt)


def test_shapes_and_row_statistics() -> None:
    cfg = SynthConfig(labels_per_row=(2, 4))
    X, Y = synth(1000, 5000, 2000, seed=0, config=cfg)
    assert X.shape == (2000, 5000) and Y.shape == (2000, 1000)
    assert X.dtype == np.float32 and Y.dtype == np.float32
    per_row = np.diff(Y.indptr)
    assert per_row.min() >= 1 and per_row.max() <= 4
    assert per_row.mean() > 2.0  # duplicates merged only rarely
    nnz = np.diff(X.indptr)
    assert 40 < nnz.mean() < 60  # 60 draws ≈ 50 distinct ids
    assert X.data.min() >= 1 and np.all(X.data == np.round(X.data))  # counts
    assert X.has_sorted_indices and np.all(np.diff(X.indices[X.indptr[0]:X.indptr[1]]) > 0)


def test_label_frequencies_are_zipf_like() -> None:
    _, Y = synth(500, 1000, 20000, seed=1, config=SynthConfig(labels_per_row=(1, 1)))
    counts = np.sort(np.bincount(Y.indices, minlength=500))[::-1].astype(float)
    # Zipf exponent 1: frequency of rank r ≈ c / r, so count[0] / count[9] ≈ 10
    assert 6 < counts[0] / counts[9] < 15
    assert counts[-50:].mean() < counts[:10].mean() / 50


def test_planted_prototypes_explain_the_rows() -> None:
    """Scoring by the true prototypes (the planted answer) gets P@1 far above chance."""
    K, D = 200, 3000
    X, Y = synth(K, D, 1000, seed=7, part=1)
    P = planted_prototypes(K, D, seed=7)
    assert P.shape == (K, D) and np.all(np.diff(P.indptr) <= SynthConfig().proto_size)
    top = _top5((X @ P.T).toarray())
    assert precision_at_k(top, Y, 1) > 0.9  # chance is ~3/200


def test_centroid_learner_recovers_structure() -> None:
    """A simple learner (label centroids from train rows) gets P@1 > 0.8 on held-out rows."""
    K, D = 300, 5000
    X, Y = synth(K, D, 6000, seed=11, part=0)
    Xt, Yt = synth(K, D, 1000, seed=11, part=1)
    C = _l2(Y.T @ _l2(X))
    top = _top5((_l2(Xt) @ C.T).toarray())
    assert precision_at_k(top, Yt, 1) > 0.8
    # with the structure of another seed the same learner is near chance
    Xo, Yo = synth(K, D, 1000, seed=12, part=1)
    assert precision_at_k(_top5((_l2(Xo) @ C.T).toarray()), Yo, 1) < 0.1


def test_write_synth_matches_synth_across_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(synth_mod, "_BLOCK", 128)
    train, test = tmp_path / "tr.txt", tmp_path / "te.txt"
    write_synth(train, 50, 400, 300, seed=5, test_path=test, test_rows=70)
    ds = read_xc(train)
    X, Y = synth(50, 400, 300, seed=5)
    assert ds.X is not None and _same(ds.X, X) and _same(ds.Y, Y)
    dt = read_xc(test)
    Xt, Yt = synth(50, 400, 70, seed=5, part=1)
    assert dt.X is not None and _same(dt.X, Xt) and _same(dt.Y, Yt)
    assert synth_dataset(50, 400, 300, seed=5).n_rows == 300


def test_zero_rows_and_bad_parameters() -> None:
    X, Y = synth(10, 20, 0)
    assert X.shape == (0, 20) and Y.shape == (0, 10)
    with pytest.raises(ParamsError, match="labels must be >= 1"):
        synth(0, 20, 5)
    with pytest.raises(ParamsError, match="labels_per_row"):
        synth(10, 20, 5, config=SynthConfig(labels_per_row=(3, 2)))
    with pytest.raises(ParamsError, match="signal"):
        synth(10, 20, 5, config=SynthConfig(signal=1.5))


def test_jsonl_rows_and_label_texts_say_what_the_planted_structure_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Text rows hold each feature's word as often as its count, labels named by id; a label's text is
    its prototype's words, and the label-texts reader takes the file."""
    import json

    from trainer.label_texts import read_label_texts
    from trainer.synth import write_label_texts

    monkeypatch.setattr(synth_mod, "_BLOCK", 64)
    rows, texts = tmp_path / "tr.jsonl", tmp_path / "texts.jsonl"
    write_synth(rows, 40, 300, 150, seed=3, fmt="jsonl")
    X, Y = synth(40, 300, 150, seed=3)
    lines = [json.loads(line) for line in rows.read_text().splitlines()]
    assert len(lines) == 150
    for i, obj in enumerate(lines):
        words = obj["text"].split()
        got = {int(w[1:]): words.count(w) for w in set(words)}
        a, b = X.indptr[i], X.indptr[i + 1]
        assert got == {int(f): int(v) for f, v in zip(X.indices[a:b], X.data[a:b], strict=True)}
        assert obj["labels"] == [str(k) for k in Y.indices[Y.indptr[i] : Y.indptr[i + 1]]]
    write_label_texts(texts, 40, 300, seed=3)
    pairs = read_label_texts(texts)
    protos = planted_prototypes(40, 300, seed=3)
    assert [n for n, _ in pairs] == [str(k) for k in range(40)]
    for k, (_, text) in enumerate(pairs):
        assert sorted(int(w[1:]) for w in text.split()) == sorted(protos[k].indices.tolist())
    with pytest.raises(ParamsError):
        write_synth(rows, 40, 300, 10, fmt="csv")  # type: ignore[arg-type]
