"""The KServe Open Inference Protocol (V2), spoken by a client that knows only V2 (plain httpx JSON)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import scipy.sparse as sp

from tests.service.conftest import API_KEY, Server, copy_version, start_server, stop_server


def _train_text(out: Path) -> None:
    from trainer.data import Dataset
    from trainer.params import TrainParams
    from trainer.train import train

    topics = ["alpha beta gamma", "delta epsilon zeta", "eta theta iota", "kappa lambda mu"]
    texts = [f"{topics[i % 4]} filler{i % 7}" for i in range(200)]
    rows = [i % 4 for i in range(200)]
    y = sp.csr_matrix(([1.0] * 200, (list(range(200)), rows)), shape=(200, 4))
    ds = Dataset(
        Y=y,
        n_features=0,
        n_labels=4,
        texts=texts,
        label_names=["greek A", "greek B", "C", "D"],
        path="<v2 test>",
    )
    train(
        TrainParams(dim=8, epochs=2, negatives=4, batch_size=32, device="cpu", eval_every=0),
        ds,
        None,
        out_dir=out,
    )


@pytest.fixture(scope="module")
def v2(model_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("v2")
    models = work / "models"
    copy_version(model_store, models, "small", "1", as_name="sparse")
    copy_version(model_store, models, "small", "2", as_name="sparse")
    _train_text(models / "words" / "1")
    srv = start_server(models, work)
    yield srv
    stop_server(srv)


def post(srv: Server, path: str, body: Any) -> httpx.Response:
    return httpx.post(srv.base + path, json=body, timeout=30)


def outputs(r: httpx.Response) -> dict[str, dict[str, Any]]:
    assert r.status_code == 200, r.text
    return {o["name"]: o for o in r.json()["outputs"]}


def test_health_and_metadata(v2: Server) -> None:
    assert httpx.get(v2.base + "/v2/health/live").json() == {"live": True}
    r = httpx.get(v2.base + "/v2/health/ready")
    assert r.status_code == 200 and r.json() == {"ready": True}
    meta = httpx.get(v2.base + "/v2/models/words").json()
    assert meta["name"] == "words" and meta["versions"] == ["1"] and meta["platform"] == "ovex"
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert {o["name"] for o in meta["outputs"]} >= {"label_ids", "label_names", "probabilities", "exact"}
    sparse = httpx.get(v2.base + "/v2/models/sparse").json()
    assert sparse["versions"] == ["1", "2"] and [i["name"] for i in sparse["inputs"]] == [
        "indices",
        "values",
        "offsets",
    ]
    active = sparse["parameters"]["active_version"]
    assert httpx.get(v2.base + f"/v2/models/sparse/versions/{active}").json()["versions"] == [active]
    assert httpx.get(v2.base + "/v2/models/sparse/ready").json() == {"name": "sparse", "ready": True}
    other = "1" if active == "2" else "2"
    r = httpx.get(v2.base + f"/v2/models/sparse/versions/{other}/ready")
    assert r.status_code == 503 and r.json() == {"name": "sparse", "ready": False}


def test_text_round_trip_matches_v1(v2: Server) -> None:
    texts = ["alpha beta gamma", "kappa lambda mu filler3"]
    body = {
        "id": "req-1",
        "inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": texts}],
        "parameters": {"top_k": 3},
    }
    r = post(v2, "/v2/models/words/infer", body)
    out = outputs(r)
    assert (
        r.json()["model_name"] == "words" and r.json()["model_version"] == "1" and r.json()["id"] == "req-1"
    )
    v1 = post(v2, "/v1/models/words/predict", {"inputs": [{"text": t} for t in texts], "top_k": 3}).json()
    for i, p in enumerate(v1["predictions"]):
        n = len(p["labels"])
        assert out["label_counts"]["data"][i] == n
        assert out["label_ids"]["data"][i][:n] == [lb["id"] for lb in p["labels"]]
        assert out["from_text"]["data"][i][:n] == [lb["from_text"] for lb in p["labels"]]
        assert out["label_names"]["data"][i][:n] == [lb["name"] for lb in p["labels"]]
        assert out["probabilities"]["data"][i][:n] == pytest.approx([lb["prob"] for lb in p["labels"]])
        assert out["exact"]["data"][i] == p["exact"]
        assert all(x == -1 for x in out["label_ids"]["data"][i][n:])
    assert out["label_ids"]["datatype"] == "INT64" and out["label_ids"]["shape"][0] == 2
    assert out["label_names"]["data"][0][0] == "greek A"  # the topic's label wins


def test_sparse_rows_with_offsets_and_classification(v2: Server) -> None:
    inputs = [
        {"name": "indices", "shape": [5], "datatype": "INT64", "data": [3, 17, 101, 5, 9]},
        {"name": "values", "shape": [5], "datatype": "FP32", "data": [1.0, 2.0, 0.5, 1.0, 1.0]},
        {"name": "offsets", "shape": [3], "datatype": "INT64", "data": [0, 3, 5]},
    ]
    body = {
        "inputs": inputs,
        "outputs": [{"name": "label_ids", "parameters": {"classification": 4}}, {"name": "scores"}],
        "parameters": {"normalization": "none", "exact": True},
    }
    out = outputs(post(v2, "/v2/models/sparse/infer", body))
    assert list(out) == ["label_ids", "scores"] and out["label_ids"]["shape"] == [2, 4]
    v1 = post(
        v2,
        "/v1/models/sparse/predict",
        {
            "inputs": [
                {"features": {"indices": [3, 17, 101], "values": [1.0, 2.0, 0.5]}},
                {"features": {"indices": [5, 9], "values": [1.0, 1.0]}},
            ],
            "top_k": 4,
            "normalization": "none",
            "exact": True,
        },
    ).json()
    assert out["label_ids"]["data"] == [[lb["id"] for lb in p["labels"]] for p in v1["predictions"]]
    assert out["scores"]["data"][1] == pytest.approx([lb["score"] for lb in v1["predictions"][1]["labels"]])


def test_version_path_serves_only_the_active_version(v2: Server) -> None:
    active = httpx.get(v2.base + "/v2/models/sparse").json()["parameters"]["active_version"]
    body = {
        "inputs": [
            {"name": "indices", "shape": [1], "datatype": "INT64", "data": [3]},
            {"name": "values", "shape": [1], "datatype": "FP32", "data": [1.0]},
        ]
    }
    r = post(v2, f"/v2/models/sparse/versions/{active}/infer", body)
    assert r.status_code == 200 and r.json()["model_version"] == active
    other = "1" if active == "2" else "2"
    r = post(v2, f"/v2/models/sparse/versions/{other}/infer", body)
    assert r.status_code == 400 and "not loaded" in r.json()["error"]
    r = httpx.post(
        v2.base + f"/v1/models/sparse/versions/{other}/activate", headers={"X-API-Key": API_KEY}, timeout=60
    )
    assert r.status_code == 200
    r = post(v2, f"/v2/models/sparse/versions/{other}/infer", body)
    assert r.status_code == 200 and r.json()["model_version"] == other


TEXT = {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["alpha"]}
IDX = {"name": "indices", "shape": [2], "datatype": "INT64", "data": [1, 2]}
VAL = {"name": "values", "shape": [2], "datatype": "FP32", "data": [1.0, 1.0]}

ERRORS: list[tuple[str, str, Any, int, str]] = [
    ("unknown model", "/v2/models/nope/infer", {"inputs": [TEXT]}, 404, "unknown model 'nope'"),
    ("unknown version", "/v2/models/words/versions/9/infer", {"inputs": [TEXT]}, 404, "no version '9'"),
    ("no inputs", "/v2/models/words/infer", {"inputs": []}, 400, "inputs"),
    ("not json", "/v2/models/words/infer", "nope", 400, ""),
    (
        "wrong input name",
        "/v2/models/words/infer",
        {"inputs": [{**TEXT, "name": "txt"}]},
        400,
        "unknown input 'txt'",
    ),
    ("sparse to text model", "/v2/models/words/infer", {"inputs": [IDX, VAL]}, 400, "unknown input"),
    ("text to sparse model", "/v2/models/sparse/infer", {"inputs": [TEXT]}, 400, "unknown input 'text'"),
    (
        "shape mismatch",
        "/v2/models/words/infer",
        {"inputs": [{**TEXT, "shape": [3]}]},
        400,
        "needs 3 elements",
    ),
    ("bytes not string", "/v2/models/words/infer", {"inputs": [{**TEXT, "data": [5]}]}, 400, "not a string"),
    ("blank text", "/v2/models/words/infer", {"inputs": [{**TEXT, "data": ["  "]}]}, 400, "row 0"),
    ("bad datatype", "/v2/models/words/infer", {"inputs": [{**TEXT, "datatype": "STRING"}]}, 400, "datatype"),
    (
        "values as ints",
        "/v2/models/sparse/infer",
        {"inputs": [IDX, {**VAL, "datatype": "INT64"}]},
        400,
        "must be a float tensor",
    ),
    (
        "float indices",
        "/v2/models/sparse/infer",
        {"inputs": [{**IDX, "datatype": "FP32"}, VAL]},
        400,
        "must be an integer tensor",
    ),
    (
        "index out of range",
        "/v2/models/sparse/infer",
        {"inputs": [{**IDX, "data": [1, 10**6]}, VAL]},
        400,
        "out of range",
    ),
    ("negative index", "/v2/models/sparse/infer", {"inputs": [{**IDX, "data": [-1, 2]}, VAL]}, 400, "row 0"),
    (
        "lengths differ",
        "/v2/models/sparse/infer",
        {"inputs": [IDX, {**VAL, "shape": [1], "data": [1.0]}]},
        400,
        "differ in length",
    ),
    (
        "bad offsets",
        "/v2/models/sparse/infer",
        {"inputs": [IDX, VAL, {"name": "offsets", "shape": [2], "datatype": "INT64", "data": [0, 5]}]},
        400,
        "'offsets' must run from 0",
    ),
    (
        "top_k too big",
        "/v2/models/words/infer",
        {"inputs": [TEXT], "parameters": {"top_k": 10**6}},
        400,
        "top_k",
    ),
    (
        "top_k a string",
        "/v2/models/words/infer",
        {"inputs": [TEXT], "parameters": {"top_k": "5"}},
        400,
        "positive integer",
    ),
    (
        "k disagree",
        "/v2/models/words/infer",
        {
            "inputs": [TEXT],
            "parameters": {"top_k": 2},
            "outputs": [{"name": "label_ids", "parameters": {"classification": 3}}],
        },
        400,
        "disagree",
    ),
    (
        "unknown parameter",
        "/v2/models/words/infer",
        {"inputs": [TEXT], "parameters": {"topk": 2}},
        400,
        "unknown parameter 'topk'",
    ),
    (
        "unknown output",
        "/v2/models/words/infer",
        {"inputs": [TEXT], "outputs": [{"name": "labels"}]},
        400,
        "unknown output 'labels'",
    ),
    (
        "probabilities without normalization",
        "/v2/models/words/infer",
        {"inputs": [TEXT], "parameters": {"normalization": "none"}, "outputs": [{"name": "probabilities"}]},
        400,
        "needs a normalization",
    ),
    (
        "bad normalization",
        "/v2/models/words/infer",
        {"inputs": [TEXT], "parameters": {"normalization": "max"}},
        400,
        "normalization",
    ),
    (
        "nan value",
        "/v2/models/sparse/infer",
        {"inputs": [IDX, {**VAL, "data": [1.0, "NaN"]}]},
        400,
        "not a finite number",
    ),
]


@pytest.mark.parametrize(("case", "path", "body", "status", "message"), ERRORS, ids=[e[0] for e in ERRORS])
def test_v2_errors_have_the_v2_shape(
    v2: Server, case: str, path: str, body: Any, status: int, message: str
) -> None:
    if isinstance(body, str):
        r = httpx.post(v2.base + path, content=body, headers={"content-type": "application/json"}, timeout=30)
    else:
        r = post(v2, path, body)
    assert r.status_code == status, (case, r.text)
    err = r.json()
    assert set(err) == {"error"} and isinstance(err["error"], str) and message in err["error"], (case, err)
    assert "Traceback" not in err["error"] and str(v2.models_dir) not in err["error"]


def test_unknown_v2_route_and_v1_errors_keep_their_shapes(v2: Server) -> None:
    r = httpx.get(v2.base + "/v2/nothing-here")
    assert r.status_code == 404 and set(r.json()) == {"error"}
    r = httpx.get(v2.base + "/v2/models/nope")
    assert r.status_code == 404 and r.json() == {"error": "unknown model 'nope'"}
    r = post(v2, "/v1/models/nope/predict", {"inputs": [{"text": "x"}]})
    assert r.status_code == 404 and set(r.json()) == {"detail"}
