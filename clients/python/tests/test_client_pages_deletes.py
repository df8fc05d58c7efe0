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

