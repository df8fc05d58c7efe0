"""Multipart dataset uploads: the body streamed to a temporary file under a size cap, as it arrives.

The body is parsed as it arrives (never buffered whole in memory or in a spooled temp file first), so an
upload over `max_upload_bytes` is refused with 413 as soon as it crosses the limit. What the file holds is
the training layer's to judge (`service.training.datasets.ingest`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

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
from service.training.datasets import ReceivedFile

_FIELD_LIMIT = 4096  # bytes of a plain (non-file) form field such as `name`


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
