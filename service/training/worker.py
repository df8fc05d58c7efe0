"""The worker process: claims queued jobs straight from the jobs table, runs them, reaps dead workers' jobs.

`ovex worker` runs one standalone; `ovex serve` in embedded mode starts one as a separate process (a fresh
interpreter, never a fork of the API process that has loaded faiss and torch thread pools) and hands it its
`Settings` on stdin. SIGTERM/SIGINT stop training at the next step and hand the job back to the queue (it
resumes from its checkpoint) instead of waiting for it.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from types import FrameType
from typing import Any

from service.db.engine import checkpoint_wal, make_engine, migrate
from service.settings import Settings
from service.training.config import JobsConfig
from service.training.runner import JobRunner
from service.training.store import JobStore

log = logging.getLogger("ovex.worker")
WAL_CHECKPOINT_EVERY_S = 30.0


def make_worker_id() -> str:
    """Opaque: job records are read by any client, so the host and process behind an id go to this
    worker's log only."""
    return f"worker-{uuid.uuid4().hex[:12]}"


class Worker:
    """One worker process: `worker_concurrency` threads each running one job at a time, plus a reaper."""

    def __init__(self, settings: Settings, parent_pid: int = 0) -> None:
        self.settings = settings
        self.cfg = JobsConfig(settings)
        self.cfg.ensure_dirs()
        self.id = make_worker_id()
        self.parent_pid = parent_pid
        self.engine = make_engine(self.cfg.db_url)
        migrate(self.engine)
        self.store = JobStore(self.engine)
        self.stop = threading.Event()
        self.shutdown = threading.Event()  # tells running training to stop and hand its job back
        self.runner = JobRunner(self.cfg, self.store, self.id, self.shutdown)
        self._threads: list[threading.Thread] = []

    # -- reaper -----------------------------------------------------------------------------------
    def reap_once(self) -> None:
        """Re-queue (or end) jobs whose worker stopped renewing its lease; ended ones lose their files."""
        s = self.settings
        for r in self.store.reap_stale(s.job_lease_s, s.job_max_attempts):
            log.warning("reaped job %s -> %s", r.job_id, r.new_state)
            if r.new_state != "queued":
                shutil.rmtree(self.cfg.job_dir(r.job_id), ignore_errors=True)

    def _reaper(self) -> None:
        every = max(0.2, min(self.settings.job_lease_s / 3.0, 5.0))
        checkpointed = time.monotonic()
        while not self.stop.is_set():
            try:
                self.reap_once()
            except Exception:
                log.warning("reaper pass failed", exc_info=True)
            if time.monotonic() - checkpointed >= WAL_CHECKPOINT_EVERY_S:
                checkpointed = time.monotonic()
                try:  # the log SQLite writes ahead gives its disk space back while the queue is quiet
                    checkpoint_wal(self.engine)
                except Exception:
                    log.warning("checkpointing the job database failed", exc_info=True)
            self.stop.wait(every)

    # -- consumer ---------------------------------------------------------------------------------
    def _consume(self) -> None:
        idle = self.settings.job_poll_s
        while not self.stop.is_set():
            try:
                job = self.store.claim_next(self.id)
            except Exception:
                log.warning("claiming a job failed; retrying", exc_info=True)
                self.stop.wait(1.0)
                continue
            if job is None:
                self.stop.wait(idle)
                continue
            try:
                self.runner.run(job)
            except Exception:
                log.exception("job %s failed outside its runner", job.id)

    def start(self) -> None:
        log.info("%s: claiming jobs from %s", self.id, self.engine.url.render_as_string(),
                 extra={"host": socket.gethostname(), "pid": os.getpid()})
        threads = [
            threading.Thread(target=self._reaper, name="reaper", daemon=True),
            threading.Thread(target=_warm_imports, name="warm-imports", daemon=True),
        ]
        for i in range(self.settings.worker_concurrency):
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
        self.engine.dispose()

    def run_forever(self) -> None:
        """Run until SIGTERM/SIGINT (or the parent `ovex serve` is gone); running jobs are handed back."""

        def _on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("%s: %s, stopping", self.id, signal.Signals(signum).name)
            self.request_stop()

        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
        self.start()
        while not self.stop.wait(0.5):
            if self.parent_pid and os.getppid() != self.parent_pid:
                log.warning("worker %s: parent process %d is gone, stopping", self.id, self.parent_pid)
                self.request_stop()
        self.join()
        log.info("%s stopped", self.id)


def _warm_imports() -> None:
    """Import the trainer (torch) while idle, so the first job does not pay for it."""
    try:
        import trainer.train  # noqa: F401
    except Exception:
        log.warning("could not import the trainer", exc_info=True)


def run_worker(settings: Settings, parent_pid: int = 0) -> None:
    import torch

    torch.set_num_threads(settings.threads)
    Worker(settings, parent_pid).run_forever()


def add_command(sub: Any) -> None:
    """Register `ovex worker` on the `ovex` command's subparsers."""
    parser = sub.add_parser(
        "worker",
        help="run training jobs from the queue (standalone worker)",
        description="run training jobs from the queue until SIGTERM/SIGINT",
    )
    add_worker_arguments(parser)

    def _run(args: argparse.Namespace) -> int:
        settings = settings_from_args(args)
        _configure_logging(settings)
        run_worker(settings)
        return 0

    parser.set_defaults(func=_run)


def _configure_logging(settings: Settings) -> None:
    """The server's log format (readable on a terminal, JSON otherwise or when OVEX_LOG_JSON says so)."""
    from service.logs import configure_logging

    configure_logging(settings.log_level, settings.log_json)


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models-dir", help="artifacts go to MODELS_DIR/<model>/<version>")
    parser.add_argument("--data-dir", help="datasets, job files and the default SQLite database")
    parser.add_argument("--db-url", help="SQLAlchemy URL of the job database (default: SQLite in data dir)")
    parser.add_argument("--concurrency", type=int, dest="worker_concurrency", help="jobs run at once")


def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides = {
        k: v
        for k, v in vars(args).items()
        if k in ("models_dir", "data_dir", "db_url", "worker_concurrency") and v is not None
    }
    return Settings(**overrides)


def main(argv: list[str] | None = None) -> None:
    """The embedded worker: `ovex serve` writes its `Settings` as JSON on our stdin."""
    parser = argparse.ArgumentParser(prog="python -m service.training.worker")
    parser.add_argument("--parent-pid", type=int, default=0, help="stop when this process is gone")
    args = parser.parse_args(argv)
    settings = Settings.model_validate_json(sys.stdin.read())
    _configure_logging(settings)
    run_worker(settings, args.parent_pid)


if __name__ == "__main__":
    main()
