"""All reads and writes of job records, as short transactions. The jobs table is the queue.

Every state change is a conditional UPDATE (`... WHERE state = 'queued'`, `... WHERE worker = me`), so two
workers, a reaper and the API can race on one job and exactly one of them wins; the loser sees rowcount 0.
Workers take the oldest queued job with `claim_next`: on PostgreSQL the candidate row is locked with
`FOR UPDATE SKIP LOCKED` so concurrent workers pick different rows; SQLite serialises writers, and the
conditional UPDATE decides a tie. Each change also appends to `job_events`, which feeds the SSE stream and
the log endpoint across processes. Dataset records are `service.training.dataset_store`'s.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import CursorResult, delete, func, or_, select, update
from sqlalchemy.orm import Session

from service.db.locks import lock_version, lock_writes
from service.db.tables import (
    ACTIVE_STATES,
    CANCELLED,
    FAILED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    TERMINAL_STATES,
    DatasetRow,
    JobEventRow,
    JobRow,
)
from service.errors import Conflict, Field, NotFound
from service.training.dataset_store import DatasetStore

# the largest event id either database stores (BIGINT); a Last-Event-ID above it names nothing
MAX_EVENT_ID = (1 << 63) - 1


@dataclass(frozen=True)
class Reaped:
    """What the reaper did with one job whose worker stopped heart-beating."""

    job_id: str
    new_state: str


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


class JobStore(DatasetStore):
    """The job records (and, through `DatasetStore`, the dataset records) of the job database; safe to
    share between threads (one session per call). A process opens this one store for both tables: a job
    is recorded only on datasets that exist, and a dataset is deleted only when no active job names it."""

    @contextlib.contextmanager
    def version_lock(self, model: str, version: str) -> Iterator[Session]:
        """A transaction holding `lock_version`: recording a job that continues `model` version `version`
        and deleting that version (`ActiveVersions.version_lock`) never act on what the other is half-way
        through."""
        with self.session() as s:
            lock_version(s, model, version)
            yield s

    # -- jobs -----------------------------------------------------------------------------------
    def create_job(
        self,
        *,
        model: str,
        train_dataset: str,
        test_dataset: str | None,
        params: dict[str, Any],
        activate: bool,
        base: dict[str, Any] | None = None,
        base_exists: Callable[[], None] | None = None,
        label_texts: str | None = None,
    ) -> JobRow:
        """Record a queued job, once its datasets are seen to exist under a lock that deleting them waits
        for (`NotFound` naming the field when one was deleted since the caller checked it). One that
        continues `base` is recorded under the base's `version_lock`, after `base_exists` (which raises
        when the version is gone) has passed under it."""
        uses: dict[str, Field] = {train_dataset: ("train_dataset",)}
        if test_dataset is not None:
            uses.setdefault(test_dataset, ("test_dataset",))
        if label_texts is not None:
            uses.setdefault(label_texts, ("label_texts",))
        if base is not None and base.get("replay_dataset"):
            uses.setdefault(str(base["replay_dataset"]), ("base", "replay_dataset"))
        now = time.time()
        row = JobRow(
            id=new_id("job"),
            model=model,
            train_dataset=train_dataset,
            test_dataset=test_dataset,
            params=params,
            base=base,
            label_texts=label_texts,
            activate=activate,
            state=QUEUED,
            cancel_requested=False,
            attempts=0,
            created_at=now,
            updated_at=now,
            activated=False,
        )
        lock = self.version_lock(str(base["model"]), str(base["version"])) if base else self.session()
        with lock as s:
            if base_exists is not None:
                base_exists()
            lock_writes(s)
            q = (select(DatasetRow.id).where(DatasetRow.id.in_(list(uses)), DatasetRow.deleted_at.is_(None))
                 .with_for_update(read=True))
            found = set(s.scalars(q))
            for dataset_id, loc in uses.items():
                if dataset_id not in found:
                    raise NotFound(f"dataset {dataset_id!r} was deleted while the job was submitted",
                                   field=loc)
            s.add(row)
            s.flush()
            s.add(JobEventRow(job_id=row.id, ts=now, kind="state", data={"state": QUEUED}))
        return row

    def get_job(self, job_id: str) -> JobRow | None:
        with self.session() as s:
            return s.get(JobRow, job_id)

    def list_jobs(
        self, *, limit: int, cursor: str | None = None, state: str | None = None, model: str | None = None
    ) -> tuple[list[JobRow], str | None]:
        q = select(JobRow)
        if state is not None:
            q = q.where(JobRow.state == state)
        if model is not None:
            q = q.where(JobRow.model == model)
        return self._page(q, JobRow, limit, cursor)

    def to_activate(self) -> list[JobRow]:
        """Succeeded jobs that asked for activation and have not been activated yet."""
        with self.session() as s:
            return list(
                s.scalars(
                    select(JobRow).where(
                        JobRow.state == SUCCEEDED, JobRow.activate.is_(True), JobRow.activated.is_(False)
                    )
                )
            )

    def succeeded_since(self, ts: float) -> list[JobRow]:
        """Jobs that succeeded after `ts`, oldest first."""
        with self.session() as s:
            q = select(JobRow).where(JobRow.state == SUCCEEDED, JobRow.finished_at > ts)
            return list(s.scalars(q.order_by(JobRow.finished_at).limit(100)))

    def made(self, model: str, version: str) -> JobRow | None:
        """The job that published `model` version `version`, if its record is kept."""
        with self.session() as s:
            q = select(JobRow).where(
                JobRow.model == model, JobRow.model_version == version, JobRow.state == SUCCEEDED
            )
            return s.scalars(q.limit(1)).first()

    def made_many(self, model: str, versions: list[str]) -> dict[str, JobRow]:
        """The jobs that published these versions of `model` (those whose record is kept), by version."""
        with self.session() as s:
            q = select(JobRow).where(JobRow.model == model, JobRow.model_version.in_(versions),
                                     JobRow.state == SUCCEEDED)
            return {str(j.model_version): j for j in s.scalars(q)}

    def continuing(self, s: Session, model: str, version: str, limit: int = 20) -> list[str]:
        """Ids of the queued and running jobs that continue `model` version `version`, oldest first (in
        the transaction `s`, e.g. one holding its `version_lock`)."""
        q = select(JobRow.id).where(
            JobRow.state.in_(ACTIVE_STATES),
            JobRow.base["model"].as_string() == model,
            JobRow.base["version"].as_string() == version,
        )
        return list(s.scalars(q.order_by(JobRow.created_at).limit(limit)))

    def using_model(self, s: Session, model: str, limit: int = 20) -> list[JobRow]:
        """The queued and running jobs that continue a version of `model` or train into it, oldest first
        (in the transaction `s`, e.g. one holding the model's version locks)."""
        q = select(JobRow).where(
            JobRow.state.in_(ACTIVE_STATES),
            or_(JobRow.model == model, JobRow.base["model"].as_string() == model),
        )
        return list(s.scalars(q.order_by(JobRow.created_at).limit(limit)))

    def delete_job(self, job_id: str) -> JobRow:
        """Remove an ended job and its events; a queued or running one must be cancelled first."""
        with self.session() as s:
            row = s.get(JobRow, job_id)
            if row is None:
                raise NotFound(f"job {job_id!r} not found", field=("job_id",))
            res = s.execute(delete(JobRow).where(JobRow.id == job_id, JobRow.state.in_(TERMINAL_STATES)))
            if _rowcount(res) != 1:
                raise Conflict(
                    f"job {job_id!r} is {row.state}; cancel it and delete it once it has ended",
                    field=("job_id",),
                )
            s.execute(delete(JobEventRow).where(JobEventRow.job_id == job_id))
            return row

    def _event(
        self, s: Session, job_id: str, kind: str, data: dict[str, Any], ts: float | None = None
    ) -> None:
        s.add(JobEventRow(job_id=job_id, ts=ts or time.time(), kind=kind, data=data))

    def add_event(self, job_id: str, kind: str, data: dict[str, Any]) -> None:
        with self.session() as s:
            self._event(s, job_id, kind, data)

    def log(self, job_id: str, message: str) -> None:
        self.add_event(job_id, "log", {"message": message})

    def claim_next(self, worker: str) -> JobRow | None:
        """Take the oldest queued job for `worker` (queued → running); None when there is none.

        One UPDATE whose WHERE picks the row: on SQLite the statement takes the write lock at once (no
        read-then-upgrade that a concurrent writer could invalidate); on PostgreSQL the subquery locks
        its row with SKIP LOCKED, so concurrent workers pick different rows instead of waiting.
        """
        now = time.time()
        oldest = (
            select(JobRow.id)
            .where(JobRow.state == QUEUED, JobRow.cancel_requested.is_(False))
            .order_by(JobRow.created_at, JobRow.id)
            .limit(1)
        )
        with self.session() as s:
            if s.get_bind().dialect.name == "postgresql":
                oldest = oldest.with_for_update(skip_locked=True)
            job_id = s.scalar(
                update(JobRow)
                .where(JobRow.id == oldest.scalar_subquery(), JobRow.state == QUEUED)
                .values(
                    state=RUNNING,
                    worker=worker,
                    heartbeat_at=now,
                    attempts=JobRow.attempts + 1,
                    updated_at=now,
                    started_at=func.coalesce(JobRow.started_at, now),
                )
                .returning(JobRow.id)
            )
            if job_id is None:
                return None
            self._event(s, job_id, "state", {"state": RUNNING, "worker": worker}, now)
            return s.get(JobRow, job_id)

    def heartbeat(self, job_id: str, worker: str) -> tuple[bool, bool]:
        """Renew the lease. Returns (still ours, cancel requested)."""
        now = time.time()
        with self.session() as s:
            res = s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.worker == worker, JobRow.state == RUNNING)
                .values(heartbeat_at=now)
            )
            if _rowcount(res) != 1:
                return False, False
            cancel = s.scalar(select(JobRow.cancel_requested).where(JobRow.id == job_id))
            return True, bool(cancel)

    def update_progress(self, job_id: str, worker: str, progress: dict[str, Any], *, event: bool) -> bool:
        now = time.time()
        with self.session() as s:
            res = s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.worker == worker, JobRow.state == RUNNING)
                .values(updated_at=now, heartbeat_at=now, **progress)
            )
            if _rowcount(res) != 1:
                return False
            if event:
                self._event(s, job_id, "progress", {k: v for k, v in progress.items()}, now)
            return True

    def finish(
        self,
        job_id: str,
        worker: str,
        state: str,
        *,
        error: str | None = None,
        model_version: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> bool:
        """running → a terminal state, only while `worker` still holds the job."""
        assert state in TERMINAL_STATES
        now = time.time()
        values: dict[str, Any] = {"state": state, "finished_at": now, "updated_at": now, "error": error}
        if model_version is not None:
            values["model_version"] = model_version
        values.update(extra or {})
        with self.session() as s:
            res = s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.worker == worker, JobRow.state == RUNNING)
                .values(**values)
            )
            if _rowcount(res) != 1:
                return False
            data: dict[str, Any] = {"state": state}
            if error is not None:
                data["error"] = error
            if model_version is not None:
                data["model_version"] = model_version
            self._event(s, job_id, "state", data, now)
            return True

    def release(self, job_id: str, worker: str, reason: str) -> bool:
        """running → queued (keeping the checkpoint) when this worker stops before the job is done."""
        now = time.time()
        with self.session() as s:
            res = s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.worker == worker, JobRow.state == RUNNING)
                .values(state=QUEUED, worker=None, heartbeat_at=None, updated_at=now)
            )
            if _rowcount(res) != 1:
                return False
            self._event(s, job_id, "log", {"message": reason}, now)
            self._event(s, job_id, "state", {"state": QUEUED}, now)
            return True

    def request_cancel(self, job_id: str) -> JobRow:
        """A queued job is cancelled at once; a running one is flagged and its worker stops it.

        One rule, idempotent so a client may retry it: the answer is the job when it is or will be
        cancelled (queued, running, already cancelled); `Conflict` when it ended another way.
        """
        now = time.time()
        with self.session() as s:
            res = s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.state == QUEUED)
                .values(state=CANCELLED, cancel_requested=True, finished_at=now, updated_at=now)
            )
            if _rowcount(res) == 1:
                self._event(s, job_id, "log", {"message": "cancelled before it started"}, now)
                self._event(s, job_id, "state", {"state": CANCELLED}, now)
                return _get(s, job_id)
            res = s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.state == RUNNING, JobRow.cancel_requested.is_(False))
                .values(cancel_requested=True, updated_at=now)
            )
            if _rowcount(res) == 1:
                self._event(s, job_id, "log", {"message": "cancel requested"}, now)
            row = _get(s, job_id)
            if row.state in TERMINAL_STATES and row.state != CANCELLED:
                raise Conflict(
                    f"job {job_id!r} has already {row.state}; only a queued or running job can be cancelled",
                    field=("job_id",),
                )
            return row

    def reap_stale(self, lease_s: float, max_attempts: int) -> list[Reaped]:
        """Jobs marked running whose worker stopped renewing its lease: re-queue, or finish if due."""
        now = time.time()
        cutoff = now - lease_s
        out: list[Reaped] = []
        with self.session() as s:
            stale = list(
                s.scalars(select(JobRow).where(JobRow.state == RUNNING, JobRow.heartbeat_at < cutoff))
            )
            for job in stale:
                extra: dict[str, Any]
                if job.cancel_requested:
                    new_state, extra = CANCELLED, {"finished_at": now}
                    msg = f"worker {job.worker} lost while cancelling; marked cancelled"
                elif job.attempts >= max_attempts:
                    new_state, extra = (
                        FAILED,
                        {"finished_at": now, "error": f"worker lost {job.attempts} times"},
                    )
                    msg = f"worker {job.worker} lost; giving up after {job.attempts} attempts"
                else:
                    new_state, extra = QUEUED, {}
                    msg = (
                        f"worker {job.worker} stopped heart-beating; re-queued to resume from its checkpoint"
                    )
                res = s.execute(
                    update(JobRow)
                    .where(
                        JobRow.id == job.id, JobRow.state == RUNNING, JobRow.heartbeat_at == job.heartbeat_at
                    )
                    .values(state=new_state, worker=None, heartbeat_at=None, updated_at=now, **extra)
                )
                if _rowcount(res) != 1:
                    continue
                self._event(s, job.id, "log", {"message": msg}, now)
                data: dict[str, Any] = {"state": new_state}
                if "error" in extra:
                    data["error"] = extra["error"]
                self._event(s, job.id, "state", data, now)
                out.append(Reaped(job.id, new_state))
        return out

    def events_since(
        self, job_id: str, after_id: int, kinds: tuple[str, ...] | None = None, limit: int = 1000
    ) -> list[JobEventRow]:
        q = select(JobEventRow).where(JobEventRow.job_id == job_id, JobEventRow.id > after_id)
        if kinds is not None:
            q = q.where(JobEventRow.kind.in_(kinds))
        with self.session() as s:
            return list(s.scalars(q.order_by(JobEventRow.id).limit(limit)))

    def mark_activated(self, job_id: str, version: str) -> None:
        with self.session() as s:
            res = s.execute(
                update(JobRow).where(JobRow.id == job_id, JobRow.activated.is_(False)).values(activated=True)
            )
            if _rowcount(res) == 1:
                self._event(s, job_id, "activated", {"model_version": version})


def _rowcount(res: Any) -> int:
    return int(res.rowcount) if isinstance(res, CursorResult) else int(getattr(res, "rowcount", 0))


def _get(s: Session, job_id: str) -> JobRow:
    row = s.get(JobRow, job_id)
    if row is None:
        raise NotFound(f"job {job_id!r} not found", field=("job_id",))
    return row
