"""The active version of every model, as rows of the shared database: the one truth every serving
process and replica follows.

A row is written when a version is activated (`explicit`) and also the first time any process picks a
version for a model nobody activated (the highest that loads): from then on a restart, a second worker or
a second replica serves that same version instead of re-deciding from what happens to be on disk.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path

from sqlalchemy import Boolean, Engine, Float, String, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, Session, mapped_column

from service.jobs.db import make_engine, migrate, reachable
from service.jobs.models import Base

log = logging.getLogger("ovex.active")

LEGACY_FILE = "active.json"  # where activation choices lived before the database held them


class ActiveVersionRow(Base):
    __tablename__ = "active_versions"

    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    version: Mapped[str] = mapped_column(String(128))
    explicit: Mapped[bool] = mapped_column(Boolean, default=False)
    updated_at: Mapped[float] = mapped_column(Float)


class ActiveVersions:
    """Reads and writes of `active_versions`, each one short transaction; safe to share between threads."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @classmethod
    def for_url(cls, db_url: str) -> ActiveVersions:
        """A store on `db_url`; nothing connects until `migrate` or the first read."""
        return cls(make_engine(db_url))

    def migrate(self) -> None:
        """Bring the schema up to date (idempotent; concurrent starts upgrade it once)."""
        migrate(self.engine)

    def all(self) -> dict[str, str]:
        """Model → active version: one small query, cheap enough to poll every second."""
        with Session(self.engine) as s:
            return {m: v for m, v in s.execute(select(ActiveVersionRow.model, ActiveVersionRow.version))}

    def get(self, model: str) -> str | None:
        with reachable(), Session(self.engine) as s:
            row = s.get(ActiveVersionRow, model)
            return None if row is None else row.version

    def set(self, model: str, version: str) -> None:
        """An explicit activation: overwrite whatever was recorded."""
        for attempt in range(2):
            now = time.time()
            try:
                with Session(self.engine) as s, s.begin():
                    res = s.execute(
                        update(ActiveVersionRow)
                        .where(ActiveVersionRow.model == model)
                        .values(version=version, explicit=True, updated_at=now)
                    )
                    if getattr(res, "rowcount", 0) == 0:
                        s.add(ActiveVersionRow(model=model, version=version, explicit=True, updated_at=now))
                return
            except IntegrityError:  # a racing first insert of this model: the row exists now, update it
                if attempt:
                    raise

    def record_first(self, model: str, version: str) -> str:
        """Record `version` unless a version is already recorded; returns the one that is (first wins)."""
        try:
            with Session(self.engine) as s, s.begin():
                if (row := s.get(ActiveVersionRow, model)) is not None:
                    return row.version
                s.add(ActiveVersionRow(model=model, version=version, explicit=False, updated_at=time.time()))
            return version
        except IntegrityError:  # another process recorded its choice between our read and insert
            recorded = self.get(model)
            return version if recorded is None else recorded

    def import_legacy_file(self, models_dir: Path) -> None:
        """Adopt the choices of an `active.json` written by an older ovex (once: the file is renamed)."""
        path = models_dir / LEGACY_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable activation file", extra={"path": str(path), "error": str(exc)})
            return
        models = data.get("models", {}) if isinstance(data, dict) else {}
        for name, version in (models.items() if isinstance(models, dict) else ()):
            if isinstance(name, str) and isinstance(version, str) and self.get(name) is None:
                self.set(name, version)
        with contextlib.suppress(FileNotFoundError):  # another process imported it at the same moment
            path.rename(path.with_name(LEGACY_FILE + ".imported"))
        log.info("activation choices imported into the database", extra={"path": str(path)})

    def close(self) -> None:
        self.engine.dispose()
