"""The model catalog: the one owner of the layout `models_dir/<name>/<version>/` on disk.

Everything that finds, numbers, publishes, hides or deletes a version goes through here (the registry, the
job runner, adding labels, continuing a base). A version's number is above every number ever used, so a
version name, once deleted, never comes back naming other weights (caches, logs and clients keep meaning
it). A version appears by one rename (the commit point) and disappears by one rename to a hidden name.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from service.errors import Unavailable, writing
from trainer.artifact import read_shape
from trainer.durable import commit_file, fsync_path, fsync_tree
from trainer.errors import ArtifactError

HIGH_WATER = ".highest-version"
PUBLISHED_BY = "published_by.json"  # in a version a job made: {"job_id"}
# a version being deleted is first renamed to this prefix (hidden: the scan skips it), then removed
DELETING = ".deleting-"
_INCOMING = ".incoming-"  # a hidden name: no scan lists the copy before its rename
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


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


def publish(staging: Path, model_dir: Path, job_id: str) -> str:
    """Move a finished artifact to models_dir/<model>/<next version>; the rename is the commit point.

    Renaming a directory onto an existing non-empty one fails, so two jobs finishing at once for the same
    model take different versions instead of overwriting each other. The artifact names the job that made
    it (`PUBLISHED_BY`), so a later attempt of the job finds its version instead of publishing another.
    A full or read-only disk is its error kind (`writing`) and leaves no half-copied version behind.
    """
    with writing("the model"):
        model_dir.mkdir(parents=True, exist_ok=True)
        tmp = staging / f"{PUBLISHED_BY}.tmp"
        tmp.write_text(json.dumps({"job_id": job_id}) + "\n")
        commit_file(tmp, staging / PUBLISHED_BY)
        fsync_path(staging)
        try:
            return rename_to_next(staging, model_dir, job_id)
        except BaseException:
            for partial in model_dir.glob(f"{_INCOMING}{job_id}-*"):  # a copy the disk cut short
                shutil.rmtree(partial, ignore_errors=True)
            raise


def rename_to_next(source: Path, model_dir: Path, tag: str) -> str:
    """Rename `source` to the next free version of `model_dir`; its name. A source on another filesystem
    is copied next to the model first (under a hidden name holding `tag`)."""
    for _ in range(1000):
        target = model_dir / str(next_version(model_dir))
        try:
            os.rename(source, target)
            fsync_path(model_dir)  # the version's name is on disk before the store records it
            return target.name
        except OSError as e:
            if e.errno == errno.EXDEV:  # data and models on different filesystems: copy next to it first
                tmp = model_dir / f"{_INCOMING}{tag}-{uuid.uuid4().hex}"
                copy_tree(source, tmp)
                fsync_tree(tmp)
                shutil.rmtree(source, ignore_errors=True)
                source = tmp
                continue
            if e.errno in (errno.EEXIST, errno.ENOTEMPTY):  # taken meanwhile (another publish): the next
                continue
            raise
    raise Unavailable(f"no free version number under model {model_dir.name!r}; retry")


def copy_tree(src: Path, dst: Path) -> None:
    """Copy a directory tree, stopping at the first file that fails with its own `OSError` (shutil's
    copytree goes on and gathers the failures as strings, losing what they were: a full disk, say)."""
    for dirpath, _dirs, files in os.walk(src):
        into = dst / Path(dirpath).relative_to(src)
        into.mkdir(parents=True, exist_ok=into != dst)
        for name in files:
            shutil.copy2(Path(dirpath) / name, into / name)


def published_version(model_dir: Path, job_id: str) -> str | None:
    """The version of the model that job `job_id` published, if one is on disk: an attempt of the job
    published it, then lost the database (or its worker, or its lease) before the job record said so."""
    if not model_dir.is_dir():
        return None
    for version in sorted((p for p in model_dir.iterdir() if p.is_dir() and not p.name.startswith(".")),
                          key=lambda p: version_key(p.name), reverse=True):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if json.loads((version / PUBLISHED_BY).read_text()).get("job_id") == job_id:
                return version.name
    return None


def remove_hidden(gone: Path) -> None:
    """Remove a version renamed out of sight. A version that was a link to a directory elsewhere loses
    only its link: the target is never followed (its files are not the registry's to delete)."""
    if gone.is_symlink() or not gone.is_dir():
        gone.unlink()
    else:
        shutil.rmtree(gone)


class ModelCatalog:
    """The models directory: where a version lives, which versions exist, and the renames that publish,
    hide and number them. Holds no state beyond the directory's path; safe to share between threads."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def model_dir(self, name: str) -> Path:
        return self.root / name

    def version_dir(self, name: str, version: str) -> Path:
        return self.root / name / version

    def scan(self) -> dict[str, list[str]]:
        """Model name → versions (ascending) present on disk. Hidden and temp directories are skipped."""
        out: dict[str, list[str]] = {}
        if not self.root.is_dir():
            return out
        for mdir in sorted(self.root.iterdir()):
            if not mdir.is_dir() or not _NAME.match(mdir.name):
                continue
            versions = [v.name for v in mdir.iterdir() if v.is_dir() and _NAME.match(v.name)]
            if versions:
                out[mdir.name] = sorted(versions, key=version_key)
        return out

    def present(self, name: str, version: str) -> Callable[[], bool]:
        """A check, to run later (under a lock), that the version is still on disk."""
        return self.version_dir(name, version).is_dir

    def created_at(self, name: str, version: str) -> float:
        """When a version was written (its config.json is written once, when it is published)."""
        path = self.version_dir(name, version)
        for p in (path / "config.json", path):
            with contextlib.suppress(OSError):
                return p.stat().st_mtime
        return float("inf")

    def summary(self, name: str, version: str) -> dict[str, Any]:
        """config/metrics of a version from its JSON files, without loading its weights."""
        path = self.version_dir(name, version)
        out: dict[str, Any] = {}
        with contextlib.suppress(ArtifactError):  # a broken version is listed, without its shape
            shape = read_shape(path)
            out.update(n_labels=shape.n_labels, n_features=shape.n_features, dim=shape.dim)
        try:
            m = json.loads((path / "metrics.json").read_text())
            if isinstance(m, dict):
                out["metrics"] = m
        except (OSError, ValueError):
            pass
        return out

    # -- numbering and publishing -------------------------------------------------------------------
    def next_version(self, name: str) -> int:
        return next_version(self.model_dir(name))

    def publish(self, staging: Path, name: str, job_id: str) -> str:
        """A job's finished artifact becomes the model's next version (see `publish`)."""
        return publish(staging, self.model_dir(name), job_id)

    def published_version(self, name: str, job_id: str) -> str | None:
        return published_version(self.model_dir(name), job_id)

    def staging_dir(self, name: str, prefix: str) -> Path:
        """A hidden directory beside the model's versions, to build one in and `commit_staged` it."""
        return self.model_dir(name) / f"{prefix}{uuid.uuid4().hex}"

    def commit_staged(self, stage: Path, name: str) -> str:
        """A version built in `staging_dir` becomes the model's next version; its name."""
        return rename_to_next(stage, self.model_dir(name), "staged")

    # -- deleting -----------------------------------------------------------------------------------
    def hide_version(self, name: str, version: str) -> Path:
        """Record the version's number as used, then rename it out of sight (the scan skips it); the
        hidden path, for `remove_hidden`. A full or read-only disk refuses here, the version whole."""
        retire(self.model_dir(name), version)
        gone = self.model_dir(name) / f"{DELETING}{version}-{uuid.uuid4().hex[:8]}"
        with writing(f"the directory of version {version}"):
            self.version_dir(name, version).rename(gone)
        return gone

    def hide_model(self, name: str) -> tuple[Path, int]:
        """Rename a whole model out of sight; (the hidden path, the highest version number it used)."""
        highest = self.next_version(name) - 1
        gone = self.root / f"{DELETING}{name}-{uuid.uuid4().hex[:8]}"
        with writing(f"the directory of model {name}"):
            self.model_dir(name).rename(gone)
        return gone, highest

    def keep_numbers(self, name: str, highest: int) -> None:
        """A model made again under a deleted one's name numbers its versions above `highest`."""
        self.model_dir(name).mkdir()
        retire(self.model_dir(name), str(highest))

    def hidden(self) -> list[Path]:
        """What deletions cut short (by a crash) left: versions and models renamed out of sight."""
        return [*self.root.glob(f"*/{DELETING}*"), *self.root.glob(f"{DELETING}*")]

