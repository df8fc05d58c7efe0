"""Dataset uploads once received (`service.api.uploads` streams them to disk): validate, store by checksum.

A file is stored only after the trainer's own reader has accepted it, under its SHA-256, so the same bytes
are stored once and a job can only ever name a dataset id, never a path.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from service.db.tables import LABEL_TEXTS, DatasetRow
from service.errors import (
    Invalid,
    writing,
)
from service.training.config import JobsConfig
from service.training.dataset_store import DatasetStore
from service.training.runner import dataset_path
from trainer.durable import commit_file
from trainer.errors import DataFormatError

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._ -]+")


def _invalid_file(filename: str, line: int, message: str) -> Invalid:
    """The uploaded file is not a valid dataset: the reader's line-level error, under the upload's name."""
    return Invalid(f"{filename}:{line}: {message}", field=("file",), kind="dataset_invalid", line=line)


@dataclass
class ReceivedFile:
    """An upload streamed to a temporary file: what it was called, its size, hash and plain form fields."""

    path: Path
    filename: str
    size: int
    sha256: str
    fields: dict[str, str] = field(default_factory=dict)


def upload_name(received: ReceivedFile) -> str:
    """The display name an upload asks for (its `name` field, else its file name)."""
    return _display_name(received)


def _display_name(received: ReceivedFile) -> str:
    name = received.fields.get("name") or Path(received.filename).stem or "dataset"
    name = _SAFE_NAME.sub("_", name).strip() or "dataset"
    return name[:255]


KINDS = ("data", LABEL_TEXTS)  # what the `kind` form field of an upload may say


def _upload_kind(received: ReceivedFile) -> str:
    """`kind` as the form says it, else by content: a first line that is a JSON object with a `name` and
    no `labels` (only `name`/`text` keys) is a label-texts file; anything else is data."""
    kind = received.fields.get("kind", "").strip()
    if kind:
        if kind not in KINDS:
            raise Invalid(f"form field `kind` must be one of {', '.join(KINDS)}, got {kind[:40]!r}",
                          field=("kind",))
        return kind
    try:
        with open(received.path, "rb") as fh:
            head = fh.read(1 << 16)
    except OSError:
        return "data"
    for raw in head.split(b"\n"):
        if raw.strip():
            try:
                obj = json.loads(raw.decode("utf-8-sig"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                return "data"
            keys = set(obj) if isinstance(obj, dict) else set()
            return LABEL_TEXTS if "name" in keys and keys <= {"name", "text"} else "data"
    return "data"


def _read_upload(received: ReceivedFile) -> tuple[str, int, int | None, int]:
    """Validate an upload with the trainer's reader of its kind: (format, rows, features, labels);
    `DataFormatError` naming the line otherwise."""
    from trainer.data import read_dataset
    from trainer.label_texts import read_label_texts

    if _upload_kind(received) == LABEL_TEXTS:
        pairs = read_label_texts(received.path)
        return LABEL_TEXTS, len(pairs), None, len(pairs)
    ds = read_dataset(received.path)
    if ds.n_rows == 0:
        raise DataFormatError(received.filename, 1, "the dataset has no rows")
    if ds.n_labels == 0:
        raise DataFormatError(received.filename, 1, "the dataset has no labels")
    return ("jsonl" if ds.is_text else "xc"), ds.n_rows, None if ds.is_text else int(ds.n_features), int(
        ds.n_labels)


def ingest(cfg: JobsConfig, store: DatasetStore, received: ReceivedFile) -> tuple[DatasetRow, bool]:
    """Validate a received file with the trainer's reader and store it; (row, created).

    The same bytes stored before are that record (not stored twice; `upload_name` tells the caller the
    name this upload asked for); stored before and since deleted, they are stored again under the new
    name. Runs in a thread (reading a large file takes a while). On any failure the temp file is
    removed, so nothing is stored.
    """
    try:
        existing = store.dataset_by_checksum(received.sha256)
        if existing is not None and existing.deleted_at is None:
            return existing, False
        if existing is not None:  # deleted while ended jobs named it: its record comes back, listed again
            final = dataset_path(cfg, existing)
            with writing("the dataset"):
                final.parent.mkdir(parents=True, exist_ok=True)
                commit_file(received.path, final)
            return store.revive_dataset(existing.id, _display_name(received), received.filename[:255]), True
        try:
            fmt, rows, features, labels = _read_upload(received)
        except DataFormatError as e:
            raise _invalid_file(received.filename, e.line, e.message) from None
        row = DatasetRow(
            id=f"ds_{received.sha256[:20]}",
            name=_display_name(received),
            checksum=received.sha256,
            format=fmt,
            filename=received.filename[:255],
            size_bytes=received.size,
            rows=rows,
            features=features,
            labels=labels,
            created_at=time.time(),
        )
        final = dataset_path(cfg, row)
        with writing("the dataset"):
            final.parent.mkdir(parents=True, exist_ok=True)
            commit_file(received.path, final)  # stored on disk before the store lists it
        try:
            store.add_dataset(row)
        except Exception:
            again = store.dataset_by_checksum(received.sha256)  # a concurrent upload of the same bytes
            if again is not None:
                return again, False
            with contextlib.suppress(OSError):
                final.unlink()
            raise
        return row, True
    finally:
        received.path.unlink(missing_ok=True)
