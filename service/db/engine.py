"""Engines for the job database and schema upgrades run programmatically at start-up.

The API and every worker call `migrate()` when they start; a lock (a file lock for SQLite, an advisory
lock for PostgreSQL) makes concurrent starts upgrade the schema once instead of racing on DDL.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import sqlite3
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

from service.errors import DomainError, InsufficientStorage, Unavailable
from service.settings import Settings

log = logging.getLogger("ovex.db")
# an outage is logged once per this many seconds, not once per request or stream poll that meets it
WARN_EVERY_S = 10.0
_warned_at = {"last": float("-inf")}

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
_PG_LOCK_KEY = 0x6F766578  # "ovex"
_PG_DISK_FULL = "53100"  # SQLSTATE disk_full
_BUSY_MS = 30_000  # how long a SQLite statement waits for another process's lock
WAL_CHECKPOINT_PAGES = 256  # about 1 MiB of 4 KiB pages
WAL_KEEP_BYTES = 1 << 20


def normalize_db_url(url: str) -> str:
    """Route plain `postgresql://` URLs to psycopg 3 (the driver we ship) instead of psycopg2."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def db_url(settings: Settings) -> str:
    """The database every process of one deployment shares: `db_url`, else a SQLite file in `data_dir`."""
    data_dir = Path(settings.data_dir).expanduser().resolve()
    return normalize_db_url(settings.db_url or f"sqlite:///{data_dir / 'ovex.db'}")


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
    """Run database calls; a lost database becomes `Unavailable` with a retry hint, naming no SQL, host,
    path or driver class (`outcome` says what did not happen), and a full disk under it
    `InsufficientStorage`; the log keeps the driver's message."""
    try:
        yield
    except Exception as exc:
        if not lost(exc):
            raise
        if time.monotonic() - _warned_at["last"] >= WARN_EVERY_S:
            _warned_at["last"] = time.monotonic()
            log.warning("job database unavailable", extra={"error": f"{type(exc).__name__}: {exc}"[:500]})
        raise _refusal(exc, f": {outcome}" if outcome else "") from exc


def _refusal(exc: Exception, then: str) -> DomainError:
    """What a lost database means for the client, in words: its disk full, read-only, or just not there."""
    orig = getattr(exc, "orig", None)
    code = getattr(orig, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None  # extended result codes keep it in the low byte
    if primary == sqlite3.SQLITE_FULL or getattr(orig, "sqlstate", None) == _PG_DISK_FULL:
        return InsufficientStorage(f"the job database's disk is full{then}; free space or ask the operator")
    if primary == sqlite3.SQLITE_READONLY:
        return Unavailable(f"the job database's disk is read-only{then}; retry later or ask the operator",
                           retry_after=30)
    return Unavailable(f"the job database is unavailable{then}; retry later", retry_after=2)


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
        cur.execute(f"PRAGMA busy_timeout={_BUSY_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        # a checkpoint every WAL_CHECKPOINT_PAGES pages, and the log cut back to WAL_KEEP_BYTES once it has
        # been copied into the database: without the limit it keeps the largest size it ever reached
        cur.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
        cur.execute(f"PRAGMA journal_size_limit={WAL_KEEP_BYTES}")
        cur.close()

    return engine


def checkpoint_wal(engine: Engine) -> None:
    """Copy SQLite's write-ahead log into the database and truncate it to nothing, if no one is reading
    or writing just now (never waits for them: the next call tries again). A no-op on other databases."""
    if _sqlite_path(str(engine.url)) is None:
        return
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA busy_timeout=0")
        try:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.exec_driver_sql(f"PRAGMA busy_timeout={_BUSY_MS}")


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
