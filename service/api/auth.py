"""Keys with scopes: the admin key allows every call; the optional read key allows reads of job logs and
dataset details (and predictions, when `predict_needs_read_key`). A key comes in `X-API-Key` or as
`Authorization: Bearer <key>`; 401 when none is sent where one is needed, 403 when it does not grant the call.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from service.errors import Forbidden, Unauthorized
from service.settings import Settings

api_key_header = APIKeyHeader(
    name="X-API-Key", auto_error=False, description="the server's OVEX_API_KEY (or OVEX_READ_KEY for reads)"
)
bearer = HTTPBearer(auto_error=False, description="the same key as `Authorization: Bearer <key>`")

_HOW = "send it in the X-API-Key header or as Authorization: Bearer <key>"


async def presented_key(
    header: Annotated[str | None, Security(api_key_header)] = None,
    token: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)] = None,
) -> str | None:
    return header or (token.credentials if token is not None else None) or None


Presented = Annotated[str | None, Depends(presented_key)]


def _matches(key: str, expected: SecretStr | None) -> bool:
    return expected is not None and hmac.compare_digest(key.encode(), expected.get_secret_value().encode())


def _settings(request: Request) -> Settings:
    s: Settings = request.app.state.settings
    return s


async def require_api_key(request: Request, key: Presented) -> None:
    """Admin scope (every mutation); compared in constant time; a server with no key refuses every key."""
    if not key:
        raise Unauthorized(f"missing API key: {_HOW}")
    admin = _settings(request).api_key
    if admin is None:
        raise Forbidden("this server has no API key configured (set OVEX_API_KEY); mutating calls are off")
    if not _matches(key, admin):
        what = "the read key only allows reads" if _matches(key, _settings(request).read_key) else "wrong key"
        raise Forbidden(f"{what}: this call needs the admin key (OVEX_API_KEY)")


async def require_read_key(request: Request, key: Presented) -> None:
    """Read scope: open while no read key is configured; otherwise the read key or the admin key."""
    s = _settings(request)
    if s.read_key is None:
        return
    if not key:
        raise Unauthorized(f"missing read key: {_HOW}")
    if not (_matches(key, s.read_key) or _matches(key, s.api_key)):
        raise Forbidden("wrong key: this call needs the read key (OVEX_READ_KEY) or the admin key")


async def require_predict_key(request: Request, key: Presented) -> None:
    """Predictions are open unless the server puts them behind the read key."""
    if _settings(request).predict_needs_read_key:
        await require_read_key(request, key)
