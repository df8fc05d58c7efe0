"""The job store's state machine: every transition is conditional, so racing workers, reapers and the API
agree on one outcome. Runs on SQLite and (marked `services`) on PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.db.engine import make_engine, migrate
from service.db.tables import DatasetRow
from service.errors import Conflict, Invalid, NotFound
from service.training.store import JobStore


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
        if store.claim_next(name) is not None:
            winners.append(name)

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    job = store.get_job(job_id)
    assert job is not None and job.state == "running" and job.worker == winners[0] and job.attempts == 1


def test_racing_workers_drain_the_queue_oldest_first_each_job_once(store: JobStore) -> None:
    jobs = [_job(store) for _ in range(12)]
    taken: dict[str, list[str]] = {}
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    def drain(name: str) -> None:
        barrier.wait()
        while (job := store.claim_next(name)) is not None:
            with lock:
                taken.setdefault(job.id, []).append(name)

    threads = [threading.Thread(target=drain, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken) == sorted(jobs) and all(len(v) == 1 for v in taken.values()), taken
    assert store.claim_next("late") is None
    first = _job(store)
    _job(store)
    claimed = store.claim_next("w")
    assert claimed is not None and claimed.id == first  # the oldest queued job first


def test_lease_loss_fences_the_old_worker(store: JobStore) -> None:
    job_id = _job(store)
    assert store.claim_next("old") is not None
    time.sleep(0.3)
    reaped = store.reap_stale(lease_s=0.2, max_attempts=3)
    assert [(r.job_id, r.new_state) for r in reaped] == [(job_id, "queued")]
    assert store.reap_stale(lease_s=0.2, max_attempts=3) == []  # once only
    assert store.claim_next("new") is not None
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
        assert store.claim_next("w") is not None
        time.sleep(0.25)
        store.reap_stale(lease_s=0.2, max_attempts=2)
    job = store.get_job(a)
    assert job is not None and job.state == "failed" and "worker lost 2 times" in (job.error or "")

    assert store.claim_next("w") is not None
    store.request_cancel(b)
    time.sleep(0.25)
    assert [r.new_state for r in store.reap_stale(lease_s=0.2, max_attempts=5)] == ["cancelled"]


def test_cancel_queued_running_and_finished(store: JobStore) -> None:
    queued = _job(store)
    assert store.request_cancel(queued).state == "cancelled"
    assert store.claim_next("w") is None  # a cancelled job never starts

    running = _job(store)
    store.claim_next("w")
    row = store.request_cancel(running)
    assert row.state == "running" and row.cancel_requested
    assert store.heartbeat(running, "w") == (True, True)
    assert store.finish(running, "w", "cancelled")

    done = _job(store)
    store.claim_next("w")
    store.finish(done, "w", "succeeded", model_version="1")
    with pytest.raises(Conflict):
        store.request_cancel(done)
    assert store.request_cancel(queued).state == "cancelled"  # idempotent: a retry gets the same answer
    failed = _job(store)
    store.claim_next("w")
    store.finish(failed, "w", "failed", error="x")
    with pytest.raises(Conflict, match="already failed"):
        store.request_cancel(failed)


def test_events_are_ordered_and_incremental(store: JobStore) -> None:
    job_id = _job(store)
    store.claim_next("w")
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
    store.claim_next("w")
    assert store.release(job_id, "w", "shutting down")
    assert not store.release(job_id, "w", "twice")
    job = store.get_job(job_id)
    assert job is not None and job.state == "queued" and job.worker is None
    assert store.claim_next("w2") is not None


def test_pages_cover_every_row_once_newest_first(store: JobStore) -> None:
    made = [_job(store) for _ in range(7)]
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        rows, cursor = store.list_jobs(limit=3, cursor=cursor)
        seen += [r.id for r in rows]
        pages += 1
        if cursor is None:
            break
    assert pages == 3 and seen == list(reversed(made))
    rows, cursor = store.list_jobs(limit=7)
    assert len(rows) == 7 and cursor is None
    for bad in ("nope", "W10=", "WzEsMl0"):
        with pytest.raises(Invalid):
            store.list_jobs(limit=3, cursor=bad)


def test_delete_rules(store: JobStore) -> None:
    job_id = _job(store)
    with pytest.raises(Conflict, match="queued"):
        store.delete_job(job_id)
    with pytest.raises(Conflict, match="queued or running"):
        store.delete_dataset("ds_1")
    store.claim_next("w")
    with pytest.raises(Conflict, match="running"):
        store.delete_job(job_id)
    store.finish(job_id, "w", "failed", error="x")
    store.delete_dataset("ds_1")  # only an ended job names it: its record stays, marked deleted
    kept = store.get_dataset("ds_1")
    assert kept is not None and kept.deleted_at is not None and store.deleted_among(["ds_1"]) == {"ds_1"}
    assert store.list_datasets(limit=10)[0] == []
    with pytest.raises(NotFound):
        store.delete_dataset("ds_1")
    with pytest.raises(NotFound, match="deleted"):  # no new job on it
        store.create_job(model="m", train_dataset="ds_1", test_dataset=None, params={}, activate=False)
    store.delete_job(job_id)
    assert store.get_job(job_id) is None and store.events_since(job_id, 0) == []
    with pytest.raises(NotFound):
        store.delete_job(job_id)


def test_what_a_continual_job_uses_is_found_and_kept(store: JobStore) -> None:
    """A continual job's replay set (in its `base` JSON) counts as one of its datasets; the jobs continuing
    a version are found by the same JSON fields, the job that made a version by its columns; on both
    databases."""
    store.add_dataset(DatasetRow(id="ds_2", name="e", checksum="1" * 64, format="xc", filename="e.txt",
                                 size_bytes=10, rows=3, features=4, labels=5, created_at=time.time()))
    fresh = store.create_job(model="m", train_dataset="ds_2", test_dataset=None, params={}, activate=False,
                             base={"model": "n", "version": "3", "replay_dataset": None})
    job = store.create_job(model="m", train_dataset="ds_2", test_dataset=None, params={}, activate=False,
                           base={"model": "m", "version": "1", "replay_dataset": "ds_1"})
    with pytest.raises(Conflict, match=f"queued or running job\\(s\\) \\({job.id}\\)"):
        store.delete_dataset("ds_1")
    def continuing(model: str, version: str) -> list[str]:
        with store.version_lock(model, version) as s:
            return store.continuing(s, model, version)

    assert continuing("m", "1") == [job.id]  # the jobs whose base version must stay
    assert continuing("m", "3") == [] and continuing("n", "3") == [fresh.id]
    store.request_cancel(job.id)
    assert continuing("m", "1") == []
    store.claim_next("w")
    store.finish(fresh.id, "w", "succeeded", model_version="7")
    made = store.made("m", "7")  # the job that published a version: its training set is the default replay
    assert made is not None and made.id == fresh.id and store.made("m", "6") is None
    assert store.made("n", "7") is None
    store.delete_dataset("ds_1")  # ended jobs keep its record, marked deleted
    assert store.deleted_among(["ds_1", "ds_2"]) == {"ds_1"}
