"""bench/suite.py and bench/stamp.py: every benchmark behind a figure can be rerun (its commands name flags
its script has), its results are stamped, stale results are found, bench/results holds only what the
suite writes, and a smoke of the quick profile runs end to end into a scratch directory."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench_scripts import load_bench

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


suite = load_bench("suite")
stamp = load_bench("stamp")


def test_results_are_one_file_set_per_benchmark() -> None:
    files = sorted(p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*") if p.is_file())
    assert len(files) <= 60, f"{len(files)} files in bench/results"
    owned = {name for bench in suite.BENCHES for name in bench.outputs}
    assert set(files) <= owned, f"written by no benchmark of bench/suite.py: {sorted(set(files) - owned)}"
    assert not [f for f in files if "/" in f], "A/B or run directories belong in docs/ or git history"


def test_every_results_file_records_what_made_it() -> None:
    """Each results JSON says at its top level which commit, machine, load, torch and command made it."""
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        missing = [key for key in stamp.STAMP_KEYS if key not in data]
        assert missing == [], f"{path.name} lacks {missing}"
        assert isinstance(data["commit"], str) and len(data["commit"]) == 40, path.name


def test_every_cited_results_file_is_written_by_a_benchmark_or_kept_in_history() -> None:
    """A figure of today cites what `make bench` writes (or a device run); a decision's record, run on
    demand, is cited from git history."""
    owned = {name for bench in suite.BENCHES if bench.full or bench.device != "cpu" for name in bench.outputs}
    for doc in DOCS:
        for cite in re.findall(r"bench/results/([\w.*-]+(?:/[\w.*-]+)*(?:@[0-9a-f]{7,40})?)",
                               doc.read_text()):
            if "@" in cite:
                continue  # checked against git by tests/test_readme.py
            assert any(Path(name).match(cite) for name in owned), \
                f"{doc.name}: cites {cite}, which `make bench` does not write: cite it as FILE@COMMIT"


@pytest.mark.parametrize("bench", [b for b in suite.BENCHES if b.steps], ids=lambda b: b.name)
def test_every_command_names_flags_its_script_has(bench: object) -> None:
    """The full and quick commands of `make bench` stay runnable as the scripts change (read from each
    script's argparse calls: importing them all would take minutes)."""
    for script in bench.scripts():  # type: ignore[attr-defined]
        source = (ROOT / script).read_text()
        known = set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", source))
        known |= {f"--no-{f[2:]}" for f in known if "BooleanOptionalAction" in source}
        assert known, script
        for step in (*bench.steps, *bench.quick):  # type: ignore[attr-defined]
            if step[0] != script:
                continue
            for flag in (a.split("=")[0] for a in step[1:] if a.startswith("--")):
                assert flag in known, f"{bench.name}: {script} has no {flag}"  # type: ignore[attr-defined]
        for output in bench.outputs:  # type: ignore[attr-defined]
            assert output.endswith((".json", ".md", ".jsonl")), output


def test_every_measured_path_exists() -> None:
    """A renamed module would silently stop making its benchmarks' results stale."""
    missing = [(b.name, m) for b in suite.BENCHES for m in b.measures if not (ROOT / m).exists()]
    assert missing == []


def test_full_profile_fits_its_budget() -> None:
    """`make bench` reruns the README's figures on this 2-core machine within BUDGET_S; a benchmark that
    would push it over goes on demand (`full=False`) or drops a part (cited as FILE@COMMIT)."""
    full = suite.selected(None, quick=False, stale_only=False)
    assert {"real", "scale_serve_1e6", "serve_1e5", "continual", "add_labels"} <= {b.name for b in full}
    total = sum(suite.expected_seconds(b) for b in full)
    assert total <= suite.BUDGET_S, f"{total / 60:.1f} min"


def test_expected_time_counts_only_the_runs_the_full_command_makes(tmp_path: Path) -> None:
    """A results file made by an earlier, larger command holds runs `make bench` no longer makes."""
    kept = {"set": "wordnet", "method": "omikuji", "label": "omikuji", "run_wall_s": 60.0}
    extra = {"set": "wordnet", "method": "ovex", "label": "ovex --precision bf16", "run_wall_s": 40.0}
    tfidf = {"set": "wordnet", "method": "ovex-tfidf", "label": "ovex-tfidf", "run_wall_s": 80.0}
    planted = {"set": "synth-1e5", "method": "ovex", "label": "ovex", "run_wall_s": 30.0}
    (tmp_path / "real.json").write_text(json.dumps({"runs": [kept, extra, tfidf, planted]}))
    assert suite.real_expected(tmp_path) == 90.0
    runs = {"base": {"wall_s": 1.0}, "continual": {"wall_s": 2.0, "wall_s_each": [2.0, 3.0]},
            "continual-ranks-2": {"wall_s": 50.0}}
    (tmp_path / "continual.json").write_text(json.dumps({"runs": [{"set": "bibtex", "runs": runs},
                                                                  {"set": "synth-40k", "runs": runs}]}))
    assert suite.continual_expected(tmp_path) == pytest.approx(6.0 * suite.CONTINUAL_UNTIMED)
    assert suite.real_expected(tmp_path / "absent") is None


def test_stamp_records_what_made_a_result() -> None:
    st = stamp.stamp(["bench/x.py", "--flag", "a b"])
    out = stamp.stamped(st, {"machine": "the script's own", "rows": [1]})
    for key in stamp.STAMP_KEYS:
        assert key in out, key
    assert out["commit"] and len(out["commit"]) == 40 and isinstance(out["dirty"], bool)
    assert out["command"].endswith("bench/x.py --flag 'a b'")
    assert set(out["machine"]) == {"cpu", "cores", "memory_gib"} and out["run_machine"] == "the script's own"
    assert len(out["loadavg_before"]) == 3 and len(out["loadavg_after"]) == 3 and out["wall_s"] >= 0
    assert "_t0" not in out and out["commit"][:10] in stamp.markdown_line(out)


def test_stale_lists_results_older_than_the_code_they_measure(tmp_path: Path) -> None:
    root_commit = subprocess.run(["git", "rev-list", "--max-parents=0", "HEAD"], capture_output=True,
                                 text=True, cwd=ROOT).stdout.split()[0]
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=ROOT).stdout.strip()
    (tmp_path / "step_cost.json").write_text(json.dumps({"commit": root_commit}))
    (tmp_path / "scale.json").write_text(json.dumps({"commit": head}))
    (tmp_path / "continual.json").write_text(json.dumps({"stamps": {"bibtex": {"commit": head},
                                                                    "synth": {"commit": root_commit}}}))
    (tmp_path / "data_read.json").write_text(json.dumps({"rows": 1}))
    rows = {row["file"]: row for row in suite.stale(tmp_path)}
    assert "trainer/" in rows["step_cost.json"]["why"]
    assert "scale.json" not in rows
    assert "continual.json" in rows  # one of its merged parts predates the trainer's last change
    assert rows["data_read.json"]["why"] == "no commit recorded"


def test_quick_profile_never_writes_over_the_committed_results() -> None:
    with pytest.raises(SystemExit):
        suite.main(["run", "--quick", "--results", str(RESULTS)])


@pytest.mark.timeout(240)
def test_quick_profile_smoke(tmp_path: Path) -> None:
    """The cheapest benchmarks of the quick profile, end to end through `bench/suite.py run --quick`:
    each writes its stamped JSON and Markdown to the scratch directory given, never to bench/results."""
    before = {p: p.stat().st_mtime for p in RESULTS.iterdir()}
    names = ["synth_scale", "data_read", "step_cost"]
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "suite.py"), "run", "--quick", "--only",
                           ",".join(names), "--results", str(tmp_path)], capture_output=True, text=True,
                          cwd=ROOT, timeout=230)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in names:
        for output in suite.BY_NAME[name].outputs:
            assert (tmp_path / output).exists(), output
            if output.endswith(".json"):
                data = json.loads((tmp_path / output).read_text())
                assert data["commit"] and data["wall_s"] is not None and "--" in data["command"], output
            else:
                assert "Commit `" in (tmp_path / output).read_text(), output
    assert {p: p.stat().st_mtime for p in RESULTS.iterdir()} == before
