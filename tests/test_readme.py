"""Every command in README.md is exercised: `bash` and `python` blocks run, in order, against a live
`ovex demo` on loopback; `sh` blocks (servers, installs, Docker) are checked against the commands' own
`--help`, the Makefile and the compose file, and are run in full by the tests they name; the configuration
table lists exactly the server's settings."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.live import load_live_server

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"  # the settings table, linked from the README
VENV_BIN = Path(sys.executable).parent
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
README_URL = "http://127.0.0.1:8000"
# OVEX_* variables documented that are not server settings (client, compose)
NON_SETTINGS = {"OVEX_URL", "OVEX_DEMO", "OVEX_PUBLISH"}


def blocks(kind: str, *docs: Path) -> list[str]:
    return [body for doc in (README, *docs) for lang, body in BLOCK.findall(doc.read_text()) if lang == kind]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """`ovex demo` (what `make run` runs) over a pre-built, smaller demo model (same vocabulary and
    label names as the full one, fewer labels and rows, so it trains in seconds)."""
    live = load_live_server()
    if not live.server_available():
        pytest.skip("the ovex server stack is not installed")
    from service.serve import build_demo_model

    root = tmp_path_factory.mktemp("readme")
    build_demo_model(root / "models", labels=200, rows=800)
    with live.live_server(root, command="demo", default_model=None) as server:
        yield server


def run_block(kind: str, body: str, demo: Any, cwd: Path) -> str:
    url = demo.url
    code = body.replace(README_URL, url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVEX_")}
    env.update({"OVEX_API_KEY": demo.api_key, "PATH": f"{VENV_BIN}:{env.get('PATH', '')}"})
    argv = ["bash", "-euo", "pipefail", "-c", code] if kind == "bash" else [sys.executable, "-c", code]
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"README {kind} block failed ({proc.returncode}):\n{body}\n" \
        f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)  # a dozen CLI processes and three training jobs; slow on a loaded machine
def test_readme_blocks_run_against_a_live_server(demo: Any, tmp_path: Path) -> None:
    # The blocks assume the repository root (`.venv/bin/...`); run them in a scratch copy of that view.
    (tmp_path / ".venv").symlink_to(VENV_BIN.parent)
    ordered = [(lang, body) for lang, body in BLOCK.findall(README.read_text()) if lang in ("bash", "python")]
    assert len(ordered) >= 6
    outputs = [run_block(lang, body, demo, tmp_path) for lang, body in ordered]
    text = "\n".join(outputs)
    # curl prints error bodies without failing: no answer may be an error
    assert '"detail"' not in text, text[-3000:]
    predict_curl, train_curl = (o.replace(" ", "") for o in outputs[:2])
    assert '"ready":true' in predict_curl and predict_curl.count('"predictions"') == 2
    assert "event:state" in train_curl and '"state":"succeeded"' in train_curl
    assert '"model":"mymodel"' in train_curl and '"active_version":"1"' in train_curl
    assert "succeeded" in text and "404 unknown model" in text
    assert (tmp_path / "answers.jsonl").read_text().count("\n") == 2
    assert '"p@1"' in text  # ovex evaluate printed its metrics
    assert '"probs"' in (tmp_path / "pred.jsonl").read_text()
    assert (tmp_path / "models-offline" / "syn" / "2" / "config.json").exists()


def _flags(line: str) -> list[str]:
    return [t.split("=")[0] for t in shlex.split(line.split("#")[0]) if t.startswith("--")]


def test_readme_sh_commands_exist_as_written() -> None:
    """Server, install and Docker commands cannot run inline; their names and flags must be real."""
    makefile = (ROOT / "Makefile").read_text()
    compose = (ROOT / "docker-compose.yml").read_text()
    docker_test = (ROOT / "scripts" / "test-docker.sh").read_text()
    docker_doc = ROOT / "docs" / "docker.md"
    lines = [ln.strip() for body in blocks("sh", docker_doc) for ln in body.splitlines() if ln.strip()]
    assert lines
    for line in lines:
        cmd = line.split("#")[0].strip()
        if cmd.startswith(".venv/bin/ovex "):
            sub = cmd.split()[1]
            helptext = subprocess.run([str(VENV_BIN / "ovex"), sub, "--help"], capture_output=True,
                                      text=True, timeout=120).stdout
            for flag in _flags(cmd):
                assert flag in helptext, f"{line}: `ovex {sub}` has no {flag}"
        elif cmd.startswith("pip install "):
            assert (ROOT / cmd.split()[-1] / "pyproject.toml").exists(), line
        elif cmd.startswith("make "):
            assert re.search(rf"^{re.escape(cmd.split()[1])}:", makefile, re.M), line
        elif cmd.startswith("docker compose"):
            words = cmd.split()[2:]
            if "--profile" in words:  # validated by `docker compose --profile ... config` in the script
                profile = words[words.index("--profile") + 1]
                assert f'profiles: ["{profile}"]' in compose, line
                assert f"dc --profile {profile} config" in docker_test, line
                continue
            if "--scale" in words:
                service = words[words.index("--scale") + 1].split("=")[0]
                assert f"\n  {service}:" in compose and f"--scale {service}=" in docker_test, line
            assert words[0] in ("up", "down") and f"dc {words[0]} {words[1]}" in docker_test, line
        else:
            raise AssertionError(f"README sh line not checked by any test: {line}")


def test_readme_configuration_lists_every_setting() -> None:
    from service.settings import Settings

    text = README.read_text() + CONFIGURATION.read_text()
    documented = set(re.findall(r"\bOVEX_[A-Z0-9_]+", text))
    settings = {f"OVEX_{name.upper()}" for name in Settings.model_fields}
    assert settings - documented == set(), "settings missing from the README and docs/configuration.md"
    assert documented - settings - NON_SETTINGS == set(), "the docs name variables nothing reads"
    assert settings <= set(re.findall(r"\bOVEX_[A-Z0-9_]+", CONFIGURATION.read_text()))


def test_readme_opens_with_the_two_setup_commands() -> None:
    head = README.read_text().split("\n")[:8]
    assert head[0] == "# ovex"
    assert any(ln.startswith("make run") for ln in head) and any(ln.startswith("make test") for ln in head)
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci


# --------------------------------------------------------------------------------------------------
# figures: every measured figure names the bench/results file it comes from, and that file holds it

DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
CITATION = re.compile(r"bench/results/[\w.*-]+(?:/[\w.*-]+)*")
FIGURE = re.compile(r"(?<![\w.=@^-])(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+)(?![\w]|\.\d)")
MEASURED = re.compile(
    r"P@\d|nDCG|PSP|recall|\bms\b|CPU-second|examples per|ex/s|req/s|\d s\b|slower|faster|\bMB\b|GiB"
)


def figure_units(text: str) -> list[str]:
    """Paragraphs and table rows outside code blocks; configuration rows (defaults, not figures) left out."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    units: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        lines = para.splitlines()
        if lines and all(ln.startswith("|") for ln in lines):
            units += [ln for ln in lines if "OVEX_" not in ln]
        else:
            units.append(para)
    return units


def figures_in(unit: str) -> list[str]:
    prose = re.sub(r"\]\([^)]*\)", "]", unit)  # link targets
    prose = re.sub(r"`[^`]*`", "", prose)  # code: flags, values, file names
    return FIGURE.findall(prose) if MEASURED.search(prose) else []


def cited_text(unit: str, doc: Path) -> tuple[list[str], str]:
    cited = sorted(set(CITATION.findall(unit)))
    texts = []
    for name in cited:
        paths = sorted(ROOT.glob(name))
        assert paths, f"{doc.name}: cites {name}, which does not exist"
        texts += [p.read_text() for p in paths]
    return cited, "\n".join(texts)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_figure_cites_a_results_file_that_holds_it(doc: Path) -> None:
    problems = []
    for unit in figure_units(doc.read_text()):
        figures = figures_in(unit)
        if not figures:
            continue
        cited, source = cited_text(unit, doc)
        if not cited:
            problems.append(f"no bench/results file cited for {figures} in: {unit[:160]!r}")
            continue
        missing = [f for f in figures if f not in source and f.replace(",", "") not in source]
        if missing:
            problems.append(f"{missing} not in {cited}: {unit[:160]!r}")
    assert problems == [], "\n".join(problems)


def test_figure_check_catches_a_stale_or_uncited_figure() -> None:
    """The rule above on made-up units: a figure missing from its file, and one citing no file."""
    stale = "P@1 rose to 0.6999 (`bench/results/scale.md`)."
    uncited = "P@1 rose to 0.7030 after 2 epochs."
    assert figures_in(stale) == ["0.6999"] and "0.6999" not in cited_text(stale, README)[1]
    assert "0.7030" in cited_text("0.7030 (bench/results/scale.md)", README)[1]
    assert figures_in(uncited) == ["0.7030"] and cited_text(uncited, README)[0] == []
    assert figures_in("| `OVEX_X` | 0.99 | recall target |") == ["0.99"]  # rows are filtered by figure_units
    assert figure_units("| `OVEX_X` | 0.99 | recall |\n| a | 0.5 ms | b |") == ["| a | 0.5 ms | b |"]


def _table_default(text: str) -> Any:
    """A default as the configuration table writes it, as a Python value ("computed" when none is fixed)."""
    words = ("none", "first by name", "auto", "half the cores", "every core", "SQLite in `data_dir`")
    if text.strip() in words:
        return "computed"  # written in words: nothing fixed (in backticks, `auto` is a literal value)
    value = text.strip().strip("`")
    sized = re.fullmatch(r"(\d+) (KiB|MiB|GiB)", value)
    if sized:
        return int(sized[1]) << {"KiB": 10, "MiB": 20, "GiB": 30}[sized[2]]
    if value in ("true", "false"):
        return value == "true"
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def test_readme_configuration_defaults_are_the_settings_defaults() -> None:
    from service.settings import Settings

    table = CONFIGURATION.read_text()
    checked = set()
    for row in (ln for ln in table.splitlines() if ln.startswith("|")):
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        names = re.findall(r"OVEX_([A-Z0-9_]+)", cells[0])
        if not names:
            continue
        defaults = cells[1].split(", ")
        if len(defaults) == 1:
            defaults *= len(names)
        assert len(defaults) == len(names), row
        for name, written in zip(names, defaults, strict=True):
            field = Settings.model_fields[name.lower()]
            value = _table_default(written)
            if value == "computed":
                assert field.default is None or field.default_factory is not None, (name, written)
            elif isinstance(value, float):
                assert float(field.default) == pytest.approx(value), (name, written)
            else:
                default = field.default
                default = str(default) if isinstance(default, Path) else default
                assert default == value, (name, written, field.default)
            checked.add(name)
    assert {n.upper() for n in Settings.model_fields} == checked


@pytest.mark.slow
def test_readme_sample_answer_is_what_the_demo_returns(tmp_path: Path) -> None:
    """The full `ovex demo` model: its suggested input is the README's, and the README shows its answer."""
    import json

    from service.api.schemas import DEMO_TEXT
    from service.serve import build_demo_model, demo_sample
    from trainer.artifact import load_artifact
    from trainer.sparse_maps import sparsemax

    artifact = build_demo_model(tmp_path / "models")
    assert demo_sample(artifact) == DEMO_TEXT
    model = load_artifact(artifact)
    scores = (model.encode(model.featurizer.transform_texts([DEMO_TEXT])) @ model.head_weight.T
              + model.head_bias)[0]
    probs = sparsemax(scores)
    order = [int(i) for i in np.argsort(-probs) if probs[i] > 0]
    text = README.read_text()
    shown = text.split("The demo's\nanswer to the first request:", 1)[1].split("```", 2)[1]
    answer = json.loads(shown)
    labels = answer["predictions"][0]["labels"]
    assert [lab["id"] for lab in labels] == order[:5]
    assert [lab["name"] for lab in labels] == [model.label_names[i] for i in order[:5]]
    for lab in labels:
        assert lab["prob"] == pytest.approx(probs[lab["id"]], abs=0.02)
        assert lab["score"] == pytest.approx(scores[lab["id"]], abs=0.05)
    assert answer["predictions"][0]["known_features"] == 4
    assert f'"text": "{DEMO_TEXT}"' in text.split("## Predict with curl", 1)[1]
