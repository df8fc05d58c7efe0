"""`POST /v1/jobs` with a `base`: version n+1 grows version n (which stays byte for byte as it was), labels
keep their ids by name, metrics split old and new labels, and a base that does not fit is a 4xx."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp

from service.serving.active import ActiveVersions
from tests.jobs.conftest import Backend, Server, sqlite_server
from trainer.data import read_xc, write_xc
from trainer.synth import synth

TINY = {"dim": 16, "batch_size": 32, "negatives": 8, "lr": 0.05}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server of default settings for the tests that need nothing else of it: each uses models of its
    own names and leaves no job running (a server's start is seconds of imports)."""
    with sqlite_server(tmp_path_factory.mktemp("continual")) as server:
        yield server


def _tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _first_version(srv: Any, model: str, dataset: str, epochs: int) -> tuple[Path, dict[str, str]]:
    """Train and activate version 1 of `model`: its directory and the digest of its files."""
    first = srv.submit({"model": model, "train_dataset": dataset, "params": {**TINY, "epochs": epochs},
                        "activate": True})
    assert srv.final_state(first) == "succeeded", srv.log_tail()
    v1 = srv.models_dir / model / "1"
    return v1, _tree_digest(v1)


def _old_rows(train: Path, out: Path) -> Path:
    """The training rows without labels 32-39, in a space of labels 0-31: the data of an older model."""
    full = read_xc(train)
    y = sp.csr_matrix(full.Y)
    keep = np.flatnonzero(np.asarray(y[:, 32:].sum(axis=1)).ravel() == 0)
    assert full.X is not None
    write_xc(out, full.X[keep], sp.csr_matrix(y[keep][:, :32]))
    return out


def _grown(srv: Any, synth_files: dict[str, Path], tmp_path: Path, model: str,
           params: dict[str, Any]) -> tuple[str, Path, dict[str, str], dict[str, str]]:
    """Version 1 of `model` trained on the older rows, then a job growing it on all of them, scored on the
    test split and activated: (the job's id, version 1's directory, its digest, dataset ids by role)."""
    ids = {"old": srv.upload(_old_rows(synth_files["train"], tmp_path / "old.txt"))["id"],
           "new": srv.upload(synth_files["train"])["id"], "test": srv.upload(synth_files["test"])["id"]}
    v1, before = _first_version(srv, model, ids["old"], epochs=6)
    job_id = srv.submit({"model": model, "train_dataset": ids["new"], "test_dataset": ids["test"],
                         "base": {}, "params": params, "activate": True})
    return job_id, v1, before, ids


def _labels(path: Path) -> list[str]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_job_with_a_base_makes_the_next_version_and_leaves_the_base_alone(
    srv: Server, synth_files: dict[str, Path], tmp_path: Path
) -> None:
    job_id, v1, before, ids = _grown(srv, synth_files, tmp_path, "grow", {"epochs": 4})
    assert srv.final_state(job_id) == "succeeded", srv.log_tail()
    job = srv.job(job_id)
    assert job["model_version"] == "2"
    # the active version was the default; the base's own training set is the default replay
    assert job["base"] == {"model": "grow", "version": "1", "replay_dataset": ids["old"]}
    assert job["params"]["dim"] == 16 and job["params"]["epochs"] == 4  # from the base / the request
    metrics = job["progress"]["metrics"]
    assert metrics["new.rows"] > 0 and metrics["old.rows"] > 0, metrics
    assert {"new.p@1", "new.p@5", "old.p@1", "old.p@5", "p@1"} <= set(metrics)
    assert metrics["new.p@1"] > 0.2, metrics

    assert _tree_digest(v1) == before  # version n untouched, file by file
    names = _labels(srv.models_dir / "grow" / "2" / "labels.txt")
    assert names[:32] == _labels(v1 / "labels.txt") and names == [str(i) for i in range(40)]
    r = srv.client.post("/v1/models/grow/predict",
                        json={"inputs": [{"features": {"indices": [1, 2], "values": [1.0, 1.0]}}]})
    assert r.status_code == 200 and r.json()["version"] == "2", r.text

    # an explicit version: grows version 1 again, into version 3
    again = srv.submit({"model": "grow", "train_dataset": ids["new"], "base": {"version": "1"},
                        "params": {"epochs": 1}})
    assert srv.final_state(again) == "succeeded", srv.log_tail()
    assert srv.job(again)["model_version"] == "3" and srv.job(again)["base"]["version"] == "1"
    assert _tree_digest(v1) == before

    # new data that is narrower than the base (32 labels declared, the base has 40): a test set that fits the
    # base fits the job, and with no label new to the base its metrics have old rows only
    narrow = srv.submit({"model": "grow", "train_dataset": ids["old"], "test_dataset": ids["test"],
                         "base": {"version": "2"}, "params": {"epochs": 1}})
    assert srv.final_state(narrow) == "succeeded", srv.log_tail()
    metrics = srv.job(narrow)["progress"]["metrics"]
    labelled = int((np.diff(sp.csr_matrix(read_xc(synth_files["test"]).Y).indptr) > 0).sum())
    assert metrics["new.rows"] == 0 and metrics["old.rows"] == labelled, metrics
    assert "new.p@1" not in metrics and metrics["old.p@1"] == metrics["p@1"], metrics

    # the base of a job that has not ended is kept until it ends (it would fail the job, or its resumption)
    long = srv.submit({"model": "grow", "train_dataset": ids["new"], "base": {"version": "3"},
                       "params": {"epochs": 3000}})
    srv.wait(long, lambda j: j["state"] == "running", 60, "the continual job to start")
    r = srv.client.delete("/v1/models/grow/versions/3")
    assert r.status_code == 409 and long in r.text and "cancel" in r.text, r.text
    assert srv.client.post(f"/v1/jobs/{long}/cancel").status_code == 202
    srv.wait(long, lambda j: j["state"] == "cancelled", 120, "the cancel")
    assert srv.client.delete("/v1/models/grow/versions/3").status_code == 204
    assert _tree_digest(v1) == before and sorted(p.name for p in v1.parent.iterdir() if p.is_dir()) == \
        ["1", "2", "4"]  # the cancelled job published nothing


def test_a_base_that_does_not_fit_is_refused_before_queueing(
    make_server: Any, synth_files: dict[str, Path], tmp_path: Path
) -> None:
    srv = make_server(Backend("sqlite"), OVEX_ACTIVE_POLL_S="60")  # it does not see another's activation
    train = srv.upload(synth_files["train"])
    first = srv.submit({"model": "m", "train_dataset": train["id"], "params": {**TINY, "epochs": 1}})
    assert srv.final_state(first) == "succeeded", srv.log_tail()
    n_jobs = len(srv.client.get("/v1/jobs").json()["jobs"])
    wide = srv.upload(synth_files["wide"])
    text = srv.upload(synth_files["train_jsonl"])

    def refused(body: dict[str, Any], status: int) -> Any:
        r = srv.client.post("/v1/jobs", json={"model": "m", "train_dataset": train["id"], **body})
        assert r.status_code == status, r.text
        assert str(srv.models_dir) not in r.text and str(srv.data_dir) not in r.text
        return r.json()["detail"]

    detail = refused({"train_dataset": wide["id"], "base": {}}, 422)
    assert detail[0]["loc"] == ["body", "train_dataset"]
    assert "declares 400 features but model 'm' version 1 takes 300" in detail[0]["msg"]
    detail = refused({"train_dataset": text["id"], "base": {}}, 422)
    assert "is jsonl but model 'm' version 1 takes xc data" in detail[0]["msg"]
    detail = refused({"base": {}, "params": {"dim": 32}}, 422)
    assert detail[0]["loc"] == ["body", "params"] and "dim=32 differs from the base model's dim=16" in \
        detail[0]["msg"]
    assert "no version '9'" in refused({"base": {"version": "9"}}, 404)
    assert "has no stored version" in refused({"base": {"model": "nope"}}, 404)
    assert "not found" in refused({"base": {"replay_dataset": "ds_missing"}}, 404)
    detail = refused({"base": {"version": 1}}, 422)  # a version is a string, as in the models API
    assert detail[0]["loc"][:3] == ["body", "base", "version"]
    detail = refused({"base": {"model": "../etc"}}, 422)
    assert detail[0]["loc"][:3] == ["body", "base", "model"]
    detail = refused({"base": {"replay_dataset": "ds\u0000x"}}, 422)  # never reaches the database
    assert detail[0]["loc"][:3] == ["body", "base", "replay_dataset"]
    # a replay set the base cannot read is refused now, not when the job has started
    detail = refused({"base": {"replay_dataset": wide["id"]}}, 422)
    assert detail[0]["loc"] == ["body", "base", "replay_dataset"]
    assert "declares 400 features but model 'm' version 1 takes 300" in detail[0]["msg"]
    X, Y = synth(60, 300, 50, seed=5)
    write_xc(tmp_path / "more.txt", X, Y)
    more = srv.upload(tmp_path / "more.txt")
    detail = refused({"base": {"replay_dataset": more["id"]}}, 422)
    assert detail[0]["loc"] == ["body", "base", "replay_dataset"]
    assert "declares 60 labels but the continued model has at most 40" in detail[0]["msg"]
    # another model's version cannot become the next version of a model that has its own: label ids
    # would no longer mean the same across its versions
    other = srv.submit({"model": "other", "train_dataset": train["id"], "params": {**TINY, "epochs": 1}})
    assert srv.final_state(other) == "succeeded", srv.log_tail()
    n_jobs += 1
    detail = refused({"base": {"model": "other"}}, 422)
    assert detail[0]["loc"] == ["body", "base", "model"]
    assert "model 'm' has versions of its own" in detail[0]["msg"]
    assert len(srv.client.get("/v1/jobs").json()["jobs"]) == n_jobs  # nothing was queued
    # a new model may start as a copy of another one
    replay = srv.upload(synth_files["test"])
    fork = srv.submit({"model": "fork", "train_dataset": train["id"], "params": {"epochs": 1},
                       "base": {"model": "other", "replay_dataset": replay["id"]}})
    assert srv.final_state(fork) == "succeeded", srv.log_tail()
    assert srv.job(fork)["model_version"] == "1" and srv.job(fork)["base"]["model"] == "other"
    # a job's replay set is one of its inputs: once the job has ended it may go, and the job's record says so
    assert srv.client.delete(f"/v1/datasets/{replay['id']}").status_code == 204
    assert replay["id"] in srv.job(fork)["deleted_datasets"]
    assert srv.client.delete(f"/v1/jobs/{fork}").status_code == 204

    # the default base is the version the database records as active, though this server still serves
    # another (it has not yet followed an activation made by another replica, or is still loading)
    second = srv.submit({"model": "m", "train_dataset": train["id"], "params": {**TINY, "epochs": 1}})
    assert srv.final_state(second) == "succeeded", srv.log_tail()
    active = ActiveVersions.for_url(f"sqlite:///{srv.data_dir / 'ovex.db'}")
    try:
        active.set("m", "2")
    finally:
        active.close()
    assert srv.client.get("/v1/models/m").json()["active_version"] == "1"
    r = srv.client.delete("/v1/models/m/versions/2")  # what every replica is to serve is kept, here too
    assert r.status_code == 409 and "is the active one" in r.text, r.text
    grow = srv.submit({"model": "m", "train_dataset": train["id"], "base": {}, "params": {"epochs": 1}})
    assert srv.job(grow)["base"]["version"] == "2"
    assert srv.final_state(grow) == "succeeded", srv.log_tail()


def test_params_of_a_continual_job_are_checked_together_with_its_base(
    srv: Server, synth_files: dict[str, Path]
) -> None:
    """A pair of fields (sampler and group_size) may take one side from the request, the other from the
    base: checked once merged, not against the defaults the request left out."""
    train = srv.upload(synth_files["train"])
    for model, extra in (("single", {"group_size": 1}), ("grouped", {})):
        params = {**TINY, **extra, "epochs": 1}
        job = srv.submit({"model": model, "train_dataset": train["id"], "params": params})
        assert srv.final_state(job) == "succeeded", srv.log_tail()

    grow = srv.submit({"model": "single", "train_dataset": train["id"], "base": {},
                       "params": {"sampler": "unigram", "epochs": 1}})
    assert srv.job(grow)["params"]["sampler"] == "unigram" and srv.job(grow)["params"]["group_size"] == 1
    assert srv.final_state(grow) == "succeeded", srv.log_tail()

    for body in ({"model": "fresh"}, {"model": "grouped", "base": {}}):
        r = srv.client.post("/v1/jobs", json={"train_dataset": train["id"], "params": {"sampler": "unigram"},
                                              **body})
        assert r.status_code == 422, r.text
        detail = r.json()["detail"][0]
        assert detail["loc"] == ["body", "params"], detail
        assert "group_size 2048 needs sampler 'uniform'" in detail["msg"]
        assert "pydantic" not in detail["msg"]
    r = srv.client.post("/v1/jobs", json={"model": "fresh", "train_dataset": train["id"],
                                          "params": {"stop_epoch": 9}})
    assert r.status_code == 422 and "stop_epoch 9 is after the last epoch (7)" in r.text, r.text
    # a text featurizer's setting on a base that takes sparse features: not a conflict, it does not apply
    r = srv.client.post("/v1/jobs", json={"model": "single", "train_dataset": train["id"], "base": {},
                                          "params": {"hash_size": 1024}})
    assert r.status_code == 422, r.text
    assert "hash_size=1024 does not apply: the base model takes sparse features" in r.text, r.text


def test_the_client_sends_the_base() -> None:
    from ovex_client import _api

    req = _api.submit_job("m", "ds_1", test_dataset=None, params=None, activate=None, base={"version": "2"})
    assert req.json == {"model": "m", "train_dataset": "ds_1", "base": {"version": "2"}}
    fresh = _api.submit_job("m", "ds_1", test_dataset=None, params=None, activate=None)
    assert "base" not in fresh.json


def test_the_memory_budget_counts_a_label_the_base_and_the_data_share_once(
    make_server: Any, synth_files: dict[str, Path]
) -> None:
    """XC labels are named by their ids: continuing a 40-label model on 40-label data makes 40 labels, not
    80, so a continual run on the data the base was trained on fits the budget its base fitted."""
    from service.training.budget import estimate
    from trainer.params import TrainParams

    params = {**TINY, "dim": 1024, "epochs": 1}
    fits, doubled = (estimate(TrainParams(**params), k, 300).bytes for k in (40, 80))
    srv = make_server(Backend("sqlite"), OVEX_MEMORY_BUDGET_BYTES=str((fits + doubled) // 2))
    train = srv.upload(synth_files["train"])
    first = srv.submit({"model": "m", "train_dataset": train["id"], "params": params})
    assert srv.final_state(first) == "succeeded", srv.log_tail()
    again = srv.submit({"model": "m", "train_dataset": train["id"], "base": {}, "params": {"epochs": 1}})
    assert srv.final_state(again) == "succeeded", srv.log_tail()


def test_a_base_named_by_ids_shares_them_with_xc_data(tmp_path: Path) -> None:
    """Only a base whose labels are named "0", "1", ... shares its ids with XC data; one with its own names
    gets every label of the data appended, which the budget and the test-set checks must allow for."""
    from service.training.continuing import _named_by_ids
    from trainer.artifact import labels_text

    (tmp_path / "labels.txt").write_text(labels_text([str(i) for i in range(12)]), encoding="utf-8")
    for chunk in (1, 5, 12, 1 << 16):  # read a chunk of ids at a time: the answer does not depend on it
        assert _named_by_ids(tmp_path, 12, chunk)
        assert not _named_by_ids(tmp_path, 11, chunk) and not _named_by_ids(tmp_path, 13, chunk)
    (tmp_path / "labels.txt").write_text(labels_text([*map(str, range(11)), "cat"]), encoding="utf-8")
    assert not _named_by_ids(tmp_path, 12)
    assert not _named_by_ids(tmp_path / "gone", 12)


def test_a_text_base_is_budgeted_for_the_vocabulary_it_may_grow_to(
    make_server: Any, synth_files: dict[str, Path]
) -> None:
    """A continual run extends a text model's vocabulary with the new data's words, up to max_vocab: its
    budget counts max_vocab input columns, as a fresh job's does, not the base's present vocabulary."""
    srv = make_server(Backend("sqlite"))
    text = srv.upload(synth_files["train_jsonl"])
    first = srv.submit({"model": "t", "train_dataset": text["id"], "params": {**TINY, "epochs": 1}})
    assert srv.final_state(first) == "succeeded", srv.log_tail()
    assert srv.proc is not None
    srv.proc.terminate()
    srv.proc.wait(60)
    srv.env["OVEX_MEMORY_BUDGET_BYTES"] = str(16 << 20)  # the base's 300 words fit; 200,000 do not
    srv.start()
    for body in ({"params": TINY}, {"base": {}}):  # a fresh job, then one continuing the base
        r = srv.client.post("/v1/jobs", json={"model": "t", "train_dataset": text["id"], **body})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["type"] == "memory_budget" and "max_vocab" in r.text, r.text


def test_a_continual_job_survives_a_killed_server_and_resumes_from_its_checkpoint(
    make_server: Any, synth_files: dict[str, Path]
) -> None:
    """SIGKILL `ovex serve` (and so its worker) while a continual job runs: after a restart the job resumes
    from its checkpoint and publishes version 2; version 1 is as it was, and nothing half-written is left."""
    srv = make_server(Backend("sqlite"))
    train = srv.upload(synth_files["train"])
    v1, before = _first_version(srv, "k", train["id"], epochs=1)
    # 1,900 steps: the worker is stopped a few hundred steps past the one seen (progress shows every 0.5 s,
    # the orphaned worker looks for its parent as often), far from the end; the resumed rest stays short
    job_id = srv.submit({"model": "k", "train_dataset": train["id"], "base": {}, "params": {"epochs": 100}})
    srv.wait(job_id, lambda j: (j["progress"]["step"] or 0) >= 60, 60, "the job to pass a checkpoint")
    assert srv.proc is not None
    os.kill(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait(10)
    srv.start()
    job = srv.wait(job_id, lambda j: j["state"] == "succeeded", 240, "the resumed job to succeed")
    assert job["attempts"] == 2 and (job["resumed_from_step"] or 0) >= 20, job
    assert job["model_version"] == "2" and job["base"]["version"] == "1"
    assert _tree_digest(v1) == before
    assert sorted(p.name for p in v1.parent.iterdir()) == ["1", "2"]
    assert not (srv.data_dir / "jobs" / job_id).exists()
    r = srv.client.post("/v1/models/k/versions/2/activate")
    assert r.status_code == 200, r.text


def test_a_version_is_kept_when_the_job_database_cannot_tell(tmp_path: Path) -> None:
    """Whether a job still needs a version, or another replica activated it, is unknown while the database
    is down: keep it, answer 503."""
    import pytest

    from service.db.engine import make_engine
    from service.errors import Unavailable
    from service.serving.registry import ModelRegistry
    from service.settings import Settings

    (tmp_path / "ovex.db").mkdir()  # SQLite cannot open its file: a real driver error
    (tmp_path / "models" / "m" / "1").mkdir(parents=True)
    registry = ModelRegistry(Settings(data_dir=str(tmp_path), models_dir=str(tmp_path / "models")),
                             ActiveVersions(make_engine(f"sqlite:///{tmp_path / 'ovex.db'}")))
    down = r"database is unavailable: version '1' of model 'm' was not deleted; retry"
    with pytest.raises(Unavailable, match=down) as e:
        registry.delete_version("m", "1")
    assert str(tmp_path) not in e.value.message and e.value.retry_after == 2
    assert (tmp_path / "models" / "m" / "1").is_dir()


def test_a_stored_base_that_cannot_be_read_is_a_409_as_everywhere_else(
    srv: Server, synth_files: dict[str, Path]
) -> None:
    """The request is fine, the stored version is broken: the same 409 as activating it, with what is wrong
    and never the server's path; a version whose weights were cut short is refused now, not by a job that
    fails once started. Nothing is queued."""
    train = srv.upload(synth_files["train"])
    v1, _ = _first_version(srv, "b", train["id"], epochs=1)
    job = srv.submit({"model": "b", "train_dataset": train["id"], "params": {**TINY, "epochs": 1}})
    assert srv.final_state(job) == "succeeded", srv.log_tail()
    n_jobs = len(srv.client.get("/v1/jobs").json()["jobs"])

    def replace(path: Path, data: bytes) -> None:  # a new file: the server's memory map keeps the old one
        path.with_suffix(".tmp").write_bytes(data)
        os.replace(path.with_suffix(".tmp"), path)

    weights = srv.models_dir / "b" / "2" / "weights.safetensors"
    replace(weights, weights.read_bytes()[: weights.stat().st_size // 2])
    config = v1 / "config.json"
    replace(config, config.read_bytes()[:40])
    for version, what in (("2", "weights.safetensors"), ("1", "config.json")):
        r = srv.client.post("/v1/jobs", json={"model": "b", "train_dataset": train["id"],
                                              "base": {"version": version}})
        assert r.status_code == 409, r.text
        detail = r.json()["detail"][0]
        assert detail["loc"] == ["body", "base"] and detail["type"] == "conflict", detail
        assert f"model 'b' version {version}" in detail["msg"] and what in detail["msg"], detail
        assert str(srv.models_dir) not in r.text and str(srv.root) not in r.text
    activate = srv.client.post("/v1/models/b/versions/2/activate")
    assert activate.status_code == 409, activate.text  # the same status for the same broken version
    r = srv.client.post("/v1/jobs", json={"model": "b", "train_dataset": train["id"],
                                          "base": {"version": "2"}})
    assert r.status_code == 409 and "failed to load and was refused" in r.text, r.text  # as it was refused
    assert str(srv.root) not in r.text and "Traceback" not in r.text, r.text
    assert len(srv.client.get("/v1/jobs").json()["jobs"]) == n_jobs


def test_an_unknown_base_version_names_a_few_versions_however_many_there_are(
    srv: Server, synth_files: dict[str, Path]
) -> None:
    """The 404 of a version a model lacks says how many it has and names the newest few: with thousands of
    versions the message stays short (the V2 route answers the same way)."""
    train = srv.upload(synth_files["train"])
    _first_version(srv, "many", train["id"], epochs=1)
    for v in range(2, 3001):
        (srv.models_dir / "many" / str(v)).mkdir()
    r = srv.client.post("/v1/jobs", json={"model": "many", "train_dataset": train["id"],
                                          "base": {"version": "99999"}})
    assert r.status_code == 404, r.text
    assert "has no version '99999'" in r.text and "3000 versions" in r.text, r.text
    assert "3000, 2999, 2998" in r.text and "2990" not in r.text and len(r.text) < 400, r.text
    r = srv.client.get("/v2/models/many/versions/99999")
    assert r.status_code == 404 and "3000 versions" in r.text and len(r.text) < 400, r.text
    few = srv.client.get("/v2/models/many/versions/0").text
    assert "3000 versions" in few
