"""Hostile requests against a live `ovex serve`: every one must get a clean answer and leave the server
responsive.

Each case is sent on a kept-alive connection and answered; a good request then follows on the same
connection (an error must not cost the client its connection). Meanwhile a second connection asks
`/healthz` every few milliseconds, so a request that stalls the event loop shows as a slow health check.
A case fails when it is answered 5xx (other than a documented 503 or 507), when the connection closes
without an answer, when its body is not the protocol's error shape, or when it shows a server path, a
host name, a traceback or an exception class.

    python bench/hostile.py            # trains two small models, starts a server, writes
                                       # bench/results/hostile.{json,md}
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from stamp import RESULTS, markdown_line, stamp, stamped  # noqa: E402

DOCUMENTED_5XX = (503, 507)  # unavailable (retry), insufficient storage: said to the client, not a fault
LEAKS = re.compile(
    r"Traceback|File \"|/tmp/|/work/|/home/|/root/|\b[A-Z][A-Za-z]*(Error|Exception)\b|\bErrno\b"
)


@dataclass(frozen=True)
class Case:
    """One request: `body` bytes as sent (the content type says what they claim to be)."""

    name: str
    method: str
    path: str
    body: bytes | None = None
    content_type: str | None = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    key: bool = True  # send the admin key


@dataclass
class Outcome:
    case: str
    status: int | None
    seconds: float
    problem: str | None = None


@dataclass
class Report:
    cases: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    server_errors: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    bad_bodies: list[str] = field(default_factory=list)
    unusable_after: list[str] = field(default_factory=list)
    healthz_checks: int = 0
    healthz_max_ms: float = 0.0
    healthz_p99_ms: float = 0.0
    # the longest /healthz wait that overlapped a refused (4xx) request, and the request
    healthz_max_ms_while_refusing: float = 0.0
    healthz_max_refusing_case: str = ""
    slowest: list[tuple[str, float]] = field(default_factory=list)  # the ten slowest answers
    accepted: list[str] = field(default_factory=list)  # answered 2xx: taken as valid

    @property
    def failures(self) -> list[str]:
        return self.server_errors + self.dropped + self.bad_bodies + self.unusable_after


def _json(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def _multipart(filename: str, content: bytes, boundary: str = "hostileboundary") -> tuple[bytes, str]:
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + content
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return body, f"multipart/form-data; boundary={boundary}"


def _inputs(text_model: str, sparse_model: str) -> Iterator[tuple[str, Any]]:
    """Wrong `inputs` and whole bodies for the /v1 predict routes."""
    yield "empty object", {}
    yield "inputs null", {"inputs": None}
    yield "inputs string", {"inputs": "hello"}
    yield "inputs number", {"inputs": 5}
    yield "inputs empty", {"inputs": []}
    yield "inputs of null", {"inputs": [None]}
    yield "inputs of numbers", {"inputs": [1, 2, 3]}
    yield "100k empty inputs", {"inputs": [{}] * 100_000}
    yield "10k texts", {"inputs": [{"text": "a"}] * 10_000}
    yield "text and features", {"inputs": [{"text": "a", "features": {"indices": [1], "values": [1.0]}}]}
    yield "text number", {"inputs": [{"text": 5}]}
    yield "text list", {"inputs": [{"text": ["a"]}]}
    yield "text nul", {"inputs": [{"text": "a\u0000b"}]}
    yield "text 900k", {"inputs": [{"text": "word " * 180_000}]}
    yield "text lone surrogate", b'{"inputs": [{"text": "a\\udfff"}]}'
    yield "indices negative", {"inputs": [{"features": {"indices": [-1], "values": [1.0]}}]}
    yield "indices huge", {"inputs": [{"features": {"indices": [2**63], "values": [1.0]}}]}
    yield (
        "indices 10**4000",
        b'{"inputs": [{"features": {"indices": [' + b"9" * 4000 + b'], "values": [1]}}]}',
    )
    yield "indices float", {"inputs": [{"features": {"indices": [1.5], "values": [1.0]}}]}
    yield "indices strings", {"inputs": [{"features": {"indices": ["1"], "values": [1.0]}}]}
    yield "indices bool", {"inputs": [{"features": {"indices": [True], "values": [1.0]}}]}
    yield (
        "100k bad indices",
        {"inputs": [{"features": {"indices": [-1] * 100_000, "values": [1.0] * 100_000}}]},
    )
    yield "values true", {"inputs": [{"features": {"indices": [1], "values": [True]}}]}
    yield "values NaN", b'{"inputs": [{"features": {"indices": [1], "values": [NaN]}}]}'
    yield "values Infinity", b'{"inputs": [{"features": {"indices": [1], "values": [Infinity]}}]}'
    yield "values 1e39", {"inputs": [{"features": {"indices": [1], "values": [1e39]}}]}
    yield "values 1e999", b'{"inputs": [{"features": {"indices": [1], "values": [1e999]}}]}'
    yield "values string", {"inputs": [{"features": {"indices": [1], "values": ["x"]}}]}
    yield "lengths differ", {"inputs": [{"features": {"indices": [1, 2], "values": [1.0]}}]}
    yield "duplicate indices", {"inputs": [{"features": {"indices": [1, 1], "values": [1.0, 2.0]}}]}
    yield "features null", {"inputs": [{"features": None}]}
    yield "features list", {"inputs": [{"features": [1, 2]}]}
    yield "top_k 0", {"inputs": [{"text": "a"}], "top_k": 0}
    yield "top_k negative", {"inputs": [{"text": "a"}], "top_k": -5}
    yield "top_k huge", {"inputs": [{"text": "a"}], "top_k": 10**30}
    yield "top_k string", {"inputs": [{"text": "a"}], "top_k": "5"}
    yield "top_k float", {"inputs": [{"text": "a"}], "top_k": 2.5}
    yield "top_k bool", {"inputs": [{"text": "a"}], "top_k": True}
    yield "normalization unknown", {"inputs": [{"text": "a"}], "normalization": "argmax"}
    yield "exact string", {"inputs": [{"text": "a"}], "exact": "yes"}
    yield "unknown field", {"inputs": [{"text": "a"}], "temperature": 2}
    yield "model field", {"inputs": [{"text": "a"}], "model": "../../etc"}
    yield "deep nesting", b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    yield "deep object", b'{"a":' * 50_000 + b"1" + b"}" * 50_000
    yield "not json", b"inputs=hello"
    yield "truncated json", b'{"inputs": [{"text": "a"'
    yield "json array", b"[1, 2, 3]"
    yield "json string", b'"hello"'
    yield "json null", b"null"
    yield "empty body", b""
    yield "latin-1 body", '{"inputs": [{"text": "caf\u00e9"}]}'.encode("latin-1")
    yield "bom", b'\xef\xbb\xbf{"inputs": [{"text": "a"}]}'
    yield "utf-16 body", '{"inputs": [{"text": "a"}]}'.encode("utf-16")
    yield "long key", {"x" * 100_000: 1, "inputs": [{"text": "a"}]}
    yield "many keys", {f"k{i}": i for i in range(50_000)}
    yield "text to sparse model", ("model", sparse_model, {"inputs": [{"text": "a b c"}]})
    yield (
        "features to text model",
        ("model", text_model, {"inputs": [{"features": {"indices": [1], "values": [1]}}]}),
    )
    yield (
        "index past the model",
        ("model", sparse_model, {"inputs": [{"features": {"indices": [10**6], "values": [1.0]}}]}),
    )


def _v2_bodies() -> Iterator[tuple[str, Any]]:
    ok_sparse = [
        {"name": "indices", "shape": [1], "datatype": "INT64", "data": [1]},
        {"name": "values", "shape": [1], "datatype": "FP32", "data": [1.0]},
        {"name": "offsets", "shape": [2], "datatype": "INT64", "data": [0, 1]},
    ]
    yield "no inputs", {}
    yield "inputs empty", {"inputs": []}
    yield "four inputs", {"inputs": ok_sparse + ok_sparse[:1]}
    yield (
        "offsets 100k zeros",
        {
            "inputs": [
                ok_sparse[0],
                ok_sparse[1],
                {"name": "offsets", "shape": [100_000], "datatype": "INT64", "data": [0] * 100_000},
            ]
        },
    )
    yield (
        "indices 100k",
        {
            "inputs": [
                {"name": "indices", "shape": [100_000], "datatype": "INT64", "data": [-1] * 100_000},
                ok_sparse[1],
                ok_sparse[2],
            ]
        },
    )
    yield "shape lies", {"inputs": [{"name": "text", "shape": [1000], "datatype": "BYTES", "data": ["a"]}]}
    yield "shape huge", {"inputs": [{"name": "text", "shape": [2**62], "datatype": "BYTES", "data": ["a"]}]}
    yield (
        "shape product overflow",
        {"inputs": [{"name": "text", "shape": [2**31, 2**31, 2**31], "datatype": "BYTES", "data": ["a"]}]},
    )
    yield "shape negative", {"inputs": [{"name": "text", "shape": [-1], "datatype": "BYTES", "data": ["a"]}]}
    yield "shape empty", {"inputs": [{"name": "text", "shape": [], "datatype": "BYTES", "data": ["a"]}]}
    yield "datatype unknown", {"inputs": [{"name": "text", "shape": [1], "datatype": "FP128", "data": ["a"]}]}
    yield "datatype wrong", {"inputs": [{"name": "text", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    yield "name unknown", {"inputs": [{"name": "pixels", "shape": [1], "datatype": "BYTES", "data": ["a"]}]}
    yield "name long", {"inputs": [{"name": "t" * 10_000, "shape": [1], "datatype": "BYTES", "data": ["a"]}]}
    yield (
        "data nested wrong",
        {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [[[["a"]]]]}]},
    )
    yield "data null", {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": None}]}
    yield "data of dicts", {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [{}]}]}
    yield (
        "values bool",
        {
            "inputs": [
                ok_sparse[0],
                {"name": "values", "shape": [1], "datatype": "FP32", "data": [True]},
                ok_sparse[2],
            ]
        },
    )
    yield (
        "values 1e39",
        {
            "inputs": [
                ok_sparse[0],
                {"name": "values", "shape": [1], "datatype": "FP32", "data": [1e39]},
                ok_sparse[2],
            ]
        },
    )
    yield (
        "offsets decreasing",
        {
            "inputs": [
                ok_sparse[0],
                ok_sparse[1],
                {"name": "offsets", "shape": [2], "datatype": "INT64", "data": [1, 0]},
            ]
        },
    )
    yield (
        "offsets past the end",
        {
            "inputs": [
                ok_sparse[0],
                ok_sparse[1],
                {"name": "offsets", "shape": [2], "datatype": "INT64", "data": [0, 9]},
            ]
        },
    )
    yield (
        "parameters list",
        {"parameters": [1], "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}]},
    )
    yield (
        "top_k huge",
        {
            "parameters": {"top_k": 10**30},
            "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
        },
    )
    yield (
        "top_k string",
        {
            "parameters": {"top_k": "x"},
            "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
        },
    )
    yield (
        "outputs unknown",
        {
            "outputs": [{"name": "gradients"}],
            "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
        },
    )
    yield (
        "id long",
        {"id": "i" * 100_000, "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}]},
    )
    yield "not json", b"text=a"
    yield (
        "deep nesting",
        b'{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": '
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}]}",
    )


def _xc_files() -> Iterator[tuple[str, bytes]]:
    yield "header 5000 nines", b"1 " + b"9" * 5000 + b" 10\n0 1:1\n"
    yield "header label nines", b"1 10 " + b"9" * 5000 + b"\n0 1:1\n"
    yield "header negative", b"-1 10 10\n"
    yield "header words", b"rows features labels\n"
    yield "header only", b"1 10 10\n"
    yield "index nines", b"1 10 10\n0 " + b"9" * 5000 + b":1\n"
    yield "label nines", b"1 10 10\n" + b"9" * 5000 + b" 1:1\n"
    yield "value nines", b"1 10 10\n0 1:" + b"9" * 5000 + b"\n"
    yield "value 1e999", b"1 10 10\n0 1:1e999\n"
    yield "value nan", b"1 10 10\n0 1:nan\n"
    yield "binary", bytes(range(256)) * 8
    yield "empty", b""
    yield "jsonl lone surrogate label", b'{"text": "a b", "labels": ["x\\udfff"]}\n'
    yield "jsonl lone surrogate text", b'{"text": "a\\ud800 b", "labels": ["x"]}\n'
    yield "jsonl nul label", b'{"text": "a b", "labels": ["x\\u0000"]}\n'
    yield "jsonl empty label", b'{"text": "a b", "labels": [""]}\n'
    yield "jsonl labels not list", b'{"text": "a b", "labels": "x"}\n'
    yield "jsonl text number", b'{"text": 5, "labels": ["x"]}\n'
    yield "jsonl deep", b'{"text": "a", "labels": ' + b"[" * 50_000 + b"]" * 50_000 + b"}\n"
    yield "jsonl invalid utf-8", b'{"text": "a \xff\xfe", "labels": ["x"]}\n'


def _job_bodies(dataset: str) -> Iterator[tuple[str, Any]]:
    yield "no model", {"train_dataset": dataset}
    yield "model traversal", {"model": "../../etc", "train_dataset": dataset}
    yield "model long", {"model": "m" * 5000, "train_dataset": dataset}
    yield "model unicode", {"model": "m\u00e9", "train_dataset": dataset}
    yield "dataset traversal", {"model": "m", "train_dataset": "../../../etc/passwd"}
    yield "dataset unknown", {"model": "m", "train_dataset": "ds_00000000000000000000"}
    yield "dataset long", {"model": "m", "train_dataset": "d" * 5000}
    for name, value in (
        ("epochs", -1),
        ("epochs", 10**12),
        ("epochs", "3"),
        ("dim", 0),
        ("dim", 10**9),
        ("lr", -1),
        ("lr", float("1e308")),
        ("negatives", -1),
        ("batch_size", 0),
        ("batch_size", 10**9),
        ("dropout", 1),
        ("seed", -1),
        ("seed", 2**80),
        ("device", "tpu"),
        ("precision", "fp8"),
        ("nproc_per_node", 1000),
        ("hidden", -1),
        ("max_vocab", 10**12),
        ("loss", "magic"),
        ("unknown", 1),
    ):
        yield (
            f"params {name}={value!r}"[:60],
            {"model": "m", "train_dataset": dataset, "params": {name: value}},
        )
    yield "params list", {"model": "m", "train_dataset": dataset, "params": [1]}
    yield "activate string", {"model": "m", "train_dataset": dataset, "activate": "yes"}
    yield "base traversal", {"model": "m", "train_dataset": dataset, "base": {"model": "../x"}}
    yield "base unknown", {"model": "m", "train_dataset": dataset, "base": {"model": "nope", "version": "9"}}
    yield "base version long", {"model": "m", "train_dataset": dataset, "base": {"version": "9" * 5000}}


def cases(text_model: str, sparse_model: str, dataset: str) -> list[Case]:
    """The suite: a few hundred requests a careless or hostile client might send."""
    out: list[Case] = []
    for name, body in _inputs(text_model, sparse_model):
        targets = ["/v1/predict", f"/v1/models/{text_model}/predict", f"/v1/models/{sparse_model}/predict"]
        if isinstance(body, tuple):  # aimed at one model
            targets, body = [f"/v1/models/{body[1]}/predict"], body[2]
        raw = body if isinstance(body, bytes) else _json(body)
        out += [Case(f"predict {name} → {path}", "POST", path, raw) for path in targets]
    for name, body in _v2_bodies():
        raw = body if isinstance(body, bytes) else _json(body)
        for path in (
            f"/v2/models/{text_model}/infer",
            f"/v2/models/{sparse_model}/infer",
            f"/v2/models/{sparse_model}/versions/1/infer",
        ):
            out.append(Case(f"v2 {name} → {path}", "POST", path, raw))
    for name, content in _xc_files():
        for filename in ("data.txt", "data.jsonl"):
            body, ctype = _multipart(filename, content)
            out.append(Case(f"upload {name} as {filename}", "POST", "/v1/datasets", body, ctype))
    out.append(Case("upload no boundary", "POST", "/v1/datasets", b"xx", "multipart/form-data"))
    out.append(
        Case("upload bad boundary", "POST", "/v1/datasets", b"--a\r\n\r\n", "multipart/form-data; boundary=b")
    )
    out.append(Case("upload json", "POST", "/v1/datasets", b"{}", "application/json"))
    out.append(
        Case(
            "upload no file part",
            "POST",
            "/v1/datasets",
            b'--b\r\nContent-Disposition: form-data; name="name"\r\n\r\nx\r\n--b--\r\n',
            "multipart/form-data; boundary=b",
        )
    )
    out.append(
        Case(
            "upload without key",
            "POST",
            "/v1/datasets",
            _multipart("a.txt", b"1 1 1\n0 0:1\n")[0],
            _multipart("a.txt", b"")[1],
            key=False,
        )
    )
    for name, body in _job_bodies(dataset):
        out.append(Case(f"job {name}", "POST", "/v1/jobs", _json(body)))
    out.append(
        Case(
            "job without key", "POST", "/v1/jobs", _json({"model": "m", "train_dataset": dataset}), key=False
        )
    )
    long = "n" * 5000
    for path in (
        f"/v1/models/{long}",
        f"/v1/models/{long}/versions",
        f"/v1/models/{long}/predict",
        f"/v2/models/{long}",
        f"/v2/models/{long}/ready",
        f"/v1/jobs/{long}",
        f"/v1/datasets/{long}",
        f"/v1/jobs/{long}/logs",
        f"/v1/models/{text_model}/versions/{long}",
        "/v1/models/%2e%2e%2f%2e%2e%2fetc",
        "/v1/models/..%2F..%2Fetc/versions",
        "/v1/models/a%00b",
        "/v1/models/%ff%fe",
        "/v1/jobs/job_%00",
        "/v1/datasets/..%2f..%2fetc",
        "/v2/models/%2e%2e/versions/%2e%2e",
        f"/v1/models/{text_model}/versions/%2e%2e",
        "/v1/models?limit=-1",
        "/v1/models?limit=100000000000",
        "/v1/models?limit=abc",
        "/v1/models?cursor=garbage",
        f"/v1/models?cursor={'A' * 10000}",
        "/v1/jobs?limit=0",
        "/v1/jobs?state=exploded",
        f"/v1/jobs?model={long}",
        "/v1/jobs?cursor=%ff",
        "/v1/datasets?limit=-5",
        "/v1/datasets?cursor=eyJhIjoxfQ",
        f"/v1/models/{text_model}?versions=-1",
        f"/v1/models/{text_model}/versions?limit=0",
        "/v1/jobs/job_nope/events",
        "/v1/jobs/job_nope/events?after=-1",
    ):
        out.append(Case(f"GET {path[:60]}", "GET", path, None, None))
    for path in (
        f"/v1/models/{text_model}/versions/99/activate",
        f"/v1/models/{text_model}/versions/1/activate",
        f"/v1/models/{long}/versions/1/activate",
        "/v1/jobs/job_nope/cancel",
    ):
        out.append(Case(f"POST {path[:60]} without key", "POST", path, None, None, key=False))
        out.append(Case(f"POST {path[:60]}", "POST", path, None, None))
    for path in (
        f"/v1/models/{text_model}/versions/1",
        f"/v1/models/{text_model}/versions/99",
        "/v1/datasets/ds_00000000000000000000",
        f"/v1/datasets/{dataset}",
        "/v1/jobs/job_nope",
    ):
        out.append(Case(f"DELETE {path[:60]} without key", "DELETE", path, None, None, key=False))
        out.append(Case(f"DELETE {path[:60]}", "DELETE", path, None, None))
    for method in ("PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"):
        for path in ("/v1/predict", "/v1/models", "/v2/models/x/infer", "/healthz"):
            out.append(Case(f"{method} {path}", method, path, b"{}"))
    ctypes: tuple[str | None, ...] = (
        "text/plain",
        "application/xml",
        "multipart/form-data",
        "application/json; charset=latin-1",
        "application/x-www-form-urlencoded",
        None,
    )
    for media in ctypes:
        out.append(
            Case(f"predict as {media}", "POST", "/v1/predict", _json({"inputs": [{"text": "a"}]}), media)
        )
    for header, value in (
        ("X-API-Key", "k" * 8000),
        ("X-API-Key", "\u00e9".encode().decode("latin-1")),
        ("Authorization", "Bearer " + "x" * 8000),
        ("Authorization", "Basic !!!"),
        ("Content-Length", "abc"),
        ("Content-Length", "-1"),
        ("Content-Length", "9" * 40),
        ("Transfer-Encoding", "gzip"),
        ("Content-Encoding", "gzip"),
        ("Accept", "application/xml"),
        ("Host", "x" * 5000),
        ("X-Forwarded-For", "1.1.1.1, " * 500),
        ("Last-Event-ID", "9" * 5000),
    ):
        out.append(
            Case(
                f"header {header}: {value[:20]}",
                "POST",
                "/v1/jobs",
                _json({"model": "m", "train_dataset": dataset}),
                headers=((header, value),),
                key=False,
            )
        )
    return out


class _Health(threading.Thread):
    """Asks /healthz every few ms on its own connection; records how long each answer took."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(daemon=True)
        self.host, self.port = host, port
        self.waits: list[float] = []
        self.spans: list[tuple[float, float]] = []  # (start, end) of each check, perf_counter seconds
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                conn.request("GET", "/healthz")
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    self.errors.append(f"/healthz answered {response.status}")
            except (OSError, http.client.HTTPException) as exc:
                self.errors.append(f"/healthz: {exc!r}")
                conn.close()
                conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            t1 = time.perf_counter()
            self.waits.append(t1 - t0)
            self.spans.append((t0, t1))
            self.stop.wait(0.005)
        conn.close()


def _problem_with_body(case: Case, status: int, body: bytes, secrets: tuple[str, ...]) -> str | None:
    text = body.decode("utf-8", "replace")
    for secret in secrets:
        if secret and secret in text:
            return f"shows {secret!r}"
    if LEAKS.search(text):
        return f"shows {LEAKS.search(text).group(0)!r}"  # type: ignore[union-attr]
    if status < 400 or status == 405:  # success, or the router's plain method refusal
        return None
    try:
        answer = json.loads(body)
    except ValueError:
        return "error body is not JSON"
    key = "error" if case.path.startswith("/v2/") else "detail"
    if not isinstance(answer, dict) or key not in answer:
        return f"error body has no {key!r}"
    if len(body) > 64 * 1024:
        return f"error body of {len(body):,} bytes"
    return None


def run_suite(base_url: str, api_key: str, suite: list[Case], secrets: tuple[str, ...] = ()) -> Report:
    """Send every case, each followed by a good request on the same connection; see the module doc."""
    host, port = base_url.removeprefix("http://").split(":")
    health = _Health(host, int(port))
    health.start()
    report = Report(cases=len(suite))
    secrets = (*secrets, socket.gethostname(), api_key)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    refused: list[tuple[float, float, str]] = []  # (start, end, case) of each request answered 4xx
    try:
        for case in suite:
            headers = {"Connection": "keep-alive", **dict(case.headers)}
            if case.content_type is not None:
                headers["Content-Type"] = case.content_type
            if case.key:
                headers["X-API-Key"] = api_key
            t0 = time.perf_counter()
            try:
                conn.request(case.method, case.path, body=case.body, headers=headers)
                response = conn.getresponse()
                body = response.read()
            except (OSError, http.client.HTTPException) as exc:
                report.dropped.append(f"{case.name}: {exc!r}")
                conn.close()
                conn = http.client.HTTPConnection(host, int(port), timeout=60)
                continue
            seconds = time.perf_counter() - t0
            report.slowest = sorted([*report.slowest, (case.name, round(seconds, 3))], key=lambda x: -x[1])[
                :10
            ]
            status = response.status
            if 400 <= status < 500:
                refused.append((t0, t0 + seconds, case.name))
            if status < 300:
                report.accepted.append(f"{case.name}: {status}")
            report.statuses[str(status)] = report.statuses.get(str(status), 0) + 1
            if status >= 500 and status not in DOCUMENTED_5XX:
                report.server_errors.append(f"{case.name}: {status} {body[:200]!r}")
            problem = _problem_with_body(case, status, body, secrets)
            if problem is not None:
                report.bad_bodies.append(f"{case.name}: {status}: {problem}")
            if response.will_close:  # answered, then closed as the answer said: a new connection
                conn.close()
                conn = http.client.HTTPConnection(host, int(port), timeout=60)
                continue
            try:  # the same connection must still serve a good request
                conn.request("GET", "/healthz")
                after = conn.getresponse()
                after.read()
                if after.status != 200:
                    report.unusable_after.append(f"{case.name}: then /healthz {after.status}")
            except (OSError, http.client.HTTPException) as exc:
                report.unusable_after.append(f"{case.name}: then {exc!r}")
                conn.close()
                conn = http.client.HTTPConnection(host, int(port), timeout=60)
    finally:
        conn.close()
        health.stop.set()
        health.join(10)
    waits = sorted(health.waits)
    report.healthz_checks = len(waits)
    if waits:
        report.healthz_max_ms = round(1000 * waits[-1], 1)
        report.healthz_p99_ms = round(1000 * waits[int(0.99 * (len(waits) - 1))], 1)
    for start, end in health.spans:
        during = [name for t0, t1, name in refused if t0 < end and start < t1]
        wait_ms = round(1000 * (end - start), 1)
        if during and wait_ms > report.healthz_max_ms_while_refusing:
            report.healthz_max_ms_while_refusing, report.healthz_max_refusing_case = wait_ms, during[0]
    report.dropped += health.errors
    return report


# -- the benchmark: its own models and server ---------------------------------------------------------
def make_models(models_dir: Path) -> tuple[str, str]:
    """A small text model (`words`) and a small sparse one (`feats`); their names."""
    from service.serve import build_demo_model
    from trainer.params import TrainParams
    from trainer.synth import synth_dataset
    from trainer.train import train

    build_demo_model(models_dir, labels=200, rows=800)
    (models_dir / "demo").rename(models_dir / "words")
    ds = synth_dataset(200, 400, 1000, seed=1)
    params = TrainParams(dim=16, epochs=1, negatives=64, batch_size=256, seed=1, device="cpu", eval_every=0)
    train(params, ds, None, out_dir=models_dir / "feats" / "1")
    return "words", "feats"


def warm_up(base_url: str, text_model: str, sparse_model: str) -> None:
    """One valid request per route and model first: a path's first use (imports, compiled kernels) is
    start-up cost, not what refusing a request costs the event loop."""
    import httpx

    sparse_v2 = [{"name": "indices", "shape": [1], "datatype": "INT64", "data": [1]},
                 {"name": "values", "shape": [1], "datatype": "FP32", "data": [1.0]},
                 {"name": "offsets", "shape": [2], "datatype": "INT64", "data": [0, 1]}]
    text_v2 = [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a b"]}]
    with httpx.Client(base_url=base_url, timeout=60) as c:
        for _ in range(3):
            c.post(f"/v1/models/{text_model}/predict", json={"inputs": [{"text": "a b"}]}).raise_for_status()
            c.post(f"/v1/models/{sparse_model}/predict",
                   json={"inputs": [{"features": {"indices": [1], "values": [1.0]}}]}).raise_for_status()
            c.post(f"/v2/models/{text_model}/infer", json={"inputs": text_v2}).raise_for_status()
            c.post(f"/v2/models/{sparse_model}/infer", json={"inputs": sparse_v2}).raise_for_status()


def upload_dataset(base_url: str, api_key: str) -> str:
    """A valid XC dataset on the server, for the job cases to name."""
    import httpx

    body, ctype = _multipart("ok.txt", b"2 4 3\n0,1 0:1 1:0.5\n2 3:1\n")
    r = httpx.post(
        base_url + "/v1/datasets",
        content=body,
        headers={"Content-Type": ctype, "X-API-Key": api_key},
        timeout=60,
    )
    r.raise_for_status()
    return str(r.json()["id"])


def _serve(models_dir: Path, work: Path, api_key: str) -> tuple[subprocess.Popen[bytes], str]:
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "OVEX_API_KEY": api_key,
        "OVEX_DATA_DIR": str(work / "data"),
        "OVEX_EMBEDDED_WORKER": "false",
        "OVEX_WARMUP": "false",
        "PYTHONPATH": str(REPO),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--models-dir", str(models_dir), "--port", str(port)],
        env=env,
        cwd=work,
        stdout=open(work / "server.log", "wb"),  # noqa: SIM115 - the child's log, closed with the directory
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the server did not get ready")


def render(result: dict[str, Any]) -> str:
    r = result["report"]
    lines = [
        "# Hostile requests against `ovex serve`",
        "",
        markdown_line(result),
        "",
        "| requests | 5xx (not 503/507) | dropped | bad error bodies | connection unusable after | "
        "/healthz checks | /healthz p99 ms | /healthz max ms | /healthz max ms while a request was refused | "
        "slowest answer s |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {r['cases']} | {len(r['server_errors'])} | {len(r['dropped'])} | {len(r['bad_bodies'])} | "
        f"{len(r['unusable_after'])} | {r['healthz_checks']} | {r['healthz_p99_ms']} | "
        f"{r['healthz_max_ms']} | {r['healthz_max_ms_while_refusing']} ({r['healthz_max_refusing_case']}) | "
        f"{r['slowest'][0][1]:.3f} ({r['slowest'][0][0]}) |",
        "",
        "Statuses: " + ", ".join(f"{k}: {v}" for k, v in sorted(r["statuses"].items())),
        "",
    ]
    for title, key in (
        ("Slowest", "slowest"),
        ("Accepted", "accepted"),
        ("5xx", "server_errors"),
        ("Dropped", "dropped"),
        ("Bad bodies", "bad_bodies"),
        ("Unusable after", "unusable_after"),
    ):
        if r[key]:
            lines += [f"## {title}", "", *(f"- {x}" for x in r[key]), ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    key = "hostile-bench-key"
    st = stamp()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models = work / "models"
        text_model, sparse_model = make_models(models)
        proc, base = _serve(models, work, key)
        try:
            dataset = upload_dataset(base, key)
            warm_up(base, text_model, sparse_model)
            suite = cases(text_model, sparse_model, dataset)
            report = run_suite(base, key, suite, secrets=(str(work),))
        finally:
            proc.terminate()
            proc.wait(20)
    result = stamped(st, {"report": asdict(report)})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hostile.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "hostile.md").write_text(render(result))
    print(render(result))
    return 1 if report.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
