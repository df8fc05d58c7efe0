"""The one paging cursor of every listing (jobs, datasets, models, a model's versions).

A cursor is an opaque token naming the last item of the page before (keyset paging): a page stays
correct while items are added or removed between two requests, and a client cannot ask for an offset the
server must count up to. A cursor names what it pages (its listing and scope), so one passed to another
listing is refused with a message saying so, not answered with a silently wrong page.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence

from service.errors import Invalid

Part = str | float


def encode_cursor(listing: Sequence[str], position: Sequence[Part]) -> str:
    """The token for `position` (the last item's sort key) in `listing` (its name, then its scope)."""
    raw = json.dumps([*listing, *position], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, listing: Sequence[str], shape: Sequence[type[Part]]) -> tuple[Part, ...]:
    """The position a cursor of `listing` names, one value of each type in `shape`; `Invalid` (on the
    field `cursor`) for anything this listing did not hand out."""
    try:
        parts = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        parts = None
    head = len(listing)
    if (isinstance(parts, list) and len(parts) == head + len(shape) and parts[:head] == list(listing)
            and all(_fits(p, t) for p, t in zip(parts[head:], shape, strict=True))):
        return tuple(float(p) if t is float else p for p, t in zip(parts[head:], shape, strict=True))
    raise Invalid(
        f"cursor is not one this server handed out for the listing of {' of '.join(p for p in listing if p)}"
        ": pass the cursor the previous page gave, or leave it out for the first page",
        field=("cursor",),
    )


def _fits(value: object, kind: type[Part]) -> bool:
    if kind is float:  # JSON writes 3.0 as 3.0 but a client may craft 3; a bool is not a number here
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, kind)
