"""The job store's state machine: every transition is conditional, so racing workers, reapers and the API
agree on one outcome. Runs on SQLite and (marked `services`) on PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.jobs.db import make_engine, migrate
from service.jobs.models import DatasetRow
from service.jobs.store import JobConflict, JobStore


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.services)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'jobs.db'}"
    else:
        import psycopg

        base = request.getfixturevalue("postgres_url")
        name = f"ovex_store_{time.monotonic_ns()}"
        admin = base.replace("postgresql+psycopg://", "postgresql://").rsplit("/", 1)[0] + "/postgres"
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f"CREATE DATABASE {name}")
        url = base.rsplit("/", 1)[0] + f"/{name}"
    engine = make_engine(url)
    migrate(engine)
    migrate(engine)  # idempotent
    s = JobStore(engine)
    s.add_dataset(
        DatasetRow(
            id="ds_1",
            name="d",
            checksum="0" * 64,
            format="xc",
            filename="d.txt",
            size_bytes=10,
            rows=3,
            features=4,
            labels=5,
            created_at=time.time(),
        )
    )
    yield s
    engine.dispose()


def _job(store: JobStore) -> str:
    return store.create_job(model="m", train_dataset="ds_1", test_dataset=None, params={}, activate=False).id


def test_exactly_one_of_many_racing_workers_claims(store: JobStore) -> None:
    job_id = _job(store)
    winners: list[str] = []
    barrier = threading.Barrier(6)

    def claim(name: str) -> None:
        barrier.wait()
        if store.claim(job_id, name) is not None:
            winners.append(name)

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    job = store.get_job(job_id)
    assert job is not None and job.state == "running" and job.worker == winners[0] and job.attempts == 1


def test_lease_loss_fences_the_old_worker(store: JobStore) -> None:
    job_id = _job(store)
    assert store.claim(job_id, "old") is not None
    time.sleep(0.3)
    reaped = store.reap_stale(lease_s=0.2, max_attempts=3)
    assert [(r.job_id, r.new_state) for r in reaped] == [(job_id, "queued")]
    assert store.reap_stale(lease_s=0.2, max_attempts=3) == []  # once only
    assert store.claim(job_id, "new") is not None
    # the old worker wakes up: every write it tries is refused
    assert store.heartbeat(job_id, "old") == (False, False)
    assert not store.update_progress(job_id, "old", {"step": 5}, event=True)
    assert not store.finish(job_id, "old", "succeeded", model_version="9")
    assert store.finish(job_id, "new", "succeeded", model_version="1")
    job = store.get_job(job_id)
    assert job is not None and job.model_version == "1" and job.attempts == 2


def test_reaper_gives_up_after_max_attempts_and_honours_cancel(store: JobStore) -> None:
    a, b = _job(store), _job(store)
    for _ in range(2):
        assert store.claim(a, "w") is not None
        time.sleep(0.25)
        store.reap_stale(lease_s=0.2, max_attempts=2)
    job = store.get_job(a)
    assert job is not None and job.state == "failed" and "worker lost 2 times" in (job.error or "")

    assert store.claim(b, "w") is not None
    store.request_cancel(b)
    time.sleep(0.25)
    assert [r.new_state for r in store.reap_stale(lease_s=0.2, max_attempts=5)] == ["cancelled"]


def test_cancel_queued_running_and_finished(store: JobStore) -> None:
    queued = _job(store)
    assert store.request_cancel(queued).state == "cancelled"
    assert store.claim(queued, "w") is None  # a cancelled job never starts

    running = _job(store)
    store.claim(running, "w")
    row = store.request_cancel(running)
    assert row.state == "running" and row.cancel_requested
    assert store.heartbeat(running, "w") == (True, True)
    assert store.finish(running, "w", "cancelled")

    done = _job(store)
    store.claim(done, "w")
    store.finish(done, "w", "succeeded", model_version="1")
    with pytest.raises(JobConflict):
        store.request_cancel(done)


def test_events_are_ordered_and_incremental(store: JobStore) -> None:
    job_id = _job(store)
    store.claim(job_id, "w")
    for step in range(1, 4):
        store.update_progress(job_id, "w", {"step": step}, event=True)
    store.log(job_id, "hello")
    store.finish(job_id, "w", "succeeded", model_version="1")
    events = store.events_since(job_id, 0)
    assert [e.kind for e in events] == ["state", "state", "progress", "progress", "progress", "log", "state"]
    assert [e.id for e in events] == sorted(e.id for e in events)
    later = store.events_since(job_id, events[3].id, ("state", "progress"))
    assert [e.data.get("step", e.data.get("state")) for e in later] == [3, "succeeded"]


def test_release_requeues_for_resume(store: JobStore) -> None:
    job_id = _job(store)
    store.claim(job_id, "w")
    assert store.release(job_id, "w", "shutting down")
    assert not store.release(job_id, "w", "twice")
    job = store.get_job(job_id)
    assert job is not None and job.state == "queued" and job.worker is None
    assert store.claim(job_id, "w2") is not None
