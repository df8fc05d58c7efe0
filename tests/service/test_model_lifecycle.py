"""A stable default model, deactivation and deletion of whole models, against a live server."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.service.conftest import API_KEY, Server, copy_version, start_server, stop_server

BODY = {"inputs": [{"features": {"indices": [3, 17, 101], "values": [1.0, 2.0, 0.5]}}], "top_k": 3}
KEY = {"X-API-Key": API_KEY}


@pytest.fixture
def srv(model_store: Path, tmp_path: Path) -> Iterator[Server]:
    """`zeta` on disk from the start; models added later are found by the server's poll."""
    models = tmp_path / "models"
    copy_version(model_store, models, "small", "1", as_name="zeta")
    s = start_server(models, tmp_path, {"OVEX_ACTIVE_POLL_S": "0.2"})
    yield s
    stop_server(s)


def add_model(srv: Server, model_store: Path, name: str, within: float = 30.0) -> None:
    """Copy a newer model into the models dir and wait until it serves."""
    dst = copy_version(model_store, srv.models_dir, "small", "2", as_name=name)
    later = time.time() + 5
    os.utime(dst / "config.json", (later, later))  # written after zeta's, whatever the copy preserved
    deadline = time.monotonic() + within
    with srv.client() as c:
        while c.post(f"/v1/models/{name}/predict", json=BODY).status_code != 200:
            assert time.monotonic() < deadline, srv.log()[-2000:]
            time.sleep(0.1)


def default_answer(c: httpx.Client) -> str:
    r = c.post("/v1/predict", json=BODY)
    assert r.status_code == 200, r.text
    return str(r.json()["model"])


def test_default_stays_when_a_model_that_sorts_first_appears(srv: Server, model_store: Path) -> None:
    with srv.client() as c:
        assert default_answer(c) == "zeta"
        add_model(srv, model_store, "big")
        assert default_answer(c) == "zeta"  # not the first by name
        listing = c.get("/v1/models").json()
        assert listing["default"] == "zeta" and listing["default_source"] == "automatic"
        flags = {m["name"]: m["default"] for m in listing["models"]}
        assert flags == {"big": False, "zeta": True}
        assert c.get("/v1/default-model").json() == {"default": "zeta", "source": "automatic"}

        # set through the API: admin key only, then every request follows it
        assert c.put("/v1/default-model", json={"model": "big"}).status_code == 401
        r = c.put("/v1/default-model", json={"model": "big"}, headers=KEY)
        assert r.status_code == 200 and r.json() == {"default": "big", "source": "api"}, r.text
        assert default_answer(c) == "big"
        r = c.put("/v1/default-model", json={"model": "nope"}, headers=KEY)
        assert r.status_code == 404 and "nope" in r.json()["detail"]
        r = c.put("/v1/default-model", json={"model": None}, headers=KEY)
        assert r.json() == {"default": "zeta", "source": "automatic"}
        assert default_answer(c) == "zeta"


def test_default_survives_a_restart(model_store: Path, tmp_path: Path) -> None:
    models = tmp_path / "models"
    copy_version(model_store, models, "small", "1", as_name="zeta")
    copy_version(model_store, models, "small", "2", as_name="big")
    srv = start_server(models, tmp_path)
    try:
        with srv.client() as c:
            assert c.put("/v1/default-model", json={"model": "big"}, headers=KEY).status_code == 200
    finally:
        stop_server(srv)
    srv = start_server(models, tmp_path)
    try:
        with srv.client() as c:
            assert default_answer(c) == "big"
    finally:
        stop_server(srv)


def test_deactivate_then_activate(srv: Server, model_store: Path) -> None:
    add_model(srv, model_store, "big")
    with srv.client() as c:
        assert c.post("/v1/models/zeta/deactivate").status_code == 401
        r = c.post("/v1/models/zeta/deactivate", headers=KEY)
        assert r.status_code == 200 and r.json() == {"name": "zeta", "deactivated": True}, r.text
        r = c.post("/v1/models/zeta/predict", json=BODY)
        assert r.status_code == 409, r.text
        detail = r.json()["detail"]
        assert "deactivated" in detail and "/v1/models/zeta/versions/1/activate" in detail
        assert default_answer(c) == "big"  # the automatic default passes a deactivated model over
        info = c.get("/v1/models/zeta").json()
        assert info["deactivated"] is True and info["active_version"] is None and info["n_versions"] == 1
        assert (srv.models_dir / "zeta" / "1").is_dir()  # its versions stay
        assert c.post("/v1/models/nope/deactivate", headers=KEY).status_code == 404

        r = c.post("/v1/models/zeta/versions/1/activate", headers=KEY)
        assert r.status_code == 200, r.text
        assert c.post("/v1/models/zeta/predict", json=BODY).status_code == 200
        assert c.get("/v1/models/zeta").json()["deactivated"] is False
        assert default_answer(c) == "zeta"


def test_delete_model(srv: Server, model_store: Path) -> None:
    add_model(srv, model_store, "big")
    with srv.client() as c:
        assert c.put("/v1/default-model", json={"model": "big"}, headers=KEY).status_code == 200
        assert c.delete("/v1/models/big").status_code == 401
        r = c.delete("/v1/models/big", headers=KEY)
        assert r.status_code == 200, r.text
        assert r.json() == {"name": "big", "versions": ["2"], "cancelled_jobs": []}
        # nothing half-deleted left: only the record of the numbers it used, so a model made again
        # under this name starts above them
        assert sorted(p.name for p in srv.models_dir.iterdir()) == ["big", "zeta"]
        assert [p.name for p in (srv.models_dir / "big").iterdir()] == [".highest-version"]
        from service.serving.catalog import next_version

        assert next_version(srv.models_dir / "big") == 3
        assert c.post("/v1/models/big/predict", json=BODY).status_code == 404
        assert [m["name"] for m in c.get("/v1/models").json()["models"]] == ["zeta"]
        assert c.get("/v1/default-model").json() == {"default": "zeta", "source": "automatic"}
        assert default_answer(c) == "zeta"
        assert c.delete("/v1/models/big", headers=KEY).status_code == 404
