"""Deleting datasets, jobs and model versions through the Python client (and its CLI) against a real server:
each refusal is a 409 that says why, each deletion takes its files with it, and afterwards no file on disk
is left that no record names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ovex_client import Client, Conflict, NotFound
from ovex_client import cli as client_cli

from service.db.engine import make_engine
from service.settings import Settings
from service.training.config import JobsConfig
from service.training.service import JobsService
from service.training.store import JobStore
from tests.jobs.conftest import API_KEY, Backend, Server

TINY = {"dim": 16, "batch_size": 32, "negatives": 8, "lr": 0.05, "epochs": 2}


def _orphans(srv: Server) -> list[str]:
    settings = Settings(data_dir=srv.data_dir, models_dir=srv.models_dir)
    engine = make_engine(JobsConfig(settings).db_url)
    try:
        return JobsService(JobsConfig(settings), JobStore(engine)).orphans()
    finally:
        engine.dispose()


def test_delete_everything_leaves_nothing_behind(
    make_server: Any, synth_files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    srv: Server = make_server(Backend("sqlite"))
    with Client(srv.base, API_KEY, timeout=60) as client:
        train = client.upload_dataset(synth_files["train"])
        test = client.upload_dataset(synth_files["test"])
        first = client.submit_job("demo", train.id, test_dataset=test.id, params=TINY, activate=True)
        with pytest.raises(Conflict, match="queued or running"):
            client.delete_dataset(test.id)
        with pytest.raises(Conflict, match="cancel it"):
            client.delete_job(first.id)
        assert client.wait_for_job(first.id).state == "succeeded"
        second = client.submit_job("demo", train.id, params=TINY, activate=True)
        assert client.wait_for_job(second.id).model_version == "2"
        srv.wait(second.id, lambda j: j["activated"], 60, "version 2 to serve")

        with pytest.raises(Conflict, match="active"):
            client.delete_version("demo", "2")
        client.delete_version("demo", "1")
        assert not (srv.models_dir / "demo" / "1").exists()
        assert [v.version for v in client.get_model("demo").versions] == ["2"]
        with pytest.raises(NotFound):
            client.delete_version("demo", "1")

        # a deleted highest version's number is never handed out again
        third = client.submit_job("demo", train.id, params=TINY)
        assert client.wait_for_job(third.id).model_version == "3"
        client.delete_version("demo", "3")
        fourth = client.submit_job("demo", train.id, params=TINY)
        assert client.wait_for_job(fourth.id).model_version == "4"
        client.delete_version("demo", "4")
        client.delete_job(third.id)
        client.delete_job(fourth.id)

        client.delete_dataset(train.id)  # the ended jobs keep their records, naming it as deleted
        assert train.id in srv.client.get(f"/v1/jobs/{first.id}").json()["deleted_datasets"]
        assert [d.id for d in client.iter_datasets()] == [test.id]
        with pytest.raises(NotFound):
            client.get_dataset(train.id)
        assert [j.id for j in client.iter_jobs(page_size=1)] == [second.id, first.id]
        client.delete_job(first.id)
        assert client_cli.main(["--url", srv.base, "--api-key", API_KEY, "jobs", "delete", second.id]) == 0
        assert "deleted" in capsys.readouterr().out
        with pytest.raises(NotFound):
            client.job_logs(first.id)
        assert list(client.iter_jobs()) == []

        assert client_cli.main(["--url", srv.base, "--api-key", API_KEY, "datasets", "delete", test.id]) == 0
        assert list(client.iter_datasets(page_size=1)) == []
        with pytest.raises(NotFound):
            client.get_dataset(train.id)

    assert _orphans(srv) == []
    for sub in ("datasets", "uploads", "jobs"):
        assert list((srv.data_dir / sub).iterdir()) == [], sub
    assert sorted(p.name for p in (srv.models_dir / "demo").iterdir() if p.is_dir()) == ["2"]
