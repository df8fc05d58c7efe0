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


def test_cli_train_base_flags_make_the_job_base(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from ovex_client import cli

    sent: list[dict[str, object]] = []
    monkeypatch.setattr(cli, "Client", lambda url, key, **kw: _client(sent))
    run = ["--url", "http://x", "train", "--dataset", "7", "--model", "m"]
    assert cli.main([*run]) == 0 and "base" not in sent[-1]
    assert cli.main([*run, "--base"]) == 0 and sent[-1]["base"] == {}  # the active version
    assert cli.main([*run, "--base", "3", "--base-model", "old", "--replay-dataset", "5"]) == 0
    assert sent[-1]["base"] == {"version": "3", "model": "old", "replay_dataset": "5"}
    n = len(sent)
    assert cli.main([*run, "--replay-dataset", "5"]) == 2
    assert "need --base" in capsys.readouterr().err and len(sent) == n
