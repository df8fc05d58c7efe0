"""Deleting a whole model while jobs would write into it: a 409 naming them, unless `force`, which cancels
them first; nothing of the model is left to serve either way it ends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jobs.conftest import Backend, Server
from tests.service.conftest import train_small


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("model_delete")
    train_small(root / "models" / "m" / "1", labels=40, features=300, rows=300)
    server = Server(root, Backend("sqlite"), embedded_worker=False, extra_env={})  # jobs stay queued
    server.start()
    yield server
    server.stop()


def test_a_model_with_queued_jobs_is_kept_unless_forced(srv: Server, synth_files: dict[str, Path]) -> None:
    train = srv.upload(synth_files["train"])["id"]
    grows = srv.submit({"model": "m", "train_dataset": train, "base": {}})
    into = srv.submit({"model": "m", "train_dataset": train})

    r = srv.client.delete("/v1/models/m")
    assert r.status_code == 409, r.text
    assert grows in r.text and into in r.text
    assert (srv.models_dir / "m" / "1" / "config.json").is_file()
    assert srv.client.get("/v1/models/m").status_code == 200

    r = srv.client.delete("/v1/models/m", params={"force": "true"})
    assert r.status_code == 200, r.text
    assert sorted(r.json()["cancelled_jobs"]) == sorted([grows, into])
    assert {srv.job(j)["state"] for j in (grows, into)} == {"cancelled"}
    assert srv.client.get("/v1/models/m").status_code == 404
    assert not (srv.models_dir / "m" / "1").exists()
