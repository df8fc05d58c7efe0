"""The service's error vocabulary, with no HTTP in it: the domain (jobs, datasets, registry, predictor
checks) raises these, and `service.api.errors` maps each kind to a status in one table.

An error may name the field at fault as a domain path (`field`, e.g. `("params", "dim")`, `("job_id",)`)
and carry a few machine-readable extras (`need_bytes`) and a hint of when to retry (`retry_after`);
`service.api.errors` turns these into the request location (body, path, query, header) and headers.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from trainer.errors import OvexError

Field = Sequence[str | int]
log = logging.getLogger("ovex.disk")


class DomainError(OvexError):
    """Base of the vocabulary. `kind` is the machine-readable type shown to clients."""

    kind = "error"

    def __init__(
        self,
        message: str,
        *,
        field: Field | None = None,
        kind: str | None = None,
        retry_after: int | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = tuple(field) if field is not None else None
        if kind is not None:
            self.kind = kind
        self.retry_after = retry_after  # seconds after which the same call may succeed
        self.extra = extra


class NotFound(DomainError):
    """The named thing (job, dataset, model, version) does not exist."""

    kind = "not_found"


class Conflict(DomainError):
    """The request is valid but the current state refuses it (a finished job, a dataset in use)."""

    kind = "conflict"


class Invalid(DomainError):
    """A value the client sent is wrong in a way only the service can tell (budget, compatibility)."""

    kind = "value_error"


class Malformed(DomainError):
    """The request body cannot be parsed at all (a broken multipart envelope)."""

    kind = "malformed"


class TooLarge(DomainError):
    """A body or upload over its size limit."""

    kind = "too_large"


class Unsupported(DomainError):
    """The body is not in a media type the endpoint takes."""

    kind = "unsupported_media_type"


class Unavailable(DomainError):
    """Not ready yet (no model loaded) or not served in time; retry later."""

    kind = "unavailable"


class InsufficientStorage(DomainError):
    """The server's disk is full (or over quota) where the request had to write; nothing was stored."""

    kind = "insufficient_storage"


class Unauthorized(DomainError):
    """No key was sent where one is needed."""

    kind = "unauthenticated"


class Forbidden(DomainError):
    """A key was sent but it does not grant this call."""

    kind = "forbidden"


MAX_FIELD_ERRORS = 20  # an answer lists this many field errors, then says how many more there are


class InputError(Invalid):
    """Several field errors at once (e.g. every out-of-range feature index of a predict batch)."""

    def __init__(self, errors: list[tuple[Field, str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{'.'.join(map(str, loc))}: {msg}" for loc, msg in errors))


# a full disk, or a full quota: the operator frees space, the request itself was fine
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_error(exc: OSError, what: str) -> DomainError | None:
    """A failed write of `what` ("the upload", "the model") as a kind the client can act on: a full disk
    is `InsufficientStorage`, a read-only one `Unavailable`; any other error is not the disk's (None).
    The log keeps the exception and its path; the message names neither."""
    if exc.errno in _DISK_FULL:
        error: DomainError = InsufficientStorage(
            f"the server's disk is full while writing {what}; free space or ask the operator"
        )
    elif exc.errno == errno.EROFS:
        error = Unavailable(
            f"the server's disk is read-only while writing {what}; retry later or ask the operator",
            retry_after=30,
        )
    else:
        return None
    log.warning("disk error while writing %s: %s: %s", what, type(exc).__name__, exc)
    return error


@contextlib.contextmanager
def writing(what: str) -> Iterator[None]:
    """Around code that writes `what` to disk: a full or read-only disk becomes its kind (`disk_error`)
    at the point of writing, so every caller reports it alike; other `OSError`s pass through."""
    try:
        yield
    except OSError as exc:
        error = disk_error(exc, what)
        if error is None:
            raise
        raise error from exc
