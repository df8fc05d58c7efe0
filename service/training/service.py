"""The jobs and datasets service: submit, cancel, get, list, follow, delete — and uploads — with no HTTP.

The routers call these and nothing else; every refusal is a `service.errors` kind naming the field at
fault, which the API maps to a status in one place. Reads only read: nothing here loads a model.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from service.db.tables import LABEL_TEXTS, SUCCEEDED, TERMINAL_STATES, DatasetRow, JobEventRow, JobRow
from service.errors import Conflict, Field, Invalid, NotFound, Unavailable
from service.serving.input_kind import KIND_OF_FORMAT, check_input_kind
from service.training import budget
from service.training.config import JobsConfig
from service.training.continuing import resolve_base
from service.training.datasets import ReceivedFile, ingest, upload_name
from service.training.runner import dataset_path
from service.training.store import MAX_EVENT_ID, JobStore
from trainer.errors import ParamsError
from trainer.label_shards import check_shardable
from trainer.params import TrainParams

# how long an idle event stream stays silent before a keep-alive comment
KEEPALIVE_S = 10.0
# how long the stream of a succeeded job that asked to be activated waits for the version to serve
ACTIVATION_WAIT_S = 300.0
# the events a job's stream follows until its terminal state
FOLLOWED = ("state", "progress")
# the events that end the wait for an activation
ACTIVATION_KINDS = ("activated", "activation_failed")


@dataclass(frozen=True)
class JobRequest:
    """A validated training request (the API's body, or any other caller's)."""

    model: str
    train_dataset: str
    test_dataset: str | None
    params: TrainParams
    activate: bool
    base: dict[str, Any] | None = None  # continue a stored version: optional model, version, replay_dataset
    label_texts: str | None = None  # an uploaded label-texts file: its labels' texts train with the rows


@dataclass(frozen=True)
class Event:
    """One item of a job's event stream; `kind` None is a keep-alive with no data."""

    id: int
    kind: str | None
    data: dict[str, Any]


class JobsService:
    def __init__(self, cfg: JobsConfig, store: JobStore, registry: Any | None = None) -> None:
        self.cfg, self.store = cfg, store
        self.registry = registry  # the stored versions a job's base is resolved against

    # -- datasets ---------------------------------------------------------------------------------
    async def upload(self, received: ReceivedFile) -> tuple[DatasetRow, bool, str]:
        """Validate and store a received upload; (record, created, the name the upload asked for). Nothing
        is stored on any refusal."""
        row, created = await asyncio.to_thread(ingest, self.cfg, self.store, received)
        return row, created, upload_name(received)

    def get_dataset(self, dataset_id: str, field: Field | None = None) -> DatasetRow:
        row = self.store.get_dataset(dataset_id)
        if row is None or row.deleted_at is not None:
            raise NotFound(f"dataset {dataset_id!r} not found", field=field or ("dataset_id",))
        return row

    def list_datasets(self, limit: int, cursor: str | None) -> tuple[list[DatasetRow], str | None]:
        return self.store.list_datasets(limit=limit, cursor=cursor)

    def delete_dataset(self, dataset_id: str) -> None:
        """Remove (or, while ended jobs name it, mark deleted) the record, then its file (a crash in between
        leaves a file no listed record names, never the reverse; `orphans()` lists such files)."""
        row = self.store.delete_dataset(dataset_id)
        dataset_path(self.cfg, row).unlink(missing_ok=True)

    # -- jobs -------------------------------------------------------------------------------------
    def submit(self, req: JobRequest) -> JobRow:
        """Check datasets and the memory budget; only then record the job (the row is its queue entry)."""
        cores = os.cpu_count() or 1
        if req.params.nproc_per_node > cores:
            raise Invalid(
                f"nproc_per_node {req.params.nproc_per_node} exceeds the worker's {cores} CPU cores",
                field=("params", "nproc_per_node"),
            )
        if req.params.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise Invalid(
                    "device 'cuda' requested but no GPU is available", field=("params", "device")
                )
        train = self.get_dataset(req.train_dataset, ("train_dataset",))
        if train.format == LABEL_TEXTS:
            raise Invalid(f"dataset {train.id} is a label-texts file, not training data: name it as the "
                          "job's `label_texts` and a data set of rows as `train_dataset`",
                          field=("train_dataset",))
        if req.label_texts is not None:
            self._check_label_texts(req.label_texts, train)
        if req.base is None:  # a base is checked against its own kind (`resolve_base`)
            check_input_kind(self.cfg.catalog, req.model, KIND_OF_FORMAT[train.format],
                             f"dataset {train.id}")
        params, base, labels, features = req.params, None, train.labels, train.features
        # what a test set may hold: the training set's labels and features, or with a base the model's
        space = Space("the training set", train.features, train.labels)
        if req.base is not None:
            if self.registry is None:
                raise Unavailable("continuing a base model needs the model registry of the API process")
            resolved = resolve_base(
                self.registry, self.store, job_model=req.model, base=req.base, params=params, train=train
            )
            params, base = resolved.params, resolved.base.to_json()
            labels = resolved.xc_labels if resolved.xc_labels is not None else labels + resolved.labels
            # a text model's vocabulary grows with the new data's words, up to max_vocab (None counts that)
            features = resolved.features if train.format == "xc" else None
            space = Space("the continued model", resolved.features, resolved.xc_labels)
        if req.test_dataset is not None:
            test = self.get_dataset(req.test_dataset, ("test_dataset",))
            _check_compatible(train, test, space)
        _check_ranks(params, labels)
        need = budget.estimate(params, labels, features)
        limit = self.cfg.settings.memory_budget_bytes
        if need.bytes > limit:
            more_ranks = ""
            if need.culprit() == "dim" and params.nproc_per_node < cores:
                more_ranks = f", shard the label head across more ranks (params.nproc_per_node <= {cores})"
            per = " a process" if params.nproc_per_node > 1 else ""
            raise Invalid(
                f"the job needs {need.explain()}; over the memory budget of {budget.human_bytes(limit)}"
                f"{per}: lower params.{need.culprit()}{more_ranks} or raise OVEX_MEMORY_BUDGET_BYTES",
                field=("params", need.culprit()),
                kind="memory_budget",
                need_bytes=need.bytes,
                budget_bytes=limit,
            )
        return self.store.create_job(
            model=req.model,
            train_dataset=req.train_dataset,
            test_dataset=req.test_dataset,
            params=params.to_json_dict(),
            activate=req.activate,
            base=base,
            base_exists=None if base is None else lambda: self._base_exists(base),
            label_texts=req.label_texts,
        )

    def _check_label_texts(self, dataset_id: str, train: DatasetRow) -> None:
        """The job's `label_texts` names an uploaded label-texts file, and the rows are text."""
        loc: Field = ("label_texts",)
        texts = self.get_dataset(dataset_id, loc)
        if texts.format != LABEL_TEXTS:
            raise Invalid(f"dataset {texts.id} is {texts.format} training data, not a label-texts file: "
                          "upload a JSONL file of {\"name\", \"text\"} lines and name its id", field=loc)
        if train.format != "jsonl":
            raise Invalid(f"label texts are read by the model's text featurizer, but dataset {train.id} is "
                          f"{train.format} (feature ids): train on a JSONL text data set", field=loc)

    def _base_exists(self, base: dict[str, Any]) -> None:
        """Checked again under the version's lock: it may have been deleted since it was resolved."""
        model, version = str(base["model"]), str(base["version"])
        assert self.registry is not None  # a job with a base was resolved against it
        if not self.registry.catalog.version_dir(model, version).is_dir():
            raise NotFound(f"base: version {version!r} of model {model!r} was deleted while the job was "
                           "submitted; continue another version")

    def keep_bases(self, s: Session, model: str, version: str) -> None:
        """Called by the registry while it deletes a version, in the transaction `s` holding the version's
        lock (`lock_version`, which recording a job on it takes too): refuses one that a queued or running
        job continues (the job would fail, or fail to resume)."""
        jobs = self.store.continuing(s, model, version)
        if jobs:
            raise Conflict(
                f"version {version!r} of model {model!r} is the base of {len(jobs)} queued or running "
                f"job(s) ({', '.join(jobs)}); cancel them or wait until they end"
            )

    def keep_model(self, s: Session, model: str, force: bool) -> None:
        """Called by the registry while it deletes a whole model, under its versions' locks: refuses while
        a queued or running job continues one of its versions or trains into it (with `force`, jobs whose
        cancel was requested are let go: they stop at their next step)."""
        jobs = [j.id for j in self.store.using_model(s, model) if not (force and j.cancel_requested)]
        if jobs:
            hint = "cancel them, wait until they end, or delete with ?force=true (cancels them)"
            raise Conflict(f"model {model!r} is used by {len(jobs)} queued or running job(s) "
                           f"({', '.join(jobs)}); {hint}")

    def cancel_model_jobs(self, model: str) -> list[str]:
        """Cancel every queued and running job that continues `model` or trains into it; their ids."""
        with self.store.session() as s:
            ids = [j.id for j in self.store.using_model(s, model, limit=1000)]
        for job_id in ids:
            with contextlib.suppress(Conflict, NotFound):  # ended meanwhile
                self.store.request_cancel(job_id)
        return ids

    def deleted_datasets(self, jobs: list[JobRow]) -> set[str]:
        """The datasets these jobs name that were deleted since (one query)."""
        ids = {d for j in jobs for d in (j.train_dataset, j.test_dataset, j.label_texts,
                                         (j.base or {}).get("replay_dataset")) if isinstance(d, str)}
        return self.store.deleted_among(sorted(ids)) if ids else set()

    def get(self, job_id: str) -> JobRow:
        job = self.store.get_job(job_id)
        if job is None:
            raise NotFound(f"job {job_id!r} not found", field=("job_id",))
        return job

    def list_jobs(
        self, limit: int, cursor: str | None, state: str | None = None, model: str | None = None
    ) -> tuple[list[JobRow], str | None]:
        return self.store.list_jobs(limit=limit, cursor=cursor, state=state, model=model)

    def cancel(self, job_id: str) -> JobRow:
        """Queued: cancelled at once; running: its worker stops at the next step; already cancelled: the
        same answer again (safe to retry); succeeded or failed: `Conflict`."""
        return self.store.request_cancel(job_id)

    def delete(self, job_id: str) -> None:
        """An ended job goes with its events, checkpoints and logs; its published version stays."""
        self.store.delete_job(job_id)
        shutil.rmtree(self.cfg.job_dir(job_id), ignore_errors=True)

    def log_lines(self, job_id: str) -> list[str]:
        """The job's log: one line per message or state change, oldest first."""
        self.get(job_id)
        lines: list[str] = []
        after = 0
        while events := self.store.events_since(job_id, after, ("log", "state", *ACTIVATION_KINDS)):
            lines.extend(_line(e) for e in events)
            after = events[-1].id
        return lines

    async def follow(
        self, job_id: str, last_event_id: str | None, gone: Callable[[], Awaitable[bool]]
    ) -> AsyncIterator[Event]:
        """`state` and `progress` events after `last_event_id`, until the job's terminal state (or the
        client is `gone`). Validates before the first item, so errors surface before a stream starts."""
        after = parse_last_event_id(last_event_id)
        await asyncio.to_thread(self.get, job_id)
        return self._follow(job_id, after, gone)

    async def _follow(
        self, job_id: str, after: int, gone: Callable[[], Awaitable[bool]]
    ) -> AsyncIterator[Event]:
        poll = self.cfg.settings.job_poll_s
        last_sent = time.monotonic()
        while True:
            try:
                events = await asyncio.to_thread(self.store.events_since, job_id, after, FOLLOWED)
                for e in events:
                    after = e.id
                    yield Event(e.id, e.kind, dict(e.data))
                    last_sent = time.monotonic()
                    if e.kind == "state" and e.data.get("state") in TERMINAL_STATES:
                        if e.data.get("state") == SUCCEEDED:
                            async for a in self._activation(job_id, after, gone):
                                yield a
                        return
                if events:
                    continue
                job = await asyncio.to_thread(self.store.get_job, job_id)
                if job is None:  # deleted while followed
                    return
                if job.state in TERMINAL_STATES:
                    # the job may have ended between the two reads: its final event (written with the state,
                    # in one transaction) is then there to read, and the activation after it
                    if await asyncio.to_thread(self.store.events_since, job_id, after, ("state",), 1):
                        continue
                    # the client resumed past the final event
                    data = {"state": job.state, "model_version": job.model_version, "error": job.error}
                    yield Event(after, "state", data)
                    return
            except Unavailable:  # the job database is down: the stream waits for it instead of breaking off
                pass
            if await gone():
                return
            if time.monotonic() - last_sent > KEEPALIVE_S:
                yield Event(after, None, {})
                last_sent = time.monotonic()
            await asyncio.sleep(poll)

    async def _activation(
        self, job_id: str, after: int, gone: Callable[[], Awaitable[bool]]
    ) -> AsyncIterator[Event]:
        """For a job that asked to be activated: its `activated` (or `activation_failed`) event, so a client
        that follows the stream to its end can use the new version at once."""
        poll, deadline = self.cfg.settings.job_poll_s, time.monotonic() + ACTIVATION_WAIT_S
        last_sent, asked = time.monotonic(), False
        while time.monotonic() < deadline and not await gone():
            try:
                if not asked:
                    job = await asyncio.to_thread(self.store.get_job, job_id)
                    if job is None or not job.activate:
                        return
                    asked = True
                events = await asyncio.to_thread(self.store.events_since, job_id, after, ACTIVATION_KINDS)
                if events:
                    yield Event(events[0].id, events[0].kind, dict(events[0].data))
                    return
            except Unavailable:  # as in `_follow`: wait for the database
                pass
            if time.monotonic() - last_sent > KEEPALIVE_S:
                yield Event(after, None, {})
                last_sent = time.monotonic()
            await asyncio.sleep(poll)

    # -- housekeeping -----------------------------------------------------------------------------
    def orphans(self) -> list[str]:
        """Files under the data directory that no record names (relative paths); empty when consistent."""
        out: list[str] = []
        known_jobs = {j.id for j in self._all_jobs() if j.state not in TERMINAL_STATES}
        if self.cfg.jobs_dir.is_dir():
            out += [f"jobs/{p.name}" for p in self.cfg.jobs_dir.iterdir() if p.name not in known_jobs]
        if self.cfg.datasets_dir.is_dir():
            known = {dataset_path(self.cfg, d).name for d in self._all_datasets()}
            out += [f"datasets/{p.name}" for p in self.cfg.datasets_dir.iterdir() if p.name not in known]
        if self.cfg.uploads_dir.is_dir():
            out += [f"uploads/{p.name}" for p in self.cfg.uploads_dir.iterdir()]
        return sorted(out)

    def _all_jobs(self) -> list[JobRow]:
        return _drain(lambda c: self.store.list_jobs(limit=1000, cursor=c))

    def _all_datasets(self) -> list[DatasetRow]:
        return _drain(lambda c: self.store.list_datasets(limit=1000, cursor=c))


def _drain(page: Callable[[str | None], tuple[list[Any], str | None]]) -> list[Any]:
    out: list[Any] = []
    cursor: str | None = None
    while True:
        rows, cursor = page(cursor)
        out += rows
        if cursor is None:
            return out


def parse_last_event_id(value: str | None) -> int:
    """`Last-Event-ID` as an event id: a decimal integer 0..2^63-1 (the ids this server hands out)."""
    if not value:
        return 0
    with contextlib.suppress(ValueError):
        n = int(value.strip())
        if 0 <= n <= MAX_EVENT_ID:
            return n
    raise Invalid(
        f"Last-Event-ID must be an event id this server sent (an integer 0..{MAX_EVENT_ID})",
        field=("last-event-id",),
    )


def _check_ranks(params: TrainParams, labels: int) -> None:
    """What the ranks of a sharded run would refuse once started, refused at submission instead."""
    ranks = params.nproc_per_node
    if ranks == 1:
        return
    loc: Field = ("params", "nproc_per_node")
    try:
        check_shardable(params.loss, ranks)
    except ParamsError as exc:
        raise Invalid(str(exc), field=("params", "loss")) from None
    if labels < ranks:
        raise Invalid(f"{labels} labels cannot be sharded across {ranks} ranks (need labels >= ranks)",
                      field=loc)


@dataclass(frozen=True)
class Space:
    """The features and labels (XC) a test set may use: `name` is how messages call their owner."""

    name: str
    features: int | None
    labels: int | None


def _check_compatible(train: DatasetRow, test: DatasetRow, space: Space) -> None:
    loc: Field = ("test_dataset",)
    if test.format != train.format:
        raise Invalid(f"test dataset is {test.format} but the training dataset is {train.format}", field=loc)
    too_wide = [
        f"{what} {n} > {m} in {space.name}"
        for what, n, m in (("features", test.features, space.features), ("labels", test.labels, space.labels))
        if train.format == "xc" and n is not None and m is not None and n > m
    ]
    if too_wide:
        raise Invalid(f"test dataset does not fit {space.name}: {', '.join(too_wide)}", field=loc)


def _line(e: JobEventRow) -> str:
    stamp = datetime.fromtimestamp(e.ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    if e.kind == "log":
        return f"{stamp} {e.data.get('message', '')}"
    if e.kind == "activated":
        return f"{stamp} version {e.data.get('model_version')} activated for serving"
    if e.kind == "activation_failed":
        return f"{stamp} version {e.data.get('model_version')} not activated: {e.data.get('error')}"
    if e.kind == "state":
        extra = "".join(f" {k}={e.data[k]}" for k in ("model_version", "error", "worker") if e.data.get(k))
        return f"{stamp} state: {e.data.get('state')}{extra}"
    return f"{stamp} {e.kind}: {json.dumps(e.data, sort_keys=True)}"
