"""`ovex-client` against a real server: tables for models and datasets, cancel, delete, deactivate, the
default model, --explain, trainer options checked before an upload, and an unreachable server."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from live_server import LiveServer, live_server
from ovex_client import AsyncClient, Client, cli


@pytest.fixture
def env(live: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVEX_URL", live.url)
    monkeypatch.setenv("OVEX_API_KEY", live.api_key)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def cells(out: str, first: str) -> list[str]:
    """The cells of the table row that starts with `first`."""
    rows = [line.split() for line in out.splitlines() if line.split()[:1] == [first]]
    assert len(rows) == 1, out
    return rows[0]


def test_models_show_and_datasets_list_are_tables(
    env: None, live: LiveServer, train_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["models", "show", "demo"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "model demo (default)"
    assert lines[1].startswith("active version 1  labels 6 ")
    assert lines[2].split()[:5] == ["VERSION", "ACTIVE", "CREATED", "LABELS", "DIM"]
    row = cells(out, "1")
    assert row[1] == "*" and row[4] == "6"  # active, 6 labels
    code, out, _ = run(["models", "show", "demo", "--json"], capsys)
    assert code == 0 and json.loads(out)["name"] == "demo" and json.loads(out)["default"] is True

    data = train_file.parent / "tables-upload.txt"
    data.write_bytes(train_file.read_bytes() + b"\n")  # bytes of its own: a new dataset
    code, out, _ = run(["datasets", "upload", str(data)], capsys)
    assert code == 0 and out.splitlines()[0].split()[:4] == ["ID", "NAME", "FORMAT", "ROWS"]
    code, out, _ = run(["datasets", "upload", str(data), "--json"], capsys)
    dataset = json.loads(out)
    assert code == 0 and dataset["already_stored"] is True
    code, out, _ = run(["datasets", "list"], capsys)
    assert code == 0
    assert out.splitlines()[0].split() == ["ID", "NAME", "FORMAT", "ROWS", "LABELS", "FEATURES", "SIZE",
                                           "CREATED"]
    assert cells(out, dataset["id"])[1:5] == ["tables-upload.txt", "xc", "300", "16"]
    code, out, _ = run(["datasets", "list", "--json"], capsys)
    assert code == 0 and dataset["id"] in {d["id"] for d in json.loads(out)}
    code, out, _ = run(["datasets", "delete", dataset["id"]], capsys)
    assert code == 0 and out == f"deleted dataset {dataset['id']}\n"


def test_bad_params_are_refused_before_any_upload(
    env: None, live: LiveServer, train_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client = Client(live.url, live.api_key)
    before = {d.id for d in client.iter_datasets()}
    data = train_file.parent / "never-uploaded.txt"
    data.write_bytes(train_file.read_bytes() + b"\n\n")
    cases = [
        (["--param", "epoch=2"], "epoch: not a trainer option (did you mean epochs?)"),
        (["--param", "epochs=two"], "epochs=two: must be an integer"),
        (["--param", "dropout=1"], "dropout=1: must be less than 1"),
        (["--param", "encoder=cnn"], "encoder=cnn: must be one of linear, mlp, maxout"),
        (["--param", "epochs"], "--param 'epochs': expected KEY=VALUE"),
    ]
    for flags, message in cases:
        code, out, err = run(["train", "--dataset", str(data), "--model", "never", *flags], capsys)
        assert code == 2, err
        assert message in err and str(data) not in err and out == ""  # no "uploaded FILE as ..." line
        assert err.count("\n") == 1
    assert {d.id for d in client.iter_datasets()} == before


def test_unreachable_server_says_which_url_and_how_to_change_it(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("ovex-client")
    env = {**os.environ, "OVEX_URL": "http://127.0.0.1:9"}
    proc = subprocess.run([str(exe), "models", "list"], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 3 and proc.stdout == ""
    assert proc.stderr == ("ovex-client: the server at http://127.0.0.1:9 (from OVEX_URL) could not be "
                           "reached (Connection refused); set OVEX_URL or --url to where ovex runs\n")
    proc = subprocess.run([str(exe), "--url", "127.0.0.1:8000", "health"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "must start with http:// or https://" in proc.stderr


def test_predict_explain_shows_the_words_behind_a_label(
    env: None, live: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["predict", "a kitten and a cat", "--model", "demo", "--top-k", "2", "--explain"],
                       capsys)
    assert code == 0
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[-1:] == ["cats"])
    why = lines[at + 1]
    assert why.strip().startswith("why: bias ") and ("kitten +" in why or "cat +" in why)

    answer = Client(live.url, live.api_key).predict("a kitten and a cat", model="demo", top_k=2, explain=True)
    label = answer.predictions[0].labels[0]
    assert label.explanation is not None and label.explanation.method == "exact"
    terms = label.explanation.contributions
    assert terms and all(t.word for t in terms)
    if label.explanation.n_features == len(terms):  # all listed: the exact sum is the score
        assert abs(label.explanation.bias + sum(t.contribution for t in terms) - label.score) < 1e-3


def _train(client: Client, model: str, dataset: str, epochs: int, activate: bool = False) -> str:
    return client.submit_job(model, dataset, params={"epochs": epochs, "dim": 8}, activate=activate).id


def test_cancel_deactivate_and_delete_a_model(
    env: None, live: LiveServer, train_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client = Client(live.url, live.api_key)
    dataset = client.upload_dataset(train_file).id
    done = client.wait_for_job(_train(client, "cli-del", dataset, 1, activate=True))
    assert done.state == "succeeded", done.error
    version = done.model_version
    assert version is not None

    code, out, _ = run(["jobs", "cancel", done.id], capsys)
    assert code == 1 and out == f"job {done.id} already ended: succeeded\n"

    code, out, _ = run(["models", "show", "cli-del"], capsys)
    assert code == 0
    row = cells(out, version)
    assert done.id in row and dataset in row and "*" in row

    code, out, _ = run(["models", "deactivate", "cli-del"], capsys)
    assert code == 0 and out.startswith("deactivated model cli-del:")
    code, _, err = run(["predict", "x", "--model", "cli-del"], capsys)
    assert code == 1 and "409" in err and "activate" in err
    code, out, _ = run(["models", "list"], capsys)
    assert any(line.startswith("cli-del\t") and line.endswith("\tdeactivated") for line in out.splitlines())
    code, out, _ = run(["models", "activate", "cli-del", version], capsys)
    assert code == 0
    assert client.predict({"indices": [1], "values": [1.0]}, model="cli-del").model == "cli-del"

    slow = _train(client, "cli-del", dataset, 500)
    code, out, err = run(["models", "delete", "cli-del"], capsys)
    assert code == 1 and "409" in err and slow in err and out == ""
    assert client.get_model("cli-del").name == "cli-del"  # nothing deleted
    code, out, _ = run(["models", "delete", "cli-del", "--force"], capsys)
    assert code == 0
    assert out.splitlines() == [f"deleted model cli-del (versions {version})", f"cancelled jobs {slow}"]
    code, _, err = run(["models", "show", "cli-del"], capsys)
    assert code == 1 and "404" in err
    assert client.wait_for_job(slow).state == "cancelled"
    code, out, _ = run(["jobs", "cancel", slow], capsys)  # a cancelled job: cancelling again is a no-op
    assert code == 0 and out == f"cancelled job {slow}\n"

    queued = _train(client, "cli-cancel-2", dataset, 500)
    code, out, _ = run(["jobs", "cancel", queued], capsys)
    assert code == 0
    assert out in (f"cancelled job {queued}\n", f"cancelling job {queued}: it is running and stops at its "
                   "next step\n")
    assert client.wait_for_job(queued).state == "cancelled"


def test_default_model_shown_set_and_cleared(tmp_path: Path, live: LiveServer,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A server without OVEX_DEFAULT_MODEL: the automatic choice, then one set from the command line."""
    for name in ("demo", "sparse"):
        shutil.copytree(live.models_dir / name, tmp_path / "models" / name)
    with live_server(tmp_path, default_model=None) as server:
        monkeypatch.setenv("OVEX_URL", server.url)
        monkeypatch.setenv("OVEX_API_KEY", server.api_key)
        code, out, _ = run(["models", "default"], capsys)
        assert code == 0 and out == "default model demo (automatic: the demo model, else the oldest)\n"
        code, out, _ = run(["models", "default", "sparse"], capsys)
        assert code == 0 and out == "default model sparse (set with models default)\n"
        code, out, _ = run(["models", "list"], capsys)
        assert [line.split("\t")[0] for line in out.splitlines() if line.endswith("\tdefault")] == ["sparse"]
        code, out, _ = run(["models", "default", "--json"], capsys)
        assert code == 0 and json.loads(out) == {"default": "sparse", "source": "api"}

        async def read() -> str | None:
            async with AsyncClient(server.url, server.api_key) as client:
                return (await client.get_default_model()).default

        assert asyncio.run(read()) == "sparse"
        code, _, err = run(["models", "default", "nope"], capsys)
        assert code == 1 and "404" in err and "nope" in err
        code, out, _ = run(["models", "default", "--clear"], capsys)
        assert code == 0 and out.startswith("default model demo (automatic")
