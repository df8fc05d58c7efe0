"""Datasets deleted while ended jobs name them, and duplicate uploads under a new name (live server)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.jobs.conftest import Backend, Server


def test_duplicate_upload_and_delete_with_history(make_server: Callable[..., Server],
                                                  synth_files: dict[str, Path]) -> None:
    srv = make_server(Backend("sqlite"), embedded_worker=False)  # no worker: jobs stay queued
    first = srv.upload(synth_files["train"], name="first")
    again = srv.upload(synth_files["train"], name="second")
    assert again["id"] == first["id"] and again["name"] == "first" and again["already_stored"] is True
    assert again["requested_name"] == "second" and "already stored as 'first'" in again["note"]

    job = srv.submit({"model": "m", "train_dataset": first["id"], "params": {"epochs": 1}})
    r = srv.client.delete(f"/v1/datasets/{first['id']}")
    assert r.status_code == 409 and job in r.text  # a queued job uses it
    assert srv.client.post(f"/v1/jobs/{job}/cancel").status_code in (200, 202)
    assert srv.client.delete(f"/v1/datasets/{first['id']}").status_code == 204  # only an ended job names it
    assert srv.job(job)["deleted_datasets"] == [first["id"]]  # the record is kept, showing it deleted
    assert srv.client.get(f"/v1/datasets/{first['id']}").status_code == 404
    assert srv.client.get("/v1/datasets").json()["datasets"] == []
    r = srv.client.post("/v1/jobs", json={"model": "m", "train_dataset": first["id"]})
    assert r.status_code == 404
    assert not list((srv.data_dir / "datasets").iterdir())

    back = srv.upload(synth_files["train"], name="third")  # the same bytes again: listed under the new name
    assert back["id"] == first["id"] and back["name"] == "third" and back["already_stored"] is False
    assert srv.job(job)["deleted_datasets"] == []
