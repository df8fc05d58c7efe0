"""End to end against a real `ovex serve` on 127.0.0.1: train over the API, cancel, survive a SIGKILLed
worker and a SIGKILLed API. Runs on SQLite and (marked `services`) on PostgreSQL; the jobs table is the queue.

No timing is asserted (the machine may be loaded): waits have generous limits and check states, not speed.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.jobs.conftest import Backend, Server

TINY = {"dim": 16, "batch_size": 32, "negatives": 8, "lr": 0.05}
# many epochs on tiny data: long enough to interrupt, each step still milliseconds
LONG = {**TINY, "epochs": 3000, "eval_every": 0}


def _first_test_row(path: Path) -> dict[str, Any]:
    line = path.read_text().splitlines()[1]
    pairs = [p.split(":") for p in line.split()[1:] if ":" in p]
    return {"indices": [int(i) for i, _ in pairs], "values": [float(v) for _, v in pairs]}


def _predict_version(srv: Server, model: str, features: dict[str, Any]) -> str:
    r = srv.client.post(f"/v1/models/{model}/predict", json={"inputs": [{"features": features}], "top_k": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == model
    assert body["predictions"][0]["labels"], body
    return str(body["version"])


def _wait_serving(srv: Server, model: str, version: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (r := srv.client.get(f"/v1/models/{model}")).status_code != 200 or r.json()[
        "active_version"
    ] != version:
        assert time.monotonic() < deadline, f"{model} {version} never served: {r.text}\n{srv.log_tail()}"
        time.sleep(0.1)


def test_train_follow_events_then_predict(
    backend: Backend, make_server: Any, synth_files: dict[str, Path]
) -> None:
    srv = make_server(backend)
    train = srv.upload(synth_files["train"])
    test = srv.upload(synth_files["test"], name="held-out")
    assert (train["rows"], train["features"], train["labels"]) == (600, 300, 40)
    assert test["name"] == "held-out" and test["id"] != train["id"]
    listed = srv.client.get("/v1/datasets").json()["datasets"]
    assert {d["id"] for d in listed} == {train["id"], test["id"]}
    assert srv.client.get(f"/v1/datasets/{train['id']}").json()["rows"] == 600

    body = {
        "model": "demo",
        "train_dataset": train["id"],
        "test_dataset": test["id"],
        "params": {**TINY, "epochs": 4},
        "activate": True,
    }
    job_id = srv.submit(body)
    events = srv.events(job_id)
    states = [d["state"] for kind, d in events if kind == "state"]
    assert states[0] == "queued" and "running" in states and states[-1] == "succeeded", events
    progress = [d for kind, d in events if kind == "progress"]
    assert progress, events
    assert progress[-1]["step"] == progress[-1]["steps_total"] > 0
    assert progress[-1]["epochs"] == 4

    # the stream ends once the API's watcher has activated the version: it serves at once
    assert events[-1] == ("activated", {"model_version": "1"}), events[-3:]
    job = srv.job(job_id)
    assert job["activated"] is True
    assert job["state"] == "succeeded" and job["model_version"] == "1" and job["error"] is None
    assert job["started_at"] and job["finished_at"] and job["finished_at"] >= job["started_at"]
    # planted structure: well above chance (40 labels, ~2-3 per row)
    assert job["progress"]["metrics"]["p@1"] > 0.3, job["progress"]
    assert (srv.models_dir / "demo" / "1" / "config.json").exists()
    assert not (srv.data_dir / "jobs" / job_id).exists()  # checkpoints and staging removed
    row = _first_test_row(synth_files["test"])
    assert _predict_version(srv, "demo", row) == "1"

    # a second job activates version 2 in the running server, no restart
    job2 = srv.submit({**body, "params": {**TINY, "epochs": 2}})
    events2 = srv.events(job2)
    assert events2[-2][1].get("state") == "succeeded", events2[-4:]
    assert events2[-1] == ("activated", {"model_version": "2"}), events2[-4:]
    assert _predict_version(srv, "demo", row) == "2"
    assert "version 2 activated for serving" in srv.logs(job2)
    assert "artifact published as demo version 2" in srv.logs(job2)

    # listing and filtering
    jobs = srv.client.get("/v1/jobs", params={"state": "succeeded"}).json()["jobs"]
    assert [j["id"] for j in jobs] == [job2, job_id]  # newest first
    assert srv.client.get("/v1/jobs", params={"state": "running"}).json()["jobs"] == []
    # a finished job cannot be cancelled
    r = srv.client.post(f"/v1/jobs/{job_id}/cancel")
    assert r.status_code == 409, r.text

    # text (JSONL) data; a test set with a label the training set lacks is scored as `ovex train --test`
    # scores it: the model never predicts that label, so its rows count it as a miss, and the log says so
    text = srv.upload(synth_files["train_jsonl"])
    unknown = srv.upload(synth_files["test_unknown_jsonl"])
    odd = srv.submit(
        {
            "model": "odd",
            "train_dataset": text["id"],
            "test_dataset": unknown["id"],
            "params": {**TINY, "epochs": 1},
        }
    )
    assert srv.events(odd)[-1][0] == "state"
    scored = srv.job(odd)
    assert scored["state"] == "succeeded" and "p@1" in scored["progress"]["metrics"], scored
    log_text = srv.logs(odd)
    assert (f"the test set dataset {unknown['id']} (test_unknown.jsonl) holds 1 label(s) the model has not "
            "trained on, on 1 of its 30 rows") in log_text, log_text
    assert str(srv.data_dir) not in log_text
    good = srv.submit({"model": "text", "train_dataset": text["id"], "params": {**TINY, "epochs": 2}})
    srv.events(good)
    assert srv.job(good)["state"] == "succeeded"
    _wait_serving(srv, "text", "1")  # a model's first version serves once the API's watcher loads it
    r = srv.client.post("/v1/models/text/predict", json={"inputs": [{"text": "w1 w2 w3"}], "top_k": 3})
    assert r.status_code == 200 and r.json()["predictions"][0]["labels"][0]["name"].startswith("topic"), (
        r.text
    )


def test_cancel_running_job_stops_fast_and_cleans_up(
    backend: Backend, make_server: Any, synth_files: dict[str, Path]
) -> None:
    srv = make_server(backend)
    train = srv.upload(synth_files["train"])
    job_id = srv.submit({"model": "long", "train_dataset": train["id"], "params": LONG})
    srv.wait(
        job_id,
        lambda j: j["state"] == "running" and (j["progress"]["step"] or 0) >= 60,
        60,
        "the job to run past a few checkpoints",
    )
    ckpt = srv.data_dir / "jobs" / job_id / "checkpoints"
    assert ckpt.is_dir() and any(ckpt.iterdir()), "expected partial files before cancelling"

    r = srv.client.post(f"/v1/jobs/{job_id}/cancel")
    assert r.status_code == 202 and r.json()["cancel_requested"], r.text
    job = srv.wait(job_id, lambda j: j["state"] != "running", 120, "the job to stop")
    assert job["state"] == "cancelled", job
    assert job["progress"]["step"] < job["progress"]["steps_total"]
    assert srv.events(job_id)[-1] == ("state", {"state": "cancelled"})
    assert not (srv.data_dir / "jobs" / job_id).exists()
    assert not (srv.models_dir / "long").exists() or not any((srv.models_dir / "long").iterdir())
    assert "cancel requested" in srv.logs(job_id)
    # one rule: 202 whenever the job is or will be cancelled (so a retry is safe), 409 once it ended otherwise
    again = srv.client.post(f"/v1/jobs/{job_id}/cancel")
    assert again.status_code == 202 and again.json()["state"] == "cancelled", again.text

    # a queued job (no free worker: the first is busy) is cancelled at once and never starts
    busy = srv.submit({"model": "long", "train_dataset": train["id"], "params": LONG})
    queued = srv.submit({"model": "long", "train_dataset": train["id"], "params": LONG})
    srv.wait(busy, lambda j: j["state"] == "running", 60, "the blocking job to start")
    r = srv.client.post(f"/v1/jobs/{queued}/cancel")
    assert r.status_code == 202 and r.json()["state"] == "cancelled", r.text
    assert srv.client.post(f"/v1/jobs/{busy}/cancel").status_code == 202
    srv.wait(busy, lambda j: j["state"] == "cancelled", 120, "the running job to stop")
    # the worker is free again: were the cancelled job claimable, it would be taken now
    follow_up = srv.submit({"model": "long", "train_dataset": train["id"], "params": LONG})
    srv.wait(follow_up, lambda j: j["state"] == "running", 60, "the next job to start")
    assert srv.job(queued)["state"] == "cancelled" and srv.job(queued)["started_at"] is None

    # stopping the server while a client follows a running job's events does not hang
    first_event = threading.Event()
    outcome: list[BaseException | None] = []

    def follow() -> None:
        try:
            with srv.client.stream("GET", f"/v1/jobs/{follow_up}/events", timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("event:"):
                        first_event.set()
            outcome.append(None)
        except BaseException as e:  # recorded and asserted on below
            outcome.append(e)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    assert first_event.wait(60), "the event stream sent nothing"
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it has shut down
    follower.join(60)
    assert not follower.is_alive(), "the follower still hangs after the server stopped"
    # the stream ends (cleanly, or cut by the server going away), never with a client-side error
    assert outcome and (outcome[0] is None or isinstance(outcome[0], httpx.TransportError)), outcome
    # its embedded worker stopped with it and handed the job back (resuming it after a restart is shown in
    # test_embedded_worker_is_a_fresh_child_that_follows_ovex_serve)
    from service.db.engine import make_engine
    from service.training.store import JobStore

    engine = make_engine(srv.env.get("OVEX_DB_URL") or f"sqlite:///{srv.data_dir / 'ovex.db'}")
    try:
        row = JobStore(engine).get_job(follow_up)
        assert row is not None and row.state == "queued" and row.worker is None
    finally:
        engine.dispose()


@pytest.mark.timeout(600)
def test_stopped_and_killed_workers_resume_from_checkpoints(
    backend: Backend, make_server: Any, synth_files: dict[str, Path]
) -> None:
    """SIGTERM the worker running a job (it hands the job back at once), then SIGKILL the one that took it
    over: each next worker continues from the last checkpoint (after the SIGKILL the lease expires and the
    reaper re-queues the job). Three workers start together so their start-ups overlap.
    (An API restart mid-job is in `test_embedded_worker_is_a_fresh_child_that_follows_ovex_serve`.)"""
    # a lease long enough that a busy machine's late heartbeat is not taken for a dead worker
    srv = make_server(
        backend, embedded_worker=False, workers=3, OVEX_JOB_LEASE_S="8", OVEX_JOB_MAX_ATTEMPTS="6"
    )
    by_pid = {w.pid: w for w in srv.workers}
    train = srv.upload(synth_files["train"])
    srv.wait_workers_ready()
    # 2,850 steps: each worker is stopped within a few hundred steps of the step the test waits for (progress
    # shows every 0.5 s), so the second is frozen far from the end; the third worker's share, most of the
    # test's time, stays short
    params = {**TINY, "epochs": 150, "eval_every": 0}
    job_id = srv.submit({"model": "crash", "train_dataset": train["id"], "params": params, "activate": True})
    before = srv.wait(job_id, lambda j: (j["progress"]["step"] or 0) >= 60, 60, "training past step 60")
    first = by_pid[srv.worker_pid(before["worker"])]

    # graceful stop: the job goes back to the queue straight away, keeping its checkpoint
    first.send_signal(signal.SIGTERM)
    assert first.wait(20) == 0
    assert "worker shutting down" in srv.logs(job_id)
    mid = srv.wait(
        job_id,
        lambda j: j["state"] == "running" and j["worker"] not in (None, before["worker"]),
        60,
        "another worker to take the job",
    )
    second = by_pid[srv.worker_pid(mid["worker"])]
    resumed_1 = mid["progress"]["step"] or 0
    srv.wait(job_id, lambda j: (j["progress"]["step"] or 0) >= resumed_1 + 100, 60, "progress on worker 2")
    os.kill(second.pid, signal.SIGSTOP)  # frozen: it cannot finish the job between our look and the kill
    frozen = srv.job(job_id)
    assert frozen["state"] == "running" and frozen["progress"]["step"] < frozen["progress"]["steps_total"]
    os.kill(second.pid, signal.SIGKILL)
    second.wait(10)
    assert srv.job(job_id)["state"] == "running"  # nobody knows yet: the lease has not expired
    job = srv.wait(
        job_id,
        lambda j: j["state"] in ("succeeded", "failed", "cancelled"),
        240,
        "the job to finish on the third worker",
    )
    logs = srv.logs(job_id)
    assert job["state"] == "succeeded", (job["error"], logs)
    # three workers took it (more only if a starved heartbeat made the reaper hand it on once more)
    assert job["attempts"] >= 3, job
    steps = [int(m) for m in re.findall(r"resumed from step (\d+)", logs)]
    assert len(steps) == job["attempts"] - 1, logs
    # checkpoint steps (OVEX_CHECKPOINT_EVERY=20), never zero, moving forward
    assert 0 < steps[0] < steps[1] and all(s % 20 == 0 for s in steps), steps
    assert job["resumed_from_step"] == steps[-1]
    assert "re-queued to resume from its checkpoint" in logs
    assert job["progress"]["step"] == job["progress"]["steps_total"]
    srv.wait(job_id, lambda j: j["activated"], 60, "the version to be activated")
    assert _predict_version(srv, "crash", _first_test_row(synth_files["test"])) == job["model_version"]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in fh)
    except FileNotFoundError:
        return False


def test_embedded_worker_is_a_fresh_child_that_follows_ovex_serve(
    backend: Backend, make_server: Any, synth_files: dict[str, Path]
) -> None:
    """`ovex serve` runs its worker as a separate interpreter (not a fork); if the server is SIGKILLed the
    worker hands its job back and exits, and the next `ovex serve` resumes the job."""
    srv = make_server(backend)
    train = srv.upload(synth_files["train"])
    job_id = srv.submit({"model": "emb", "train_dataset": train["id"], "params": LONG})
    job = srv.wait(
        job_id,
        lambda j: j["state"] == "running" and (j["progress"]["step"] or 0) >= 40,
        60,
        "the embedded worker to run the job",
    )
    pid = srv.worker_pid(job["worker"])
    assert srv.proc is not None and pid != srv.proc.pid
    stat = Path(f"/proc/{pid}/stat").read_text()
    assert int(stat.rsplit(")", 1)[1].split()[1]) == srv.proc.pid  # its parent is the server
    assert b"service.training.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()  # a new interpreter

    os.kill(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait(10)
    deadline = time.monotonic() + 15
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the orphaned worker kept running"

    srv.start()
    assert srv.client.get(f"/v1/datasets/{train['id']}").json()["rows"] == 600  # nothing lost
    resumed = srv.wait(
        job_id,
        lambda j: j["state"] == "running" and j["attempts"] == 2,
        60,
        "the restarted server's worker to resume the job",
    )
    assert srv.worker_pid(resumed["worker"]) != pid
    srv.wait(job_id, lambda j: "resumed from step" in srv.logs(job_id), 30, "the resume log line")
    assert srv.client.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
    srv.wait(job_id, lambda j: j["state"] == "cancelled", 120, "the cancel")


def test_a_job_builds_the_serving_index_and_the_service_loads_it_from_the_cache(
    make_server: Any, synth_files: dict[str, Path]
) -> None:
    """A head the service serves through its int8 scan (every head, with OVEX_EXACT_MAX_WEIGHTS=0): the job
    builds the index into the artifact before publishing it, and the service loads that cache, not a build."""
    import json

    from service.serving.retrieval import fingerprint
    from trainer.artifact import load_artifact

    srv = make_server(Backend("sqlite"), OVEX_EXACT_MAX_WEIGHTS="0")
    train = srv.upload(synth_files["train"])
    job_id = srv.submit({"model": "indexed", "train_dataset": train["id"], "params": {**TINY, "epochs": 2},
                         "activate": True})
    srv.wait(job_id, lambda j: j["state"] == "succeeded" and j["activated"], 180, "activation")
    assert re.search(r"serving index \(int8\) built in [0-9.]+ s", srv.logs(job_id)), srv.logs(job_id)

    art = srv.models_dir / "indexed" / "1"
    meta = json.loads((art / "index" / "int8" / "meta.json").read_text())
    loaded = load_artifact(art)
    assert meta["fingerprint"] == fingerprint(loaded.head_weight, loaded.head_bias, art)  # published files

    features = _first_test_row(synth_files["test"])
    r = srv.client.post("/v1/models/indexed/predict",
                        json={"inputs": [{"features": features}], "top_k": 3, "normalization": "sparsemax"})
    assert r.status_code == 200, r.text
    assert r.json()["predictions"][0]["exact"] is True
    # the embedded worker logs to the same file: one build (the job's), then the service's cached load
    lines = [json.loads(x) for x in (srv.root / "server.log").read_text().splitlines() if x.startswith("{")]
    ready = [x for x in lines if x.get("msg") == "int8 scan ready"]
    assert [x["cached"] for x in ready] == [False, True], ready
    assert sum(x.get("msg") == "building the int8 scan" for x in lines) == 1


def test_a_cancel_while_the_serving_index_builds_stops_the_job(tmp_path: Path) -> None:
    """The runner's build step polls the job's stop flag: a cancel there ends the job as cancelled, with
    no index left in the artifact it would have published."""
    from service.settings import Settings
    from service.training.config import JobsConfig
    from service.training.runner import JobRunner
    from trainer.errors import TrainingCancelled
    from trainer.hooks import QuietHooks
    from trainer.params import TrainParams
    from trainer.synth import synth_dataset
    from trainer.train import train

    staging = tmp_path / "artifact"
    train(TrainParams(dim=8, epochs=1, batch_size=64), synth_dataset(50, 200, 300, seed=5), None,
          out_dir=staging, hooks=QuietHooks())

    class Store:
        def __init__(self) -> None:
            self.lines: list[str] = []

        def log(self, job_id: str, message: str) -> None:
            self.lines.append(message)

    class Cancelled:
        def should_stop(self) -> bool:
            return True

    settings = Settings(exact_max_weights=0, data_dir=str(tmp_path / "data"), models_dir=str(tmp_path / "m"))
    store = Store()
    runner = JobRunner(JobsConfig(settings), store, "w", threading.Event())  # type: ignore[arg-type]
    with pytest.raises(TrainingCancelled):
        runner._serving_index("job", staging, Cancelled())  # type: ignore[arg-type]
    assert not (staging / "index" / "int8" / "meta.json").exists()
    assert store.lines == ["preparing the serving index"]


def test_a_failed_job_tells_what_failed_without_the_servers_paths(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk while a job writes its model is the trainer's one-line error; the job's record, which
    API clients read, names where it was writing by what it is, not by the server's path."""
    import errno
    from types import SimpleNamespace

    from service.settings import Settings
    from service.training.config import JobsConfig
    from service.training.runner import JobRunner
    from trainer.errors import write_error

    class Store:
        def __init__(self) -> None:
            self.lines: list[str] = []
            self.error: str | None = None

        def log(self, job_id: str, message: str) -> None:
            self.lines.append(message)

        def heartbeat(self, job_id: str, worker: str) -> tuple[bool, bool]:
            return True, False

        def finish(self, job_id: str, worker: str, state: str, error: str | None = None, **kw: Any) -> bool:
            self.error = error
            return True

    def full_disk(self: JobRunner, job: Any, staging: Path, checkpoints: Path, hooks: Any) -> Any:
        raise write_error(str(staging), OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "the model")

    settings = Settings(data_dir=str(tmp_path / "data"), models_dir=str(tmp_path / "models"))
    store = Store()
    monkeypatch.setattr(JobRunner, "_train", full_disk)
    runner = JobRunner(JobsConfig(settings), store, "w", threading.Event())  # type: ignore[arg-type]
    runner.run(SimpleNamespace(id="j1", attempts=1, model="m"))  # type: ignore[arg-type]
    assert store.error == ("the job's new model: no space left on device while writing the model here; "
                           "free space and rerun"), store.error
    assert str(tmp_path) not in store.error and str(tmp_path) not in "".join(store.lines)
