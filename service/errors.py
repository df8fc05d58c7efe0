"""The service's error vocabulary, with no HTTP in it: the domain (jobs, datasets, registry, predictor
checks) raises these, and `service.api.errors` maps each kind to a status in one table.

An error may name the request field at fault (`loc`, e.g. `["body", "params", "dim"]`) and carry a few
machine-readable extras (`need_bytes`), so a client can point at what to fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainer.errors import OvexError

Loc = Sequence[str | int]


class DomainError(OvexError):
    """Base of the vocabulary. `kind` is the machine-readable type shown to clients."""

    kind = "error"

    def __init__(
        self,
        message: str,
        *,
        loc: Loc | None = None,
        kind: str | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.loc = list(loc) if loc is not None else None
        if kind is not None:
            self.kind = kind
        self.headers = headers
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


class Unauthorized(DomainError):
    """No key was sent where one is needed."""

    kind = "unauthenticated"


class Forbidden(DomainError):
    """A key was sent but it does not grant this call."""

    kind = "forbidden"


class InputError(Invalid):
    """Several field errors at once (e.g. every out-of-range feature index of a predict batch)."""

    def __init__(self, errors: list[tuple[Loc, str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{'.'.join(map(str, loc))}: {msg}" for loc, msg in errors))
