"""A model's version numbers: the next one to publish is above every number ever used, so a version
name, once deleted, never comes back naming other weights (caches, logs and clients keep meaning it)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from service.errors import writing
from trainer.durable import commit_file

HIGH_WATER = ".highest-version"


def version_key(v: str) -> tuple[int, int | str]:
    """Numeric versions sort numerically and above non-numeric ones ("10" > "9" > "beta")."""
    return (1, int(v)) if v.isdigit() else (0, v)


def some_versions(versions: list[str], shown: int = 5) -> str:
    """A model's versions (ascending) as a message names them: all of a few; of many, how many and the
    newest `shown`, so an answer stays short however many versions a model has."""
    if len(versions) <= shown:
        return ", ".join(versions)
    return f"{len(versions)} versions, the newest {', '.join(reversed(versions[-shown:]))}"


def _recorded(model_dir: Path) -> int:
    try:
        return int((model_dir / HIGH_WATER).read_text().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def next_version(model_dir: Path) -> int:
    """One above the highest version on disk or ever deleted."""
    on_disk = (
        [int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()]
        if model_dir.exists()
        else []
    )
    return max([*on_disk, _recorded(model_dir)], default=0) + 1


def retire(model_dir: Path, version: str) -> None:
    """Record a numbered version about to be deleted, atomically, before its directory goes. A disk that
    cannot take the record (full, read-only) refuses the delete here, with the version still whole."""
    if not version.isdigit() or int(version) <= _recorded(model_dir):
        return
    tmp = model_dir / f"{HIGH_WATER}.{os.getpid()}.tmp"
    try:
        with writing(f"the record of deleted version {version}"):
            tmp.write_text(f"{int(version)}\n")
            commit_file(tmp, model_dir / HIGH_WATER)
    except BaseException:
        with contextlib.suppress(OSError):  # a read-only disk refuses this too
            tmp.unlink(missing_ok=True)
        raise
