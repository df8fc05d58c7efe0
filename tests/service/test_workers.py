"""`ovex serve --workers 2`: two processes on one port follow one active version, under load too."""

from __future__ import annotations

import asyncio
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
