"""The job database goes down under a running `ovex serve`: every jobs and datasets endpoint answers 503
with a message that says so (no traceback, no server path), and once it is back the service recovers
with nothing stored lost."""

from __future__ import annotations

import json
import threading
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
    spec = srv.client.get("/openapi.json").json()["paths"]
    assert all("503" in spec[path][method]["responses"]  # documented, like every other status
               for path, method in (("/v1/jobs", "post"), ("/v1/datasets", "get")))
    before = _listing(srv)
    # a job followed across the outage: its stream waits for the database instead of breaking off
    long = srv.submit({"model": "m", "train_dataset": train["id"], "base": {}, "params": {"epochs": 3000}})
    srv.wait(long, lambda j: j["state"] == "running", 60, "the long job to start")
    followed: dict[str, Any] = {"events": []}
    streaming = threading.Event()

    def follow() -> None:
        try:
            with srv.client.stream("GET", f"/v1/jobs/{long}/events", timeout=300) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        followed["events"].append(json.loads(line.split(":", 1)[1]))
                        streaming.set()
        except Exception as exc:
            followed["error"] = exc

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    assert streaming.wait(60)

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
    assert srv.client.post(f"/v1/jobs/{long}/cancel").status_code == 202
    follower.join(300)
    assert "error" not in followed, followed
    assert followed["events"][-1] == {"state": "cancelled"}, followed["events"][-3:]
    assert srv.client.delete(f"/v1/jobs/{long}").status_code == 204
    after = _listing(srv)
    assert after == before  # nothing lost, nothing half-written by the calls refused meanwhile
    # the refused upload left no file behind
    assert len(list((srv.data_dir / "datasets").rglob("*.*"))) == 1
    assert not [p for p in (srv.data_dir / "uploads").rglob("*") if p.is_file()]
    again = srv.submit({"model": "m", "train_dataset": train["id"], "base": {}, "params": {"epochs": 1}})
    assert srv.final_state(again) == "succeeded", srv.log_tail()
    assert srv.job(again)["model_version"] == "2"
    assert httpx.get(srv.base + "/healthz").status_code == 200
