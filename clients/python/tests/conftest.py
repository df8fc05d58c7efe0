"""Fixtures: one real `ovex serve` on loopback per session, with a tiny model trained by the real CLI."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from live_server import (
    CLIENT_ONLY,
    LiveServer,
    live_server,
    make_dataset,
    make_models,
    server_available,
)


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    if not server_available():
        pytest.skip(f"{CLIENT_ONLY} is set: client-only environment, no live server")
    root = tmp_path_factory.mktemp("ovex-live")
    make_models(root / "models")
    with live_server(root) as server:
        yield server


@pytest.fixture(scope="session")
def train_file(live: LiveServer) -> Path:
    """A small XC-format training file with planted structure (shared by the job tests)."""
    return make_dataset(live.root / "upload-train.txt", labels=16, features=200, rows=300, seed=5)
