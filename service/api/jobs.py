"""`/v1/jobs`: submit (validated before anything is queued), list, get, SSE events, logs, cancel."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError
from starlette.concurrency import run_in_threadpool

from service.api.auth import require_api_key
from service.api.datasets import KEYED, Runtime, _error
from service.api.deps import RegistryDep
from service.continual import resolve_base
from service.jobs import budget
from service.jobs.models import STATES, TERMINAL_STATES, JobEventRow, JobRow
from service.jobs.runtime import JobsRuntime
from service.jobs.store import JobConflict
from trainer.params import TrainParams

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
State = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class JobBase(BaseModel):
    """The stored model version a job continues (`ovex train --init-from`): labels keep their ids."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr | None = Field(None, pattern=MODEL_NAME, description="default: the job's model")
    version: StrictStr | None = Field(
        None, min_length=1, max_length=64, description="default: the active version of that model"
    )
    replay_dataset: StrictStr | None = Field(
        None,
        min_length=1,
        max_length=40,
        description="rows replayed against forgetting; default: the training dataset of the job that "
        "made the base version, when it is known",
    )


class JobCreate(BaseModel):
    """A training request. Datasets are named by id (from `POST /v1/datasets`), never by path."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr = Field(
        pattern=MODEL_NAME, description="model name; the artifact becomes its next version"
    )
    train_dataset: StrictStr = Field(min_length=1, max_length=40)
    test_dataset: StrictStr | None = Field(None, min_length=1, max_length=40)
    params: dict[str, Any] = Field(default_factory=dict, description="trainer options (TrainParams fields)")
    activate: StrictBool = Field(False, description="activate the new version for serving when it succeeds")
    base: JobBase | None = Field(
        None,
        description="continue a stored version instead of training from scratch; params not given come "
        "from it, and the job's metrics add new.* and old.* (test rows with and without a new label)",
    )


class JobProgress(BaseModel):
    epoch: int | None = None
    epochs: int | None = None
    step: int | None = None
    steps_total: int | None = None
    examples_per_s: float | None = None
    loss: float | None = None
    metrics: dict[str, float] | None = None


class JobOut(BaseModel):
    id: str
    state: State
    model: str
    train_dataset: str
    test_dataset: str | None
    params: dict[str, Any]
    activate: bool
    progress: JobProgress
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    error: str | None
    model_version: str | None
    attempts: int
    worker: str | None
    resumed_from_step: int | None
    cancel_requested: bool
    base: dict[str, Any] | None = None


class JobList(BaseModel):
    jobs: list[JobOut]


class JobAccepted(BaseModel):
    id: str
    state: State


def _ts(v: float | None) -> datetime | None:
    return None if v is None else datetime.fromtimestamp(v, UTC)


def job_out(job: JobRow) -> JobOut:
    return JobOut(
        id=job.id,
        state=job.state,  # type: ignore[arg-type]
        model=job.model,
        train_dataset=job.train_dataset,
        test_dataset=job.test_dataset,
        params=dict(job.params),
        activate=job.activate,
        progress=JobProgress(
            epoch=job.epoch,
            epochs=job.epochs,
            step=job.step,
            steps_total=job.steps_total,
            examples_per_s=job.examples_per_s,
            loss=job.loss,
            metrics=job.metrics,
        ),
        created_at=_ts(job.created_at),  # type: ignore[arg-type]
        started_at=_ts(job.started_at),
        finished_at=_ts(job.finished_at),
        updated_at=_ts(job.updated_at),  # type: ignore[arg-type]
        error=job.error,
        model_version=job.model_version,
        attempts=job.attempts,
        worker=job.worker,
        resumed_from_step=job.resumed_from_step,
        cancel_requested=job.cancel_requested,
        base=job.base,
    )


def _validate_params(raw: dict[str, Any]) -> TrainParams:
    try:
        params = TrainParams.model_validate(raw)
    except ValidationError as e:
        errors = [
            {"loc": ["body", "params", *e_["loc"]], "msg": e_["msg"], "type": e_["type"]}
            for e_ in e.errors(include_url=False, include_context=False, include_input=False)
        ]
        raise HTTPException(422, errors) from None
    if params.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise _error(
                422,
                ["body", "params", "device"],
                "device 'cuda' requested but no GPU is available",
                "value_error",
            )
    return params


def _submit(rt: JobsRuntime, body: JobCreate, registry: Any) -> JobRow:
    params = _validate_params(body.params)
    train = rt.store.get_dataset(body.train_dataset)
    if train is None:
        raise _error(404, ["body", "train_dataset"], f"dataset {body.train_dataset!r} not found", "not_found")
    base = None
    labels, features = train.labels, train.features
    if body.base is not None:
        resolved = resolve_base(registry, rt.store, job_model=body.model, base=body.base.model_dump(),
                                params=params, train=train)
        params, base = resolved.params, resolved.base.to_json()
        labels, features = labels + resolved.labels, resolved.features
    if body.test_dataset is not None:
        test = rt.store.get_dataset(body.test_dataset)
        if test is None:
            raise _error(
                404, ["body", "test_dataset"], f"dataset {body.test_dataset!r} not found", "not_found"
            )
        too_wide = [
            f"{what} {n} > {m} in the training set"
            for what, n, m in (
                ("features", test.features, train.features),
                ("labels", test.labels, train.labels),
            )
            if train.format == "xc" and n is not None and m is not None and n > m
        ]
        if too_wide:
            raise _error(
                422,
                ["body", "test_dataset"],
                f"test dataset does not fit the training set: {', '.join(too_wide)}",
                "value_error",
            )
        if test.format != train.format:
            raise _error(
                422,
                ["body", "test_dataset"],
                f"test dataset is {test.format} but the training dataset is {train.format}",
                "value_error",
            )
    need = budget.estimate(params, labels, features)
    if need.bytes > rt.cfg.memory_budget_bytes:
        raise _error(
            422,
            ["body", "params", "dim"],
            f"the model needs {need.explain()}, over the memory budget of "
            f"{budget.human_bytes(rt.cfg.memory_budget_bytes)}; "
            "lower params.dim or raise OVEX_MEMORY_BUDGET_BYTES",
            "memory_budget",
            need_bytes=need.bytes,
            budget_bytes=rt.cfg.memory_budget_bytes,
        )
    job = rt.store.create_job(
        model=body.model,
        train_dataset=body.train_dataset,
        test_dataset=body.test_dataset,
        params=params.to_json_dict(),
        activate=body.activate,
        base=base,
    )
    try:
        rt.queue.enqueue(job.id)
    except Exception as e:
        rt.store.delete_job(job.id)
        raise HTTPException(
            503, f"the job queue is unavailable ({type(e).__name__}); nothing was queued"
        ) from None
    return job


@router.post(
    "",
    dependencies=[Depends(require_api_key)],
    status_code=202,
    response_model=JobAccepted,
    responses={
        **KEYED,
        404: {"description": "unknown dataset, or base model/version"},
        422: {"description": "invalid params, a base that does not fit the data, or over budget"},
        503: {"description": "the queue is unavailable; nothing was queued"},
    },
)
def submit_job(body: JobCreate, rt: Runtime, registry: RegistryDep) -> JobAccepted:
    """Validate params (types, ranges), datasets, the base version and the memory budget; only then record
    and queue the job."""
    job = _submit(rt, body, registry)
    return JobAccepted(id=job.id, state="queued")


@router.get("", response_model=JobList)
def list_jobs(
    rt: Runtime,
    state: State | None = None,
    model: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> JobList:
    return JobList(jobs=[job_out(j) for j in rt.store.list_jobs(state=state, model=model, limit=limit)])


def _get(rt: JobsRuntime, job_id: str) -> JobRow:
    job = rt.store.get_job(job_id)
    if job is None:
        raise _error(404, ["path", "job_id"], f"job {job_id!r} not found", "not_found")
    rt.sync_job(job)
    return job


@router.get("/{job_id}", response_model=JobOut, responses={404: {"description": "unknown job"}})
def get_job(job_id: str, rt: Runtime) -> JobOut:
    return job_out(_get(rt, job_id))


@router.post(
    "/{job_id}/cancel",
    dependencies=[Depends(require_api_key)],
    status_code=202,
    response_model=JobOut,
    responses={**KEYED, 404: {"description": "unknown job"}, 409: {"description": "job already finished"}},
)
def cancel_job(job_id: str, rt: Runtime) -> JobOut:
    """A queued job is cancelled at once; a running one stops at its next step (its worker cleans up)."""
    _get(rt, job_id)
    try:
        job = rt.store.request_cancel(job_id)
    except JobConflict as e:
        raise _error(409, ["path", "job_id"], str(e), "conflict") from None
    return job_out(job)


def _line(e: JobEventRow) -> str:
    stamp = datetime.fromtimestamp(e.ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    if e.kind == "log":
        return f"{stamp} {e.data.get('message', '')}"
    if e.kind == "state":
        extra = "".join(f" {k}={e.data[k]}" for k in ("model_version", "error", "worker") if e.data.get(k))
        return f"{stamp} state: {e.data.get('state')}{extra}"
    return f"{stamp} {e.kind}: {json.dumps(e.data, sort_keys=True)}"


@router.get(
    "/{job_id}/logs", response_class=PlainTextResponse, responses={404: {"description": "unknown job"}}
)
def job_logs(job_id: str, rt: Runtime) -> PlainTextResponse:
    """The job's log as text: one line per message or state change, oldest first."""
    _get(rt, job_id)
    lines: list[str] = []
    after = 0
    while True:
        events = rt.store.events_since(job_id, after, ("log", "state"))
        if not events:
            break
        lines.extend(_line(e) for e in events)
        after = events[-1].id
    return PlainTextResponse("\n".join(lines) + ("\n" if lines else ""))


def _sse(event_id: int, kind: str, data: dict[str, Any]) -> str:
    return f"id: {event_id}\nevent: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


@router.get(
    "/{job_id}/events",
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "progress and state events"},
        404: {"description": "unknown job"},
        422: {"description": "Last-Event-ID is not an integer"},
    },
)
async def job_events(
    job_id: str,
    request: Request,
    rt: Runtime,
    last_event_id: Annotated[str | None, Header()] = None,
) -> StreamingResponse:
    """Server-Sent Events: `state` and `progress` events from the start (or after `Last-Event-ID`); the stream
    ends after the event of a terminal state (succeeded, failed, cancelled)."""
    await run_in_threadpool(_get, rt, job_id)
    try:
        start_after = max(0, int(last_event_id)) if last_event_id else 0
    except ValueError:
        raise _error(
            422, ["header", "last-event-id"], "Last-Event-ID must be an integer", "value_error"
        ) from None

    async def stream() -> AsyncIterator[str]:
        after = start_after
        last_sent = time.monotonic()
        yield ": ovex job events\n\n"
        while True:
            events = await run_in_threadpool(rt.store.events_since, job_id, after, ("state", "progress"))
            for e in events:
                after = e.id
                terminal = e.kind == "state" and e.data.get("state") in TERMINAL_STATES
                if terminal:
                    job = await run_in_threadpool(rt.store.get_job, job_id)
                    if job is not None and job.state in TERMINAL_STATES:
                        await run_in_threadpool(rt.sync_job, job)
                yield _sse(e.id, e.kind, dict(e.data))
                last_sent = time.monotonic()
                if terminal:
                    return
            if not events:
                job = await run_in_threadpool(rt.store.get_job, job_id)
                if job is None:
                    return
                if job.state in TERMINAL_STATES:  # the client resumed past the final event
                    yield _sse(
                        after,
                        "state",
                        {"state": job.state, "model_version": job.model_version, "error": job.error},
                    )
                    return
                if await request.is_disconnected():
                    return
                if time.monotonic() - last_sent > 10.0:
                    yield ": keep-alive\n\n"
                    last_sent = time.monotonic()
                await asyncio.sleep(rt.cfg.poll_s)

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


__all__ = ["STATES", "router"]
