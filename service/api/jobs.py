"""`/v1/jobs`: submit, list, get, follow (SSE), logs, cancel, delete — thin over `JobsService`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

from service.api.bodies import ClientBody
from service.api.deps import DB_DOWN, KEYED, ApiKey, Cursor, Jobs, Limit, ReadKey
from service.db.tables import JobRow
from service.errors import InputError
from service.training.service import Event, JobRequest
from trainer.losses import LOSSES, load_plugins
from trainer.params import TrainParams, given_params, validation_message

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=DB_DOWN)

MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
DATASET_ID = r"^[A-Za-z0-9_.-]{1,40}$"  # ids are ds_<hex>; anything else (NUL, ...) never reaches the DB
State = Literal["queued", "running", "succeeded", "failed", "cancelled"]
JobId = Annotated[str, PathParam(description="job id (from POST /v1/jobs)", max_length=64)]


def _list_losses(schema: dict[str, Any]) -> None:
    """Name the losses as an enum, so the OpenAPI document (and the console's form) lists them."""
    load_plugins()
    schema["properties"]["loss"]["enum"] = sorted(LOSSES)


class JobParams(TrainParams):
    """`TrainParams` as a request takes them: strict JSON types (`"3"` and `true` are not integers). The
    checks between fields wait for `job_params`: a job that continues a base takes one field of a pair
    (sampler and group_size, stop_epoch and epochs) from the base when the request leaves it out."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        validate_assignment=True,
        title="TrainParams",
        json_schema_extra=_list_losses,
    )

    def check_between_fields(self) -> None:  # checked by `job_params`
        pass


class JobBase(ClientBody):
    """The stored model version a job continues (`ovex train --init-from`): labels keep their ids."""

    model: StrictStr | None = Field(None, pattern=MODEL_NAME, description="default: the job's model")
    version: StrictStr | None = Field(
        None, min_length=1, max_length=64, description="default: the active version of that model"
    )
    replay_dataset: StrictStr | None = Field(
        None,
        pattern=DATASET_ID,
        description="rows replayed against forgetting; default: the training dataset of the job that "
        "made the base version, when it is known",
    )


class JobCreate(ClientBody):
    """A training request. Datasets are named by id (from `POST /v1/datasets`), never by path."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"model": "mymodel", "train_dataset": "ds_0123456789abcdef0123", "params": {"epochs": 3},
                 "activate": True}
            ]
        },
    )

    model: StrictStr = Field(
        pattern=MODEL_NAME, description="model name; the artifact becomes its next version"
    )
    train_dataset: StrictStr = Field(pattern=DATASET_ID, description="id of the training data set")
    test_dataset: StrictStr | None = Field(
        None, pattern=DATASET_ID, description="id of a test data set: P@k after each epoch"
    )
    params: JobParams = Field(default_factory=JobParams, description="trainer options; omitted: defaults")
    activate: StrictBool = Field(False, description="activate the new version for serving when it succeeds")
    base: JobBase | None = Field(
        None,
        description="continue a stored version instead of training from scratch; params not given come "
        "from it, and the job's metrics add new.* and old.* (test rows with and without a new label)",
    )
    label_texts: StrictStr | None = Field(
        None, pattern=DATASET_ID, description="id of an uploaded label-texts file (JSONL `{\"name\", "
        "\"text\"}` lines): every label in it joins the label space and learns from its text as well as its "
        "rows; the model can then take labels by text (POST /v1/models/{name}/labels). Text data only",
    )


class JobProgress(BaseModel):
    """The last progress report of a running or finished job."""

    epoch: int | None = Field(None, description="current epoch, from 1")
    epochs: int | None = Field(None, description="epochs in the run")
    step: int | None = Field(None, description="training steps done")
    steps_total: int | None = Field(None, description="training steps in the run")
    examples_per_s: float | None = Field(None, description="training rows per second")
    loss: float | None = Field(None, description="training loss (moving average)")
    metrics: dict[str, float] | None = Field(None, description="test metrics of the last evaluated epoch")


class JobOut(BaseModel):
    """A training job: what was asked, where it is, what it produced."""

    id: str = Field(description="job id")
    state: State = Field(description="queued → running → succeeded, failed or cancelled")
    model: str = Field(description="the model the job trains a version of")
    train_dataset: str = Field(description="id of the training data set")
    test_dataset: str | None = Field(description="id of the test data set, if any")
    params: dict[str, Any] = Field(description="every training option, defaults filled in")
    activate: bool = Field(description="the new version is activated when the job succeeds")
    activated: bool = Field(description="the new version serves (set shortly after success when asked)")
    progress: JobProgress = Field(description="the last progress report")
    created_at: datetime = Field(description="when it was submitted")
    started_at: datetime | None = Field(description="when a worker started it")
    finished_at: datetime | None = Field(description="when it ended")
    updated_at: datetime = Field(description="last change of any field")
    error: str | None = Field(description="why it failed")
    model_version: str | None = Field(description="the version it produced")
    attempts: int = Field(description="workers that started it (more than one after a worker was lost)")
    worker: str | None = Field(description="the worker running it")
    resumed_from_step: int | None = Field(description="the checkpoint step a retry resumed from")
    cancel_requested: bool = Field(description="a cancel was asked for; a running job stops at its next step")
    base: dict[str, Any] | None = Field(None, description="the stored version the job continues, if any")
    label_texts: str | None = Field(None, description="id of the label-texts file it trains with, if any")
    deleted_datasets: list[str] = Field(
        default_factory=list, description="which of the datasets it names were deleted since (its record "
        "keeps their ids; the files are gone)")


class JobList(BaseModel):
    """Jobs, newest first."""

    jobs: list[JobOut] = Field(description="newest first")
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null on the last")


class JobAccepted(BaseModel):
    """A job recorded and queued."""

    id: str = Field(description="job id: follow it at /v1/jobs/{id}/events")
    state: State = Field(description='always "queued"')


def _ts(v: float) -> datetime:
    return datetime.fromtimestamp(v, UTC)


def job_out(job: JobRow, deleted: set[str] | None = None) -> JobOut:
    """The job as the API shows it; `deleted`: dataset ids known to be deleted."""
    named = [job.train_dataset, job.test_dataset, job.label_texts,
             (job.base or {}).get("replay_dataset")]
    return JobOut(
        deleted_datasets=[d for d in dict.fromkeys(named) if isinstance(d, str) and d in (deleted or set())],
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
        base=job.base,
        label_texts=job.label_texts,
    )


UNKNOWN: dict[int | str, dict[str, Any]] = {404: {"description": "unknown job"}}


@router.post(
    "",
    status_code=202,
    response_model=JobAccepted,
    responses={
        **KEYED,
        404: {"description": "unknown dataset, or base model/version"},
        409: {"description": "the base version is stored but cannot be read (as when activating it)"},
        422: {"description": "invalid params, a base that does not fit the data, or over the memory budget"},
    },
)
def submit_job(body: JobCreate, jobs: Jobs, _: ApiKey) -> JobAccepted:
    """Validate params (types, ranges), datasets, the base version and the memory budget; only then queue
    the job."""
    base = None if body.base is None else body.base.model_dump()
    req = JobRequest(body.model, body.train_dataset, body.test_dataset, job_params(body), body.activate, base,
                     body.label_texts)
    return JobAccepted(id=jobs.submit(req).id, state="queued")


def job_params(body: JobCreate) -> TrainParams:
    """The params the request set (only those count as set: a continual run takes the others from its
    base), checked between fields here for a fresh job, once merged with the base's for a continual one
    (`trainer.params.given_params`)."""
    try:
        return given_params(body.params.model_dump(exclude_unset=True), continuing=body.base is not None)
    except ValidationError as exc:
        raise InputError([(("params",), validation_message(exc))]) from None


@router.get("", response_model=JobList)
def list_jobs(
    jobs: Jobs,
    limit: Limit = 100,
    cursor: Cursor = None,
    state: Annotated[State | None, Query(description="only jobs in this state")] = None,
    model: Annotated[str | None, Query(max_length=64, description="only jobs of this model")] = None,
) -> JobList:
    """Jobs, newest first, one page at a time, optionally of one state or model."""
    rows, nxt = jobs.list_jobs(limit, cursor, state=state, model=model)
    deleted = jobs.deleted_datasets(rows)
    return JobList(jobs=[job_out(j, deleted) for j in rows], next_cursor=nxt)


@router.get("/{job_id}", response_model=JobOut, responses=UNKNOWN)
def get_job(job_id: JobId, jobs: Jobs) -> JobOut:
    """One job: state, progress, timestamps, the version it produced or why it failed."""
    job = jobs.get(job_id)
    return job_out(job, jobs.deleted_datasets([job]))


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
def cancel_job(job_id: JobId, jobs: Jobs, _: ApiKey) -> JobOut:
    """202 with the job whenever it is or will be cancelled: a queued job at once, a running one at its
    next step, a cancelled one again (so a retry is safe); 409 when it already succeeded or failed."""
    return job_out(jobs.cancel(job_id))


@router.delete(
    "/{job_id}",
    status_code=204,
    response_class=Response,
    responses={**KEYED, **UNKNOWN, 409: {"description": "the job is queued or running: cancel it first"}},
)
def delete_job(job_id: JobId, jobs: Jobs, _: ApiKey) -> Response:
    """Remove an ended job with its events, logs and checkpoints; the model version it made stays."""
    jobs.delete(job_id)
    return Response(status_code=204)


@router.get(
    "/{job_id}/logs",
    response_class=PlainTextResponse,
    responses={**KEYED, **UNKNOWN, 200: {"content": {"text/plain": {}}, "description": "the log"}},
)
def job_logs(job_id: JobId, jobs: Jobs, _: ReadKey) -> PlainTextResponse:
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
        200: {
            "content": {"text/event-stream": {}},
            "description": "progress and state events; then `activated` (or `activation_failed`) for a "
            "succeeded job that asked to be activated",
        },
        **UNKNOWN,
        422: {"description": "Last-Event-ID is not an event id"},
    },
)
async def job_events(
    job_id: JobId,
    request: Request,
    jobs: Jobs,
    last_event_id: Annotated[
        str | None,
        Header(max_length=32, description="resume after this event id (sent by EventSource on reconnect)"),
    ] = None,
) -> StreamingResponse:
    """Server-Sent Events: `state` and `progress` events from the start (or after `Last-Event-ID`); the stream
    ends after the event of a terminal state (succeeded, failed, cancelled) or, for a succeeded job that asked
    to be activated, after its `activated` (or `activation_failed`) event: the version serves once it ends."""
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
