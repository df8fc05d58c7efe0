"""Typed errors users can act on: each names the file, line, field or index at fault."""

from __future__ import annotations

import errno


class OvexError(Exception):
    """Base of every error ovex raises on purpose (the API maps these to 4xx, never 500)."""


class DataFormatError(OvexError):
    """A dataset file is malformed; carries the file and 1-based line so the user can fix it."""

    def __init__(self, path: str, line: int, message: str) -> None:
        self.path = path
        self.line = line
        self.message = message
        super().__init__(f"{path}:{line}: {message}")


class ArtifactError(OvexError):
    """A model directory is missing, corrupt or of another schema version."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}")


class ParamsError(OvexError):
    """Training parameters out of range or inconsistent with the data."""


class TrainingCancelled(OvexError):
    """Raised inside the training loop when hooks ask it to stop."""


class RankFailed(OvexError):
    """A rank of a multi-process training run failed or was killed; the run stopped on every rank."""


def write_error(path: str, exc: OSError, what: str) -> ArtifactError:
    """A failed write of `what` (e.g. "the model") under `path` as what to do about it, a full disk above
    all: that one the user fixes by freeing space, not by reading a traceback."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ArtifactError(path, f"no space left on device while writing {what} here; free space and rerun")
    return ArtifactError(path, f"cannot write {what} here: {exc.strerror or exc}")
