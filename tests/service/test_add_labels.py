"""POST /v1/models/{name}/labels against a live `ovex serve`: labels added by their texts.

A model trained with label texts on planted data (labels 0..K0-1 have texts, the last few labels are held
out of training altogether) is served from a models directory on a small tmpfs, through the int8 scan. The
held-out labels are added by their planted texts: each becomes the top answer for an input that reads as
its text, the answers stay certified, version n is byte for byte what it was, and the new version's int8
cells come from the base's (appended, not rebuilt). Bad requests are 4xx naming what to fix; a full or
read-only disk is a 507/503 with nothing left behind.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.jobs.test_disk_faults import full, read_only, tmpfs
from tests.service.conftest import (
    API_KEY,
    HELD,
    K0,
    Server,
    copy_version,
    start_server,
    stop_server,
    train_small,
    train_with_texts,
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lt-trained")
    train_with_texts(root)
    train_small(root / "models" / "plain" / "1")
    return root


@pytest.fixture(scope="module")
def srv(trained: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("lt-srv")
    with tmpfs(work / "models", "16m") as models:
        copy_version(trained / "models", models, "lt", "1")
        copy_version(trained / "models", models, "plain", "1")
        s = start_server(models, work, {"OVEX_RETRIEVAL": "int8", "OVEX_MAX_LABELS_PER_REQUEST": "50"})
        try:
            yield s
        finally:
            stop_server(s)


@pytest.fixture(scope="module")
def held(trained: Path) -> list[dict[str, str]]:
    out: list[dict[str, str]] = json.loads((trained / "held.json").read_text())
    return out


def _client(srv: Server) -> httpx.Client:
    return srv.client(headers={"X-API-Key": API_KEY})


def _digests(version: Path) -> dict[str, str]:
    return {str(p.relative_to(version)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(version.rglob("*")) if p.is_file()}


def _leftovers(models: Path) -> list[str]:
    return [str(p.relative_to(models)) for p in models.glob("*/.*") if p.name != ".highest-version"]


def _predict(c: httpx.Client, texts: list[str], k: int = 5) -> list[dict[str, object]]:
    r = c.post("/v1/models/lt/predict", json={"inputs": [{"text": t} for t in texts], "top_k": k,
                                               "normalization": "none"})
    assert r.status_code == 200, r.text
    out: list[dict[str, object]] = r.json()["predictions"]
    return out


def test_labels_added_by_text_answer_as_their_texts_say_and_version_n_is_untouched(
    srv: Server, held: list[dict[str, str]], trained: Path
) -> None:
    with _client(srv) as c:
        before = _predict(c, [h["text"] for h in held])
        v1 = srv.models_dir / "lt" / "1"
        assert (v1 / "index" / "int8" / "meta.json").is_file()  # the served base has its int8 cells
        digests = _digests(v1)
        r = c.post("/v1/models/lt/labels", json={"labels": held, "activate": True})
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["version"] == "2" and body["base_version"] == "1" and body["activated"]
        assert body["n_labels"] == K0 + HELD and body["first_label_id"] == K0 and body["added"] == HELD
        assert body["index"] == "appended"
        assert _digests(v1) == digests  # version n byte for byte
        assert c.get("/v1/models/lt").json()["active_version"] == "2"
        assert c.get("/v1/models/lt").json()["label_texts"] is True
        assert c.get("/v1/models/plain").json()["label_texts"] is False
        after = _predict(c, [h["text"] for h in held])
        texts = [h["text"] for h in held]
        r = c.post("/v2/models/lt/infer", json={"inputs": [{"name": "text", "shape": [len(texts)],
                   "datatype": "BYTES", "data": texts}], "parameters": {"top_k": 5, "normalization": "none"}})
        v2 = {o["name"]: o["data"] for o in r.json()["outputs"]}
        # the KServe V2 answer marks the same labels as the REST one
        assert v2["from_text"] == [[lab["from_text"] for lab in a["labels"]] for a in after]  # type: ignore[attr-defined]
    v2 = srv.models_dir / "lt" / "2"
    names = [json.loads(line) for line in (v2 / "labels.txt").read_text().splitlines()]
    assert names[K0:] == [h["name"] for h in held]
    texts = [json.loads(line) for line in (v2 / "label_texts.jsonl").read_text().splitlines()]
    assert texts[K0:] == held and len(texts) == K0 + HELD
    assert json.loads((v2 / "config.json").read_text())["n_labels"] == K0 + HELD
    new = {h["name"] for h in held}
    for b in before:  # before: none of them can be answered
        assert not new & {lab["name"] for lab in b["labels"]}  # type: ignore[index, attr-defined]
    # answers mark the labels known by their text alone (no training row), and only them
    rows = (trained / "rows.jsonl").read_text().splitlines()
    with_rows = {n for line in rows for n in json.loads(line)["labels"]}
    marks = [(lab["name"], lab["from_text"]) for a in before + after for lab in a["labels"]]  # type: ignore[attr-defined]
    assert all(marked == (name not in with_rows) for name, marked in marks), marks
    assert {name for name, marked in marks if marked} & new and not all(marked for _, marked in marks)
    tops = [a["labels"][0]["name"] for a in after]  # type: ignore[index]
    hits = sum(t == h["name"] for t, h in zip(tops, held, strict=True))
    top5 = [[lab["name"] for lab in a["labels"]] for a in after]  # type: ignore[attr-defined]
    assert all(h["name"] in t for h, t in zip(held, top5, strict=True)), top5
    # a zero-shot label is the top answer for an input that reads as its text (most of them here)
    assert hits >= HELD // 2, tops
    assert all(a["exact"] for a in after)  # certified through the appended cells
    assert _leftovers(srv.models_dir) == []


def test_bad_requests_are_4xx_naming_what_to_fix(srv: Server, held: list[dict[str, str]]) -> None:
    with _client(srv) as c:
        def post(model: str, body: object) -> httpx.Response:
            return c.post(f"/v1/models/{model}/labels", json=body)

        r = post("lt", {"labels": [{"name": "a-new-one", "text": "w1 w2"}, {"name": "b", "text": "  "}]})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "labels", 1, "text"], r.text
        assert "empty" in r.json()["detail"][0]["msg"]
        r = post("lt", {"labels": [{"name": "x", "text": "w1"}, {"name": "x", "text": "w2"}]})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "labels", 1, "name"], r.text
        assert "'x'" in r.json()["detail"][0]["msg"] and "twice" in r.json()["detail"][0]["msg"]
        r = post("lt", {"labels": [{"name": "fresh", "text": "w1"}, {"name": "7", "text": "w2"}]})
        assert r.status_code == 409 and "'7'" in r.json()["detail"][0]["msg"], r.text
        assert r.json()["detail"][0]["loc"] == ["body", "labels", 1, "name"]
        many = [{"name": f"n{i}", "text": "w1"} for i in range(51)]
        r = post("lt", {"labels": many})
        assert r.status_code == 422 and "at most 50" in r.text, r.text
        r = post("lt", {"labels": []})
        assert r.status_code == 422 and "at least one" in r.text, r.text
        r = post("plain", {"labels": [{"name": "fresh", "text": "w1"}]})
        assert r.status_code == 409 and "without label texts" in r.text, r.text
        r = post("nope", {"labels": [{"name": "fresh", "text": "w1"}]})
        assert r.status_code == 404 and "nope" in r.text, r.text
        r = post("lt", {"labels": [{"name": "fresh", "text": "w1"}], "base_version": "99"})
        assert r.status_code == 404 and "99" in r.text, r.text
        r = post("lt", {"labels": [{"name": "fresh", "text": 3}]})
        assert r.status_code == 422, r.text
        r = post("lt", {"labels": [{"name": "fresh", "text": "w1", "colour": "red"}]})
        assert r.status_code == 422 and "colour" in r.text, r.text
        r = httpx.post(f"{srv.base}/v1/models/lt/labels", json={"labels": [{"name": "fresh", "text": "w1"}]})
        assert r.status_code == 401, r.text
    assert _leftovers(srv.models_dir) == []
    assert sorted(p.name for p in (srv.models_dir / "plain").iterdir()) == ["1"]


def test_a_full_or_read_only_disk_leaves_nothing_half_written(srv: Server) -> None:
    versions = sorted(p.name for p in (srv.models_dir / "lt").iterdir() if not p.name.startswith("."))
    body = {"labels": [{"name": "disk-label", "text": "w10 w20 w30"}], "activate": False}
    with _client(srv) as c:
        with full(srv.models_dir):
            r = c.post("/v1/models/lt/labels", json=body)
            assert r.status_code == 507 and "disk is full" in r.json()["detail"], r.text
        assert _leftovers(srv.models_dir) == []
        with read_only(srv.models_dir):
            r = c.post("/v1/models/lt/labels", json=body)
            assert r.status_code == 503 and "read-only" in r.json()["detail"], r.text
        assert _leftovers(srv.models_dir) == []
        now = sorted(p.name for p in (srv.models_dir / "lt").iterdir() if not p.name.startswith("."))
        assert now == versions
        for word in ("Error", "Traceback", "/tmp", str(srv.models_dir)):
            assert word not in r.text
        r = c.post("/v1/models/lt/labels", json=body)  # once there is room, the same request succeeds
        assert r.status_code == 201, r.text
        assert r.json()["version"] == str(int(versions[-1]) + 1) and not r.json()["activated"]
