"""Pages of the model registry's listings: models by name, a model's versions newest first.

A cursor is an opaque token naming the last item of the page before (keyset paging): a page stays
correct while versions are published or deleted between two requests, and a client cannot ask for an
offset the server must count up to. A cursor names what it pages (which listing, which model), so one
passed to the wrong listing is a 422 that says where it came from, not a silently wrong page.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence

from service.errors import Invalid
from service.versions import version_key

MAX_PAGE = 1000  # the most items one listing page holds, whatever the client asks


def _encode(parts: list[str]) -> str:
    raw = json.dumps(parts, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(cursor: str, kind: str, scope: str, where: str) -> str:
    """The last item a cursor of listing `kind` within `scope` names; `Invalid` for anything else."""
    try:
        parts = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        parts = None
    if not (isinstance(parts, list) and len(parts) == 3 and all(isinstance(p, str) for p in parts)
            and parts[:2] == [kind, scope]):
        raise Invalid(f"cursor is not one this server handed out for {where}: pass the cursor the previous "
                      "page gave, or leave it out for the first page", loc=["query", "cursor"])
    return str(parts[2])


def models_page(names: Sequence[str], limit: int, cursor: str | None) -> tuple[list[str], str | None]:
    """Up to `limit` model names after the cursor's, by name; and the cursor of the next page (None:
    the last)."""
    ordered = sorted(names)
    if cursor is not None:
        after = _decode(cursor, "models", "", "GET /v1/models")
        ordered = [n for n in ordered if n > after]
    page = ordered[:limit]
    more = bool(page) and len(ordered) > limit
    return page, _encode(["models", "", page[-1]]) if more else None


def versions_page(
    model: str, versions: Sequence[str], limit: int, cursor: str | None
) -> tuple[list[str], str | None]:
    """Up to `limit` versions of `model` older than the cursor's, newest first; and the cursor of the next
    page (None: the last)."""
    newest_first = sorted(versions, key=version_key, reverse=True)
    if cursor is not None:
        after = version_key(_decode(cursor, "versions", model, f"the versions of model {model!r}"))
        newest_first = [v for v in newest_first if version_key(v) < after]
    page = newest_first[:limit]
    more = bool(page) and len(newest_first) > limit
    return page, _encode(["versions", model, page[-1]]) if more else None
