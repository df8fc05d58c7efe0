"""How the memory check's estimate (`trainer.capacity.run_bytes`) compares with what a run really takes.

    .venv/bin/python bench/capacity_rss.py [--quick]

Each case trains through the real CLI in a fresh process whose peak RSS (VmHWM) is read at its end;
a run of the same kind at 10 labels gives the fixed cost (interpreter, torch, kernels), so
`peak - fixed` is what the label space and the input projection cost, set beside the estimate.
Cases: continual runs at dim 8 whose data header claims millions of labels (the label-sized structures
dominate), and fresh runs at the default dim (the weights and their optimizer state dominate). The
estimate counts Adam's moments of every row; these runs update few rows and Adam's moments are zeroed at
a row's first update (`trainer/optim.py`), so the rows never updated stay untouched: the check is an
upper bound, which a run that updates every row (or writes a checkpoint) reaches.
Writes bench/results/capacity_rss.json and .md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from stamp import RESULTS  # noqa: E402

FAST = ["--batch-size", "16", "--negatives", "4", "--epochs", "1", "--quiet"]

# the child: train through the CLI, then report its peak RSS (VmHWM of its own memory: ru_maxrss would
# start from the forking parent's)
_CHILD = """
import json, re, sys
from pathlib import Path
from service.cli import main
rc = main(sys.argv[1:])
peak = int(re.search(r"VmHWM:\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024
print(json.dumps({"rc": rc, "peak": peak}))
"""


def _rows(labels: int, features: int, n: int = 40) -> str:
    """`n` rows over a few features, using labels spread over [0, labels) (the last one included)."""
    lines = []
    for i in range(n):
        lab = sorted({i % 10, (i * 7919) % labels, labels - 1 - i % 3})
        feats = sorted({i % features, (i * 31) % features})
        lines.append(",".join(map(str, lab)) + " " + " ".join(f"{f}:1" for f in feats))
    return f"{n} {features} {labels}\n" + "\n".join(lines) + "\n"


def _run(args: list[str]) -> int:
    proc = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True,
                          check=False, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"run failed: {args}\n{proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if out["rc"] != 0:
        raise SystemExit(f"run refused or failed: {args}\n{proc.stderr[-2000:]}")
    return int(out["peak"])


def _estimate(labels: int, features: int, dim: int, base_labels: int | None) -> int:
    sys.path.insert(0, str(ROOT))
    from trainer.capacity import run_bytes
    from trainer.params import TrainParams

    return run_bytes(labels, features, TrainParams(dim=dim), base_labels=base_labels).total


def _case(tmp: Path, kind: str, labels: int, features: int, dim: int) -> dict[str, Any]:
    data = tmp / f"{kind}-{labels}.txt"
    data.write_text(_rows(labels, features))
    out = tmp / f"out-{kind}-{labels}"
    if kind == "continual":
        base = tmp / "base"
        if not base.exists():
            (tmp / "base.txt").write_text(_rows(10, features))
            subprocess.run([sys.executable, "-m", "service.cli", "train", "--train", str(tmp / "base.txt"),
                            "--out", str(base), "--dim", str(dim), *FAST], check=True, cwd=ROOT)
        args = ["train", "--init-from", str(base), "--train", str(data), "--out", str(out), *FAST]
        base_labels: int | None = 10
    else:
        args = ["train", "--train", str(data), "--out", str(out), "--dim", str(dim), *FAST]
        base_labels = None
    peak = _run(args)
    return {"kind": kind, "labels": labels, "features": features, "dim": dim, "peak_rss": peak,
            "estimate": _estimate(labels, features, dim, base_labels)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the smaller sizes only")
    args = ap.parse_args()
    cont = [10, 1_000_000] + ([] if args.quick else [3_000_000])
    fresh = [10, 100_000] + ([] if args.quick else [300_000])
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        rows += [_case(tmp, "continual", k, 1000, 8) for k in cont]
        rows += [_case(tmp, "fresh", k, 1000, 512) for k in fresh]
    fixed = {r["kind"]: r["peak_rss"] for r in rows if r["labels"] == 10}
    for r in rows:
        r["above_fixed"] = r["peak_rss"] - fixed[r["kind"]]
        r["estimate_over_measured"] = r["estimate"] / r["above_fixed"] if r["labels"] > 10 else None
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "capacity_rss.json").write_text(json.dumps(rows, indent=2))
    lines = ["| run | labels | D | dim | peak RSS MiB | above fixed MiB | estimate MiB | estimate / measured "
             "|",
             "|---|---|---|---|---|---|---|---|"]
    def ratio(x: float | None) -> str:
        return "(fixed cost)" if x is None else f"{x:.2f}"

    for r in rows:
        lines.append(f"| {r['kind']} | {r['labels']:,} | {r['features']:,} | {r['dim']} | "
                     f"{r['peak_rss'] / 2**20:,.0f} | {r['above_fixed'] / 2**20:,.0f} | "
                     f"{r['estimate'] / 2**20:,.0f} | {ratio(r['estimate_over_measured'])} |")
    (RESULTS / "capacity_rss.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
