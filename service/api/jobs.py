"""`/v1/jobs`: submit, list, get, follow (SSE), logs, cancel, delete — thin over `JobsService`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from service.api.auth import ApiKey, ReadKey
from service.api.datasets import KEYED, Cursor, Jobs, Limit
from service.jobs.models import JobRow
from service.jobs.service import Event, JobRequest
from trainer.params import TrainParams

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
State = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class JobParams(TrainParams):
    """`TrainParams` as a request takes them: strict JSON types (`"3"` and `true` are not integers)."""

    model_config = ConfigDict(strict=True, extra="forbid", validate_assignment=True, title="TrainParams")


class JobCreate(BaseModel):
    """A training request. Datasets are named by id (from `POST /v1/datasets`), never by path."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr = Field(
        pattern=MODEL_NAME, description="model name; the artifact becomes its next version"
    )
    train_dataset: StrictStr = Field(min_length=1, max_length=40)
    test_dataset: StrictStr | None = Field(None, min_length=1, max_length=40)
    params: JobParams = Field(default_factory=JobParams, description="trainer options; omitted: defaults")
    activate: StrictBool = Field(False, description="activate the new version for serving when it succeeds")


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
    activated: bool = Field(description="the new version serves (set shortly after success when asked)")
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


class JobList(BaseModel):
    jobs: list[JobOut]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null on the last")


class JobAccepted(BaseModel):
    id: str
    state: State


def _ts(v: float) -> datetime:
    return datetime.fromtimestamp(v, UTC)


def job_out(job: JobRow) -> JobOut:
    return JobOut(
        id=job.id,
        state=job.state,  # type: ignore[arg-type]
        model=job.model,
        train_dataset=job.train_dataset,
        test_dataset=job.test_dataset,
        params=dict(job.params),
        activate=job.activate,
        activated=job.activated,
        progress=JobProgress(
            epoch=job.epoch,
            epochs=job.epochs,
            step=job.step,
            steps_total=job.steps_total,
            examples_per_s=job.examples_per_s,
            loss=job.loss,
            metrics=job.metrics,
        ),
        created_at=_ts(job.created_at),
        started_at=None if job.started_at is None else _ts(job.started_at),
        finished_at=None if job.finished_at is None else _ts(job.finished_at),
        updated_at=_ts(job.updated_at),
        error=job.error,
        model_version=job.model_version,
        attempts=job.attempts,
        worker=job.worker,
        resumed_from_step=job.resumed_from_step,
        cancel_requested=job.cancel_requested,
    )


UNKNOWN: dict[int | str, dict[str, Any]] = {404: {"description": "unknown job"}}


@router.post(
    "",
    status_code=202,
    response_model=JobAccepted,
    responses={
        **KEYED,
        404: {"description": "unknown dataset"},
        422: {"description": "invalid params, incompatible datasets or over the memory budget"},
    },
)
def submit_job(body: JobCreate, jobs: Jobs, _: ApiKey) -> JobAccepted:
    """Validate params (types, ranges), datasets and the memory budget; only then queue the job."""
    params = TrainParams.model_validate(body.params.model_dump())
    req = JobRequest(body.model, body.train_dataset, body.test_dataset, params, body.activate)
    return JobAccepted(id=jobs.submit(req).id, state="queued")


@router.get("", response_model=JobList)
def list_jobs(
    jobs: Jobs,
    limit: Limit = 100,
    cursor: Cursor = None,
    state: State | None = None,
    model: Annotated[str | None, Query(max_length=64)] = None,
) -> JobList:
    """Newest first, one page at a time."""
    rows, nxt = jobs.list_jobs(limit, cursor, state=state, model=model)
    return JobList(jobs=[job_out(j) for j in rows], next_cursor=nxt)


@router.get("/{job_id}", response_model=JobOut, responses=UNKNOWN)
def get_job(job_id: str, jobs: Jobs) -> JobOut:
    return job_out(jobs.get(job_id))


@router.post(
    "/{job_id}/cancel",
    status_code=202,
    response_model=JobOut,
    responses={
        **KEYED,
        **UNKNOWN,
        409: {"description": "the job already succeeded or failed"},
    },
)
def cancel_job(job_id: str, jobs: Jobs, _: ApiKey) -> JobOut:
    """202 with the job whenever it is or will be cancelled: a queued job at once, a running one at its
    next step, a cancelled one again (so a retry is safe); 409 when it already succeeded or failed."""
    return job_out(jobs.cancel(job_id))


@router.delete(
    "/{job_id}",
    status_code=204,
    response_class=Response,
    responses={**KEYED, **UNKNOWN, 409: {"description": "the job is queued or running: cancel it first"}},
)
def delete_job(job_id: str, jobs: Jobs, _: ApiKey) -> Response:
    """Remove an ended job with its events, logs and checkpoints; the model version it made stays."""
    jobs.delete(job_id)
    return Response(status_code=204)


@router.get(
    "/{job_id}/logs",
    response_class=PlainTextResponse,
    responses={**KEYED, **UNKNOWN, 200: {"content": {"text/plain": {}}, "description": "the log"}},
)
def job_logs(job_id: str, jobs: Jobs, _: ReadKey) -> PlainTextResponse:
    """The job's log as text: one line per message or state change, oldest first."""
    lines = jobs.log_lines(job_id)
    return PlainTextResponse("\n".join(lines) + ("\n" if lines else ""))


def _sse(e: Event) -> str:
    if e.kind is None:
        return ": keep-alive\n\n"
    return f"id: {e.id}\nevent: {e.kind}\ndata: {json.dumps(e.data, separators=(',', ':'))}\n\n"


@router.get(
    "/{job_id}/events",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "progress and state events"},
        **UNKNOWN,
        422: {"description": "Last-Event-ID is not an event id"},
    },
)
async def job_events(
    job_id: str,
    request: Request,
    jobs: Jobs,
    last_event_id: Annotated[str | None, Header(max_length=32)] = None,
) -> StreamingResponse:
    """Server-Sent Events: `state` and `progress` events from the start (or after `Last-Event-ID`); the stream
    ends after the event of a terminal state (succeeded, failed, cancelled)."""
    events = await jobs.follow(job_id, last_event_id, request.is_disconnected)

    async def stream() -> AsyncIterator[str]:
        yield ": ovex job events\n\n"
        async for e in events:
            yield _sse(e)

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
