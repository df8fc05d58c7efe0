"""Dataset uploads: stream a multipart file to disk under a size cap, validate it, store it by checksum.

The body is parsed as it arrives (never buffered whole in memory or in a spooled temp file first), so an
upload over `max_upload_bytes` is refused with 413 as soon as it crosses the limit. A file is stored only
after the trainer's own reader has accepted it, under its SHA-256, so the same bytes are stored once and a
job can only ever name a dataset id, never a path.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from service.db.tables import LABEL_TEXTS, DatasetRow
from service.errors import (
    DomainError,
    InsufficientStorage,
    Invalid,
    Malformed,
    TooLarge,
    Unavailable,
    Unsupported,
    writing,
)
from service.jobs.config import JobsConfig
from service.jobs.runner import dataset_path
from service.jobs.store import JobStore
from trainer.durable import commit_file
from trainer.errors import DataFormatError

_FIELD_LIMIT = 4096  # bytes of a plain (non-file) form field such as `name`
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._ -]+")


def _invalid_file(filename: str, line: int, message: str) -> Invalid:
    """The uploaded file is not a valid dataset: the reader's line-level error, under the upload's name."""
    return Invalid(f"{filename}:{line}: {message}", field=("file",), kind="dataset_invalid", line=line)


@dataclass
class ReceivedFile:
    path: Path
    filename: str
    size: int
    sha256: str
    fields: dict[str, str] = field(default_factory=dict)


class _MultipartSink:
    """Callbacks for python-multipart: the `file` part goes to disk, small fields to memory."""

    def __init__(self, out: IO[bytes], max_bytes: int, file_field: str) -> None:
        self.out, self.max_bytes, self.file_field = out, max_bytes, file_field
        self.hash = hashlib.sha256()
        self.size = 0
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self.seen_file = False
        self._header_name = b""
        self._header_value = b""
        self._headers: dict[bytes, bytes] = {}
        self._name: str | None = None
        self._is_file = False
        self._buf = bytearray()
        self.ended = False  # the closing boundary arrived

    def on_part_begin(self) -> None:
        self._headers, self._name, self._is_file, self._buf = {}, None, False, bytearray()

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def on_header_end(self) -> None:
        self._headers[self._header_name.strip().lower()] = self._header_value.strip()
        self._header_name, self._header_value = b"", b""

    def on_headers_finished(self) -> None:
        _, opts = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._name = opts.get(b"name", b"").decode("utf-8", "replace")
        if self._name == self.file_field:
            if self.seen_file:
                raise Invalid(f"more than one `{self.file_field}` part in the upload", field=("file",))
            self.seen_file = self._is_file = True
            raw = opts.get(b"filename", b"").decode("utf-8", "replace")
            self.filename = os.path.basename(raw.replace("\\", "/")) or "upload"

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if self._is_file:
            self.size += len(chunk)
            if self.size > self.max_bytes:
                raise TooLarge(f"upload exceeds the limit of {self.max_bytes} bytes", field=("file",))
            self.hash.update(chunk)
            self.out.write(chunk)
        else:
            self._buf += chunk
            if len(self._buf) > _FIELD_LIMIT:
                raise Invalid(
                    f"form field {self._name!r} is longer than {_FIELD_LIMIT} bytes",
                    field=(self._name or "body",),
                )

    def on_part_end(self) -> None:
        if not self._is_file and self._name:
            self.fields[self._name] = self._buf.decode("utf-8", "replace")

    def on_end(self) -> None:
        self.ended = True


async def receive_file(
    content_type: str | None,
    content_length: str | None,
    chunks: AsyncIterator[bytes],
    dest_dir: Path,
    max_bytes: int,
    file_field: str = "file",
) -> ReceivedFile:
    """Stream a multipart/form-data body into a temp file in `dest_dir`; raises a `DomainError`."""
    mime, opts = parse_options_header(content_type or "")
    boundary = opts.get(b"boundary")
    if mime != b"multipart/form-data" or not boundary:
        raise Unsupported(
            f"send the dataset as multipart/form-data with a `{file_field}` field",
            field=("content-type",),
        )
    envelope = max_bytes + (1 << 20)  # room for part headers and small fields around the file
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            raise Malformed("invalid Content-Length header", field=("content-length",)) from None
        if declared > envelope:
            raise TooLarge(
                f"upload of {declared} bytes exceeds the limit of {max_bytes} bytes", field=("file",)
            )
    body = _counted(chunks, envelope, max_bytes)
    try:
        with writing("the upload"):
            dest_dir.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix="upload-", suffix=".part", dir=dest_dir)
    except DomainError:
        await _drain(body)
        raise
    tmp = Path(tmp_name)
    try:
        try:
            with writing("the upload"), os.fdopen(fd, "wb") as out:
                sink = _MultipartSink(out, max_bytes, file_field)
                parser = MultipartParser(boundary, callbacks=_callbacks(sink))  # type: ignore[arg-type]
                async for chunk in body:
                    _feed(parser, chunk)
                _feed(parser, None)
        except (InsufficientStorage, Unavailable):
            tmp.unlink(missing_ok=True)  # the space it holds first, then the rest of the body
            await _drain(body)
            raise
        if not sink.ended:
            raise Malformed(
                "the multipart body ends before its closing boundary: the upload was cut short", field=()
            )
        if not sink.seen_file:
            raise Invalid(f"no `{file_field}` part in the multipart body", field=(file_field,))
        return ReceivedFile(tmp, sink.filename or "upload", sink.size, sink.hash.hexdigest(), sink.fields)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


async def _counted(chunks: AsyncIterator[bytes], envelope: int, max_bytes: int) -> AsyncIterator[bytes]:
    """The body's chunks, refused (413) once more than `envelope` bytes have arrived."""
    total = 0
    async for chunk in chunks:
        total += len(chunk)
        if total > envelope:
            raise TooLarge(f"upload exceeds the limit of {max_bytes} bytes", field=("file",))
        yield chunk


async def _drain(body: AsyncIterator[bytes]) -> None:
    """Read the rest of a body the server could not store (its disk at fault, not the request), so the
    connection is left ready for the client's next request instead of closed mid-body."""
    with contextlib.suppress(Exception):  # over the limit or the client gone: nothing more to keep
        async for _ in body:
            pass


def _feed(parser: MultipartParser, chunk: bytes | None) -> None:
    """Write a chunk (None: finish); any parser failure on client bytes is the client's 400, not a 500."""
    try:
        if chunk is None:
            parser.finalize()
        else:
            parser.write(chunk)
    except DomainError:
        raise
    except (MultipartParseError, ValueError, TypeError, IndexError) as e:
        raise Malformed(f"malformed multipart body: {e}", field=()) from None


def _callbacks(sink: _MultipartSink) -> dict[str, object]:
    return {
        "on_part_begin": sink.on_part_begin,
        "on_part_data": sink.on_part_data,
        "on_part_end": sink.on_part_end,
        "on_header_field": sink.on_header_field,
        "on_header_value": sink.on_header_value,
        "on_header_end": sink.on_header_end,
        "on_headers_finished": sink.on_headers_finished,
        "on_end": sink.on_end,
    }


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


def ingest(cfg: JobsConfig, store: JobStore, received: ReceivedFile) -> tuple[DatasetRow, bool]:
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
