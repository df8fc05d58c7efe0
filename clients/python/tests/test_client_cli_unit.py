"""The command line's own logic: flag parsing, input files with line-numbered errors, exit codes."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from ovex_client import Client, cli
from ovex_client.models import JobEvent, JobProgress


def test_params_parse_json_values_and_reject_bad_pairs() -> None:
    pairs = ["epochs=3", "lr=0.5", "loss=ove", "encoder=\"mlp\""]
    assert cli.parse_params(pairs, '{"dim": 8, "epochs": 1}') == {
        "dim": 8, "epochs": 3, "lr": 0.5, "loss": "ove", "encoder": "mlp"
    }
    with pytest.raises(cli.UsageError, match="KEY=VALUE"):
        cli.parse_params(["epochs"], None)
    with pytest.raises(cli.UsageError, match="JSON object"):
        cli.parse_params([], "[1]")


def test_rows_file_errors_name_file_and_line(tmp_path: Path) -> None:
    good = tmp_path / "rows.jsonl"
    good.write_text('{"text": "a", "labels": ["x"]}\n\n{"features": {"indices": [1], "values": [2.0]}}\n')
    assert list(cli.read_rows(good)) == [
        {"text": "a"}, {"features": {"indices": [1], "values": [2.0]}}
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"text": \n')
    with pytest.raises(cli.UsageError, match=r"bad.jsonl:2: not valid JSON"):
        list(cli.read_rows(bad))
    bad.write_text('{"text": "a"}\n{"txt": "b"}\n')
    with pytest.raises(cli.UsageError, match=r"bad.jsonl:2: needs a \"text\" or a \"features\" field"):
        list(cli.read_rows(bad))
    bad.write_bytes(b'{"text": "a"}\n{"text": "\xff\xfe"}\n')
    with pytest.raises(cli.UsageError, match=r"bad.jsonl:2: not UTF-8"):
        list(cli.read_rows(bad))
    with pytest.raises(cli.UsageError, match="cannot open"):
        list(cli.read_rows(tmp_path / "missing.jsonl"))


def test_progress_line_draws_a_bar() -> None:
    prog = JobProgress(step=25, steps_total=100, epoch=1, epochs=4, loss=0.25)
    line = cli.progress_line("j1", "running", prog)
    assert line.startswith("[#######.....................]  25.0%")
    assert "epoch 1/4" in line and "loss 0.2500" in line


def fake_server(monkeypatch: pytest.MonkeyPatch, answers: dict[str, Any]) -> list[httpx.Request]:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        status, body = answers[f"{req.method} {req.url.path}"]
        return httpx.Response(status, json=body)

    def factory(url: str | None, key: str | None, **kw: Any) -> Client:
        return Client(url, key, transport=httpx.MockTransport(handler), retries=0, **kw)

    monkeypatch.setattr(cli, "Client", factory)
    return seen


def test_exit_codes(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    pred = {"model": "m", "version": 1, "predictions": [{"labels": [{"id": 0, "name": "a", "score": 1.0}]}]}
    seen = fake_server(monkeypatch, {
        "POST /v1/predict": (200, pred),
        "POST /v1/models/none/predict": (404, {"detail": "unknown model 'none'"}),
    })
    assert cli.main(["--url", "http://x", "predict", "hello"]) == 0
    assert json.loads(seen[0].content)["inputs"] == [{"text": "hello"}]
    assert "model m version 1" in capsys.readouterr().out
    assert cli.main(["--url", "http://x", "predict", "--model", "none", "hello"]) == 1
    assert "server said 404: unknown model 'none'" in capsys.readouterr().err
    assert cli.main(["--url", "http://x", "predict"]) == 2
    assert cli.main(["--url", "http://x", "train", "--dataset", "no/such.txt", "--model", "m"]) == 2
    assert "no/such.txt: no such file" in capsys.readouterr().err


def test_unreachable_server_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    # Port 9 on loopback (discard) is closed here; the client must fail fast with a clear line.
    assert cli.main(["--url", "http://127.0.0.1:9", "--timeout", "2", "models", "list"]) == 3
    err = capsys.readouterr().err
    assert err == ("ovex-client: the server at http://127.0.0.1:9 (from --url) could not be reached "
                   "(Connection refused); set OVEX_URL or --url to where ovex runs\n")


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_view_redraws_one_line_on_a_terminal() -> None:
    out = FakeTTY()
    view = cli.ProgressView("j1", out)
    view(JobEvent(event="state", data={"state": "running"}))
    view(JobEvent(event="progress", data={"epoch": 1, "epochs": 2, "step": 5, "steps_total": 10}))
    view(JobEvent(event="state", data={"state": "succeeded"}))
    view.finish()
    text = out.getvalue()
    assert text.count("\r\033[K") == 3 and text.endswith("succeeded  epoch 1/2\n")
    assert "[##############..............]  50.0%" in text
