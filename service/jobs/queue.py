"""The task queue between the API and the workers: huey, on a SQLite file or on Redis.

Why huey: one small library whose same task code runs on an embedded SQLite-file queue (the one-command
setup needs no server; the queue survives restarts because it is a file) and on Redis (N workers on N
machines), with a consumer that handles signals. Celery needs a broker server even for one machine, RQ
is Redis-only, and Dramatiq has no SQLite broker. The queue only carries job ids: the job's truth
(state, progress, lease) lives in the SQL database, so a lost or duplicated queue message is harmless —
the conditional claim in `JobStore.claim` lets exactly one worker run a job.
"""

from __future__ import annotations

from collections.abc import Callable

from huey import Huey, RedisHuey, SqliteHuey

from service.jobs.config import JobsConfig

TASK_NAME = "ovex_run_job"


def make_huey(cfg: JobsConfig) -> Huey:
    if cfg.queue == "redis":
        return RedisHuey("ovex", url=cfg.redis_url, results=False, blocking=True, read_timeout=1)
    cfg.queue_file.parent.mkdir(parents=True, exist_ok=True)
    return SqliteHuey("ovex", filename=str(cfg.queue_file), results=False, timeout=30)


class JobQueue:
    """Enqueue job ids; in a worker, `handler` runs each dequeued id."""

    def __init__(self, cfg: JobsConfig, handler: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self.huey = make_huey(cfg)
        self._handler = handler

        def ovex_run_job(job_id: str) -> None:
            if self._handler is None:
                raise RuntimeError("this process only enqueues jobs; run `ovex worker` to execute them")
            self._handler(job_id)

        self._task = self.huey.task(retries=0, name=TASK_NAME)(ovex_run_job)

    def enqueue(self, job_id: str) -> None:
        self._task(job_id)

    def pending(self) -> int:
        return int(self.huey.pending_count())

    def close(self) -> None:
        storage = self.huey.storage
        pool = getattr(storage, "pool", None)
        if pool is not None:
            pool.disconnect()
