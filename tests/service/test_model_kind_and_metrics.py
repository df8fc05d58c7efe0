"""A model's listing says what input it takes, and /metrics times predictions per model."""

from __future__ import annotations

import re

from tests.service.conftest import Server

FEATURES = {"inputs": [{"features": {"indices": [3, 17], "values": [1.0, 1.0]}}], "top_k": 3}


def _count(metrics: str, name: str, model: str) -> float:
    found = re.search(rf'^{name}\{{model="{model}"\}} (\S+)$', metrics, re.M)
    return float(found.group(1)) if found else 0.0


def test_the_listing_names_the_input_kind(server: Server) -> None:
    with server.client() as c:
        [model] = [m for m in c.get("/v1/models").json()["models"] if m["name"] == "small"]
        assert model["input_kind"] == "sparse"
        assert c.get("/v1/models/small").json()["input_kind"] == "sparse"


def test_predictions_are_timed_and_refusals_counted_per_model(server: Server) -> None:
    with server.client() as c:
        before = c.get("/metrics").text
        assert c.post("/v1/models/small/predict", json=FEATURES).status_code == 200
        assert c.post("/v2/models/small/infer", json={"inputs": [
            {"name": "indices", "shape": [1], "datatype": "INT64", "data": [3]},
            {"name": "values", "shape": [1], "datatype": "FP32", "data": [1.0]},
            {"name": "offsets", "shape": [2], "datatype": "INT64", "data": [0, 1]}]}).status_code == 200
        refused = c.post("/v1/models/small/predict", json={"inputs": [{"text": "a b"}]})
        assert refused.status_code == 422  # a sparse model takes no text: the model's own check
        after = c.get("/metrics").text
    timed = "ovex_predict_duration_seconds_count"
    assert _count(after, timed, "small") - _count(before, timed, "small") == 2
    errors = "ovex_predict_errors_total"
    assert _count(after, errors, "small") - _count(before, errors, "small") == 1
