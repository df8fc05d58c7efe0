"""What every results JSON records at its top level, so a figure can be traced to the code and the machine
that made it: `commit` and `dirty`, the date, the machine (CPU model, cores, memory), the load average
before and after, the torch version, the exact command and the run's wall time.

    st = stamp()                      # at the start: the load before, the clock
    ...                               # the benchmark
    out.write_text(json.dumps({**finish(st), **result}))

Results go under `RESULTS` (bench/results, or `OVEX_BENCH_RESULTS` when set: `make bench QUICK=1` writes to
a scratch directory, never over the committed files).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(os.environ.get("OVEX_BENCH_RESULTS") or ROOT / "bench" / "results")
STAMP_KEYS = ("commit", "dirty", "date", "machine", "loadavg_before", "loadavg_after", "torch", "command",
              "wall_s")


def git(*args: str) -> str:
    """A git command's output in the repository, empty when git or the repository is missing."""
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return ""
    return done.stdout.strip()


def machine() -> dict[str, Any]:
    """CPU model, core count and memory, for reading the times."""
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_kib / 1024**2, 2)}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def command(argv: list[str] | None = None) -> str:
    """The command line as it can be pasted again from the repository root."""
    argv = list(sys.argv if argv is None else argv)
    python = Path(sys.executable)
    exe = python.relative_to(ROOT).as_posix() if python.is_relative_to(ROOT) else "python"
    script = Path(argv[0]) if argv else Path("-")
    if script.is_absolute() and script.is_relative_to(ROOT):
        script = script.relative_to(ROOT)
    return shlex.join([exe, script.as_posix(), *argv[1:]])


def dirty() -> bool:
    """Tracked code differs from the commit. Results written by the run itself (make bench writes one
    benchmark after another) are no change to the code that made them."""
    return bool(git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results"))


def source() -> dict[str, Any]:
    """The commit measured and whether the code differed from it. A device machine gets a copy of the code
    without its history: there they come in `OVEX_COMMIT` and `OVEX_DIRTY` (non-empty: dirty)."""
    if "OVEX_COMMIT" in os.environ:
        return {"commit": os.environ["OVEX_COMMIT"] or None, "dirty": bool(os.environ.get("OVEX_DIRTY"))}
    return {"commit": git("rev-parse", "HEAD") or None, "dirty": dirty()}


def stamp(argv: list[str] | None = None) -> dict[str, Any]:
    """The stamp at the start of a run; `finish` completes it."""
    return {
        **source(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "loadavg_after": None,
        "torch": _version("torch"),
        "command": command(argv),
        "wall_s": None,
        "_t0": time.monotonic(),
    }


def finish(st: dict[str, Any]) -> dict[str, Any]:
    """The stamp with the load average and wall time at the end (call it when writing the file)."""
    out = {k: v for k, v in st.items() if k != "_t0"}
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    out["wall_s"] = round(time.monotonic() - st["_t0"], 1)
    return out


def stamped(st: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """`result` under the finished stamp; a result key that a stamp key shadows is kept as `run_<key>`."""
    head = finish(st)
    body = {(f"run_{k}" if k in head else k): v for k, v in result.items()}
    return {**head, **body}


def markdown_line(st: dict[str, Any]) -> str:
    """One line for a results Markdown file: the commit, the date, the machine and the load."""
    s = finish(st) if "_t0" in st else st
    m = s["machine"]
    commit = (s["commit"] or "unknown")[:10] + (" (dirty tree)" if s["dirty"] else "")
    return (f"Commit `{commit}`, {s['date']}; {m['cpu']}, {m['cores']} cores, {m['memory_gib']:.1f} GiB; "
            f"torch {s['torch']}; load average {s['loadavg_before'][0]:.2f} before, "
            f"{s['loadavg_after'][0]:.2f} after; `{s['command']}`.")


def mean_std(stat: dict[str, Any]) -> str:
    """A summary's `mean ± std` as the results tables show it (four decimals)."""
    return f"{stat['mean']:.4f} ± {stat['std']:.4f}"


def under_title(md: str, st: dict[str, Any]) -> str:
    """A results Markdown text with the stamp's line under its title."""
    head, _, rest = md.partition("\n")
    return f"{head}\n\n{markdown_line(st)}\n{rest}"


def write_results(out: Path, result: dict[str, Any], st: dict[str, Any],
                  markdown: Callable[[dict[str, Any]], str]) -> None:
    """`out`.json and `out`.md under the stamp finished now: written after each unit of work, so a run cut
    short keeps what it measured."""
    result.update(finish(st))
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    out.with_suffix(".md").write_text(markdown(result))
