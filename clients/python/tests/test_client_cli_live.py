"""`ovex-client` against a real server: predict (text and file), train --follow, jobs, models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from live_server import LiveServer
from ovex_client import Client, cli


@pytest.fixture
def env(live: LiveServer, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """URL and key from the environment, as a user would set them."""
    monkeypatch.setenv("OVEX_URL", live.url)
    monkeypatch.setenv("OVEX_API_KEY", live.api_key)
    return {**os.environ, "OVEX_URL": live.url, "OVEX_API_KEY": live.api_key}


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_predict_text_and_file(
    env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["predict", "a kitten and a cat", "--model", "demo", "--top-k", "2"], capsys)
    assert code == 0
    assert "model demo version 1" in out and "cats" in out

    code, out, _ = run(["predict", "rocket orbit", "--model", "demo", "--json"], capsys)
    assert code == 0 and json.loads(out)["predictions"][0]["labels"][0]["name"] == "space"

    rows = tmp_path / "rows.jsonl"
    lines = [{"text": "guitar chord"}, {"text": "bake with flour"}, {"text": "puppy bark"}]
    rows.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    out_file = tmp_path / "answers.jsonl"
    code, _, err = run(["predict", "--file", str(rows), "--model", "demo", "--batch-size", "2",
                        "--out", str(out_file)], capsys)
    assert code == 0 and "wrote 3 predictions" in err
    answers = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [a["labels"][0]["name"] for a in answers] == ["music", "cooking", "dogs"]
    assert all(a["model"] == "demo" for a in answers)

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\nnot json\n')
    code, _, err = run(["predict", "--file", str(bad), "--model", "demo"], capsys)
    assert code == 2 and "bad.jsonl:2: not valid JSON" in err

    code, _, err = run(["predict", "--model", "nope", "x"], capsys)
    assert code == 1 and "404" in err and "nope" in err


def test_train_follow_jobs_and_models(
    env: dict[str, str], live: LiveServer, train_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The installed console script, as a user runs it; not a terminal, so progress comes as lines.
    exe = Path(sys.executable).with_name("ovex-client")
    proc = subprocess.run(
        [str(exe), "train", "--dataset", str(train_file), "--model", "cli-model", "--param", "epochs=2",
         "--param", "dim=16", "--activate", "--follow"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"uploaded {train_file} as dataset" in proc.stderr or f"already stored {train_file}" in proc.stderr
    assert "submitted job" in proc.stderr
    assert "succeeded" in proc.stderr  # the progress lines end with the final state
    assert "succeeded: model cli-model as version" in proc.stdout
    version = proc.stdout.strip().rsplit(" ", 1)[-1]

    client = Client(live.url, live.api_key)
    job = client.list_jobs(model="cli-model")[0]
    code, out, _ = run(["jobs", "list", "--json"], capsys)
    assert code == 0 and job.id in {j["id"] for j in json.loads(out)}
    code, out, _ = run(["jobs", "list"], capsys)
    assert code == 0 and any(line.startswith(job.id) and "succeeded" in line for line in out.splitlines())
    code, out, _ = run(["jobs", "show", job.id], capsys)
    assert code == 0 and json.loads(out)["model_version"] == version
    code, out, _ = run(["jobs", "logs", job.id], capsys)
    assert code == 0 and "state: succeeded" in out
    code, out, _ = run(["jobs", "cancel", job.id], capsys)
    assert code == 1 and out == f"job {job.id} already ended: succeeded\n"  # a finished job stays as it is

    code, out, _ = run(["models", "list"], capsys)
    assert code == 0 and any(line.startswith("cli-model\tactive " + version) for line in out.splitlines())
    code, out, _ = run(["models", "activate", "cli-model", version], capsys)
    assert code == 0 and f"version {version} active" in out
    code, out, _ = run(["models", "show", "cli-model", "--json"], capsys)
    assert code == 0 and json.loads(out)["active_version"] == version

    # Without --follow the job id is printed at once; then it can be cancelled.
    code, out, _ = run(["train", "--dataset", str(train_file), "--model", "cli-cancel",
                        "--param", "epochs=500"], capsys)
    assert code == 0
    job_id = out.strip()
    code, out, _ = run(["jobs", "cancel", job_id], capsys)
    assert code == 0 and job_id in out
    assert client.wait_for_job(job_id).state == "cancelled"


def test_key_and_url_flags_override_the_environment(
    env: dict[str, str], live: LiveServer, train_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["datasets", "upload", str(train_file), "--api-key", "wrong"], capsys)
    assert code == 1 and "403" in err
    code, out, _ = run(["--url", live.url, "health"], capsys)
    assert code == 0 and json.loads(out)["ready"] is True
    code, _, err = run(["health", "--url", "http://127.0.0.1:9", "--timeout", "1"], capsys)
    assert code == 3


def test_train_base_continues_a_stored_version(
    env: dict[str, str], live: LiveServer, train_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`train --base`: the next version of the model, grown from the serving one, label ids kept."""
    code, out, err = run(["train", "--dataset", str(train_file), "--model", "cli-grow", "--param", "epochs=1",
                          "--param", "dim=16", "--activate", "--follow"], capsys)
    assert code == 0, err
    v1 = out.strip().rsplit(" ", 1)[-1]
    code, out, err = run(["train", "--dataset", str(train_file), "--model", "cli-grow", "--base", "--follow",
                          "--json"], capsys)
    assert code == 0, err
    job = json.loads(out)
    assert job["base"]["model"] == "cli-grow" and job["base"]["version"] == v1
    client = Client(live.url, live.api_key)
    versions = [v.version for v in client.get_model("cli-grow").versions]
    assert job["model_version"] in versions and job["model_version"] != v1
    code, _, err = run(["train", "--dataset", str(train_file), "--model", "cli-grow", "--base", "nope"],
                       capsys)
    assert code == 1 and "404" in err and "nope" in err
