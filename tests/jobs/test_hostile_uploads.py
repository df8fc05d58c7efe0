"""Hostile dataset uploads against a real server: each refused with 422 naming the file and line, on a
connection that answers the next request; and unusual but valid text stored and trained on by a job."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.jobs.conftest import API_KEY, Server, sqlite_server
from tests.jobs.test_jobs_e2e import _wait_serving

NINES = "9" * 5000
TINY = {"dim": 16, "batch_size": 16, "negatives": 4, "lr": 0.05, "epochs": 2}

# (file name, content, line of the fault, what the message says)
HOSTILE = [
    ("header.txt", f"1 {NINES} 10\n0 1:1\n", 1, "5,000-digit count of features"),
    ("label.txt", f"2 5 10\n0 1:1\n{NINES} 1:1\n", 3, "label id '9999"),
    ("feature.txt", f"2 5 10\n0 1:1\n1 2:1 {NINES}:1\n", 3, "feature id '9999"),
    ("exponent.txt", "2 5 10\n0 1:1\n1 1:1e999999\n", 3, "overflows float32"),
    ("digits.txt", "2 5 10\n0 1:1\n1 1:" + "1" * 100_000 + "\n", 3, "100,000 characters long"),
    ("nan.txt", "2 5 10\n0 1:1\n1 1:nan\n", 3, "non-finite value 'nan'"),
    ("text.jsonl", '{"text": "ok", "labels": ["x"]}\n{"text": "a\\udfff", "labels": ["x"]}\n', 2,
     "'text' holds a lone surrogate"),
    ("label.jsonl", '{"text": "ok", "labels": ["x"]}\n\n{"text": "a", "labels": ["x\\udfff"]}\n', 3,
     "label name 'x\\udfff' holds a lone surrogate"),
    ("number.jsonl", '{"text": "ok", "labels": ["x"], "id": ' + NINES + "}\n", 1, "a JSON number with more"),
]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with sqlite_server(tmp_path_factory.mktemp("hostile")) as server:
        yield server


def _local_port(r: httpx.Response) -> int:
    """The client side port of the connection that carried `r` (the same port: the same connection)."""
    return int(r.extensions["network_stream"].get_extra_info("client_addr")[1])


@pytest.mark.parametrize(("name", "content", "line", "says"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_upload_is_422_with_the_line_on_a_connection_that_lives(
    srv: Server, name: str, content: str, line: int, says: str
) -> None:
    before = srv.client.get("/v1/datasets").json()["datasets"]
    with httpx.Client(base_url=srv.base, headers={"X-API-Key": API_KEY}, timeout=60,
                      limits=httpx.Limits(max_connections=1, max_keepalive_connections=1)) as client:
        r = client.post("/v1/datasets", files={"file": (name, content.encode(), "text/plain")})
        assert r.status_code == 422, r.text
        err = r.json()["detail"][0]
        assert err["loc"] == ["body", "file"] and err["line"] == line, err
        assert err["msg"].startswith(f"{name}:{line}: ") and says in err["msg"], err["msg"]
        assert len(err["msg"]) < 400  # a 100,000-digit token is not echoed whole
        assert r.headers.get("connection", "").lower() != "close"
        port = _local_port(r)
        again = client.get("/v1/datasets")  # the same keep-alive connection answers the next request
        assert again.status_code == 200 and _local_port(again) == port
        assert again.json()["datasets"] == before  # nothing stored
    uploads = srv.data_dir / "uploads"
    assert not uploads.exists() or not any(uploads.iterdir())  # no temporary file left behind


def _unusual_rows() -> list[dict[str, Any]]:
    """Valid text a job must take: astral characters (JSON writes them as escaped surrogate pairs), NUL,
    control and zero-width characters, right-to-left and combining text, a label name with a newline."""
    labels = ["😀 smile", "日本語", "two\nlines", "nul\x00in", "עברית", "e\u0301", "\u200bzw"]
    words = ["𝔘𝔫𝔦𝔠𝔬𝔡𝔢 alpha", "日本 語彙 beta", "naïve café gamma", "ctl\x01\x7f delta", "שלום עולם epsilon",
             "zero\u200bwidth zeta", "nul\x00byte eta"]
    rows = []
    for i in range(70):
        k = i % len(labels)
        rows.append({"text": f"{words[k]} {words[k]} common{i % 3} 😀\u2028", "labels": [labels[k]],
                     "id": i})
    return rows


def test_unusual_but_valid_unicode_is_stored_and_trains(srv: Server, tmp_path: Path) -> None:
    rows = _unusual_rows()
    path = tmp_path / "unicode.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds = srv.upload(path)
    assert ds["format"] == "jsonl" and ds["rows"] == 70 and ds["labels"] == 7, ds
    job = srv.submit({"model": "unicode", "train_dataset": ds["id"], "params": TINY})
    srv.events(job)
    done = srv.job(job)
    assert done["state"] == "succeeded", (done, srv.log_tail())
    _wait_serving(srv, "unicode", "1")
    r = srv.client.post("/v1/models/unicode/predict",
                        json={"inputs": [{"text": rows[1]["text"]}], "top_k": 7, "normalization": "none"})
    assert r.status_code == 200, r.text
    names = {lab["name"] for lab in r.json()["predictions"][0]["labels"]}
    assert names == {lab for row in rows for lab in row["labels"]}  # every name back exactly as uploaded
