"""`ovex train --ensemble 2` against one default model and against one model of the same width
(`--dim 1024`), each through the console command a user runs.

For each set and seed, each arm is trained by `ovex train` as a subprocess (real.py's `run_ovex`: the
artifact is loaded back and the test rows scored with `model.topk`, one scorer and label space as
real.py, test-only labels count as misses). An ensemble of 2 from seed s trains seeds s and s+1 and
serves one model 1024 wide, exactly the sum of their scores (tests/test_ensemble.py); `--dim 1024` is a
single model of that width. A record of a decision, not a figure of today's defaults:
`make bench ONLY=ensemble`.

    .venv/bin/python bench/ensemble.py [--sets wordnet bibtex corel5k] [--seeds 0 1 2]
        [--out bench/results/ensemble]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from real import _stats, load_set, run_ovex  # noqa: E402
from stamp import RESULTS, finish, mean_std, stamp, write_results  # noqa: E402

from trainer import metrics as xc_metrics  # noqa: E402

SETS = ("wordnet", "bibtex", "corel5k")
SHOWN = ("p@1", "p@3", "p@5", "psp@5")
COSTS = ("train_wall_s", "model_mb")
# (label, extra flags): the defaults, the option, and one model as wide as the option's
ARMS: tuple[tuple[str, list[str]], ...] = (
    ("defaults", []), ("--ensemble 2", ["--ensemble", "2"]), ("--dim 1024", ["--dim", "1024"]))


def run_set(set_name: str, seeds: list[int], data_dir: Path, work: Path) -> dict[str, Any]:
    b = load_set(set_name, data_dir)
    prop = xc_metrics.propensities(b.y_train)
    out: dict[str, Any] = {}
    for label, extra in ARMS:
        runs = []
        for seed in seeds:
            res = run_ovex(b, set_name, "ovex", seed, extra, work)
            res["model_mb"] = (work / "model" / "weights.safetensors").stat().st_size / 2**20
            m = xc_metrics.evaluate_topk(res["top"], b.y_test, prop)
            runs.append({**{k: float(m[k]) for k in SHOWN}, **{k: float(res[k]) for k in COSTS}})
            print(f"{set_name} {label} seed {seed}: p@1 {runs[-1]['p@1']:.4f}, {res['train_wall_s']:.1f} s",
                  flush=True)
        out[label] = {**{k: _stats([r[k] for r in runs]) for k in (*SHOWN, *COSTS)}, "runs": runs}
    return out


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# `ovex train --ensemble 2` against one default model and one model of the same width",
        "",
        f"Command: `{result['command']}`  ",
        f"Commit {result['commit'][:12]}{' (dirty)' if result['dirty'] else ''}, {result['date']}; "
        f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']:.1f} GiB; torch {result['torch']}.  ",
        f"Seeds {result['seeds']}: mean ± sample std. Each arm is `ovex train` with the defaults plus its "
        "flags; `--ensemble 2` from seed s trains seeds s and s+1 (train wall: the whole command's). Model "
        "MB: the saved weights file, what a server loads. (Peak RSS is left out: one process runs every "
        "`ovex train` here, and a child's peak would start from this process's.)",
        "",
        "| set | arm | " + " | ".join(SHOWN) + " | train wall s | model MB |",
        "|---" * (len(SHOWN) + 4) + "|",
    ]
    for set_name, r in result["sets"].items():
        for label, _ in ARMS:
            a = r[label]
            cells = " | ".join(mean_std(a[k]) for k in SHOWN)
            lines.append(f"| {set_name} | {label} | {cells} | {a['train_wall_s']['mean']:.1f} ± "
                         f"{a['train_wall_s']['std']:.1f} | {a['model_mb']['mean']:,.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=RESULTS / "ensemble")
    args = ap.parse_args()
    st = stamp()
    result: dict[str, Any] = {**finish(st), "seeds": args.seeds, "sets": {}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for set_name in args.sets:
        with tempfile.TemporaryDirectory(prefix="ovex-ensemble-") as tmp:
            result["sets"][set_name] = run_set(set_name, args.seeds, args.data_dir, Path(tmp))
        write_results(args.out, result, st, markdown)
    print(markdown(result))


if __name__ == "__main__":
    main()
