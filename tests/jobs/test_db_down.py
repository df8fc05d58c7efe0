"""The job database goes down under a running `ovex serve`: every jobs and datasets endpoint answers 503
with a message that says so (no traceback, no server path), and once it is back the service recovers
with nothing stored lost."""

from __future__ import annotations

import json
import threading
import time
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


def test_a_job_that_published_before_the_database_went_down_never_publishes_twice(
    tmp_path: Path, own_postgres: Postgres, synth_files: dict[str, Path], monkeypatch: Any
) -> None:
    """The database goes down right after a job's version is on disk, before the job's record says so: the
    attempt dies, the job is re-queued once the database is back, and its next attempt finishes with that
    version instead of training and publishing a second one."""
    import hashlib
    import shutil

    import pytest

    from service.db.tables import DatasetRow
    from service.errors import Unavailable
    from service.serving import catalog as catalog_module
    from service.settings import Settings
    from service.training.runner import JobRunner
    from service.training.runtime import JobsRuntime
    from trainer.params import TrainParams

    settings = Settings(data_dir=tmp_path / "data", models_dir=tmp_path / "models", db_url=own_postgres.url)
    runtime = JobsRuntime(settings, None)
    store, cfg = runtime.store, runtime.cfg
    try:
        checksum = hashlib.sha256(synth_files["train"].read_bytes()).hexdigest()
        shutil.copy(synth_files["train"], cfg.datasets_dir / f"{checksum}.txt")
        store.add_dataset(DatasetRow(id="ds_t", name="t", checksum=checksum, format="xc", filename="t",
                                     size_bytes=1, rows=600, features=300, labels=40, created_at=time.time()))
        job = store.create_job(model="m", train_dataset="ds_t", test_dataset=None, activate=False,
                               params=TrainParams(**TINY).to_json_dict())
        real_publish = catalog_module.publish

        def publish_then_outage(*args: Any) -> str:
            version = real_publish(*args)
            own_postgres.stop()  # the version is on disk; nothing after it reaches the database
            return version

        monkeypatch.setattr(catalog_module, "publish", publish_then_outage)
        first = store.claim_next("w1")
        assert first is not None and first.id == job.id
        with pytest.raises(Unavailable):  # the worker logs it; the job stays 'running' in the database
            JobRunner(cfg, store, "w1", threading.Event()).run(first)
        assert sorted(p.name for p in (tmp_path / "models" / "m").iterdir()) == ["1"]

        assert own_postgres.start() is None
        monkeypatch.setattr(catalog_module, "publish", real_publish)
        assert [r.job_id for r in store.reap_stale(lease_s=0, max_attempts=3)] == [job.id]  # re-queued
        again = store.claim_next("w2")
        assert again is not None and again.id == job.id and again.attempts == 2
        JobRunner(cfg, store, "w2", threading.Event()).run(again)

        done = store.get_job(job.id)
        assert done is not None and (done.state, done.model_version) == ("succeeded", "1"), done.error
        assert sorted(p.name for p in (tmp_path / "models" / "m").iterdir()) == ["1"]  # no second version
        stored = json.loads((tmp_path / "models" / "m" / "1" / "metrics.json").read_text())
        assert done.metrics is not None and done.metrics["steps"] == stored["steps"]  # what version 1 stored
        lines = [e.data.get("message", "") for e in store.events_since(job.id, 0)]
        assert any("published by an earlier attempt" in x for x in lines), lines
        assert not cfg.job_dir(job.id).exists()
    finally:
        runtime.stop()
