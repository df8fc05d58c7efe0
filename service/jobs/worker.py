"""The worker process: pulls job ids from the huey queue, runs them, and reaps jobs of dead workers.

`ovex worker` runs one standalone; `ovex serve` in embedded mode starts one as a separate process (a fresh
interpreter, never a fork of the API process that has loaded faiss and torch thread pools). The loop around
huey's `dequeue`/`execute` is ours rather than huey's consumer so that SIGTERM/SIGINT stop training at the
next step and hand the job back to the queue (it resumes from its checkpoint) instead of waiting for it.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import threading
import time
import uuid
from types import FrameType
from typing import Any

from service.jobs.config import JobsConfig
from service.jobs.db import make_engine, migrate
from service.jobs.models import QUEUED
from service.jobs.queue import JobQueue
from service.jobs.runner import JobRunner
from service.jobs.store import JobStore

log = logging.getLogger("ovex.worker")


def make_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker:
    """One worker process: `concurrency` threads each running one job at a time, plus a reaper."""

    def __init__(self, cfg: JobsConfig) -> None:
        cfg.ensure_dirs()
        self.cfg = cfg
        self.id = make_worker_id()
        self.engine = make_engine(cfg.db_url)
        migrate(self.engine)
        self.store = JobStore(self.engine)
        self.stop = threading.Event()
        self.shutdown = threading.Event()  # tells running training to stop and hand its job back
        self.queue = JobQueue(cfg, handler=self._handle)
        self.runner = JobRunner(cfg, self.store, self.id, self.shutdown, requeue=self.queue.enqueue)
        self._threads: list[threading.Thread] = []

    def _handle(self, job_id: str) -> None:
        self.runner.run(job_id)

    # -- reaper -----------------------------------------------------------------------------------
    def reap_once(self) -> None:
        """Re-queue jobs whose worker died and re-send queued jobs whose queue message was lost."""
        for r in self.store.reap_stale(self.cfg.lease_s, self.cfg.max_attempts):
            log.warning("reaped job %s -> %s", r.job_id, r.new_state)
            if r.new_state == QUEUED:
                self.queue.enqueue(r.job_id)
            else:
                shutil.rmtree(self.cfg.job_dir(r.job_id), ignore_errors=True)
        self._resend_lost_messages()

    def _resend_lost_messages(self) -> None:
        cutoff = time.time() - self.cfg.lease_s
        old_queued = [j for j in self.store.list_jobs(state=QUEUED, limit=1000) if j.updated_at < cutoff]
        if not old_queued:
            return
        try:
            pending = {t.args[0] for t in self.queue.huey.pending() if t.args}
        except Exception:
            log.warning("could not list pending queue messages", exc_info=True)
            return
        for job in old_queued:
            if job.id in pending:
                continue
            again = self.store.get_job(job.id)  # its message may have been in flight while we listed
            if again is not None and again.state == QUEUED and again.updated_at == job.updated_at:
                log.warning("job %s is queued but has no queue message; re-sending", job.id)
                self.queue.enqueue(job.id)

    def _reaper(self) -> None:
        every = max(0.2, min(self.cfg.lease_s / 3.0, 5.0))
        while not self.stop.is_set():
            try:
                self.reap_once()
            except Exception:
                log.warning("reaper pass failed", exc_info=True)
            self.stop.wait(every)

    # -- consumer ---------------------------------------------------------------------------------
    def _consume(self) -> None:
        huey = self.queue.huey
        idle = 0.05
        while not self.stop.is_set():
            try:
                task = huey.dequeue()
            except Exception:
                log.warning("queue read failed; retrying", exc_info=True)
                self.stop.wait(1.0)
                continue
            if task is None:
                self.stop.wait(idle)
                idle = min(idle * 1.5, 0.5)
                continue
            idle = 0.05
            try:
                huey.execute(task)
            except Exception:
                log.exception("task %s failed", task)

    def start(self) -> None:
        log.info("worker %s: queue=%s db=%s", self.id, self.cfg.queue, self.engine.url.render_as_string())
        threads = [
            threading.Thread(target=self._reaper, name="reaper", daemon=True),
            threading.Thread(target=_warm_imports, name="warm-imports", daemon=True),
        ]
        for i in range(max(1, self.cfg.worker_concurrency)):
            threads.append(threading.Thread(target=self._consume, name=f"consumer-{i}", daemon=True))
        self._threads = threads
        for t in threads:
            t.start()

    def request_stop(self) -> None:
        self.stop.set()
        self.shutdown.set()

    def join(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self.queue.close()
        self.engine.dispose()

    def run_forever(self) -> None:
        """Run until SIGTERM/SIGINT; running jobs are handed back to the queue before exiting."""

        def _on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("worker %s: %s, stopping", self.id, signal.Signals(signum).name)
            self.request_stop()

        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
        self.start()
        parent = int(os.environ.get("OVEX_WORKER_PARENT_PID", "0") or 0)
        while not self.stop.wait(0.5):
            if parent and os.getppid() != parent:  # embedded in `ovex serve`, which is gone: hand jobs back
                log.warning("worker %s: parent process %d is gone, stopping", self.id, parent)
                self.request_stop()
        self.join()
        log.info("worker %s stopped", self.id)


def _warm_imports() -> None:
    """Import the trainer (torch) while idle, so the first job does not pay for it."""
    try:
        import trainer.train  # noqa: F401
    except Exception:
        log.warning("could not import the trainer", exc_info=True)


def _configure_torch_threads(settings: Any) -> None:
    threads = getattr(settings, "threads", None)
    if threads:
        import torch

        torch.set_num_threads(int(threads))


def run_worker(settings: Any) -> None:
    """Entry point for `ovex worker`: build the config from the service settings and run."""
    cfg = JobsConfig.from_settings(settings)
    _configure_torch_threads(settings)
    Worker(cfg).run_forever()


def add_command(sub: Any) -> None:
    """Register `ovex worker` on the `ovex` command's subparsers."""
    parser = sub.add_parser(
        "worker",
        help="run training jobs from the queue (standalone worker)",
        description="run training jobs from the queue until SIGTERM/SIGINT",
    )
    add_worker_arguments(parser)

    def _run(args: argparse.Namespace) -> int:
        _configure_logging()
        run_worker(settings_from_args(args))
        return 0

    parser.set_defaults(func=_run)


def _configure_logging() -> None:
    """The server's log format (readable on a terminal, JSON otherwise or when OVEX_LOG_JSON says so)."""
    from service.logs import configure_logging
    from service.settings import Settings

    settings = Settings()
    configure_logging(settings.log_level, settings.log_json)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="ovex worker", description="run training jobs from the queue")
    add_worker_arguments(parser)
    args = parser.parse_args(argv)
    run_worker(settings_from_args(args))


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models-dir", help="artifacts go to MODELS_DIR/<model>/<version>")
    parser.add_argument("--data-dir", help="datasets, job files and the default SQLite database")
    parser.add_argument("--db-url", help="SQLAlchemy URL of the job database (default: SQLite in data dir)")
    parser.add_argument("--queue", choices=["sqlite", "redis"], help="queue backend")
    parser.add_argument("--redis-url", help="Redis URL when --queue redis")
    parser.add_argument("--concurrency", type=int, dest="worker_concurrency", help="jobs run at once")


def settings_from_args(args: argparse.Namespace) -> Any:
    from service.settings import Settings

    overrides = {
        k: v
        for k, v in vars(args).items()
        if k in ("models_dir", "data_dir", "db_url", "queue", "redis_url", "worker_concurrency")
        and v is not None
    }
    return Settings(**overrides)


if __name__ == "__main__":
    _configure_logging()
    main()
