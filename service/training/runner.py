"""Runs one job inside a worker: claim, heartbeat, train with checkpoints, publish the artifact.

The lease (a heartbeat written every `heartbeat_s`) is what makes a SIGKILLed worker's job recoverable: a
reaper re-queues jobs whose heartbeat is older than `lease_s`, and the next worker resumes from the job's
checkpoint directory. The same heartbeat thread reads the cancel flag, so `should_stop()` — called by
the trainer every step — is a cheap read of in-memory flags rather than a database query.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from service.db.tables import CANCELLED, FAILED, LABEL_TEXTS, SUCCEEDED, DatasetRow, JobRow
from service.errors import disk_error
from service.serving.input_kind import artifact_kind, check_input_kind
from service.training.config import JobsConfig
from service.training.continuing import trainer_inputs
from service.training.store import JobStore
from trainer.errors import DataFormatError, OvexError, TrainingCancelled

log = logging.getLogger("ovex.jobs")

_PROGRESS_EVERY_S = 0.5
# in a published version: the job that made it, so a re-run of the job never publishes a second version


def dataset_path(cfg: JobsConfig, ds: DatasetRow) -> Path:
    """Where a stored dataset lives: named by its content checksum, never by a user-given path."""
    ext = ".jsonl" if ds.format in ("jsonl", LABEL_TEXTS) else ".txt"
    return cfg.datasets_dir / f"{ds.checksum}{ext}"


def _stored_metrics(version_dir: Path) -> dict[str, float]:
    """The finite figures of a published version's metrics.json (what the job that made it reports)."""
    try:
        stored = json.loads((version_dir / "metrics.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(stored, dict):
        return {}
    return {str(k): float(v) for k, v in stored.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and _opt_float(v) is not None}


class _Lease:
    """Background heartbeat: renews the job's lease and mirrors the cancel flag into memory."""

    def __init__(self, store: JobStore, job_id: str, worker: str, every_s: float) -> None:
        self.store, self.job_id, self.worker, self.every_s = store, job_id, worker, every_s
        self.cancel = threading.Event()
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{job_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                owned, cancel = self.store.heartbeat(self.job_id, self.worker)
            except Exception:  # a database blip must not kill the job; the next beat retries
                log.warning("heartbeat for %s failed", self.job_id, exc_info=True)
                continue
            if not owned:
                self.lost.set()
                return
            if cancel:
                self.cancel.set()


class _Hooks:
    """`TrainHooks` for one job: progress and logs into the job store, stop on cancel/lease loss/shutdown."""

    def __init__(self, store: JobStore, job_id: str, worker: str, lease: _Lease, shutdown: threading.Event,
                 public: Callable[[str], str]):
        self.store, self.job_id, self.worker, self.lease, self.shutdown = (
            store,
            job_id,
            worker,
            lease,
            shutdown,
        )
        self.public = public  # a log line as API clients may read it (no server paths)
        self._last = 0.0

    def on_progress(self, progress: Any) -> None:
        fields: dict[str, Any] = {
            "epoch": _opt_int(getattr(progress, "epoch", None)),
            "epochs": _opt_int(getattr(progress, "epochs", None)),
            "step": _opt_int(getattr(progress, "step", None)),
            "steps_total": _opt_int(getattr(progress, "steps_total", None)),
            "examples_per_s": _opt_float(getattr(progress, "examples_per_s", None)),
            "loss": _opt_float(getattr(progress, "loss", None)),
        }
        metrics = getattr(progress, "metrics", None)
        if metrics:
            fields["metrics"] = {str(k): float(v) for k, v in dict(metrics).items()}
        now = time.monotonic()
        final = fields["step"] is not None and fields["step"] == fields["steps_total"]
        # an epoch's evaluation is never dropped by the rate limit: it is a point on the P@k curve
        if not final and not metrics and now - self._last < _PROGRESS_EVERY_S:
            return
        self._last = now
        try:
            owned = self.store.update_progress(self.job_id, self.worker, fields, event=True)
        except Exception:  # a database blip costs one progress report, not the job
            log.warning("progress update for %s failed", self.job_id, exc_info=True)
            return
        if not owned:
            self.lease.lost.set()

    def on_log(self, message: str) -> None:
        log.info("[%s] %s", self.job_id, message)
        try:
            self.store.log(self.job_id, self.public(message))
        except Exception:
            log.warning("log write for %s failed", self.job_id, exc_info=True)

    def should_stop(self) -> bool:
        return self.lease.cancel.is_set() or self.lease.lost.is_set() or self.shutdown.is_set()


def _finish_extra(figures: dict[str, float], resumed: int | None) -> dict[str, Any]:
    extra: dict[str, Any] = {"resumed_from_step": resumed}
    if figures:
        extra["metrics"] = figures
    return extra


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _opt_float(v: Any) -> float | None:
    if v is None:
        return None
    f = float(v)
    return f if f == f and f not in (float("inf"), float("-inf")) else None


def _public(row: DatasetRow) -> str:
    return f"dataset {row.id} ({row.filename})"


@contextlib.contextmanager
def _named(row: DatasetRow) -> Iterator[None]:
    """Report data errors by dataset id and upload name, not by the server's storage path."""
    try:
        yield
    except DataFormatError as e:
        raise DataFormatError(_public(row), e.line, e.message) from None


class JobRunner:
    """Runs jobs its worker has claimed (one at a time per consumer thread)."""

    def __init__(self, cfg: JobsConfig, store: JobStore, worker: str, shutdown: threading.Event) -> None:
        self.cfg, self.store, self.worker, self.shutdown = cfg, store, worker, shutdown

    def run(self, job: JobRow) -> None:
        job_id = job.id
        lease = _Lease(self.store, job_id, self.worker, self.cfg.settings.job_heartbeat_s)
        job_dir = self.cfg.job_dir(job_id)
        hooks = _Hooks(self.store, job_id, self.worker, lease, self.shutdown,
                       lambda message: self._without_paths(message, job_dir))
        staging, checkpoints = job_dir / "artifact", job_dir / "checkpoints"
        lease.start()
        try:
            self.store.log(job_id, f"attempt {job.attempts} on worker {self.worker}")
            catalog = self.cfg.catalog
            earlier = catalog.published_version(job.model, job_id) if job.attempts > 1 else None
            if earlier is not None:
                stored = _stored_metrics(catalog.version_dir(job.model, earlier))
                self._published(job, job_dir, earlier, stored, None)
                return
            result = self._train(job, staging, checkpoints, hooks)
            resumed = _opt_int(getattr(result, "resumed_from_step", None))
            self._serving_index(job_id, staging, hooks)
            if hooks.should_stop():
                raise TrainingCancelled("stop requested at the end of training")
            metrics = getattr(result, "metrics", None)
            figures = {str(k): float(v) for k, v in dict(metrics).items()} if metrics else {}
            # published by an attempt that lost its lease meanwhile
            earlier = catalog.published_version(job.model, job_id)
            if earlier is not None:
                shutil.rmtree(staging, ignore_errors=True)
                self._published(job, job_dir, earlier, figures, resumed)
                return
            kind = artifact_kind(staging)  # a job queued before the model's first version was published
            if kind is not None:
                check_input_kind(catalog, job.model, kind, "this job's training data")
            version = catalog.publish(staging, job.model, job_id)
            self.store.log(job_id, f"artifact published as {job.model} version {version}")
            if not self._succeed(job, job_dir, version, figures, resumed):
                # lost the lease at the last moment: the attempt that holds the job now finishes with it
                log.warning("job %s finished after losing its lease; version %s kept", job_id, version)
        except TrainingCancelled:
            self._stopped(job_id, job_dir)
        except OvexError as e:
            self._failed(job_id, job_dir, self._without_paths(str(e), job_dir))
        except Exception as e:
            # the traceback names server paths and classes: it goes to the worker's log, the job says what
            log.exception("job %s: internal error", job_id)
            disk = disk_error(e, "the job's files") if isinstance(e, OSError) else None
            self._failed(job_id, job_dir, disk.message if disk is not None
                         else "internal error while running the job; see the worker log")
        finally:
            lease.stop()

    def _published(self, job: JobRow, job_dir: Path, version: str, figures: dict[str, float],
                   resumed: int | None) -> None:
        """An earlier attempt of this job published `version` and could not record it: the job ends with
        that version, never a second one."""
        self.store.log(job.id, f"version {version} of {job.model} was published by an earlier attempt of "
                               "this job; the job finishes with it instead of publishing another")
        self._succeed(job, job_dir, version, figures, resumed)

    def _succeed(self, job: JobRow, job_dir: Path, version: str, figures: dict[str, float],
                 resumed: int | None) -> bool:
        """Record the job as succeeded on `version` and remove its files; False if it lost its lease.
        The files go first while the job is still ours (the version is published, no attempt needs them):
        a client that sees `succeeded` finds nothing left."""
        self._remove_if_ours(job.id, job_dir)
        done = self.store.finish(job.id, self.worker, SUCCEEDED, model_version=version,
                                 extra=_finish_extra(figures, resumed))
        if done:
            shutil.rmtree(job_dir, ignore_errors=True)
        return done

    def _remove_if_ours(self, job_id: str, job_dir: Path) -> None:
        """Remove the job's files unless another worker holds the job now (its attempt uses them); a store
        that cannot answer leaves them for after the record is written."""
        with contextlib.suppress(Exception):
            if self._still_ours(job_id):
                shutil.rmtree(job_dir, ignore_errors=True)

    def _without_paths(self, message: str, job_dir: Path) -> str:
        """A log line or error as the job's record shows it to API clients: the server's directories named
        by what they hold (a full disk while writing the model says where it was writing)."""
        named = [(job_dir / "artifact", "the job's new model"),
                 (job_dir / "checkpoints", "the job's checkpoints"), (job_dir, "the job's files"),
                 (self.cfg.models_dir, "the models directory"), (self.cfg.data_dir, "the data directory")]
        for path, name in named:
            message = message.replace(str(path), name)
        return message

    def _train(self, job: JobRow, staging: Path, checkpoints: Path, hooks: _Hooks) -> Any:
        from trainer.data import read_dataset
        from trainer.params import TrainParams
        from trainer.train import train

        params = TrainParams.from_json_dict(dict(job.params))
        train_row = self.store.get_dataset(job.train_dataset)
        if train_row is None:
            raise OvexError(f"training dataset {job.train_dataset} no longer exists")
        with _named(train_row):
            train_ds = read_dataset(dataset_path(self.cfg, train_row))
        train_ds.path = _public(train_row)  # later errors (e.g. against a base) name the upload
        base_kw = trainer_inputs(self.cfg.catalog, job.base, self._read_replay) if job.base else {}
        test_ds = None
        if job.test_dataset:
            test_row = self.store.get_dataset(job.test_dataset)
            if test_row is None:
                raise OvexError(f"test dataset {job.test_dataset} no longer exists")
            with _named(test_row):
                # labels are matched by name inside train(), as for `ovex train --test`: a label the model
                # has not trained on counts as a miss, with a warning in the job's log
                test_ds = read_dataset(dataset_path(self.cfg, test_row))
            test_ds.path = _public(test_row)
        if job.label_texts is not None:
            base_kw["label_texts"] = self._read_label_texts(job.label_texts)
        shutil.rmtree(staging, ignore_errors=True)  # a partial artifact from a killed attempt
        checkpoints.mkdir(parents=True, exist_ok=True)
        return train(
            params,
            train_ds,
            test_ds,
            out_dir=staging,
            hooks=hooks,
            checkpoint_dir=checkpoints,
            checkpoint_every=self.cfg.settings.checkpoint_every,
            **base_kw,
        )

    def _serving_index(self, job_id: str, staging: Path, hooks: _Hooks) -> None:
        """Build the index the service will serve the artifact from into it, before it is published: the
        service then loads the new version from that cache instead of building it while it serves.
        A cancel stops the build between chunks. A failure costs only the cache: the artifact is good,
        and the service builds the index when it loads the version."""
        from service.serving.registry import build_serving_index

        def check() -> None:
            if hooks.should_stop():
                raise TrainingCancelled("stop requested while building the serving index")

        t0 = time.perf_counter()
        self.store.log(job_id, "preparing the serving index")
        try:
            kind = build_serving_index(staging, self.cfg.settings, check)
        except TrainingCancelled:
            raise
        except Exception:
            log.exception("job %s: serving index not built", job_id)
            self.store.log(job_id, "serving index not built (worker log); the service builds it at load")
            return
        if kind == "exact":
            self.store.log(job_id, "serving: exact scan of every label, no index to build")
        else:
            self.store.log(job_id, f"serving index ({kind}) built in {time.perf_counter() - t0:.1f} s")

    def _read_label_texts(self, dataset_id: str) -> list[tuple[str, str]]:
        from trainer.label_texts import read_label_texts

        row = self.store.get_dataset(dataset_id)
        if row is None:
            raise OvexError(f"label texts {dataset_id} no longer exist")
        with _named(row):
            return read_label_texts(dataset_path(self.cfg, row))

    def _read_replay(self, dataset_id: str) -> Any:
        from trainer.data import read_dataset

        row = self.store.get_dataset(dataset_id)
        if row is None:
            raise OvexError(f"replay dataset {dataset_id} no longer exists")
        with _named(row):
            ds = read_dataset(dataset_path(self.cfg, row))
        ds.path = _public(row)
        return ds

    def _stopped(self, job_id: str, job_dir: Path) -> None:
        lease_lost = not self._still_ours(job_id)
        if lease_lost:
            log.warning("job %s: lease lost to another worker; leaving its files alone", job_id)
            return
        job = self.store.get_job(job_id)
        if job is not None and job.cancel_requested:
            # files first: a client that sees `cancelled` finds nothing left (were we killed in between,
            # the reaper ends the job as cancelled all the same)
            shutil.rmtree(job_dir, ignore_errors=True)
            self.store.finish(job_id, self.worker, CANCELLED)
            return
        if self.shutdown.is_set():
            self.store.release(
                job_id, self.worker, "worker shutting down; re-queued to resume from checkpoint"
            )
            return
        self._failed(job_id, job_dir, "training stopped unexpectedly")

    def _still_ours(self, job_id: str) -> bool:
        job = self.store.get_job(job_id)
        return job is not None and job.worker == self.worker

    def _failed(self, job_id: str, job_dir: Path, message: str) -> None:
        """End the job as failed. Its files go first while it is still ours: a full disk (the job
        database's too, often) gets their space back before the failure is written."""
        self._remove_if_ours(job_id, job_dir)
        try:
            self.store.log(job_id, f"failed: {message}")
        except Exception:  # the log line is lost, not the job's end
            log.warning("log write for %s failed", job_id, exc_info=True)
        if self.store.finish(job_id, self.worker, FAILED, error=message):
            shutil.rmtree(job_dir, ignore_errors=True)
