"""All reads and writes of job and dataset records, as short transactions.

Every state change is a conditional UPDATE (`... WHERE state = 'queued'`, `... WHERE worker = me`), so two
workers, a reaper and the API can race on one job and exactly one of them wins; the loser sees rowcount 0.
Each change also appends to `job_events`, which feeds the SSE stream and the log endpoint across processes.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import CursorResult, Engine, select, update
from sqlalchemy.orm import Session, sessionmaker

from service.jobs.models import (
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


class JobConflict(Exception):
    """The job is not in a state that allows the request (e.g. cancelling a finished job)."""


@dataclass(frozen=True)
class Reaped:
    """What the reaper did with one job whose worker stopped heart-beating."""

    job_id: str
    new_state: str


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


class JobStore:
    """Typed access to the job database; safe to share between threads (one session per call)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        with self._sessions() as s, s.begin():
            yield s

    # -- datasets -------------------------------------------------------------------------------
    def add_dataset(self, row: DatasetRow) -> DatasetRow:
        with self.session() as s:
            s.add(row)
        return row

    def get_dataset(self, dataset_id: str) -> DatasetRow | None:
        with self.session() as s:
            return s.get(DatasetRow, dataset_id)

    def dataset_by_checksum(self, checksum: str) -> DatasetRow | None:
        with self.session() as s:
            return s.scalars(select(DatasetRow).where(DatasetRow.checksum == checksum)).first()

    def list_datasets(self, limit: int = 1000) -> list[DatasetRow]:
        with self.session() as s:
            return list(s.scalars(select(DatasetRow).order_by(DatasetRow.created_at.desc()).limit(limit)))

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
    ) -> JobRow:
        now = time.time()
        row = JobRow(
            id=new_id("job"),
            model=model,
            train_dataset=train_dataset,
            test_dataset=test_dataset,
            params=params,
            base=base,
            activate=activate,
            state=QUEUED,
            cancel_requested=False,
            attempts=0,
            created_at=now,
            updated_at=now,
            activated=False,
        )
        with self.session() as s:
            s.add(row)
            s.flush()
            s.add(JobEventRow(job_id=row.id, ts=now, kind="state", data={"state": QUEUED}))
        return row

    def delete_job(self, job_id: str) -> None:
        """Undo `create_job` when the queue refused the task, so nothing half-made stays behind."""
        with self.session() as s:
            s.query(JobEventRow).filter(JobEventRow.job_id == job_id).delete()
            s.query(JobRow).filter(JobRow.id == job_id).delete()

    def get_job(self, job_id: str) -> JobRow | None:
        with self.session() as s:
            return s.get(JobRow, job_id)

    def list_jobs(
        self, *, state: str | None = None, model: str | None = None, limit: int = 100
    ) -> list[JobRow]:
        q = select(JobRow).order_by(JobRow.created_at.desc()).limit(limit)
        if state is not None:
            q = q.where(JobRow.state == state)
        if model is not None:
            q = q.where(JobRow.model == model)
        with self.session() as s:
            return list(s.scalars(q))

    def count_jobs(self) -> int:
        with self.session() as s:
            return len(list(s.scalars(select(JobRow.id))))

    def _event(
        self, s: Session, job_id: str, kind: str, data: dict[str, Any], ts: float | None = None
    ) -> None:
        s.add(JobEventRow(job_id=job_id, ts=ts or time.time(), kind=kind, data=data))

    def add_event(self, job_id: str, kind: str, data: dict[str, Any]) -> None:
        with self.session() as s:
            self._event(s, job_id, kind, data)

    def log(self, job_id: str, message: str) -> None:
        self.add_event(job_id, "log", {"message": message})

    def claim(self, job_id: str, worker: str) -> JobRow | None:
        """queued → running for `worker`; None if another worker has it or it was cancelled meanwhile."""
        now = time.time()
        with self.session() as s:
            res = s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.state == QUEUED, JobRow.cancel_requested.is_(False))
                .values(
                    state=RUNNING,
                    worker=worker,
                    heartbeat_at=now,
                    attempts=JobRow.attempts + 1,
                    updated_at=now,
                )
            )
            if _rowcount(res) != 1:
                return None
            s.execute(
                update(JobRow).where(JobRow.id == job_id, JobRow.started_at.is_(None)).values(started_at=now)
            )
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
        """A queued job is cancelled at once; a running one is flagged and its worker stops it."""
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
            else:
                res = s.execute(
                    update(JobRow)
                    .where(JobRow.id == job_id, JobRow.state == RUNNING)
                    .values(cancel_requested=True, updated_at=now)
                )
                if _rowcount(res) == 1:
                    self._event(s, job_id, "log", {"message": "cancel requested"}, now)
            row = s.get(JobRow, job_id)
            if row is None:
                raise KeyError(job_id)
            if row.state in TERMINAL_STATES and row.state != CANCELLED:
                raise JobConflict(f"job {job_id} already {row.state}")
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

    def queued_ids(self) -> list[str]:
        with self.session() as s:
            return list(
                s.scalars(select(JobRow.id).where(JobRow.state == QUEUED).order_by(JobRow.created_at))
            )

    def events_since(
        self, job_id: str, after_id: int, kinds: tuple[str, ...] | None = None
    ) -> list[JobEventRow]:
        q = select(JobEventRow).where(JobEventRow.job_id == job_id, JobEventRow.id > after_id)
        if kinds is not None:
            q = q.where(JobEventRow.kind.in_(kinds))
        with self.session() as s:
            return list(s.scalars(q.order_by(JobEventRow.id).limit(1000)))

    def succeeded_to_publish(self) -> list[JobRow]:
        """Succeeded jobs asking for activation that this deployment has not activated yet."""
        with self.session() as s:
            return list(
                s.scalars(
                    select(JobRow).where(
                        JobRow.state == SUCCEEDED, JobRow.activate.is_(True), JobRow.activated.is_(False)
                    )
                )
            )

    def latest_success_at(self) -> float:
        with self.session() as s:
            rows = s.scalars(
                select(JobRow.finished_at)
                .where(JobRow.state == SUCCEEDED)
                .order_by(JobRow.finished_at.desc())
                .limit(1)
            ).first()
            return float(rows or 0.0)

    def mark_activated(self, job_id: str) -> None:
        with self.session() as s:
            s.execute(update(JobRow).where(JobRow.id == job_id).values(activated=True))


def _rowcount(res: Any) -> int:
    return int(res.rowcount) if isinstance(res, CursorResult) else int(getattr(res, "rowcount", 0))
