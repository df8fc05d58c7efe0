"""Locks taken inside a transaction, the same in every process and replica sharing the database."""

from __future__ import annotations

import hashlib

from sqlalchemy import false, text, update
from sqlalchemy.orm import Session

from service.db.tables import JobRow


def lock_version(s: Session, model: str, version: str) -> None:
    """Take, in the transaction `s`, the lock that every act on one model version (delete it, activate it,
    record a job that continues it) takes, in every process and replica, until `s` ends. PostgreSQL: an
    advisory lock on the pair; SQLite: the database's write lock, taken by a write that changes nothing."""
    if s.get_bind().dialect.name == "postgresql":
        key = int.from_bytes(hashlib.blake2b(f"{model}/{version}".encode(), digest_size=8).digest(),
                             "big", signed=True)
        s.execute(text("SELECT pg_advisory_xact_lock(CAST(:k AS BIGINT))"), {"k": key})
    else:
        lock_writes(s)


def lock_writes(s: Session) -> None:
    """SQLite: take the database's write lock now (a write that changes nothing), so what the transaction
    reads next cannot change before it commits. PostgreSQL locks rows instead: nothing to do."""
    if s.get_bind().dialect.name == "sqlite":
        s.execute(update(JobRow).where(false()).values(id=JobRow.id))
