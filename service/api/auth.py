"""API-key check for mutating endpoints: 401 when no key is sent, 403 when it is not the server's."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader

from service.api.errors import Forbidden, Unauthorized

api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="the server's OVEX_API_KEY")


def require_api_key(request: Request, key: Annotated[str | None, Security(api_key_header)] = None) -> None:
    """Dependency: compare in constant time; a server with no key configured refuses every key."""
    if not key:
        raise Unauthorized(
            "missing API key: send it in the X-API-Key header", headers={"WWW-Authenticate": "APIKey"}
        )
    expected = request.app.state.settings.api_key
    if expected is None:
        raise Forbidden("this server has no API key configured (set OVEX_API_KEY); mutating calls are off")
    if not hmac.compare_digest(key.encode(), expected.get_secret_value().encode()):
        raise Forbidden("wrong API key")


ApiKey = Annotated[None, Depends(require_api_key)]
