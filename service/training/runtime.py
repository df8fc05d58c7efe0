"""The job system as the API process sees it: the store, the activation watcher, the embedded worker.

Workers are other processes, so the API learns of a finished job through the database: a watcher thread
polls for succeeded jobs and hands each new version to the serving registry, activating it when the job
asked for that. Requests never do this work: a GET is a read of the store.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy.orm import Session

from service.db.engine import make_engine, migrate
from service.settings import Settings
from service.training.config import JobsConfig
from service.training.service import JobsService
from service.training.store import JobStore

log = logging.getLogger("ovex.jobs")


class Registry(Protocol):
    """What the watcher needs of `service.serving.registry.ModelRegistry`."""

    def active(self) -> Mapping[str, Any]: ...

    def load_version(self, name: str, version: str, activate: bool = False) -> Any: ...

    before_delete: Callable[[Session, str, str], None] | None
    before_model_delete: Callable[[Session, str, bool], None] | None
    cancel_model_jobs: Callable[[str], list[str]] | None


class JobsRuntime:
    """Everything the jobs/datasets routers need, created once per app."""

    def __init__(self, settings: Settings, registry: Registry | None = None) -> None:
        self.cfg = JobsConfig(settings)
        self.cfg.ensure_dirs()
        self.settings = settings
        self.engine = make_engine(self.cfg.db_url)
        migrate(self.engine)
        self.store = JobStore(self.engine)
        self.service = JobsService(self.cfg, self.store, registry)
        self.registry = registry
        if registry is not None:
            registry.before_delete = self.service.keep_bases
            registry.before_model_delete = self.service.keep_model
            registry.cancel_model_jobs = self.service.cancel_model_jobs
        self._since = time.time()  # versions finished earlier are found by the registry's start-up scan
        self._given_up: set[str] = set()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.embedded: EmbeddedWorker | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        if self.settings.embedded_worker:
            self.embedded = EmbeddedWorker(self.settings)
            self.embedded.start()
        if self.registry is not None:
            self._watcher = threading.Thread(target=self._watch, name="jobs-watcher", daemon=True)
            self._watcher.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        if self.embedded is not None:
            self.embedded.stop()
        self.engine.dispose()

    # -- registry hand-over -----------------------------------------------------------------------
    def watch_once(self) -> None:
        """Activate versions whose job asked for it; load new ones of models that serve nothing yet."""
        registry = self.registry
        assert registry is not None
        for job in self.store.to_activate():
            if job.id in self._given_up or not job.model_version:
                continue
            try:
                registry.load_version(job.model, job.model_version, activate=True)
            except Exception as exc:
                self._given_up.add(job.id)  # the registry keeps the refusal and its reason
                log.warning(
                    "could not activate %s version %s of job %s", job.model, job.model_version, job.id
                )
                self.store.add_event(
                    job.id, "activation_failed", {"model_version": job.model_version, "error": str(exc)}
                )
                continue
            self.store.mark_activated(job.id, job.model_version)
        for job in self.store.succeeded_since(self._since):
            self._since = max(self._since, job.finished_at or 0.0)
            if not job.activate and job.model_version and job.model not in registry.active():
                try:
                    registry.load_version(job.model, job.model_version)
                except Exception:
                    log.warning("could not load %s version %s", job.model, job.model_version)

    def _watch(self) -> None:
        while not self._stop.wait(self.settings.job_poll_s):
            try:
                self.watch_once()
            except Exception:
                log.warning("jobs watcher pass failed", exc_info=True)


class EmbeddedWorker:
    """`ovex worker` as a child process of `ovex serve`, restarted if it dies.

    A fresh interpreter (subprocess), never a fork: the API process has faiss/torch thread pools that
    misbehave in forked children.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.proc: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.restarts = 0

    def _spawn(self) -> None:
        # this checkout's packages, even when not installed
        root = str(Path(__file__).resolve().parents[2])
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service.training.worker", "--parent-pid", str(os.getpid())],
            env=env,
            stdin=subprocess.PIPE,
            start_new_session=True,  # Ctrl-C in the terminal reaches the API, which stops the worker itself
        )
        assert self.proc.stdin is not None
        # the one settings object itself (keys left out: a worker needs none)
        self.proc.stdin.write(self.settings.model_dump_json(exclude={"api_key", "read_key"}).encode())
        self.proc.stdin.close()
        log.info("embedded worker started (pid %d)", self.proc.pid)

    def start(self, watch: bool = True) -> None:
        """Start the worker; `watch`: a thread restarts it if it dies (else the caller calls `check`)."""
        self._spawn()
        if watch:
            self._thread = threading.Thread(target=self._supervise, name="worker-supervisor", daemon=True)
            self._thread.start()

    def check(self) -> None:
        """Restart the worker if it died."""
        proc = self.proc
        if proc is not None and proc.poll() is not None and not self._stop.is_set():
            log.warning("embedded worker exited with %s; restarting", proc.returncode)
            self.restarts += 1
            self._spawn()

    def _supervise(self) -> None:
        while not self._stop.wait(1.0):
            self.check()

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.proc is not None:
            terminate(self.proc, timeout)


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
