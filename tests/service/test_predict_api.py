"""Answers over HTTP equal the maps applied to the full score vector of the model (issue 4, must-show 2)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp

from tests.service.conftest import Server
from trainer.artifact import load_artifact
from trainer.sparse_maps import evsoftmax, softmax, sparsemax


def _inputs(n: int, n_features: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        idx = rng.choice(n_features, size=int(rng.integers(3, 30)), replace=False)
        out.append(
            {"features": {"indices": idx.tolist(), "values": rng.uniform(0.5, 3, len(idx)).round(3).tolist()}}
        )
    return out


def _full_scores(server: Server, inputs: list[dict[str, Any]]) -> np.ndarray:
    model = load_artifact(server.models_dir / "small" / "1")
    rows, cols, vals = [], [], []
    for i, inp in enumerate(inputs):
        rows += [i] * len(inp["features"]["indices"])
        cols += inp["features"]["indices"]
        vals += inp["features"]["values"]
    raw = sp.csr_matrix((np.asarray(vals, np.float32), (rows, cols)), shape=(len(inputs), model.n_features))
    return model.scores(model.featurizer.transform_sparse(raw)).astype(np.float64)


@pytest.fixture(scope="module")
def case(server: Server) -> tuple[list[dict[str, Any]], np.ndarray]:
    inputs = _inputs(12, 400)
    return inputs, _full_scores(server, inputs)


def _post(server: Server, body: dict[str, Any]) -> dict[str, Any]:
    with server.client() as c:
        r = c.post("/v1/models/small/predict", json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    assert out["model"] == "small" and out["version"] == "1"
    return out


@pytest.mark.parametrize("exact", [False, True])
def test_sparsemax_equals_sparsemax_of_all_scores(server: Server, case: Any, exact: bool) -> None:
    inputs, scores = case
    out = _post(server, {"inputs": inputs, "top_k": 200, "normalization": "sparsemax", "exact": exact})
    for row, pred in zip(scores, out["predictions"], strict=True):
        full = sparsemax(row)
        support = np.flatnonzero(full > 0)
        got = {lb["id"]: lb["prob"] for lb in pred["labels"]}
        assert pred["exact"] is True  # small model: flat index and exact path both score every label
        assert set(got) == set(support.tolist())
        for i in support:
            assert got[int(i)] == pytest.approx(full[i], abs=1e-5)
        assert sum(got.values()) == pytest.approx(1.0, abs=1e-5)
        probs = [lb["prob"] for lb in pred["labels"]]
        assert probs == sorted(probs, reverse=True)


def test_sparsemax_truncated_to_top_k_keeps_true_probabilities(server: Server, case: Any) -> None:
    inputs, scores = case
    out = _post(server, {"inputs": inputs, "top_k": 2, "normalization": "sparsemax"})
    for row, pred in zip(scores, out["predictions"], strict=True):
        full = sparsemax(row)
        assert len(pred["labels"]) <= 2
        assert pred["exact"] is True  # the support is fetched whole even when only 2 labels are listed
        for lb in pred["labels"]:
            assert lb["prob"] == pytest.approx(full[lb["id"]], abs=1e-5)
            assert lb["score"] == pytest.approx(row[lb["id"]], abs=1e-4)


@pytest.mark.parametrize("exact", [False, True])
def test_evsoftmax_threshold_is_the_mean_of_all_scores(server: Server, case: Any, exact: bool) -> None:
    inputs, scores = case
    out = _post(server, {"inputs": inputs, "top_k": 1000, "normalization": "evsoftmax", "exact": exact})
    assert len(out["predictions"]) == len(inputs)
    for row, pred in zip(scores, out["predictions"], strict=True):
        ids = {lb["id"] for lb in pred["labels"]}
        assert ids, "evsoftmax keeps at least the best label"
        assert min(row[list(ids)]) >= row.mean() - 1e-5  # nothing below the threshold is ever listed
        # K·d is under `exact_max_weights`: the index path scores every label too, so it must be exact
        assert pred["exact"] is True
        full = evsoftmax(row)
        assert ids == set(np.flatnonzero(full > 0).tolist())
        for lb in pred["labels"]:
            assert lb["prob"] == pytest.approx(full[lb["id"]], abs=1e-5)
        assert sum(lb["prob"] for lb in pred["labels"]) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("exact", [False, True])
def test_softmax_gives_full_softmax_probabilities(server: Server, case: Any, exact: bool) -> None:
    """K·d is under `exact_max_weights`: both paths score every label and normalise over all of them."""
    inputs, scores = case
    out = _post(server, {"inputs": inputs, "top_k": 5, "normalization": "softmax", "exact": exact})
    for row, pred in zip(scores, out["predictions"], strict=True):
        full = softmax(row)
        assert pred["exact"] is True
        top = np.argsort(-row, kind="stable")[:5]
        assert [lb["id"] for lb in pred["labels"]] == top.tolist()
        for lb in pred["labels"]:
            assert lb["prob"] == pytest.approx(full[lb["id"]], rel=1e-4)


def test_none_returns_exact_top_scores(server: Server, case: Any) -> None:
    inputs, scores = case
    out = _post(server, {"inputs": inputs, "top_k": 7, "normalization": "none"})
    for row, pred in zip(scores, out["predictions"], strict=True):
        want = np.sort(row)[::-1][:7]
        got = [lb["score"] for lb in pred["labels"]]
        np.testing.assert_allclose(got, want, atol=1e-4)
        assert all(lb["prob"] is None for lb in pred["labels"])


def test_default_model_route_and_label_names(server: Server, case: Any) -> None:
    """The default route answers like the named one: sparsemax, top 3, ids and names from full scoring."""
    inputs, scores = case
    with server.client() as c:
        r = c.post("/v1/predict", json={"inputs": inputs[:2], "top_k": 3})
    names = load_artifact(server.models_dir / "small" / "1").label_names
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "small" and body["version"] == "1"
    assert len(body["predictions"]) == 2
    for row, pred in zip(scores[:2], body["predictions"], strict=True):
        full = sparsemax(row)
        support = np.flatnonzero(full > 0)
        want = support[np.argsort(-full[support], kind="stable")][:3]
        assert len(pred["labels"]) == min(3, len(support)) >= 1
        assert sorted(lb["id"] for lb in pred["labels"]) == sorted(want.tolist())
        for lb in pred["labels"]:
            assert lb["name"] == names[lb["id"]]
            assert lb["prob"] == pytest.approx(full[lb["id"]], abs=1e-5)
            assert lb["score"] == pytest.approx(row[lb["id"]], abs=1e-4)


def test_models_endpoints_describe_the_served_version(server: Server) -> None:
    with server.client() as c:
        lst = c.get("/v1/models").json()
        one = c.get("/v1/models/small").json()
    on_disk = json.loads((server.models_dir / "small" / "1" / "metrics.json").read_text())
    assert lst["default"] == "small"
    assert [m["name"] for m in lst["models"]] == ["small"]
    assert one["active_version"] == "1" and one["n_labels"] == 200 and one["n_features"] == 400
    assert one["dim"] == 16 and one["retrieval"] == "exact"
    [version] = one["versions"]
    assert version["version"] == "1" and version["active"] is True and version["loaded"] is True
    # trained without a test set: the training figures, as written next to the weights
    for metrics in (one["metrics"], version["metrics"], lst["models"][0]["metrics"]):
        assert {"train_loss", "steps", "examples_per_s", "train_seconds"} <= set(metrics)
        assert metrics == on_disk
    assert one["metrics"]["steps"] == 4.0  # 1000 rows in batches of 256, one epoch
    assert one["metrics"]["train_loss"] > 0
