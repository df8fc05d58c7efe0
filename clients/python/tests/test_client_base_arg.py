"""`submit_job(base=...)`: a wrong `base` is a TypeError saying what to pass, not a failure inside dict(),
and a version given as a number is sent as the string the server names versions by."""

from __future__ import annotations

import json

import httpx
import pytest
from ovex_client import Client

JOB = {"id": "1", "state": "queued", "model": "m", "created_at": "2026-01-01T00:00:00Z"}


def _client(sent: list[dict[str, object]]) -> Client:
    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(202, json=JOB)

    return Client("http://test", transport=httpx.MockTransport(handler))


@pytest.mark.parametrize("base", ["3", 3, ["m", "3"]])
def test_a_base_that_is_not_a_mapping_is_named(base: object) -> None:
    sent: list[dict[str, object]] = []
    with pytest.raises(TypeError, match=r"base must be a mapping such as \{'model'"):
        _client(sent).submit_job("m", 1, base=base)  # type: ignore[arg-type]
    assert not sent


def test_a_numeric_version_is_sent_as_a_string() -> None:
    sent: list[dict[str, object]] = []
    _client(sent).submit_job("m", 1, base={"model": "m", "version": 3})
    assert sent[0]["base"] == {"model": "m", "version": "3"}
