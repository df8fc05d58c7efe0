"""Jobs that continue a stored model version: check the base when the job is submitted, pass it to train().

A job with a `base` trains the next version of a model from an existing one (trainer.continual). The base
is resolved when the job is submitted (no version given: the one serving, else the newest), so the job
records exactly which version it grows, and every mismatch between base, data and parameters is a 4xx
then instead of a failed job later. The base directory is only ever read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.errors import Conflict, Field, InputError, Invalid, NotFound
from service.serving.catalog import ModelCatalog, some_versions
from trainer.artifact import labels_text, map_safetensors, read_params, read_shape
from trainer.continual import continual_params
from trainer.errors import ArtifactError, OvexError, ParamsError
from trainer.params import TrainParams

log = logging.getLogger("ovex.continual")


@dataclass(frozen=True)
class BaseRef:
    """A resolved base: the version a job grows, and the dataset replayed against forgetting (if any)."""

    model: str
    version: str
    replay_dataset: str | None

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "version": self.version, "replay_dataset": self.replay_dataset}

    @property
    def label(self) -> str:
        """How messages name the base (never by its path on the server)."""
        return f"model {self.model!r} version {self.version}"


@dataclass(frozen=True)
class Resolved:
    base: BaseRef
    params: TrainParams  # the base's parameters overridden by the ones the request set
    labels: int  # the base's label count (the grown model has at most this plus the data's)
    features: int
    xc_labels: int | None  # XC data: at most this many labels in the grown model


def _base_summary(path: Path, label: str) -> tuple[TrainParams, int, int, str]:
    """(params, n_labels, n_features, featurizer kind) from the JSON files (trainer.artifact's readers);
    the weights' header is read and every tensor's byte range checked against the file (a cut-short
    file), not their values."""
    try:
        params, kind = read_params(path, label)
        shape = read_shape(path, label)
    except ArtifactError as exc:
        log.warning("base %s: %s", label, exc.message)
        raise
    what = "weights.safetensors"
    try:
        map_safetensors(path / what)
    except (OSError, ValueError) as exc:
        log.warning("base %s: %s unreadable: %s: %s", label, what, type(exc).__name__, exc)
        raise ArtifactError(label, f"{what} {_unreadable(exc)}") from None
    return params, shape.n_labels, shape.n_features, kind


def _unreadable(exc: Exception) -> str:
    """Why a stored file cannot be used, in words (the class and the server's path stay in the log)."""
    if isinstance(exc, FileNotFoundError):
        return "is missing"
    if isinstance(exc, OSError):
        return f"cannot be read ({(exc.strerror or 'I/O error').lower()})"
    return "is damaged (cut short, or not in its format)"


def resolve_base(
    registry: Any,
    store: Any,
    *,
    job_model: str,
    base: dict[str, Any],
    params: TrainParams,
    train: Any,
) -> Resolved:
    """Check a job's `base` against the stored versions, the training dataset and the parameters.

    `base` holds optional `model` (default: the job's), `version` (default: the active one, else the
    newest) and `replay_dataset` (default: the training dataset of the job that made the base, when
    known). Raises `NotFound` (404) for an unknown model, version or dataset, `Conflict` (409) for a stored
    version that cannot be read, and `Invalid` (422) for a base that does not fit the job's model, the
    data or the parameters.
    """
    name = base.get("model") or job_model
    stored = registry.scan()
    versions = stored.get(name, [])
    if not versions:
        raise NotFound(f"base: model {name!r} has no stored version to continue from")
    if name != job_model and stored.get(job_model):
        # its next version would give label ids other meanings than its earlier versions do
        raise Invalid(f"model {job_model!r} has versions of its own: a job continues a version of its own "
                      f"model (leave out base.model), or starts a new model from {name!r} (another "
                      f"model name)", field=("base", "model"))
    version = base.get("version")
    if version is None:
        version = _active_version(registry, name, versions)
    elif version not in versions:
        raise NotFound(f"base: model {name!r} has no version {version!r} (it has {some_versions(versions)})")
    ref = BaseRef(name, version, None)
    refused = registry.refused(name, version)
    try:
        if refused is not None:
            raise ArtifactError(ref.label, f"failed to load and was refused: {refused}")
        stored = registry.catalog.version_dir(name, version)
        base_params, labels, features, kind = _base_summary(stored, ref.label)
    except ArtifactError as exc:  # the request is fine, the stored version is broken: as for activating it
        raise Conflict(f"base: {exc}; continue another version", field=("base",)) from None
    wants = "jsonl" if kind == "text" else "xc"
    if train.format != wants:
        raise InputError([(("train_dataset",), f"dataset {train.id} is {train.format} but {ref.label} "
                           f"takes {wants} data")])
    if train.format == "xc" and train.features is not None and train.features > features:
        raise InputError([(("train_dataset",), f"dataset {train.id} declares {train.features} "
                           f"features but {ref.label} takes {features}")])
    try:
        merged = continual_params(base_params, params, ref.label, kind)
    except ParamsError as exc:
        raise InputError([(("params",), str(exc))]) from None
    xc_labels = None
    if train.format == "xc":  # XC data names labels by id: a base named so shares the ids it has
        shared = _named_by_ids(registry.catalog.version_dir(name, version), labels)
        xc_labels = max(labels, train.labels) if shared else labels + train.labels
    replay = _replay_dataset(store, base.get("replay_dataset"), ref, train, features, xc_labels)
    return Resolved(BaseRef(name, version, replay), merged, labels, features, xc_labels)


def _named_by_ids(path: Path, n_labels: int, chunk: int = 1 << 16) -> bool:
    """Whether the base's labels are named "0", "1", ... in id order (a model trained on XC data without
    label names), by comparing labels.txt with that listing as the artifact writer writes it, a chunk of
    ids at a time: a request costs bounded memory at any label count, and a named base stops at once."""
    try:
        with open(path / "labels.txt", encoding="utf-8") as fh:
            for lo in range(0, n_labels, chunk):
                ids = labels_text([str(i) for i in range(lo, min(lo + chunk, n_labels))])
                if fh.read(len(ids)) != ids:
                    return False
            return fh.read(1) == ""
    except (OSError, UnicodeDecodeError):
        return False


def _active_version(registry: Any, name: str, versions: list[str]) -> str:
    """The version the database records as active (this process may not have followed it yet, or still be
    loading), else the one this process serves, else the newest."""
    recorded = registry.store.get(name)
    if recorded in versions:
        return str(recorded)
    served = registry.serving(name)
    return served.version if served is not None else versions[-1]


def _replay_dataset(store: Any, given: str | None, ref: BaseRef, train: Any, features: int,
                    xc_labels: int | None) -> str | None:
    if given is not None:
        row = store.get_dataset(given)
        if row is None:
            raise NotFound(f"base.replay_dataset: dataset {given!r} not found")
        loc: Field = ("base", "replay_dataset")
        if row.format != train.format:
            raise InputError([(loc, f"dataset {given} is {row.format} but the training dataset is "
                               f"{train.format}")])
        if row.features is not None and row.features > features:
            raise InputError([(loc, f"dataset {given} declares {row.features} features but {ref.label} "
                               f"takes {features}")])
        if xc_labels is not None and row.labels > xc_labels:
            raise InputError([(loc, f"dataset {given} declares {row.labels} labels but the continued model "
                               f"has at most {xc_labels} ({ref.label}'s and the training dataset's)")])
        return None if given == train.id else given
    job = store.made(ref.model, ref.version)
    if job is None or job.train_dataset == train.id or store.get_dataset(job.train_dataset) is None:
        return None
    return str(job.train_dataset)


def trainer_inputs(catalog: ModelCatalog, base: dict[str, Any], read_replay: Any) -> dict[str, Any]:
    """The keyword arguments `trainer.train.train` takes to continue `base` (a job's stored base).

    `read_replay(dataset_id)` reads the replay dataset (the runner knows where datasets live).
    """
    ref = BaseRef(str(base["model"]), str(base["version"]), base.get("replay_dataset"))
    path = catalog.version_dir(ref.model, ref.version)
    if not path.is_dir():
        raise OvexError(f"the base {ref.label} no longer exists")
    replay = read_replay(ref.replay_dataset) if ref.replay_dataset else None
    return {"base": path, "base_name": ref.label, "replay_ds": replay}
