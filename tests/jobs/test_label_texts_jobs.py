"""Label texts through the API: an upload of the label-texts format (told by its content or a `kind` field,
validated by the trainer's reader: a bad one is a 422 naming the line), and a job that trains with it,
after which the model takes labels by their texts (POST /v1/models/{name}/labels)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jobs.conftest import Server, sqlite_server

TINY = {"dim": 16, "batch_size": 64, "negatives": 16, "epochs": 2, "eval_every": 0}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with sqlite_server(tmp_path_factory.mktemp("lt-jobs")) as s:
        yield s


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from trainer.synth import write_label_texts, write_synth

    root = tmp_path_factory.mktemp("lt-files")
    out = {"rows": root / "rows.jsonl", "texts": root / "texts.jsonl", "xc": root / "rows.txt"}
    write_synth(out["rows"], 60, 500, 400, seed=2, fmt="jsonl")
    write_synth(out["xc"], 60, 500, 100, seed=2)
    write_label_texts(out["texts"], 62, 500, seed=2)  # two labels no row carries
    return out


def _post(srv: Server, name: str, content: bytes, kind: str | None = None) -> tuple[int, dict[str, object]]:
    data = {"kind": kind} if kind else None
    r = srv.client.post("/v1/datasets", files={"file": (name, content, "text/plain")}, data=data)
    return r.status_code, r.json()


def test_label_texts_uploads_are_told_apart_and_checked_line_by_line(
    srv: Server, files: dict[str, Path]
) -> None:
    status, body = _post(srv, "texts.jsonl", files["texts"].read_bytes())
    assert status == 201 and body["format"] == "label_texts" and body["labels"] == 62, body
    good = b'{"name": "a", "text": "w1 w2"}\n{"name": "b", "text": "w3"}\n'
    bad = b'{"name": "a", "text": "w1 w2"}\n{"name": "a", "text": "w3"}\n'
    status, body = _post(srv, "dup.jsonl", bad)
    assert status == 422 and "dup.jsonl:2" in json.dumps(body) and "duplicate" in json.dumps(body), body
    status, body = _post(srv, "blank.jsonl", b'{"name": "a", "text": "w1"}\n{"name": "b", "text": " "}\n')
    assert status == 422 and "blank.jsonl:2" in json.dumps(body) and "empty" in json.dumps(body), body
    # told by `kind`: a first line without a name is still read as label texts, and refused as such
    status, body = _post(srv, "k.jsonl", b'{"text": "w1", "labels": ["a"]}\n', kind="label_texts")
    assert status == 422 and "k.jsonl:1" in json.dumps(body) and "name" in json.dumps(body), body
    status, body = _post(srv, "k2.jsonl", good, kind="rows")
    assert status == 422 and "kind" in json.dumps(body), body
    status, body = _post(srv, "k3.jsonl", good, kind="label_texts")
    assert status == 201 and body["format"] == "label_texts", body
    for p in (srv.data_dir / "uploads").glob("*"):
        raise AssertionError(f"an upload left {p.name}")


def test_a_job_trains_with_uploaded_label_texts_and_the_model_then_takes_labels_by_text(
    srv: Server, files: dict[str, Path]
) -> None:
    rows = srv.upload(files["rows"])["id"]
    texts = srv.upload(files["texts"])["id"]
    xc = srv.upload(files["xc"])["id"]
    # refused up front, naming the field
    r = srv.client.post("/v1/jobs", json={"model": "t", "train_dataset": texts, "params": TINY})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "train_dataset"], r.text
    r = srv.client.post("/v1/jobs", json={"model": "t", "train_dataset": rows, "label_texts": rows,
                                          "params": TINY})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "label_texts"], r.text
    r = srv.client.post("/v1/jobs", json={"model": "t", "train_dataset": xc, "label_texts": texts,
                                          "params": TINY})
    assert r.status_code == 422 and "JSONL" in r.text, r.text
    r = srv.client.post("/v1/jobs", json={"model": "t", "train_dataset": rows,
                                          "label_texts": "ds_" + "0" * 20, "params": TINY})
    assert r.status_code == 404 and r.json()["detail"][0]["loc"] == ["body", "label_texts"], r.text
    # a live sample of 8 of each step's candidates' texts (the rest from the tower's cache)
    job_id = srv.submit({"model": "t", "train_dataset": rows, "label_texts": texts,
                         "params": {**TINY, "label_tower_live": 8}, "activate": True})
    assert srv.final_state(job_id) == "succeeded", srv.log_tail()
    job = srv.wait(job_id, lambda j: j["activated"], 60, "activation")
    assert job["label_texts"] == texts and job["params"]["label_tower_live"] == 8
    assert srv.client.get("/v1/models/t").json()["n_labels"] == 62  # labels without rows joined too
    r = srv.client.post("/v1/models/t/labels", json={"labels": [{"name": "late", "text": "w1 w7 w9"}],
                                                     "activate": True})
    assert r.status_code == 201 and r.json()["n_labels"] == 63, r.text
    # the label-texts dataset is named by an ended job only: it may go, and the job's record says so
    assert srv.client.delete(f"/v1/datasets/{texts}").status_code == 204
    assert texts in srv.job(job_id)["deleted_datasets"]


def test_a_job_trains_its_apart_tower_every_nth_step_and_refuses_out_of_range_tower_params(srv: Server,
                                                                          files: dict[str, Path]) -> None:
    from trainer.artifact import load_artifact

    rows = srv.upload(files["rows"])["id"]
    texts = srv.upload(files["texts"])["id"]
    n_jobs = len(srv.client.get("/v1/jobs").json()["jobs"])
    r = srv.client.post("/v1/jobs", json={"model": "every", "train_dataset": rows, "label_texts": texts,
                                          "params": {**TINY, "label_tower_every": 0}})
    assert r.status_code == 422, r.text
    errs = [e for e in r.json()["detail"] if e["loc"] == ["body", "params", "label_tower_every"]]
    assert errs and "greater than or equal to 1" in errs[0]["msg"], r.text
    for name, bad in (("label_tower_zero_bias", 1000), ("label_tower_zero_bias", "high"),
                      ("label_tower_live", -1), ("label_tower_live", 10**6),
                      ("label_tower_zero_scale", 0), ("label_tower_zero_scale", 101),
                      ("label_text_rows", "sometimes")):
        r = srv.client.post("/v1/jobs", json={"model": "every", "train_dataset": rows, "label_texts": texts,
                                              "params": {**TINY, name: bad}})
        assert r.status_code == 422, r.text
        locs = [e["loc"] for e in r.json()["detail"]]
        assert ["body", "params", name] in locs, r.text
    assert len(srv.client.get("/v1/jobs").json()["jobs"]) == n_jobs  # nothing queued
    apart = {**TINY, "label_tower_mode": "apart", "label_tower_detach": True, "label_tower_every": 3,
             "label_tower_zero_bias": 1.5, "label_tower_zero_scale": 0.5, "label_text_rows": False}
    job_id = srv.submit({"model": "every", "train_dataset": rows, "label_texts": texts, "params": apart})
    assert srv.final_state(job_id) == "succeeded", srv.log_tail()
    job = srv.job(job_id)
    assert job["params"]["label_tower_every"] == 3, job["params"]
    loaded = load_artifact(srv.models_dir / "every" / str(job["model_version"]))
    assert loaded.params.label_tower_every == 3 and loaded.params.label_tower_mode == "apart"
    assert job["params"]["label_tower_zero_bias"] == loaded.params.label_tower_zero_bias == 1.5
    assert job["params"]["label_tower_zero_scale"] == loaded.params.label_tower_zero_scale == 0.5
    assert job["params"]["label_text_rows"] is loaded.params.label_text_rows is False
    assert loaded.label_names[-2:] == ["60", "61"]  # the labels no row carries joined by their texts
