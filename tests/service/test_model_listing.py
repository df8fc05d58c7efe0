"""GET /v1/models is bounded and paged: models by name a page at a time, each with its newest versions and
their count; a model's versions are paged by GET /v1/models/{name}/versions (newest first). Bad paging
values are a 422 that names the parameter. Against a real server, with hundreds of versions on disk."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.service.conftest import Server, start_server, stop_server

N_VERSIONS = 250
MODELS = ["big", *(f"m{i}" for i in range(5))]


@pytest.fixture(scope="module")
def crowded(model_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Model `big` with versions 1..250 (hard links of one artifact) and five models of one version."""
    work = tmp_path_factory.mktemp("crowded")
    models = work / "models"
    for v in range(1, N_VERSIONS + 1):
        shutil.copytree(model_store / "small" / "1", models / "big" / str(v), copy_function=os.link)
    for name in MODELS[1:]:
        shutil.copytree(model_store / "small" / "1", models / name / "1", copy_function=os.link)
    srv = start_server(models, work)
    yield srv
    stop_server(srv)


def _versions(items: list[dict[str, Any]]) -> list[int]:
    return [int(v["version"]) for v in items]


def test_models_are_listed_a_page_at_a_time_with_their_newest_versions(crowded: Server) -> None:
    with crowded.client() as c:
        seen: list[str] = []
        cursor = None
        for _ in range(10):
            r = c.get("/v1/models", params={"limit": 2, **({"cursor": cursor} if cursor else {})})
            assert r.status_code == 200, r.text
            page = r.json()
            assert len(page["models"]) <= 2
            seen += [m["name"] for m in page["models"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == MODELS  # by name, each once

        big = c.get("/v1/models").json()["models"][0]
        assert big["name"] == "big" and big["n_versions"] == N_VERSIONS
        assert big["active_version"] == str(N_VERSIONS)
        assert _versions(big["versions"]) == list(range(N_VERSIONS - 19, N_VERSIONS + 1))  # newest 20
        assert big["versions"][-1]["active"] is True and big["versions"][-1]["n_labels"] == 200
        assert big["versions_cursor"]
        small = c.get("/v1/models").json()["models"][1]
        assert small["n_versions"] == 1 and small["versions_cursor"] is None

        one = c.get("/v1/models/big", params={"versions": 5}).json()
        assert _versions(one["versions"]) == list(range(N_VERSIONS - 4, N_VERSIONS + 1))
        counted = c.get("/v1/models/big", params={"versions": 0}).json()
        assert counted["versions"] == [] and counted["n_versions"] == N_VERSIONS
        assert len(c.get("/v1/models/big").json()["versions"]) == 100  # bounded by default too

        # the older versions, a page at a time from where the listing stopped, newest first
        got, cursor = _versions(big["versions"]), big["versions_cursor"]
        pages = 0
        while cursor is not None:
            r = c.get("/v1/models/big/versions", params={"limit": 100, "cursor": cursor})
            assert r.status_code == 200, r.text
            page = r.json()
            assert len(page["versions"]) <= 100
            got += _versions(page["versions"])
            cursor = page["next_cursor"]
            pages += 1
            if pages == 1:  # a version deleted between two pages shifts nothing (keyset paging)
                shutil.rmtree(crowded.models_dir / "big" / "100")
        assert pages == 3
        assert sorted(got) == [v for v in range(1, N_VERSIONS + 1) if v != 100] and len(set(got)) == len(got)
        first = c.get("/v1/models/big/versions", params={"limit": 3}).json()
        assert _versions(first["versions"]) == [N_VERSIONS, N_VERSIONS - 1, N_VERSIONS - 2]


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/v1/models", {"limit": 0}, "limit"),
        ("/v1/models", {"limit": 1001}, "limit"),
        ("/v1/models", {"limit": "ten"}, "limit"),
        ("/v1/models", {"versions": -1}, "versions"),
        ("/v1/models", {"versions": 5000}, "versions"),
        ("/v1/models", {"cursor": "not-a-cursor"}, "cursor"),
        ("/v1/models", {"cursor": "x" * 401}, "cursor"),
        ("/v1/models/big", {"versions": 1001}, "versions"),
        ("/v1/models/big/versions", {"limit": 100000}, "limit"),
        ("/v1/models/big/versions", {"cursor": "bm9wZQ"}, "cursor"),
    ],
)
def test_bad_paging_values_are_a_422_naming_the_parameter(
    crowded: Server, path: str, params: dict[str, Any], field: str
) -> None:
    with crowded.client() as c:
        r = c.get(path, params=params)
    assert r.status_code == 422, r.text
    [err] = r.json()["detail"]
    assert err["loc"] == ["query", field] and err["msg"], err
    assert str(crowded.models_dir) not in r.text and "Traceback" not in r.text


def test_a_cursor_works_only_where_it_was_handed_out(crowded: Server) -> None:
    with crowded.client() as c:
        models_cursor = c.get("/v1/models", params={"limit": 1}).json()["next_cursor"]
        big_cursor = c.get("/v1/models/big/versions", params={"limit": 1}).json()["next_cursor"]
        wrong = [("/v1/models/big/versions", models_cursor), ("/v1/models/m0/versions", big_cursor),
                 ("/v1/models", big_cursor)]
        for path, cursor in wrong:
            r = c.get(path, params={"cursor": cursor})
            assert r.status_code == 422, (path, r.text)
            assert "previous page" in r.json()["detail"][0]["msg"]
        assert c.get("/v1/models/nope/versions").status_code == 404
