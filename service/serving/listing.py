"""Pages of the model registry's listings: models by name, a model's versions newest first, each paged
by the one cursor codec (`service.db.cursor`): a cursor names its listing and the last item before.
"""

from __future__ import annotations

from collections.abc import Sequence

from service.db.cursor import decode_cursor, encode_cursor
from service.serving.catalog import version_key

MAX_PAGE = 1000  # the most items one listing page holds, whatever the client asks


def models_page(names: Sequence[str], limit: int, cursor: str | None) -> tuple[list[str], str | None]:
    """Up to `limit` model names after the cursor's, by name; and the cursor of the next page (None:
    the last)."""
    ordered = sorted(names)
    if cursor is not None:
        after = str(decode_cursor(cursor, ["models", ""], [str])[0])
        ordered = [n for n in ordered if n > after]
    page = ordered[:limit]
    more = bool(page) and len(ordered) > limit
    return page, encode_cursor(["models", ""], [page[-1]]) if more else None


def versions_page(
    model: str, versions: Sequence[str], limit: int, cursor: str | None
) -> tuple[list[str], str | None]:
    """Up to `limit` versions of `model` older than the cursor's, newest first; and the cursor of the next
    page (None: the last)."""
    newest_first = sorted(versions, key=version_key, reverse=True)
    if cursor is not None:
        after = version_key(str(decode_cursor(cursor, ["versions", model], [str])[0]))
        newest_first = [v for v in newest_first if version_key(v) < after]
    page = newest_first[:limit]
    more = bool(page) and len(newest_first) > limit
    return page, encode_cursor(["versions", model], [page[-1]]) if more else None
