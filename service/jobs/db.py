"""Engines for the job database and schema upgrades run programmatically at start-up.

The API and every worker call `migrate()` when they start; a lock (a file lock for SQLite, an advisory
lock for PostgreSQL) makes concurrent starts upgrade the schema once instead of racing on DDL.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from service.errors import Unavailable

log = logging.getLogger("ovex.db")
# an outage is logged once per this many seconds, not once per request or stream poll that meets it
WARN_EVERY_S = 10.0
_warned_at = {"last": float("-inf")}

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
_PG_LOCK_KEY = 0x6F766578  # "ovex"


def _sqlite_path(url: str) -> Path | None:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def lost(exc: BaseException) -> bool:
    """Whether a database error means the database cannot be reached or used now (down, restarting,
    locked, out of connections) rather than a statement at fault."""
    return isinstance(exc, OperationalError | InterfaceError | PoolTimeout) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    )


@contextlib.contextmanager
def reachable(outcome: str = "") -> Iterator[None]:
    """Run database calls; a lost database becomes `Unavailable`, a 503 with Retry-After that names no
    SQL, host or path (`outcome` says what did not happen); the log keeps the driver's message."""
    try:
        yield
    except Exception as exc:
        if not lost(exc):
            raise
        if time.monotonic() - _warned_at["last"] >= WARN_EVERY_S:
            _warned_at["last"] = time.monotonic()
            log.warning("job database unavailable", extra={"error": f"{type(exc).__name__}: {exc}"[:500]})
        then = f": {outcome}" if outcome else ""
        raise Unavailable(f"the job database is unavailable ({type(exc).__name__}){then}; retry later",
                          headers={"Retry-After": "2"}) from exc


def make_engine(url: str) -> Engine:
    """An engine tuned for several processes sharing one database (WAL and a busy timeout on SQLite)."""
    sqlite_path = _sqlite_path(url)
    if sqlite_path is None:
        return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)
    sqlite_path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    return engine


@contextlib.contextmanager
def _migration_lock(engine: Engine) -> Iterator[None]:
    sqlite_path = _sqlite_path(str(engine.url))
    if sqlite_path is not None:
        lock_path = sqlite_path.with_name(sqlite_path.name + ".migrate.lock")
        with open(lock_path, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
        return
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK_KEY})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK_KEY})
                conn.commit()
        return
    yield


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest revision (idempotent; safe when several processes start at once)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with _migration_lock(engine), engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
