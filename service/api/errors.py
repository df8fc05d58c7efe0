"""Every error → HTTP status, in one place. Bodies are FastAPI's shape: `{"detail": str | [field errors]}`,
except under /v2, where the Open Inference Protocol's `{"error": str}` is what its clients read (and
its invalid requests are 400, not 422).

Field errors are `{"loc": [...], "msg": str, "type": str}` with `loc` naming the field and list index
(`["body", "inputs", 2, "features", "indices", 5]`), so a client can point at what to fix. The domain
raises the kinds of `service.errors` with domain field paths (`("params", "dim")`); `STATUS` below is
the only place they meet HTTP, and `request_loc` the only place a field path becomes a request location.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import (
    MAX_FIELD_ERRORS,
    Conflict,
    DomainError,
    Forbidden,
    InputError,
    InsufficientStorage,
    Invalid,
    Malformed,
    NotFound,
    TooLarge,
    Unauthorized,
    Unavailable,
    Unsupported,
)
from trainer.errors import ArtifactError, DataFormatError, OvexError, ParamsError

log = logging.getLogger("ovex.api")

# The one mapping from error kinds (domain and trainer) to statuses; the first matching class wins.
STATUS: tuple[tuple[type[OvexError], int], ...] = (
    (Malformed, 400),
    (Unauthorized, 401),
    (Forbidden, 403),
    (NotFound, 404),
    (Conflict, 409),
    (TooLarge, 413),
    (Unsupported, 415),
    (Invalid, 422),
    (Unavailable, 503),
    (InsufficientStorage, 507),
    (DataFormatError, 422),
    (ParamsError, 422),
    (ArtifactError, 409),
)


def status_for(exc: OvexError) -> int:
    for cls, code in STATUS:
        if isinstance(exc, cls):
            return code
    return 400


# request headers a domain field may name; a field in neither the path, the query nor these is the body's
HEADER_FIELDS = frozenset({"content-type", "content-length", "last-event-id"})


def _query_names(request: Request | None) -> set[str]:
    """The query parameters the matched route declares (a client's stray `?params=` is not one)."""
    route = request.scope.get("route") if request is not None else None
    todo: list[Any] = [getattr(route, "dependant", None)]
    names: set[str] = set()
    while todo:
        dependant = todo.pop()
        if dependant is not None:
            names.update(p.alias for p in dependant.query_params)
            todo.extend(dependant.dependencies)
    return names


def request_loc(request: Request | None, field: Sequence[str | int]) -> list[str | int]:
    """Where in the request a domain field path lies: a path parameter, a declared query parameter, a
    header, or (anything else) the body."""
    head = field[0] if field else None
    if request is not None and head in request.path_params:
        where = "path"
    elif head in HEADER_FIELDS:
        where = "header"
    elif head in _query_names(request):
        where = "query"
    else:
        where = "body"
    return [where, *field]


def detail_for(exc: OvexError, request: Request | None = None) -> Any:
    """A string, or a list of field errors when the error names the field(s) at fault."""
    if isinstance(exc, InputError):
        return [{"loc": request_loc(request, f), "msg": msg, "type": "value_error"} for f, msg in exc.errors]
    if isinstance(exc, DomainError):
        if exc.field is None:
            return exc.message
        return [{"loc": request_loc(request, exc.field), "msg": exc.message, "type": exc.kind, **exc.extra}]
    return str(exc)


def headers_for(exc: OvexError) -> dict[str, str] | None:
    """What the error's kind means in headers: when to retry, how to authenticate."""
    headers: dict[str, str] = {}
    if isinstance(exc, DomainError) and exc.retry_after is not None:
        headers["Retry-After"] = str(exc.retry_after)
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    return headers or None


def _shown(text: str, limit: int) -> str:
    """A client's own words echoed back (a field name it made up), cut to a readable length."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"




def _clean_validation_errors(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """Keep loc/msg/type only: pydantic's `input`/`ctx` may hold NaN or bytes that are not JSON. At most
    `MAX_FIELD_ERRORS`, then one entry counting the rest: a bad list must not make a huge answer."""
    out = []
    for e in errors[:MAX_FIELD_ERRORS]:
        loc = [p if isinstance(p, int) else _shown(str(p), 64) for p in e.get("loc", ())]
        msg, typ = _shown(str(e.get("msg", "invalid")), 500), str(e.get("type", "value_error"))
        out.append({"loc": loc, "msg": msg, "type": typ})
    if len(errors) > MAX_FIELD_ERRORS:
        more = len(errors) - MAX_FIELD_ERRORS
        out.append({"loc": ["body"], "msg": f"and {more} more errors", "type": "too_many_errors"})
    return out


V2_PREFIX = "/v2/"


def _loc_msg(loc: Sequence[Any], msg: str) -> str:
    where = ".".join(str(p) for p in loc if p != "body")
    return f"{where}: {msg}" if where else msg


def _v2(status: int, detail: Any, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The V2 error body: one message (field errors joined), 422 reported as 400."""
    if isinstance(detail, list):
        detail = "; ".join(_loc_msg(d.get("loc", ()), str(d.get("msg", ""))) for d in detail)
    return JSONResponse({"error": str(detail)}, status_code=400 if status == 422 else status, headers=headers)


def error_response(
    path: str, status: int, detail: Any, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The error answer for a request to `path` in its protocol's shape; also for the middleware and the
    HTTP protocol, which answer (413, 408, 431) before any handler runs."""
    if path.startswith(V2_PREFIX):
        return _v2(status, detail, headers)
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """The one mapping from exceptions to responses; never a 500 for a user's mistake."""

    def respond(
        request: Request, status: int, detail: Any, headers: Mapping[str, str] | None = None
    ) -> JSONResponse:
        return error_response(request.url.path, status, detail, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return respond(request, 422, _clean_validation_errors(exc.errors()))

    @app.exception_handler(OvexError)
    async def _ovex(request: Request, exc: OvexError) -> JSONResponse:
        return respond(request, status_for(exc), detail_for(exc, request), headers_for(exc))

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect) -> JSONResponse:
        # the client left mid-body: nobody reads this answer, and it is not a server fault
        log.info("client disconnected before its body was read", extra={"path": request.url.path})
        return respond(request, 400, "client disconnected")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return respond(request, exc.status_code, exc.detail, exc.headers)

    app.add_middleware(ContainErrors)


INTERNAL_ERROR = "internal error (logged on the server)"


class ContainErrors:
    """The last word on an exception nothing else handled: logged, answered 500 in the protocol's shape,
    and not raised further. Starlette's own handler re-raises after answering, and uvicorn then closes the
    connection, so a client's next request on it would go unanswered."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def _send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, _send)
        except Exception:
            path = scope.get("path", "")
            log.exception("unhandled error", extra={"path": path})
            if started:  # the answer is half sent: only closing the connection can end it
                raise
            await error_response(path, 500, INTERNAL_ERROR)(scope, receive, send)


def document_errors(app: FastAPI) -> None:
    """Add the statuses every route may answer to the OpenAPI schema, in one place: 401/403 where the
    API key is required, 413 where a body is read, so clients and fuzzers see the whole contract."""
    from fastapi.openapi.utils import get_openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        spec = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        ref = {"$ref": "#/components/schemas/ErrorBody"}
        spec.setdefault("components", {}).setdefault("schemas", {}).setdefault(
            "ErrorBody",
            {
                "title": "ErrorBody",
                "type": "object",
                "required": ["detail"],
                "properties": {
                    "detail": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]}
                },
            },
        )
        schemas = spec["components"]["schemas"]
        for name, doc in (("HTTPValidationError", "invalid request: one entry per field at fault"),
                          ("ValidationError", "what is wrong with one field of the request")):
            if name in schemas:  # FastAPI's own 422 models, described like ours
                schemas[name]["description"] = doc
                for field, text in (("loc", "where: the path to the field"), ("msg", "what is wrong"),
                                    ("type", "error kind"), ("detail", "the fields at fault"),
                                    ("input", "the value given"), ("ctx", "details of the check")):
                    if field in schemas[name].get("properties", {}):
                        schemas[name]["properties"][field]["description"] = text
        extra = {
            "401": "missing API key",
            "403": "wrong API key, or none configured on the server",
            "413": "request body over the size limit",
        }
        for item in spec.get("paths", {}).values():
            for op in item.values():
                if not isinstance(op, dict) or "responses" not in op:
                    continue
                codes = []
                if op.get("security"):
                    codes += ["401", "403"]
                if "requestBody" in op:
                    codes.append("413")
                for code in codes:
                    op["responses"].setdefault(
                        code, {"description": extra[code], "content": {"application/json": {"schema": ref}}}
                    )
        app.openapi_schema = spec
        return spec

    app.openapi = openapi  # type: ignore[method-assign]
