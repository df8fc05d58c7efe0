"""What every store of the job database shares: one short transaction per call, and keyset pages.

The job store and the dataset store hold different rows of one database; they open transactions and page
their listings the same way, so both are built on `Records` instead of each carrying a copy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, TypeVar

from sqlalchemy import Engine, Select, or_
from sqlalchemy.orm import Session, sessionmaker

from service.db.cursor import decode_cursor, encode_cursor
from service.db.engine import reachable
from service.db.tables import DatasetRow, JobRow

Row = TypeVar("Row", JobRow, DatasetRow)


class Records:
    """Typed access to the job database; safe to share between threads (one session per call)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction; a lost database is `Unavailable` (a 503 to clients, a retry to workers)."""
        with reachable(), self._sessions() as s, s.begin():
            yield s

    def _page(
        self, q: Select[Any], table: type[Row], limit: int, cursor: str | None
    ) -> tuple[list[Row], str | None]:
        """Keyset paging on (created_at, id), newest first: stable while rows are added or removed."""
        if cursor is not None:
            at, last_id = decode_cursor(cursor, [table.__tablename__], [float, str])
            q = q.where(or_(table.created_at < at, (table.created_at == at) & (table.id < last_id)))
        q = q.order_by(table.created_at.desc(), table.id.desc()).limit(limit + 1)
        with self.session() as s:
            rows = list(s.scalars(q))
        if len(rows) <= limit:
            return rows, None
        rows = rows[:limit]
        return rows, encode_cursor([table.__tablename__], [rows[-1].created_at, rows[-1].id])
