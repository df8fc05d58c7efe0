"""Every command in README.md is exercised: `bash` and `python` blocks run, in order, against a live
`ovex demo` on loopback; `sh` blocks (servers, installs, Docker) are checked against the commands' own
`--help`, the Makefile and the compose file, and are run in full by the tests they name; the configuration
table lists exactly the server's settings."""

from __future__ import annotations

import fnmatch
import json
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
# figures: every measured figure names the bench/results file (and, where it says so, the row) it comes
# from, and that file holds it as a number; a figure of a missed target says so

DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
# a results file, optionally as it was at a commit (a decision's record kept in git history)
CITATION = re.compile(r"bench/results/[\w.*-]+(?:/[\w.*-]+)*(?:@[0-9a-f]{7,40})?")
UNIT = r"(?:\s?(?:ms|MB|GB|GiB|MiB|KiB|%)|\ss|[x×]|\s(?:requests|req|examples|rows)/s)(?![\w/])"
# a number that is not a bound (≤ 10 ms), an exponent (10^6), a setting (d=128), a version or a name part
BOUND_WORDS = ("over", "under", "every", "last", "up to", "at most", "at least", "within")
BOUND = "".join(f"(?<!{w} )" for w in BOUND_WORDS)
NUMBER = (rf"(?:(?<=[\s(])[-−+])?(?<![\w.,=@^/])(?<![≤≥<>~]\s)(?<![≤≥<>~]){BOUND}"
          r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+)")
COUNT = r"(?!-row|-label|\s(?:rows|labels|features|words|texts)\b)"  # a data set's size, not a measurement
FIGURE = re.compile(rf"({NUMBER}){COUNT}(?:(?={UNIT})|(?![\w]|\.\d|,\d))")
MEASURED = re.compile(
    r"P@\d|nDCG|PSP|recall|\bms\b|CPU-second|examples per|ex/s|req/s|requests/s|examples/s|\d s\b|slower|"
    r"faster|\bMB\b|GiB|\bGB\b|certified|\d\s?%|\d\s?[x×]\b|\bratio\b|\bwall time\b"
)
COMPUTED = "(computed, not measured)"  # a paragraph or a table (in the paragraph above it) of arithmetic
ROW = re.compile(r"\brows?\s((?:`[^`]+`(?:,?\s+(?:and\s+|or\s+)?)?)+)")


def figure_units(text: str) -> list[str]:
    """Paragraphs and table rows outside code blocks (each row with its table's header, for its
    keywords); configuration rows (defaults, not figures) left out."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = re.sub(r"^<!--.*?-->\n", "", text, flags=re.M)  # the markers of generated blocks
    units: list[str] = []
    before = ""
    for para in re.split(r"\n\s*\n", text):
        lines = para.splitlines()
        if COMPUTED in para or (COMPUTED in before and para.startswith("|")):
            before = para
            continue  # arithmetic from sizes, said to be so: no measurement to cite
        if lines and all(ln.startswith("|") for ln in lines):
            rule = [i for i, ln in enumerate(lines) if re.fullmatch(r"\|[\s:|-]+\|?", ln.strip())]
            head = lines[0] if rule == [1] else ""
            cites = " ".join(CITATION.findall(before))  # a table's source may be named just above it
            units += [f"{ln}\n{head}\n{cites}".rstrip() if head and i > 1 else ln
                      for i, ln in enumerate(lines) if "OVEX_" not in ln and i not in rule]
        else:
            units.append(para)
        before = para
    return units


def figures_in(unit: str) -> list[str]:
    """The measured numbers of a unit: any number with a unit of measure, and, where the unit speaks of
    a measurement (or is a table row citing a results file), every decimal and grouped number too."""
    prose = unit.split("\n|", 1)[0] if unit.startswith("|") else unit  # a row, without its header
    prose = re.sub(r"\]\([^)]*\)", "]", prose)  # link targets
    prose = re.sub(r"`[^`]*`", "", prose)  # code: flags, values, file names
    measured = bool(MEASURED.search(unit)) or (unit.startswith("|") and bool(CITATION.search(unit)))
    out = []
    for m in FIGURE.finditer(prose):
        number = m[1].replace("−", "-")
        with_unit = bool(re.match(UNIT, prose[m.end(1):]))
        if with_unit or (measured and ("." in number or "," in number)):
            out.append(number)
    return out


def _read_cited(name: str, doc: Path, root: Path) -> str:
    if "@" in name:  # a file as it was at a commit
        pattern, commit = name.split("@")
        listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", commit, "--", "bench/results"],
                                cwd=root, capture_output=True, text=True).stdout.split()
        paths = [p for p in listed if fnmatch.fnmatch(p, pattern)]
        assert paths, f"{doc.name}: cites {name}, which git does not have"
        return "\n".join(subprocess.run(["git", "show", f"{commit}:{p}"], cwd=root, capture_output=True,
                                        text=True, check=True).stdout for p in paths)
    paths = sorted(root.glob(name))
    assert paths, f"{doc.name}: cites {name}, which does not exist"
    return "\n".join(p.read_text() for p in paths)


def _rows(text: str, selector: str) -> str:
    """The part of a results file a citation names: the section under a heading that contains the
    selector, or the table lines whose cells include every cell of the selector (`a | b | c`)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):  # a heading named by the selector (a word: the whole heading)
        title = line.lstrip("#").strip()
        if line.startswith("#") and (selector == title or (" " in selector and selector in title)):
            level = len(line) - len(line.lstrip("#"))
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("#")
                        and len(lines[j]) - len(lines[j].lstrip("#")) <= level), len(lines))
            return "\n".join(lines[i:end])
    want = [c.strip() for c in selector.replace("\\|", "|").split("|") if c.strip()]  # \| in a table
    picked = []
    for line in lines:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if all(w in cells for w in want):
                picked.append(line)
    return "\n".join(picked)


def cited_text(unit: str, doc: Path, root: Path = ROOT) -> tuple[list[str], str]:
    """The files a unit cites and the text its figures must come from: the rows it names, if any."""
    cited = sorted(set(CITATION.findall(unit)))
    text = "\n".join(_read_cited(name, doc, root) for name in cited)
    selectors = [s for group in ROW.findall(re.sub(r"\]\([^)]*\)", "]", unit))
                 for s in re.findall(r"`([^`]+)`", group)]
    if cited and selectors:
        parts = [_rows(text, sel) for sel in selectors]
        absent = [s for s, p in zip(selectors, parts, strict=True) if not p]
        assert not absent, f"{doc.name}: no row {absent} in {cited}"
        text = "\n".join(parts)
    return cited, text


def holds(source: str, figure: str) -> bool:
    """The figure occurs in the source as a whole number (0.60 is not 0.6012), commas optional."""
    plain = figure.replace(",", "")
    for shown in {figure, plain, figure.lstrip("+"), plain.lstrip("+")}:
        if re.search(rf"(?<![\d.,]){re.escape(shown)}(?![\d]|[.,]\d)", source):
            return True
    return False


def missed_figures() -> set[str]:
    """Figures of targets the results files mark as missed (`"met": false`), as the docs write them."""
    out: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("met") is False and isinstance(node.get("mean"), float):
                out.update({f"{node['mean']:.4f}", f"{node['mean']:+.4f}"})
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for path in sorted((ROOT / "bench" / "results").glob("*.json")):
        walk(json.loads(path.read_text()))
    return out


def said_missed(unit: str, figure: str) -> bool:
    """Each clause (between semicolons or sentences) that gives the figure also says the target was missed."""
    clauses = [c for c in re.split(r";|\.\s", unit.replace("−", "-")) if holds(c, figure)]
    return all(re.search(r"\bmiss(ed|es)\b|\bnot met\b", c, re.I) for c in clauses)


def figure_problems(text: str, doc: Path, missed: set[str] | None = None, root: Path = ROOT) -> list[str]:
    problems = []
    for unit in figure_units(text):
        figures = figures_in(unit)
        if not figures:
            continue
        cited, source = cited_text(unit, doc, root)
        if not cited:
            problems.append(f"no bench/results file cited for {figures} in: {unit[:160]!r}")
            continue
        wrong = [f for f in figures if not holds(source, f)]
        if wrong:
            problems.append(f"{wrong} not in {cited} (rows named there): {unit[:160]!r}")
        unsaid = [f for f in figures if f in (missed or set()) and not said_missed(unit, f)]
        if unsaid:
            problems.append(f"{unsaid}: a missed target, not said to be missed: {unit[:160]!r}")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_figure_cites_a_results_file_that_holds_it(doc: Path) -> None:
    problems = figure_problems(doc.read_text(), doc, missed_figures())
    assert problems == [], "\n".join(problems)


PLANTED_FILE = """# made-up results

| method | P@1 | train s |
|---|---|---|
| ovex | 0.5951 ± 0.0041 | 63 |
| omikuji | 0.6073 ± 0.0010 | 10.3 |

- exact softmax: 1,300.4x slower; 1,103.3 requests/s
"""
PLANTED = [
    # (kind, a unit that passes, the same unit with one figure wrong)
    ("decimal", "P@1 0.5951 (`bench/results/x.md`).", "P@1 0.5952 (`bench/results/x.md`)."),
    ("whole number with a unit", "trained in 63 s (`bench/results/x.md`).",
     "trained in 64 s (`bench/results/x.md`)."),
    ("a number followed by a letter", "1,300.4x the time (`bench/results/x.md`)",
     "1,300.5x the time (`bench/results/x.md`)"),
    ("a paragraph without keywords", "It answered 1,103.3 requests/s (`bench/results/x.md`).",
     "It answered 1,103.4 requests/s (`bench/results/x.md`)."),
    ("a results-table row", "| ovex | 0.5951 | `bench/results/x.md` |",
     "| ovex | 0.5961 | `bench/results/x.md` |"),
    ("a figure from another row", "P@1 0.6073, row `omikuji` of `bench/results/x.md`",
     "P@1 0.5951, row `omikuji` of `bench/results/x.md`"),
    ("a prefix of a longer number", "P@1 0.6073 (`bench/results/x.md`)", "P@1 0.607 (`bench/results/x.md`)"),
]


@pytest.mark.parametrize(("kind", "good", "bad"), PLANTED, ids=[k for k, _, _ in PLANTED])
def test_figure_check_fails_on_a_planted_wrong_figure(kind: str, good: str, bad: str, tmp_path: Path) -> None:
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "x.md").write_text(PLANTED_FILE)
    assert figure_problems(good, README, root=tmp_path) == [], kind
    assert figure_problems(bad, README, root=tmp_path) != [], kind


def test_figure_check_wants_a_citation_and_says_missed_targets(tmp_path: Path) -> None:
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "x.md").write_text("old-label P@1 -0.0209 against the base\n")
    assert figure_problems("P@1 rose to 0.7030 after 2 epochs.", README) != []  # no file cited
    unit = "old-label P@1 -0.0209 against the base (`bench/results/x.md`)"
    assert figure_problems(unit, README, {"-0.0209"}, tmp_path) != []
    assert figure_problems(unit + ", a missed target", README, {"-0.0209"}, tmp_path) == []
    assert figures_in("| `OVEX_X` | 0.99 | recall target |") == ["0.99"]  # rows are filtered by figure_units
    assert figure_units("| `OVEX_X` | 0.99 | recall |\n| a | 0.5 ms | b |") == ["| a | 0.5 ms | b |"]
    assert figures_in("p99 ≤ 10 ms, 10^6 labels, d=128, 5 workers") == []  # bounds and settings


def test_readme_figures_are_generated_from_the_results() -> None:
    """The README's generated blocks are what scripts/figures.py writes from today's results files."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "figures.py")], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, "README.md differs from scripts/figures.py's output (run it with " \
        f"--write):\n{done.stdout[-3000:]}{done.stderr[-2000:]}"


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
    assert answer["predictions"][0]["known_features"] == 7  # 4 words, 3 of them leading (marked again)
    assert f'"text": "{DEMO_TEXT}"' in text.split("## Predict with curl", 1)[1]
