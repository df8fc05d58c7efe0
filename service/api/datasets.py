"""`/v1/datasets`: upload (streamed, size-capped, validated, stored by checksum), list, get."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi import Path as PathParam
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from service.api.auth import require_api_key
from service.jobs.datasets import DatasetInvalid, UploadError, ingest, receive_file
from service.jobs.models import DatasetRow
from service.jobs.runtime import JobsRuntime

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])


class DatasetOut(BaseModel):
    """An uploaded data set, checked by the trainer's reader and stored under its SHA-256."""

    id: str = Field(description="dataset id, for `train_dataset`/`test_dataset` of a job")
    name: str = Field(description="display name (the file name unless one was given)")
    rows: int = Field(description="number of rows")
    features: int | None = Field(
        description="input width (XC header D); null for JSONL text: the featurizer fixes it in training"
    )
    labels: int = Field(description="number of labels (XC header L, or distinct names in JSONL)")
    format: str = Field(description="xc or jsonl")
    size_bytes: int = Field(description="file size")
    checksum: str = Field(description="SHA-256 of the file: the same bytes uploaded twice are one dataset")
    filename: str = Field(description="the uploaded file's name")
    created_at: float = Field(description="upload time, seconds since the Unix epoch")


class DatasetList(BaseModel):
    """Uploaded data sets."""

    datasets: list[DatasetOut] = Field(description="newest first")


def dataset_out(row: DatasetRow) -> DatasetOut:
    return DatasetOut(
        id=row.id,
        name=row.name,
        rows=row.rows,
        features=row.features,
        labels=row.labels,
        format=row.format,
        size_bytes=row.size_bytes,
        checksum=row.checksum,
        filename=row.filename,
        created_at=row.created_at,
    )


def jobs_runtime(request: Request) -> JobsRuntime:
    rt = getattr(request.app.state, "jobs", None)
    if rt is None:
        raise HTTPException(503, "the job system is not running in this process")
    return rt


Runtime = Annotated[JobsRuntime, Depends(jobs_runtime)]
DatasetId = Annotated[str, PathParam(description="dataset id (from POST /v1/datasets)")]


KEYED: dict[int | str, dict[str, Any]] = {
    401: {"description": "missing API key"},
    403: {"description": "wrong API key (or none configured on the server)"},
}


def _error(status: int, loc: list[str | int], msg: str, kind: str, **extra: Any) -> HTTPException:
    return HTTPException(status, [{"loc": loc, "msg": msg, "type": kind, **extra}])


_UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "XC-format (header `N D L`) or JSONL (`{text, labels}`) file",
                        },
                        "name": {"type": "string", "description": "display name (default: the file name)"},
                    },
                }
            }
        },
    }
}


@router.post(
    "",
    dependencies=[Depends(require_api_key)],
    status_code=201,
    response_model=DatasetOut,
    openapi_extra=_UPLOAD_BODY,
    responses={
        **KEYED,
        400: {"description": "malformed multipart body"},
        413: {"description": "upload over the size limit"},
        415: {"description": "not multipart/form-data"},
        422: {"description": "not a valid dataset (file and line named)"},
    },
)
async def upload_dataset(request: Request, response: Response, rt: Runtime) -> DatasetOut:
    """Stream the `file` part to disk (413 over the limit), validate it with the trainer's reader (422 with
    the line at fault), and store it under its SHA-256. Uploading the same bytes again returns the record."""
    try:
        received = await receive_file(
            request.headers.get("content-type"),
            request.headers.get("content-length"),
            request.stream(),
            rt.cfg.uploads_dir,
            rt.cfg.max_upload_bytes,
        )
    except UploadError as e:
        raise _error(e.status, ["body", e.field], e.message, "upload_error") from None
    try:
        row, created = await run_in_threadpool(ingest, rt.cfg, rt.store, received)
    except DatasetInvalid as e:
        raise _error(
            422, ["body", "file"], f"{e.filename}:{e.line}: {e.message}", "dataset_invalid", line=e.line
        ) from None
    if not created:
        response.status_code = 200
    return dataset_out(row)


@router.get("", response_model=DatasetList)
def list_datasets(rt: Runtime) -> DatasetList:
    """Every uploaded data set with its row, feature and label counts."""
    return DatasetList(datasets=[dataset_out(r) for r in rt.store.list_datasets()])


@router.get("/{dataset_id}", response_model=DatasetOut, responses={404: {"description": "unknown dataset"}})
def get_dataset(dataset_id: DatasetId, rt: Runtime) -> DatasetOut:
    """One uploaded data set by id."""
    row = rt.store.get_dataset(dataset_id)
    if row is None:
        raise _error(404, ["path", "dataset_id"], f"dataset {dataset_id!r} not found", "not_found")
    return dataset_out(row)
