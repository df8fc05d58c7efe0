"""Typed errors, so callers can catch "not found" or "bad input" without parsing status codes."""

from __future__ import annotations

from typing import Any

import httpx


class OvexClientError(Exception):
    """Base of every error this package raises."""


class TransportError(OvexClientError):
    """The server could not be reached or the connection broke (after any retries)."""


class RequestTimeout(TransportError):
    """The server did not answer within the configured timeout."""


class APIError(OvexClientError):
    """The server answered with an error status; `message` is the server's own explanation."""

    def __init__(self, status_code: int, message: str, body: Any = None, *, method: str = "", url: str = ""):
        self.status_code = status_code
        self.message = message
        self.body = body
        self.method = method
        self.url = url
        where = f" ({method} {url})" if method else ""
        super().__init__(f"HTTP {status_code}{where}: {message}")


class BadRequest(APIError):
    """400: the request could not be understood."""


class AuthenticationError(APIError):
    """401: no API key, or the key was not accepted."""


class PermissionDenied(APIError):
    """403: the API key is known but not allowed to do this."""


class NotFound(APIError):
    """404: unknown model, version, dataset or job."""


class Conflict(APIError):
    """409: the request conflicts with the current state (e.g. cancelling a finished job)."""


class PayloadTooLarge(APIError):
    """413: the body (batch or upload) is over the server's size limit."""


class ValidationError(APIError):
    """422: a field of the request is invalid; `errors` holds the server's per-field details."""

    @property
    def errors(self) -> list[dict[str, Any]]:
        detail = self.body.get("detail") if isinstance(self.body, dict) else None
        return [d for d in detail if isinstance(d, dict)] if isinstance(detail, list) else []


class RateLimited(APIError):
    """429: too many requests."""


class ServerError(APIError):
    """5xx: the server failed."""


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequest,
    401: AuthenticationError,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: ValidationError,
    429: RateLimited,
}


def _format_detail_item(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)
    loc = item.get("loc")
    msg = item.get("msg") or item.get("message") or ""
    if isinstance(loc, list | tuple) and loc:
        return f"{'.'.join(str(p) for p in loc)}: {msg}"
    return str(msg) if msg else str(item)


def message_from_body(body: Any, fallback: str) -> str:
    """Pull a human message out of the common error shapes (FastAPI `detail`, `{"error": ...}`)."""
    if isinstance(body, dict):
        for key in ("detail", "error", "message"):
            if key not in body:
                continue
            value = body[key]
            if isinstance(value, str):
                return value
            if isinstance(value, list) and value:
                return "; ".join(_format_detail_item(v) for v in value)
            if isinstance(value, dict):
                inner = value.get("message") or value.get("detail")
                if isinstance(inner, str):
                    return inner
                return str(value)
    if isinstance(body, str) and body.strip():
        return body.strip()[:500]
    return fallback


def error_from_response(response: httpx.Response) -> APIError:
    """Build the typed error for a non-2xx response (the body must already be read)."""
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    message = message_from_body(body, response.reason_phrase or "error")
    status = response.status_code
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else APIError)
    return cls(status, message, body, method=response.request.method, url=str(response.request.url))
