"""Deleting a model version and recording a job that continues it, at the same moment: the job is either
recorded first (and the delete refused with 409) or refused with 404 (its base is gone) — never queued on a
deleted base. The interleaving is forced with a hook, not left to timing; both job databases."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from service.db.tables import DatasetRow
from service.errors import Conflict, NotFound
from service.serving import catalog as catalog_module
from service.serving.active import ActiveVersions
from service.serving.registry import ModelRegistry
from service.settings import Settings
from service.training.config import JobsConfig
from service.training.runtime import JobsRuntime
from service.training.service import JobRequest
from tests.jobs.conftest import Backend
from tests.service.conftest import train_small
from trainer.params import TrainParams


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_small(tmp_path_factory.mktemp("base") / "1", labels=40, features=300, rows=200)


def _setup(tmp_path: Path, backend: Backend, trained: Path) -> tuple[JobsRuntime, ModelRegistry]:
    models = tmp_path / "models"
    for v in ("1", "2"):
        shutil.copytree(trained, models / "m" / v)
    db_url = backend.fresh_env().get("OVEX_DB_URL")  # None: SQLite in the data dir
    settings = Settings(data_dir=tmp_path / "data", models_dir=models, db_url=db_url)
    runtime = JobsRuntime(settings, None)
    registry = ModelRegistry(settings, ActiveVersions(runtime.engine))
    runtime.service.registry, registry.before_delete = registry, runtime.service.keep_bases
    runtime.store.add_dataset(DatasetRow(id="ds_train", name="t", checksum="c" * 64, format="xc",
                                         filename="t", size_bytes=1, rows=10, features=300, labels=40,
                                         created_at=time.time()))
    return runtime, registry


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except Exception as exc:
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


class _Gate(threading.Event):
    """Set to let a paused thread go on; `reached` is set when it got there."""

    def __init__(self) -> None:
        super().__init__()
        self.reached = threading.Event()


def _paused_delete(monkeypatch: pytest.MonkeyPatch) -> _Gate:
    """Deletes pause just before the version is renamed, after every check, until the gate is set."""
    gate, real_retire = _Gate(), catalog_module.retire

    def paused_retire(model_dir: Path, version: str) -> None:
        gate.reached.set()
        assert gate.wait(60)
        real_retire(model_dir, version)

    monkeypatch.setattr(catalog_module, "retire", paused_retire)
    return gate


def test_a_job_is_never_queued_on_a_version_being_deleted(
    tmp_path: Path, backend: Backend, trained: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime, registry = _setup(tmp_path, backend, trained)
    try:
        real_retire = catalog_module.retire
        go = _paused_delete(monkeypatch)  # at the point the delete has checked for jobs
        deleter, deleted = _in_thread(lambda: registry.delete_version("m", "2"))
        assert go.reached.wait(60)
        req = JobRequest("m", "ds_train", None, TrainParams(epochs=1), False,
                         {"model": "m", "version": "2", "replay_dataset": None})
        submitter, submitted = _in_thread(lambda: runtime.service.submit(req))
        submitter.join(5)  # without a lock both paths take, nothing holds the submission back
        go.set()
        deleter.join(60)
        submitter.join(60)
        assert not deleter.is_alive() and not submitter.is_alive()

        assert "error" not in deleted, deleted
        assert not (tmp_path / "models" / "m" / "2").exists()
        assert isinstance(submitted.get("error"), NotFound), submitted
        assert "'2'" in submitted["error"].message and str(tmp_path) not in submitted["error"].message
        assert runtime.store.list_jobs(limit=10)[0] == []  # nothing queued on the deleted base

        # the other order: a job recorded first keeps its base
        req = JobRequest("m", "ds_train", None, TrainParams(epochs=1), False,
                         {"model": "m", "version": "1", "replay_dataset": None})
        job = runtime.service.submit(req)
        monkeypatch.setattr(catalog_module, "retire", real_retire)
        with pytest.raises(Conflict, match=job.id):
            registry.delete_version("m", "1")
        assert (tmp_path / "models" / "m" / "1" / "weights.safetensors").is_file()
        assert sorted(p.name for p in (tmp_path / "models" / "m").iterdir()) == [".highest-version", "1"]

        # a deletion cut short by a crash (renamed out of sight, files not yet removed) is finished at start
        leftover = tmp_path / "models" / "m" / ".deleting-7-0123abcd"
        shutil.copytree(trained, leftover)
        assert registry.scan() == {"m": ["1"]}
        registry.start()
        registry.stop()
        assert not leftover.exists() and (tmp_path / "models" / "m" / "1" / "weights.safetensors").is_file()
    finally:
        runtime.stop()
        registry.store.close()


@pytest.mark.parametrize("field", ["train_dataset", "replay_dataset"])
def test_a_job_is_never_recorded_on_a_dataset_deleted_meanwhile(
    tmp_path: Path, backend: Backend, trained: Path, monkeypatch: pytest.MonkeyPatch, field: str
) -> None:
    """A dataset deleted between a submission's checks and its record: the submission is a 404 naming the
    field, not a 500 (the foreign key of a training set) nor a job whose replay set is gone."""
    runtime, registry = _setup(tmp_path, backend, trained)
    try:
        runtime.store.add_dataset(DatasetRow(id="ds_other", name="o", checksum="d" * 64, format="xc",
                                             filename="o", size_bytes=1, rows=10, features=300, labels=40,
                                             created_at=time.time()))
        reached, go = threading.Event(), threading.Event()
        real_create = runtime.store.create_job

        def paused_create(**kw: Any) -> Any:  # the submission has checked its datasets
            reached.set()
            assert go.wait(60)
            return real_create(**kw)

        monkeypatch.setattr(runtime.store, "create_job", paused_create)
        train = "ds_other" if field == "train_dataset" else "ds_train"
        req = JobRequest("m", train, None, TrainParams(epochs=1), False,
                         {"model": "m", "version": "1", "replay_dataset": "ds_other"})
        submitter, submitted = _in_thread(lambda: runtime.service.submit(req))
        assert reached.wait(60)
        runtime.service.delete_dataset("ds_other")  # no job names it yet
        go.set()
        submitter.join(60)
        error = submitted.get("error")
        assert isinstance(error, NotFound), submitted
        assert error.field is not None and error.field[-1] == field and "ds_other" in error.message
        assert runtime.store.list_jobs(limit=10)[0] == []
    finally:
        runtime.stop()
        registry.store.close()


def _replica(registry: ModelRegistry) -> ModelRegistry:
    """A second serving process on the same models and database (its own connections)."""
    return ModelRegistry(registry.settings, ActiveVersions.for_url(JobsConfig(registry.settings).db_url))


def test_the_active_version_is_never_deleted_by_a_racing_activation(
    tmp_path: Path, backend: Backend, trained: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another replica activates a version between a delete's check ("is it active?") and its rename: the
    activation waits for the delete, finds the version gone and records nothing (404); and an activation
    recorded first makes the delete a 409. Either way the recorded active version stays on disk."""
    runtime, registry = _setup(tmp_path, backend, trained)
    other = _replica(registry)
    try:
        other.activate("m", "1")
        real_retire = catalog_module.retire
        go = _paused_delete(monkeypatch)  # at the point the delete has checked "not active"
        deleter, deleted = _in_thread(lambda: registry.delete_version("m", "2"))
        assert go.reached.wait(60)
        activator, activated = _in_thread(lambda: other.activate("m", "2"))
        activator.join(5)  # without a lock both take, the activation is recorded now
        go.set()
        deleter.join(60)
        activator.join(60)
        assert not deleter.is_alive() and not activator.is_alive()
        assert "error" not in deleted, deleted
        assert isinstance(activated.get("error"), NotFound), activated
        assert "'2'" in activated["error"].message and str(tmp_path) not in activated["error"].message
        assert registry.store.get("m") == "1" and other.serving("m").version == "1"  # type: ignore[union-attr]
        assert (tmp_path / "models" / "m" / "1").is_dir() and not (tmp_path / "models" / "m" / "2").exists()

        # the other order: the activation holds the lock first, the delete waits and then refuses
        shutil.copytree(trained, tmp_path / "models" / "m" / "3")
        monkeypatch.setattr(catalog_module, "retire", real_retire)
        reached, go = threading.Event(), threading.Event()
        real_present = other._present

        def paused_present(name: str, version: str) -> Callable[[], bool]:
            def check() -> bool:  # under the version's lock, before the activation is recorded
                reached.set()
                assert go.wait(60)
                return real_present(name, version)()
            return check

        monkeypatch.setattr(other, "_present", paused_present)
        activator, activated = _in_thread(lambda: other.activate("m", "3"))
        assert reached.wait(60)
        deleter, deleted = _in_thread(lambda: registry.delete_version("m", "3"))
        deleter.join(2)
        assert deleter.is_alive()  # waiting for the activation's lock
        go.set()
        activator.join(60)
        deleter.join(60)
        assert "error" not in activated, activated
        assert isinstance(deleted.get("error"), Conflict), deleted
        assert "active one" in deleted["error"].message
        assert registry.store.get("m") == "3" and (tmp_path / "models" / "m" / "3").is_dir()
    finally:
        other.store.close()
        runtime.stop()
        registry.store.close()
