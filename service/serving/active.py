"""The active version of every model, as rows of the shared database: the one truth every serving
process and replica follows.

A row is written when a version is activated (`explicit`) and also the first time any process picks a version
for a model nobody activated (the highest that loads): from then on a restart, a second serving process or a
second replica serves that same version instead of re-deciding from what happens to be on disk.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.db.engine import make_engine, migrate, reachable
from service.db.locks import lock_version
from service.db.tables import ActiveVersionRow, ModelFlagsRow
from service.errors import NotFound

log = logging.getLogger("ovex.active")

# checked under a version's lock before its activation is recorded: the version is still on disk
Present = Callable[[], bool]
LEGACY_FILE = "active.json"  # where activation choices lived before the database held them


@dataclass(frozen=True)
class Flags:
    """The models that are deactivated, and the one set as the default (None: none was set)."""

    deactivated: frozenset[str] = frozenset()
    default: str | None = None


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

    def flags(self) -> Flags:
        """Deactivated models and the default set through the API: one small query, polled like `all`."""
        with Session(self.engine) as s:
            rows = list(s.execute(select(ModelFlagsRow.model, ModelFlagsRow.deactivated,
                                         ModelFlagsRow.is_default)))
        return Flags(frozenset(m for m, off, _ in rows if off), next((m for m, _, d in rows if d), None))

    def set_default(self, model: str | None) -> None:
        """Make `model` the default for every process and replica (None: back to the automatic choice)."""
        with reachable("the default model was not changed"), Session(self.engine) as s, s.begin():
            s.execute(update(ModelFlagsRow).where(ModelFlagsRow.is_default.is_(True)).values(is_default=False))
            if model is not None:
                _flag(s, model, is_default=True)

    def deactivate(self, model: str) -> None:
        """Stop serving `model` everywhere; its versions and recorded active version stay, and activating
        a version serves it again (`set` clears the flag)."""
        with reachable(f"model {model!r} was not deactivated"), Session(self.engine) as s, s.begin():
            _flag(s, model, deactivated=True)

    @staticmethod
    def forget(s: Session, model: str) -> None:
        """Drop every row about `model` in the transaction `s` (the model is being deleted)."""
        s.execute(delete(ActiveVersionRow).where(ActiveVersionRow.model == model))
        s.execute(delete(ModelFlagsRow).where(ModelFlagsRow.model == model))

    def get(self, model: str) -> str | None:
        with reachable(), Session(self.engine) as s:
            return self.recorded(s, model)

    @contextlib.contextmanager
    def version_lock(self, model: str, version: str, outcome: str = "") -> Iterator[Session]:
        """A transaction holding the lock on `model` version `version` that activating it, deleting it and
        recording a job that continues it all take (`lock_version`), in every process and replica. The
        database lost: `Unavailable`, saying what did not happen (`outcome`)."""
        with reachable(outcome), Session(self.engine) as s, s.begin():
            lock_version(s, model, version)
            yield s

    @contextlib.contextmanager
    def versions_lock(self, model: str, versions: list[str], outcome: str = "") -> Iterator[Session]:
        """`version_lock` on every one of `versions` in one transaction (deleting a whole model)."""
        with reachable(outcome), Session(self.engine) as s, s.begin():
            for v in sorted(versions):  # one order everywhere: two deletes never wait on each other
                lock_version(s, model, v)
            yield s

    @staticmethod
    def recorded(s: Session, model: str) -> str | None:
        """The active version of `model` as the transaction `s` sees it (one holding a version lock)."""
        row = s.get(ActiveVersionRow, model)
        return None if row is None else row.version

    def set(self, model: str, version: str, present: Present | None = None) -> None:
        """An explicit activation: overwrite whatever was recorded. Under the version's lock `present`
        must still hold (the version was not deleted meanwhile), or nothing is recorded (`NotFound`)."""
        outcome = f"version {version!r} of model {model!r} was not activated"
        with self.version_lock(model, version, outcome) as s:
            _still(present, model, version)
            overwrite = (
                update(ActiveVersionRow)
                .where(ActiveVersionRow.model == model)
                .values(version=version, explicit=True, updated_at=time.time())
            )
            if getattr(s.execute(overwrite), "rowcount", 0) == 0 and not _inserted(s, model, version, True):
                # a racing first record of this model (another version's lock) won the insert: overwrite it
                s.execute(overwrite)
            # activating a version of a deactivated model serves it again
            s.execute(update(ModelFlagsRow).where(ModelFlagsRow.model == model).values(deactivated=False))

    def record_first(self, model: str, version: str, present: Present | None = None) -> str:
        """Record `version` unless a version is already recorded; returns the one that is (first wins).
        Like `set`, nothing is recorded for a version no longer `present` (`NotFound`)."""
        outcome = f"version {version!r} of model {model!r} was not recorded as active"
        with self.version_lock(model, version, outcome) as s:
            if (chosen := self.recorded(s, model)) is not None:
                return chosen
            _still(present, model, version)
            if _inserted(s, model, version, False):
                return version
            chosen = self.recorded(s, model)
            return version if chosen is None else chosen

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


def _still(present: Present | None, model: str, version: str) -> None:
    if present is not None and not present():
        raise NotFound(f"version {version!r} of model {model!r} was deleted meanwhile; nothing was activated")


def _flag(s: Session, model: str, **values: bool) -> None:
    """Set flags of `model` in `s`, inserting its row if it has none."""
    now = time.time()
    change = update(ModelFlagsRow).where(ModelFlagsRow.model == model).values(updated_at=now, **values)
    if getattr(s.execute(change), "rowcount", 0) == 0:
        try:
            with s.begin_nested():
                s.add(ModelFlagsRow(model=model, **{"deactivated": False, "is_default": False, **values},
                                    updated_at=now))
        except IntegrityError:  # inserted meanwhile by another transaction: update it
            s.execute(change)


def _inserted(s: Session, model: str, version: str, explicit: bool) -> bool:
    """Insert the first row of `model`; False when another transaction inserted it first."""
    try:
        with s.begin_nested():
            s.add(ActiveVersionRow(model=model, version=version, explicit=explicit, updated_at=time.time()))
        return True
    except IntegrityError:
        return False
