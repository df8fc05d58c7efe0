"""`ovex serve --workers 2`: two processes on one port follow one active version, under load too; the
supervisor replaces a worker that is killed or hangs, and none outlives it; /metrics sums both."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service.conftest import API_KEY, Server, copy_version, start_server, stop_server

BODY = {
    "inputs": [{"features": {"indices": [3, 17, 101, 250], "values": [1.0, 2.0, 0.5, 1.5]}}],
    "top_k": 5,
}


def versions_by_worker(srv: Server, want_workers: int = 2, within: float = 60.0) -> dict[str, str]:
    """Active version of `m` per worker pid, asking on fresh connections until every worker answered."""
    seen: dict[str, str] = {}
    deadline = time.monotonic() + within
    while len(seen) < want_workers and time.monotonic() < deadline:
        r = httpx.get(srv.base + "/readyz", timeout=10)
        if r.status_code == 200:
            seen[r.headers["x-ovex-worker"]] = r.json()["models"]["m"]
        time.sleep(0.05)
    assert len(seen) == want_workers, f"only workers {sorted(seen)} answered in {within}s"
    return seen


def all_workers_serve(srv: Server, version: str, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if set(versions_by_worker(srv).values()) == {version}:
            return
    raise AssertionError(f"not every worker serves {version!r} after {within}s: {versions_by_worker(srv)}")


@pytest.fixture
def two_workers(model_store: Path, tmp_path: Path) -> Any:
    models = tmp_path / "models"
    copy_version(model_store, models, "small", "1", as_name="m")
    copy_version(model_store, models, "small", "2", as_name="m")
    srv = start_server(models, tmp_path, {"OVEX_WORKERS": "2", "OVEX_THREADS": "2"})
    yield srv, tmp_path
    stop_server(srv)


def test_two_workers_agree_after_an_activation_and_after_a_restart(two_workers: tuple[Server, Path]) -> None:
    srv, work = two_workers
    assert set(versions_by_worker(srv).values()) == {"2"}
    with srv.client() as c:
        r = c.post("/v1/models/m/versions/1/activate", headers={"X-API-Key": API_KEY})
    assert r.status_code == 200, r.text
    all_workers_serve(srv, "1", within=5.0)
    stop_server(srv)
    srv2 = start_server(srv.models_dir, work, {"OVEX_WORKERS": "2", "OVEX_THREADS": "2"})
    try:
        assert set(versions_by_worker(srv2).values()) == {"1"}
    finally:
        stop_server(srv2)


def _answer(body: dict[str, Any]) -> list[list[tuple[int, float]]]:
    return [[(lb["id"], round(lb["prob"], 6)) for lb in p["labels"]] for p in body["predictions"]]


def test_2000_requests_across_workers_while_activating(two_workers: tuple[Server, Path]) -> None:
    """Zero errors, and every answer is exactly the answer of the version it names."""
    srv, _ = two_workers
    versions_by_worker(srv)  # both workers up
    with srv.client() as c:
        ref = {"2": _answer(c.post("/v1/models/m/predict", json=BODY).json())}
    n_total, concurrency = 2000, 16
    results: list[tuple[int, str | None, str, Any]] = []
    swapped: dict[str, float] = {}

    async def main() -> None:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=srv.base, timeout=30, limits=limits) as ac:
            counter = iter(range(n_total))

            async def worker() -> None:
                for i in counter:
                    # a fresh connection now and then, so the kernel spreads requests over both workers
                    headers = {"connection": "close"} if i % 5 == 0 else {}
                    r = await ac.post("/v1/models/m/predict", json=BODY, headers=headers)
                    pid = r.headers.get("x-ovex-worker", "?")
                    if r.status_code == 200:
                        body = r.json()
                        results.append((200, body["version"], pid, _answer(body)))
                    else:
                        results.append((r.status_code, None, pid, r.text))

            async def activator() -> None:
                while len(results) < n_total // 4:
                    await asyncio.sleep(0.01)
                r = await ac.post("/v1/models/m/versions/1/activate", headers={"X-API-Key": API_KEY})
                assert r.status_code == 200, r.text
                swapped["at"] = time.monotonic()

            await asyncio.gather(activator(), *[worker() for _ in range(concurrency)])

    asyncio.run(main())
    with srv.client() as c:
        ref["1"] = _answer(c.post("/v1/models/m/predict", json=BODY).json())
    assert ref["1"] != ref["2"]  # the versions answer differently, so a mixed answer would show
    errors = [r for r in results if r[0] != 200]
    assert len(results) == n_total and not errors, errors[:3]
    for _, version, _, ans in results:
        assert version in ref and ans == ref[version]
    assert {r[1] for r in results} == {"1", "2"}
    assert len({r[2] for r in results}) == 2, "both workers answered"
    all_workers_serve(srv, "1", within=5.0)


def _children(pid: int) -> list[Any]:
    import psutil

    return psutil.Process(pid).children(recursive=True)


def _gone(procs: list[Any], within: float) -> list[Any]:
    """The processes still running (zombies count as gone: nothing runs) after waiting `within` s."""
    import psutil

    _, alive = psutil.wait_procs(procs, timeout=within)
    return [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_a_killed_worker_is_replaced_and_requests_keep_succeeding(two_workers: tuple[Server, Path]) -> None:
    """SIGKILL one worker: every request succeeds while a fresh fork takes its place, because the
    replacement takes connections only once its model is loaded."""
    import os
    import signal

    srv, _ = two_workers
    before = versions_by_worker(srv)
    serving = {str(c.pid) for c in _children(srv.proc.pid)}
    assert set(before) <= serving, "the workers answering are the supervisor's children"
    victim = int(sorted(before)[0])
    os.kill(victim, signal.SIGKILL)
    # eight clients on fresh connections until the replacement answers one: the whole window of its start
    answered: list[str] = []
    failed: list[str] = []

    async def client() -> None:
        deadline = time.monotonic() + 90
        async with httpx.AsyncClient(base_url=srv.base, timeout=30) as ac:
            while time.monotonic() < deadline and not set(answered) - set(before) and not failed:
                r = await ac.post("/v1/models/m/predict", json=BODY, headers={"Connection": "close"})
                if r.status_code != 200:
                    failed.append(f"request {len(answered)} after the kill: {r.status_code} {r.text}")
                answered.append(r.headers["x-ovex-worker"])

    async def clients() -> None:
        await asyncio.gather(*[client() for _ in range(8)])

    asyncio.run(clients())
    assert not failed, failed[:3]
    assert str(victim) not in answered
    replacement = set(answered) - set(before)
    assert len(replacement) == 1, f"no replacement answered in 90 s ({len(answered)} requests)"
    assert {c.pid for c in _children(srv.proc.pid)} >= {int(p) for p in replacement}
    after = versions_by_worker(srv, within=90)
    assert str(victim) not in after and len(after) == 2, after
    assert set(after.values()) == {"2"}, "the replacement serves the active version"
    assert srv.proc.poll() is None
    assert "serving process exited; restarting" in srv.log() and "SIGKILL" in srv.log()


def test_a_hung_worker_is_killed_and_replaced(model_store: Path, tmp_path: Path) -> None:
    """SIGSTOP freezes a worker's event loop: its heartbeats stop, the supervisor kills and replaces it,
    and the other worker answers every request meanwhile."""
    import signal

    import psutil

    models = tmp_path / "models"
    copy_version(model_store, models, "small", "1", as_name="m")
    # the hang limit is twice the request timeout (at least 5 s)
    srv = start_server(models, tmp_path, {"OVEX_WORKERS": "2", "OVEX_REQUEST_TIMEOUT_S": "3"})
    try:
        frozen = psutil.Process(int(sorted(versions_by_worker(srv))[0]))
        frozen.suspend()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "serving process unresponsive" not in srv.log():
            r = httpx.post(srv.base + "/v1/models/m/predict", json=BODY, timeout=30)
            assert r.status_code == 200 and r.headers["x-ovex-worker"] != str(frozen.pid), r.text
            time.sleep(0.2)
        assert "serving process unresponsive" in srv.log()
        assert _gone([frozen], within=10) == []
        after = versions_by_worker(srv, within=60)
        assert str(frozen.pid) not in after and len(after) == 2, after
    finally:
        for child in _children(srv.proc.pid):
            with contextlib.suppress(psutil.NoSuchProcess):
                child.send_signal(signal.SIGCONT)
        stop_server(srv)


def test_sigterm_to_the_supervisor_leaves_no_process_behind(model_store: Path, tmp_path: Path) -> None:
    """Both serving workers and the job worker stop with the supervisor."""
    models = tmp_path / "models"
    copy_version(model_store, models, "small", "1", as_name="m")
    srv = start_server(models, tmp_path, {"OVEX_WORKERS": "2", "OVEX_EMBEDDED_WORKER": "true"})
    try:
        versions_by_worker(srv)
        children = _children(srv.proc.pid)
        assert len(children) >= 3, children  # two serving workers and the job worker
        srv.proc.terminate()
        assert srv.proc.wait(30) == 0
        assert _gone(children, within=10) == []
    finally:
        stop_server(srv)


def test_workers_stop_when_the_supervisor_is_killed(model_store: Path, tmp_path: Path) -> None:
    """SIGKILL leaves the supervisor no chance to stop them: the kernel tells them instead."""
    models = tmp_path / "models"
    copy_version(model_store, models, "small", "1", as_name="m")
    srv = start_server(models, tmp_path, {"OVEX_WORKERS": "2"})
    try:
        workers = _children(srv.proc.pid)
        assert len(workers) == 2
        srv.proc.kill()
        srv.proc.wait(10)
        assert _gone(workers, within=30) == []
    finally:
        stop_server(srv)


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--workers", "0"], {}, "--workers: Input should be greater than or equal to 1"),
        ([], {"OVEX_WORKERS": "many"}, "OVEX_WORKERS: Input should be a valid integer"),
        ([], {"OVEX_ACTIVE_POLL_S": "0"}, "OVEX_ACTIVE_POLL_S: Input should be greater than 0"),
    ],
)
def test_bad_serving_settings_are_one_line_errors(args: list[str], env: dict[str, str], message: str) -> None:
    import os
    import subprocess
    import sys

    from tests.service.conftest import REPO

    proc = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve", *args],
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_metrics_sum_every_worker(two_workers: tuple[Server, Path]) -> None:
    """/metrics counts the requests of both workers, whichever answers the scrape."""
    import re

    srv, _ = two_workers
    versions_by_worker(srv)
    n = 60
    answered = set()
    for _ in range(n):  # a fresh connection each: the kernel hands them to both workers
        r = httpx.post(srv.base + "/v1/models/m/predict", json=BODY, timeout=30)
        assert r.status_code == 200, r.text
        answered.add(r.headers["x-ovex-worker"])
    assert len(answered) == 2, "both workers answered"
    series = 'ovex_requests_total{method="POST",route="/v1/models/{name}/predict",status="200"}'
    for _ in range(6):  # scrapes land on either worker; each sees the sum
        text = httpx.get(srv.base + "/metrics", timeout=10).text
        found = re.search(re.escape(series) + r" (\S+)", text)
        assert found and float(found.group(1)) == n, text[:2000]
        assert 'ovex_models_loaded{model="m",version="2"} 1.0' in text


def test_workers_split_the_threads_between_them() -> None:
    from service.serve import serving_process_settings
    from service.settings import Settings

    child = serving_process_settings(Settings(workers=2, threads=4, lone_scan_threads=4))
    assert (child.threads, child.lone_scan_threads, child.embedded_worker) == (2, 2, False)
    alone = serving_process_settings(Settings(workers=4, threads=2, lone_scan_threads=2))
    assert alone.lone_scan_threads == 1


def test_a_burst_of_connections_is_shared_between_the_workers(two_workers: tuple[Server, Path]) -> None:
    """A client that opens its pool of connections at once (8 here, kept alive) gets them spread over both
    workers, not all taken by whichever woke first: each worker holds at least a quarter, in every burst."""
    import socket

    srv, _ = two_workers
    versions_by_worker(srv)
    port = int(srv.base.rsplit(":", 1)[1])
    body = (b'{"inputs": [{"features": {"indices": [3, 17], "values": [1.0, 2.0]}}], "top_k": 3}')
    request = (f"POST /v1/models/m/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    for burst in range(3):
        conns = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(8)]
        try:
            time.sleep(0.3)  # every connection accepted (or waiting) before any request
            workers = []
            for c in conns:
                c.sendall(request)
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = c.recv(65536)
                    assert chunk, "connection closed before the response"
                    head += chunk
                assert head.startswith(b"HTTP/1.1 200"), head[:200]
                line = next(x for x in head.split(b"\r\n") if x.lower().startswith(b"x-ovex-worker:"))
                workers.append(line.split(b":", 1)[1].strip())
            counts = sorted((workers.count(w) for w in set(workers)), reverse=True)
            assert len(counts) == 2 and counts[1] >= 2, f"burst {burst}: connections per worker {counts}"
        finally:
            for c in conns:
                c.close()
        time.sleep(0.3)  # both workers see their connections closed
