"""Explanations of an answer: exact contributions for the linear encoder, gradient × input otherwise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.serving.explain import EXACT, GRADIENT, explain, method
from service.serving.predictor import InputRow, Options, Predictor
from service.serving.registry import ServedModel, load_served
from service.settings import Settings
from tests.service.conftest import Server
from trainer.featurize import LEAD_MARK

N_FEATURES = 400


@pytest.fixture(scope="module")
def served(model_store: Path) -> ServedModel:
    return load_served("small", "1", model_store / "small" / "1", Settings(warmup=False))


@pytest.fixture(scope="module")
def served_mlp(tmp_path_factory: pytest.TempPathFactory) -> ServedModel:
    from trainer.params import TrainParams
    from trainer.synth import synth_dataset
    from trainer.train import train

    out = tmp_path_factory.mktemp("mlp") / "m" / "1"
    ds = synth_dataset(50, N_FEATURES, 400, seed=2)
    train(TrainParams(dim=8, encoder="mlp", hidden=1, epochs=1, negatives=16, batch_size=128, seed=2,
                      device="cpu", eval_every=0), ds, None, out_dir=out)
    return load_served("m", "1", out, Settings(warmup=False))


rows_st = st.dictionaries(st.integers(0, N_FEATURES - 1), st.floats(-5, 5, allow_nan=False, width=32),
                          min_size=0, max_size=30)


def row_of(features: dict[int, float]) -> InputRow:
    idx = np.asarray(sorted(features), dtype=np.int64)
    return InputRow(indices=idx, values=np.asarray([features[i] for i in idx.tolist()], dtype=np.float32))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(features=rows_st, top_k=st.integers(1, 10))
def test_linear_contributions_sum_to_score_minus_bias(served: ServedModel, features: dict[int, float],
                                                      top_k: int) -> None:
    pred: Predictor = served.predictor
    assert method(pred) == EXACT
    row = row_of(features)
    [[answer]] = pred.predict_queries([_query(row, top_k)])
    [why] = explain(pred, [row], [answer], max_terms=1000)
    assert len(why) == len(answer.labels)
    for label, e in zip(answer.labels, why, strict=True):
        assert e["method"] == EXACT and e["approximate"] is False
        total = e["bias"] + sum(c["contribution"] for c in e["contributions"])
        assert total == pytest.approx(label.score, rel=1e-4, abs=1e-4)
        mags = [abs(c["contribution"]) for c in e["contributions"]]
        assert mags == sorted(mags, reverse=True)
        assert {c["feature"] for c in e["contributions"]} <= set(features)


def _query(row: InputRow, top_k: int) -> object:
    from service.serving.predictor import Query

    return Query([row], Options(top_k=top_k, normalization="none", exact_scan=True))


def test_bounded_to_max_terms(served: ServedModel) -> None:
    row = row_of({i: 1.0 for i in range(0, 60, 2)})
    [[answer]] = served.predictor.predict_queries([_query(row, 3)])
    [why] = explain(served.predictor, [row], [answer], max_terms=4)
    assert all(len(e["contributions"]) == 4 and e["n_features"] == 30 for e in why)


def test_mlp_is_flagged_approximate(served_mlp: ServedModel) -> None:
    pred = served_mlp.predictor
    assert method(pred) == GRADIENT
    row = row_of({3: 1.0, 17: 2.0, 101: 0.5})
    [[answer]] = pred.predict_queries([_query(row, 3)])
    [why] = explain(pred, [row], [answer], max_terms=10)
    assert why and all(e["method"] == GRADIENT and e["approximate"] is True for e in why)
    assert all(np.isfinite(c["contribution"]) for e in why for c in e["contributions"])


def test_explain_through_the_api(server: Server) -> None:
    body = {"inputs": [{"features": {"indices": [3, 17, 101], "values": [1.0, 2.0, 0.5]}}], "top_k": 3,
            "normalization": "none", "exact": True}
    with server.client() as c:
        plain = c.post("/v1/models/small/predict", json=body).json()
        assert "explanation" not in plain["predictions"][0]["labels"][0]
        r = c.post("/v1/models/small/predict", json={**body, "explain": True})
        assert r.status_code == 200, r.text
        for label in r.json()["predictions"][0]["labels"]:
            e = label["explanation"]
            assert e["method"] == "exact" and e["n_features"] == 3
            total = e["bias"] + sum(x["contribution"] for x in e["contributions"])
            assert total == pytest.approx(label["score"], rel=1e-4, abs=1e-4)
        r = c.post("/v1/models/small/predict", json={**body, "explain": True, "top_k": 500})
        assert r.status_code == 422 and "with explain, top_k must be at most 20" in r.text
        r = c.post("/v1/models/small/predict", json={**body, "explain": "yes"})
        assert r.status_code == 422


def test_text_words_are_named(tmp_path: Path) -> None:
    """A text model names the input's words behind its features, and its contributions are exact too."""
    from trainer.data import read_jsonl
    from trainer.params import TrainParams
    from trainer.synth import synth_dataset, write_jsonl_rows
    from trainer.train import train

    X, Y = synth_dataset(30, 200, 300, seed=5).X, synth_dataset(30, 200, 300, seed=5).Y
    path = tmp_path / "train.jsonl"
    with open(path, "w") as fh:
        write_jsonl_rows(fh, X, Y)
    out = tmp_path / "t" / "1"
    train(TrainParams(dim=8, epochs=1, negatives=16, batch_size=128, seed=5, device="cpu", eval_every=0),
          read_jsonl(path), None, out_dir=out)
    pred = load_served("t", "1", out, Settings(warmup=False)).predictor
    text = " ".join(f"w{j}" for j in X.indices[X.indptr[0] : X.indptr[1]]) + " unknownword"
    row = InputRow(text=text)
    [[answer]] = pred.predict_queries([_query(row, 3)])
    [why] = explain(pred, [row], [answer], max_terms=1000)
    words = set(text.split())
    for label, e in zip(answer.labels, why, strict=True):
        # words, the word pairs of a bigram model, and leading words marked as such
        assert e["contributions"] and all(set(c["word"].removeprefix(LEAD_MARK).split()) <= words
                                          for c in e["contributions"])
        assert "unknownword" not in {c["word"] for c in e["contributions"]}
        total = e["bias"] + sum(c["contribution"] for c in e["contributions"])
        assert total == pytest.approx(label.score, rel=1e-4, abs=1e-4)
