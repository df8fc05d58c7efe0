"""Hot swap under load (issue 4, must-show 3) and refusal of versions that fail to load."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.serving.active import ActiveVersions
from tests.service.conftest import API_KEY, Server, copy_version, start_server, stop_server

BODY = {
    "inputs": [{"features": {"indices": [3, 17, 101, 250], "values": [1.0, 2.0, 0.5, 1.5]}}],
    "top_k": 5,
    "normalization": "sparsemax",
}


@pytest.fixture(scope="module")
def swap_server(model_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Model `m` with versions 1 and 2 on disk; version 1 chosen in an older ovex's active.json, which the
    server adopts into its database, so it serves first."""
    work = tmp_path_factory.mktemp("swap")
    models = work / "models"
    copy_version(model_store, models, "small", "1", as_name="m")
    copy_version(model_store, models, "small", "2", as_name="m")
    (models / "active.json").write_text(json.dumps({"models": {"m": "1"}}))
    # a model whose highest version is broken: the next one down serves
    copy_version(model_store, models, "small", "1", as_name="fallback", as_version="1")
    broken = copy_version(model_store, models, "small", "2", as_name="fallback", as_version="2")
    (broken / "weights.safetensors").write_bytes(b"\x00" * 64)
    srv = start_server(models, work)
    yield srv
    stop_server(srv)


def recorded(srv: Server) -> dict[str, str]:
    """The active versions as the database holds them (the server's data dir is beside its models)."""
    store = ActiveVersions.for_url(f"sqlite:///{srv.models_dir.parent / 'data' / 'ovex.db'}")
    try:
        return store.all()
    finally:
        store.close()


def test_legacy_activation_file_is_imported_once(swap_server: Server) -> None:
    assert not (swap_server.models_dir / "active.json").exists()
    assert (swap_server.models_dir / "active.json.imported").exists()
    assert recorded(swap_server)["fallback"] == "1"  # the first choice for a model nobody activated


def _answer(r: httpx.Response) -> tuple[str, Any]:
    body = r.json()
    return body["version"], [
        [(lb["id"], round(lb["prob"], 6)) for lb in p["labels"]] for p in body["predictions"]
    ]


def test_startup_falls_back_below_a_broken_version(swap_server: Server) -> None:
    with swap_server.client() as c:
        info = c.get("/v1/models/fallback").json()
    assert info["active_version"] == "1"
    v2 = next(v for v in info["versions"] if v["version"] == "2")
    assert v2["error"] and "weights.safetensors" in v2["error"]
    assert '"model version refused"' in swap_server.log() and '"fallback"' in swap_server.log()


def test_hot_swap_under_load(swap_server: Server) -> None:
    with swap_server.client() as c:
        assert c.get("/v1/models/m").json()["active_version"] == "1"
        ref1 = _answer(c.post("/v1/models/m/predict", json=BODY))
    assert ref1[0] == "1"

    n_total, concurrency = 2000, 16
    results: list[tuple[float, float, int, str | None, Any]] = []
    swap_times: dict[str, float] = {}

    async def main() -> None:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=swap_server.base, timeout=30, limits=limits) as ac:
            counter = iter(range(n_total))

            async def worker() -> None:
                for _ in counter:
                    t0 = time.monotonic()
                    r = await ac.post("/v1/models/m/predict", json=BODY)
                    t1 = time.monotonic()
                    if r.status_code == 200:
                        v, ans = _answer(r)
                        results.append((t0, t1, 200, v, ans))
                    else:
                        results.append((t0, t1, r.status_code, None, r.text))

            async def swapper() -> None:
                while len(results) < n_total // 4:
                    await asyncio.sleep(0.01)
                swap_times["start"] = time.monotonic()
                r = await ac.post("/v1/models/m/versions/2/activate", headers={"X-API-Key": API_KEY})
                swap_times["end"] = time.monotonic()
                assert r.status_code == 200, r.text
                assert r.json() == {"name": "m", "active_version": "2", "previous_version": "1"}

            await asyncio.gather(swapper(), *[worker() for _ in range(concurrency)])

    asyncio.run(main())
    with swap_server.client() as c:
        ref2 = _answer(c.post("/v1/models/m/predict", json=BODY))
    assert ref2[0] == "2" and ref2[1] != ref1[1]  # the two versions answer differently

    assert len(results) == n_total
    errors = [r for r in results if r[2] != 200]
    assert not errors, errors[:3]
    for t0, t1, _, version, ans in results:
        assert ans == (ref1[1] if version == "1" else ref2[1])  # whole answer from the version it names
        if t1 < swap_times["start"]:
            assert version == "1"
        if t0 > swap_times["end"]:
            assert version == "2"
    assert {r[3] for r in results} == {"1", "2"}
    assert recorded(swap_server)["m"] == "2"


def test_broken_version_is_refused_and_the_old_one_keeps_serving(swap_server: Server) -> None:
    models = swap_server.models_dir
    bad = models / "m" / "7"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with swap_server.client() as c:
        before = c.get("/v1/models/m").json()["active_version"]
        r = c.post("/v1/models/m/versions/7/activate", headers={"X-API-Key": API_KEY})
        assert r.status_code == 409, r.text
        assert "failed to load" in r.json()["detail"] and "keeps serving" in r.json()["detail"]
        info = c.get("/v1/models/m").json()
        assert info["active_version"] == before
        assert next(v for v in info["versions"] if v["version"] == "7")["error"]
        p = c.post("/v1/models/m/predict", json=BODY)
        assert p.status_code == 200 and p.json()["version"] == before
    assert recorded(swap_server)["m"] == before
