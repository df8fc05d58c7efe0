"""Liveness without models, readiness, Prometheus metrics, OpenAPI docs."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.service.conftest import API_KEY, Server, copy_version, start_server, stop_server


def test_healthz_up_with_no_model_and_not_ready(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "empty-models", tmp_path, wait_ready=False)
    try:
        with srv.client() as c:
            assert c.get("/healthz").json() == {"status": "ok"}
            ready = c.get("/readyz")
            assert ready.status_code == 503 and ready.json()["ready"] is False
            assert _ready(c) == (503, 503)
            r = c.post("/v1/predict", json={"inputs": [{"text": "x"}]})
            assert r.status_code == 503 and "no model" in r.json()["detail"]
            assert c.get("/v1/models").json() == {
                "default": None, "default_source": "automatic", "models": [], "next_cursor": None
            }
    finally:
        stop_server(srv)


def test_readyz_lists_active_versions(server: Server) -> None:
    r = httpx.get(server.base + "/readyz")
    assert r.status_code == 200 and r.json() == {"ready": True, "models": {"small": "1"}}


def _ready(c: httpx.Client) -> tuple[int, int]:
    """The statuses of /readyz and /v2/health/ready, checked to say what they answer."""
    v1, v2 = c.get("/readyz"), c.get("/v2/health/ready")
    assert v1.json()["ready"] is (v1.status_code == 200) and v2.json() == {"ready": v2.status_code == 200}
    return v1.status_code, v2.status_code


def test_readiness_is_one_rule_for_readyz_and_v2(model_store: Path, tmp_path: Path) -> None:
    """Both answer the KServe V2 "server ready" (the models are ready for inference): 200 while a model
    serves and none that is to serve is still loading. A deactivated model is not to serve, and a model
    none of whose versions loads is refused on its own (its readiness 503) without taking the server out
    of rotation."""
    models = tmp_path / "models"
    copy_version(model_store, models, "small", "1")
    copy_version(model_store, models, "small", "1", as_name="other")
    broken = copy_version(model_store, models, "small", "1", as_name="broken")
    for f in broken.iterdir():
        if f.is_file() and f.suffix != ".json":
            f.write_bytes(b"not the weights")
    # one refresh a minute: a model copied in later stays unloaded until something asks for it
    srv = start_server(models, tmp_path, {"OVEX_ACTIVE_POLL_S": "60"})
    admin = {"X-API-Key": API_KEY}
    try:
        with srv.client() as c:
            assert _ready(c) == (200, 200)
            assert c.get("/v2/models/broken/ready").status_code == 503
            assert c.post("/v1/models/other/deactivate", headers=admin).status_code == 200
            assert _ready(c) == (200, 200)
            assert c.get("/readyz").json()["models"] == {"small": "1"}

            copy_version(model_store, models, "small", "2", as_name="late", as_version="1")
            assert _ready(c) == (503, 503)  # on disk, to serve, not loaded yet
            r = c.post("/v1/models/late/versions/1/activate", headers=admin)
            assert r.status_code == 200, r.text
            assert _ready(c) == (200, 200)

            for name in ("small", "late"):
                assert c.post(f"/v1/models/{name}/deactivate", headers=admin).status_code == 200
            assert _ready(c) == (503, 503)  # nothing serves: deactivated or refused
    finally:
        stop_server(srv)


def _scrape(c: httpx.Client) -> dict[str, float]:
    text = c.get("/metrics").text
    return {
        ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1])
        for ln in text.splitlines()
        if ln and not ln.startswith("#")
    }


def test_metrics_count_requests_batches_and_models(server: Server) -> None:
    """Counted exactly: the server is shared by the session, so the test reads the change it caused."""
    route = 'method="POST",route="/v1/models/{name}/predict"'
    row = {"features": {"indices": [1], "values": [1.0]}}
    with server.client() as c:
        before = _scrape(c)
        for n in (1, 2, 3):  # one request at a time: one predictor call each
            assert c.post("/v1/models/small/predict", json={"inputs": [row] * n}).status_code == 200
        assert c.post("/v1/models/nope/predict", json={"inputs": [row]}).status_code == 404
        after = _scrape(c)

    def added(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert added(f'ovex_requests_total{{{route},status="200"}}') == 3
    assert added(f'ovex_requests_total{{{route},status="404"}}') == 1
    assert added(f'ovex_request_duration_seconds_count{{{route},status="200"}}') == 3
    assert added(f'ovex_request_duration_seconds_sum{{{route},status="200"}}') > 0
    assert added("ovex_batch_rows_count") == 3 and added("ovex_batch_rows_sum") == 6
    assert added('ovex_batch_rows_bucket{le="2.0"}') == 2  # the calls with 1 and 2 rows
    assert added('ovex_predicted_rows_total{model="small",version="1"}') == 6
    assert after['ovex_models_loaded{model="small",version="1"}'] == 1.0


def test_openapi_and_docs(server: Server) -> None:
    with server.client() as c:
        spec = c.get("/openapi.json").json()
        docs = c.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    for path in (
        "/v1/predict",
        "/v1/models/{name}/predict",
        "/v1/models",
        "/v1/models/{name}",
        "/v1/models/{name}/versions",
        "/v1/models/{name}/versions/{version}/activate",
        "/healthz",
        "/readyz",
        "/metrics",
    ):
        assert path in spec["paths"], path
    req = spec["components"]["schemas"]["PredictRequest"]
    assert set(req["properties"]) == {"inputs", "top_k", "normalization", "exact", "explain"}
