"""The SDK's paging and delete calls, sync and async, against httpx.MockTransport: the cursors it follows,
the methods and paths it sends, and the key as a bearer token."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from ovex_client import AsyncClient, Client, Conflict

JOB = {"id": "j", "state": "succeeded", "model": "m"}


def _server(seen: list[httpx.Request]) -> httpx.MockTransport:
    """Three jobs over two pages; deletes answer 204, except the active version (409). A MockTransport
    serves the sync and the async client alike."""

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        if req.method == "GET" and req.url.path == "/v1/jobs":
            if req.url.params.get("cursor") == "c1":
                return httpx.Response(200, json={"jobs": [{**JOB, "id": "j3"}], "next_cursor": None})
            jobs = [{**JOB, "id": "j1"}, {**JOB, "id": "j2"}]
            return httpx.Response(200, json={"jobs": jobs, "next_cursor": "c1"})
        if req.method == "GET" and req.url.path == "/v1/datasets":
            return httpx.Response(200, json={"datasets": [], "next_cursor": None})
        if req.method == "DELETE" and req.url.path.endswith("/versions/2"):
            return httpx.Response(409, json={"detail": "version '2' of model 'm' is the active one"})
        if req.method == "DELETE":
            return httpx.Response(204)
        return httpx.Response(404, json={"detail": "no"})

    return httpx.MockTransport(handler)


def _check(seen: list[httpx.Request], ids: list[str]) -> None:
    assert ids == ["j1", "j2", "j3"]
    pages = [r for r in seen if r.url.path == "/v1/jobs"]
    assert [r.url.params.get("cursor") for r in pages] == [None, "c1"]
    assert all(r.url.params["limit"] == "2" and r.url.params["state"] == "succeeded" for r in pages)
    deletes = [(r.method, r.url.raw_path.decode()) for r in seen if r.method == "DELETE"]
    assert deletes == [
        ("DELETE", "/v1/jobs/j1"),
        ("DELETE", "/v1/datasets/ds%2F1"),  # escaped: a name cannot walk the URL
        ("DELETE", "/v1/models/m/versions/1"),
        ("DELETE", "/v1/models/m/versions/2"),
    ]
    assert all(r.headers["authorization"] == "Bearer k" for r in seen)


def test_sync_pages_and_deletes() -> None:
    seen: list[httpx.Request] = []
    with Client("http://ovex.test", "k", transport=_server(seen)) as c:
        ids = [j.id for j in c.iter_jobs("succeeded", page_size=2)]
        assert list(c.iter_datasets()) == []
        c.delete_job("j1")
        c.delete_dataset("ds/1")
        c.delete_version("m", 1)
        with pytest.raises(Conflict, match="active"):
            c.delete_version("m", 2)
    _check(seen, ids)


def test_async_pages_and_deletes() -> None:
    seen: list[httpx.Request] = []

    async def go() -> list[str]:
        async with AsyncClient("http://ovex.test", "k", transport=_server(seen)) as c:
            ids = [j.id async for j in c.iter_jobs("succeeded", page_size=2)]
            assert [d async for d in c.iter_datasets()] == []
            await c.delete_job("j1")
            await c.delete_dataset("ds/1")
            await c.delete_version("m", 1)
            with pytest.raises(Conflict, match="active"):
                await c.delete_version("m", 2)
            return ids

    _check(seen, asyncio.run(go()))



def _models_server(seen: list[httpx.Request]) -> httpx.MockTransport:
    """Models over two pages (an older server's answer, without a cursor, is one page); a model's versions
    over two pages."""

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        path, cursor = req.url.path, req.url.params.get("cursor")
        if path == "/v1/models":
            if cursor == "m1":
                return httpx.Response(200, json={"default": "a", "models": [{"name": "b", "versions": []}],
                                                 "next_cursor": None})
            first = {"name": "a", "active_version": "9", "versions": ["8", "9"], "n_versions": 9,
                     "versions_cursor": "v8"}
            return httpx.Response(200, json={"default": "a", "models": [first], "next_cursor": "m1"})
        if path == "/v1/models/a/versions":
            if cursor == "v8":
                return httpx.Response(200, json={"versions": [{"version": "7"}], "next_cursor": None})
            return httpx.Response(200, json={"versions": [{"version": "9"}, {"version": "8"}],
                                             "next_cursor": "v8"})
        return httpx.Response(404, json={"detail": "no"})

    return httpx.MockTransport(handler)


def test_models_and_versions_are_walked_page_by_page() -> None:
    """`list_models` returns every model however many pages the server cuts them into; `iter_versions`
    walks a model's versions newest first; both clients."""
    seen: list[httpx.Request] = []
    with Client("http://ovex.test", "k", transport=_models_server(seen)) as c:
        models = c.list_models()
        versions = [v.version for v in c.iter_versions("a", page_size=2)]
        page = c.list_versions("a", limit=2)
        assert c.default_model() == "a"

    async def go() -> tuple[list[str], list[str]]:
        async with AsyncClient("http://ovex.test", "k", transport=_models_server([])) as ac:
            names = [m.name for m in await ac.list_models()]
            return names, [v.version async for v in ac.iter_versions("a", page_size=2)]

    assert [m.name for m in models] == ["a", "b"] and models[0].n_versions == 9
    assert models[0].versions_cursor == "v8" and [v.version for v in models[0].versions] == ["8", "9"]
    assert versions == ["9", "8", "7"] and [v.version for v in page] == ["9", "8"]
    assert asyncio.run(go()) == (["a", "b"], ["9", "8", "7"])
    listed = [r.url.params.get("cursor") for r in seen if r.url.path == "/v1/models"]
    assert listed[:2] == [None, "m1"]
    walked = [(r.url.params.get("cursor"), r.url.params.get("limit")) for r in seen
              if r.url.path == "/v1/models/a/versions"]
    assert walked == [(None, "2"), ("v8", "2"), (None, "2")]
