"""The job database goes down under a running `ovex serve`: every jobs and datasets endpoint answers 503
with a message that says so (no traceback, no server path), and once it is back the service recovers
with nothing stored lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.jobs.conftest import Backend, Postgres

TINY = {"dim": 16, "batch_size": 32, "negatives": 8, "lr": 0.05, "epochs": 1}


def _listing(srv: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    jobs = srv.client.get("/v1/jobs").json()["jobs"]
    datasets = srv.client.get("/v1/datasets").json()["datasets"]
    return jobs, datasets


def test_a_lost_job_database_is_a_503_and_the_service_recovers(
    make_server: Any, own_postgres: Postgres, synth_files: dict[str, Path]
) -> None:
    srv = make_server(Backend("postgres", lambda: {"OVEX_DB_URL": own_postgres.url}))
    train = srv.upload(synth_files["train"])
    first = srv.submit({"model": "m", "train_dataset": train["id"], "params": TINY, "activate": True})
    assert srv.final_state(first) == "succeeded", srv.log_tail()
    srv.wait(first, lambda j: j["activated"], 60, "the activation")
    before = _listing(srv)

    own_postgres.stop()
    with open(synth_files["test"], "rb") as fh:
        upload = fh.read()
    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/v1/jobs", {"json": {"model": "m", "train_dataset": train["id"], "params": TINY}}),
        ("POST", "/v1/jobs", {"json": {"model": "m", "train_dataset": train["id"], "base": {}}}),
        ("GET", "/v1/jobs", {}),
        ("GET", f"/v1/jobs/{first}", {}),
        ("GET", f"/v1/jobs/{first}/logs", {}),
        ("GET", f"/v1/jobs/{first}/events", {}),
        ("POST", f"/v1/jobs/{first}/cancel", {}),
        ("DELETE", f"/v1/jobs/{first}", {}),
        ("GET", "/v1/datasets", {}),
        ("GET", f"/v1/datasets/{train['id']}", {}),
        ("DELETE", f"/v1/datasets/{train['id']}", {}),
        ("POST", "/v1/datasets", {"files": {"file": ("test.txt", upload, "text/plain")}}),
        ("POST", "/v1/models/m/versions/1/activate", {}),
    ]
    for method, path, kwargs in calls:
        r = srv.client.request(method, path, **kwargs)
        assert r.status_code == 503, (method, path, r.status_code, r.text)
        detail = r.json()["detail"]
        assert "database is unavailable" in detail and "retry" in detail, (method, path, detail)
        assert r.headers.get("retry-after"), (method, path)
        for leak in ("Traceback", str(srv.root), "psycopg", "127.0.0.1", "SELECT", "INSERT"):
            assert leak not in r.text, (method, path, r.text)
    # predictions do not need the job database
    r = srv.client.post("/v1/models/m/predict",
                        json={"inputs": [{"features": {"indices": [1, 2], "values": [1.0, 1.0]}}]})
    assert r.status_code == 200, r.text

    assert own_postgres.start() is None
    after = _listing(srv)
    assert after == before  # nothing lost, nothing half-written by the calls refused meanwhile
    # the refused upload left no file behind
    assert len(list((srv.data_dir / "datasets").rglob("*.*"))) == 1
    assert not [p for p in (srv.data_dir / "uploads").rglob("*") if p.is_file()]
    again = srv.submit({"model": "m", "train_dataset": train["id"], "base": {}, "params": {"epochs": 1}})
    assert srv.final_state(again) == "succeeded", srv.log_tail()
    assert srv.job(again)["model_version"] == "2"
    assert httpx.get(srv.base + "/healthz").status_code == 200
