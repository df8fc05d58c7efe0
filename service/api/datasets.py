"""`/v1/datasets`: upload (streamed, size-capped, validated, stored by checksum), list, get, delete."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request, Response
from fastapi import Path as PathParam
from pydantic import BaseModel, Field

from service.api.deps import DB_DOWN, KEYED, ApiKey, Cursor, Jobs, Limit, ReadKey
from service.api.uploads import receive_file
from service.db.tables import DatasetRow

router = APIRouter(prefix="/v1/datasets", tags=["datasets"], responses=DB_DOWN)


class DatasetOut(BaseModel):
    """An uploaded data set, checked by the trainer's reader and stored under its SHA-256."""

    id: str = Field(description="dataset id, for `train_dataset`/`test_dataset` of a job")
    name: str = Field(description="display name (the file name unless one was given)")
    rows: int = Field(description="number of rows")
    features: int | None = Field(
        description="input width (XC header D); null for JSONL text: the featurizer fixes it in training"
    )
    labels: int = Field(description="number of labels (XC header L, or distinct names in JSONL)")
    format: str = Field(description="xc or jsonl (training data), or label_texts (a job's `label_texts`)")
    size_bytes: int = Field(description="file size")
    checksum: str = Field(description="SHA-256 of the file: the same bytes uploaded twice are one dataset")
    filename: str = Field(description="the uploaded file's name")
    created_at: float = Field(description="upload time, seconds since the Unix epoch")
    already_stored: bool = Field(
        default=False,
        description="only on an upload: these bytes were stored before, under `name`; nothing was "
        "stored again",
    )
    requested_name: str | None = Field(
        default=None,
        description="only on an upload of bytes already stored under another name: the name this "
        "upload asked for",
    )
    note: str | None = Field(default=None, description="what happened, in words, when it is not plain")


class DatasetList(BaseModel):
    """Uploaded data sets, one page at a time."""

    datasets: list[DatasetOut] = Field(description="newest first")
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null on the last")


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


DatasetId = Annotated[str, PathParam(description="dataset id (from POST /v1/datasets)", max_length=64)]

UNKNOWN: dict[int | str, dict[str, Any]] = {404: {"description": "unknown dataset"}}

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
                            "description": "XC-format (header `N D L`) or JSONL (`{text, labels}`) file, "
                            "or label texts (JSONL `{name, text}`)",
                        },
                        "name": {"type": "string", "description": "display name (default: the file name)"},
                        "kind": {"type": "string", "enum": ["data", "label_texts"],
                                 "description": "what the file is; omitted: told by its first line (a "
                                 "`{name, text}` object is label texts)"},
                    },
                }
            }
        },
    }
}


@router.post(
    "",
    status_code=201,
    response_model=DatasetOut,
    openapi_extra=_UPLOAD_BODY,
    responses={
        **KEYED,
        200: {"model": DatasetOut, "description": "the same bytes were uploaded before: that record, with "
                                                  "`already_stored` and, when this upload asked for another "
                                                  "name, `requested_name` and a `note`"},
        400: {"description": "malformed or cut-short multipart body"},
        413: {"description": "upload over the size limit"},
        415: {"description": "not multipart/form-data"},
        422: {"description": "not a valid dataset (file and line named)"},
        503: {"description": "the job database is unavailable, or the server's disk is read-only; retry "
                             "after Retry-After seconds"},
        507: {"description": "the server's disk is full: nothing was stored; free space or ask the operator"},
    },
)
async def upload_dataset(request: Request, response: Response, jobs: Jobs, _: ApiKey) -> DatasetOut:
    """Stream the `file` part to disk (413 over the limit), validate it with the trainer's reader (422 with
    the line at fault), and store it under its SHA-256. Uploading the same bytes again returns the record."""
    received = await receive_file(
        request.headers.get("content-type"),
        request.headers.get("content-length"),
        request.stream(),
        jobs.cfg.uploads_dir,
        jobs.cfg.settings.max_upload_bytes,
    )
    row, created, asked = await jobs.upload(received)
    out = dataset_out(row)
    if not created:
        response.status_code = 200
        out.already_stored = True
        if asked != row.name:
            out.requested_name = asked
            out.note = (f"these bytes were already stored as {row.name!r} ({row.id}); the upload was not "
                        f"stored again and the dataset keeps its name: use {row.id} for {asked!r}")
    return out


@router.get("", response_model=DatasetList, responses=KEYED)
def list_datasets(jobs: Jobs, _: ReadKey, limit: Limit = 100, cursor: Cursor = None) -> DatasetList:
    """Newest first, one page at a time."""
    rows, nxt = jobs.list_datasets(limit, cursor)
    return DatasetList(datasets=[dataset_out(r) for r in rows], next_cursor=nxt)


@router.get("/{dataset_id}", response_model=DatasetOut, responses={**KEYED, **UNKNOWN})
def get_dataset(dataset_id: DatasetId, jobs: Jobs, _: ReadKey) -> DatasetOut:
    """One uploaded data set by id."""
    return dataset_out(jobs.get_dataset(dataset_id))


@router.delete(
    "/{dataset_id}",
    status_code=204,
    response_class=Response,
    responses={**KEYED, **UNKNOWN, 409: {"description": "a queued or running job uses the dataset (named)"}},
)
def delete_dataset(dataset_id: DatasetId, jobs: Jobs, _: ApiKey) -> Response:
    """Remove the dataset and its file; refused (409) while a queued or running job uses it. Ended jobs
    that name it keep their records: the dataset is no longer listed or usable, and their
    `deleted_datasets` names it. Uploading the same bytes again brings it back under the new name."""
    jobs.delete_dataset(dataset_id)
    return Response(status_code=204)
