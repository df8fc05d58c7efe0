"""A name or id longer than any stored one is refused before it is looked up, and never echoed back whole."""

from __future__ import annotations

import pytest

from tests.service.conftest import API_KEY, Server

LONG = "n" * 5000


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", f"/v1/models/{LONG}"),
        ("GET", f"/v1/models/{LONG}/versions"),
        ("POST", f"/v1/models/{LONG}/predict"),
        ("POST", f"/v1/models/{LONG}/versions/1/activate"),
        ("DELETE", f"/v1/models/small/versions/{LONG}"),
        ("GET", f"/v2/models/{LONG}"),
        ("POST", f"/v2/models/{LONG}/infer"),
        ("GET", f"/v1/jobs/{LONG}"),
        ("GET", f"/v1/datasets/{LONG}"),
    ],
)
def test_a_long_name_is_a_short_422(server: Server, method: str, path: str) -> None:
    body = {"inputs": [{"text": "a"}]} if method == "POST" else None
    with server.client(headers={"X-API-Key": API_KEY}) as client:
        r = client.request(method, path, json=body)
        assert r.status_code in (400, 422), r.text[:300]
        assert len(r.content) < 1000 and LONG not in r.text
        assert ("error" if path.startswith("/v2/") else "detail") in r.json()
        assert client.get("/healthz").status_code == 200  # the same connection answers the next request
