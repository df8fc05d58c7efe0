"""The job system as the API process sees it: store, queue, the registry watcher, the embedded worker.

Workers are other processes, so the API learns of a finished job through the database: a watcher thread
polls for succeeded jobs and hands each new version to the serving registry (activating it when the job
asked for that). Reads of a job (GET, SSE) call the same idempotent `sync()` first, so a client that sees
`succeeded` can predict with the new version straight away.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from service.jobs.config import JobsConfig
from service.jobs.db import make_engine, migrate
from service.jobs.models import SUCCEEDED, JobRow
from service.jobs.queue import JobQueue
from service.jobs.store import JobStore

log = logging.getLogger("ovex.jobs")

# publish(model, version, activate) -> None; raises if the version cannot be loaded
PublishFn = Callable[[str, str, bool], None]


class JobsRuntime:
    """Everything the jobs/datasets routers need, created once per app."""

    def __init__(
        self, cfg: JobsConfig, *, publish: PublishFn | None = None, worker_env: dict[str, str] | None = None
    ) -> None:
        cfg.ensure_dirs()
        self.cfg = cfg
        self.engine = make_engine(cfg.db_url)
        migrate(self.engine)
        self.store = JobStore(self.engine)
        self.queue = JobQueue(cfg)
        self.publish = publish
        self._worker_env = worker_env
        self._seen: set[str] = set()
        self._started_at = time.time()
        self._sync_lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.embedded: EmbeddedWorker | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        if self.cfg.embedded_worker:
            self.embedded = EmbeddedWorker(self._worker_env or dict(os.environ), self.cfg.data_dir)
            self.embedded.start()
        self._watcher = threading.Thread(target=self._watch, name="jobs-watcher", daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        if self.embedded is not None:
            self.embedded.stop()
        self.queue.close()
        self.engine.dispose()

    # -- registry sync ----------------------------------------------------------------------------
    def sync_job(self, job: JobRow) -> None:
        """Hand a succeeded job's version to the registry once per process (idempotent)."""
        if job.state != SUCCEEDED or not job.model_version or self.publish is None:
            return
        with self._sync_lock:
            if job.id in self._seen:
                return
            activate = job.activate and not job.activated
            self._seen.add(job.id)  # once, even on failure: the registry keeps the refusal and its reason
            try:
                self.publish(job.model, job.model_version, activate)
            except Exception:
                log.exception(
                    "could not load %s version %s from job %s", job.model, job.model_version, job.id
                )
                return
            if activate:
                self.store.mark_activated(job.id)

    def _watch(self) -> None:
        while not self._stop.wait(self.cfg.poll_s * 2):
            try:
                for job in self.store.list_jobs(state=SUCCEEDED, limit=50):
                    if job.id in self._seen:
                        continue
                    if (job.finished_at or 0.0) >= self._started_at or (job.activate and not job.activated):
                        self.sync_job(job)
                    else:  # finished before this process started: the registry's start-up scan has it
                        self._seen.add(job.id)
            except Exception:
                log.warning("jobs watcher pass failed", exc_info=True)


class EmbeddedWorker:
    """`ovex worker` as a child process of `ovex serve`, restarted if it dies.

    A fresh interpreter (subprocess), never a fork: the API process has faiss/torch thread pools that
    misbehave in forked children.
    """

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.restarts = 0

    def _spawn(self) -> None:
        env = dict(self.env, OVEX_WORKER_PARENT_PID=str(os.getpid()))  # the worker exits if we die
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service.jobs.worker"],
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in the terminal reaches the API, which stops the worker itself
        )
        log.info("embedded worker started (pid %d)", self.proc.pid)

    def start(self) -> None:
        self._spawn()
        self._thread = threading.Thread(target=self._supervise, name="worker-supervisor", daemon=True)
        self._thread.start()

    def _supervise(self) -> None:
        while not self._stop.wait(1.0):
            proc = self.proc
            if proc is not None and proc.poll() is not None and not self._stop.is_set():
                log.warning("embedded worker exited with %s; restarting", proc.returncode)
                self.restarts += 1
                self._spawn()

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.proc is not None:
            terminate(self.proc, timeout)


def settings_env(settings: Any) -> dict[str, str]:
    """The `OVEX_*` environment that rebuilds `settings` in a child process (CLI flags included)."""
    import json

    env = dict(os.environ)
    dump = settings.model_dump() if hasattr(settings, "model_dump") else {}
    for key, value in dump.items():
        if value is None:
            continue
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        if isinstance(value, (dict, list, tuple)):
            text = json.dumps(value)
        elif isinstance(value, bool):
            text = "true" if value else "false"
        else:
            text = str(value)
        env[f"OVEX_{key.upper()}"] = text
    # the child must import this checkout's packages even when not installed
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def runtime_for_app(settings: Any, registry: Any) -> JobsRuntime:
    """The runtime `create_app`'s lifespan starts: new versions go to `registry.load_version`.

    A version is loaded in this process only when the job asked for activation or the model has none
    serving yet; otherwise it just sits on disk (listed by the registry's scan) until activated.
    """
    cfg = JobsConfig.from_settings(settings)

    def publish(model: str, version: str, activate: bool) -> None:
        if activate or model not in registry.active():
            registry.load_version(model, version, activate=activate)

    return JobsRuntime(cfg, publish=publish, worker_env=settings_env(settings))


def terminate(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM first so a worker can hand its job back; SIGKILL only if it does not exit in time."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
