"""Continual training at 10^6 labels: time, peak memory and P@1 of growing a model against a full retrain.

    .venv/bin/python bench/continual_scale.py [--labels 1000000] [--rows 20000] [--repeats 2]

Planted data (`trainer.synth`), 20 % of the labels held out as in `bench/continual.py`: the base trains
on the rows without a held-out label, then a continual run from it on every row (`train(base=...)`, the
path of `ovex train --init-from`) and a full retrain on every row, all with the default parameters (only
`seed` set). Each run is its own process, so its peak RSS is its own (`ru_maxrss`).

Extra row, not the defaults: `continual-zeroed-moments` allocates the optimizer's moments zeroed up
front, as the trainer did before it zeroed each row's moments at the row's first update. A short run
updates a small share of 10^6 head rows, so the rest of that memory is never touched. Its scores must
equal the default continual run's (the same arithmetic); the time and memory are what the change saves.

Writes bench/results/continual_scale.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from continual import PhaseHooks, base_split, median_time, old_p_at, p_at, score, timed  # noqa: E402
from stamp import RESULTS, stamp, stamped, under_title  # noqa: E402

from trainer import optim  # noqa: E402
from trainer.params import TrainParams  # noqa: E402
from trainer.synth import synth_dataset  # noqa: E402
from trainer.train import train  # noqa: E402

FEATURES, TEST_ROWS, DATA_SEED = 50_000, 1_000, 7


def child(args: argparse.Namespace) -> None:
    """One timed run in this process; prints its figures as one JSON line."""
    torch.set_num_threads(1)
    if args.run == "continual-zeroed-moments":
        optim._unzeroed = lambda shape, like: torch.zeros(shape, device=like.device)  # type: ignore[assignment]
    tr = synth_dataset(args.labels, FEATURES, args.rows, seed=DATA_SEED)
    d = Path(args.dir)
    params = TrainParams(seed=args.seed)
    hooks = PhaseHooks()
    if args.run == "base":
        ds, base = base_split(tr, args.seed)[0], None
    else:
        ds, base = tr, (d / "base" if args.run.startswith("continual") else None)
    _, t = timed(lambda: train(params, ds, None, out_dir=d / args.run, hooks=hooks, base=base), hooks)
    print(json.dumps({**t, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))


def run_child(run: str, args: argparse.Namespace, d: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", run, "--dir", str(d), "--labels", str(args.labels),
           "--rows", str(args.rows), "--seed", str(args.seed)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    res: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    print(f"{run}: {res['wall_s']:.2f} s, peak RSS {res['peak_rss_gb']:.2f} GB", flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--labels", type=int, default=1_000_000)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2, help="timed runs of each continual row (median)")
    ap.add_argument("--child", dest="run", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run is not None:
        child(args)
        return
    st = stamp()
    tr = synth_dataset(args.labels, FEATURES, args.rows, seed=DATA_SEED)
    test = synth_dataset(args.labels, FEATURES, TEST_ROWS, seed=DATA_SEED, part=1)
    held = base_split(tr, args.seed)[1]
    y = sp.csr_matrix(test.Y)
    carries_new = np.asarray(y[:, np.flatnonzero(held)].sum(axis=1)).ravel() > 0
    new_rows = np.flatnonzero(carries_new)
    old_rows = np.flatnonzero((np.diff(y.indptr) > 0) & ~carries_new)
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="ovex-continual-scale-") as tmp:
        d = Path(tmp)
        plan = ["base"] + [r for i in range(args.repeats) for r in
                           (("continual", "continual-zeroed-moments") if i % 2 == 0
                            else ("continual-zeroed-moments", "continual"))] + ["full"]
        timings: dict[str, list[dict[str, Any]]] = {}
        tops: dict[str, np.ndarray] = {}
        for run in plan:
            timings.setdefault(run, []).append(run_child(run, args, d))
            if run == "base":  # read before the timed runs, as the server that serves it has read it
                tops[run] = score(d / run, test)
        for run, ts in timings.items():
            top = tops[run] if run in tops else score(d / run, test)
            runs[run] = {
                **median_time(ts), "peak_rss_gb": float(max(t["peak_rss_gb"] for t in ts)),
                "new": p_at(top, y, new_rows), "old": old_p_at(top, y, old_rows, held),
                "all": p_at(top, y, np.arange(test.n_rows)),
            }
    c, z, f = runs["continual"], runs["continual-zeroed-moments"], runs["full"]
    summary = {"time_ratio": c["wall_s"] / f["wall_s"], "new_p@1_ratio": c["new"]["p@1"] / f["new"]["p@1"],
               "all_p@1_delta_vs_full": c["all"]["p@1"] - f["all"]["p@1"],
               "old_p@1_delta_vs_base": c["old"]["p@1"] - runs["base"]["old"]["p@1"],
               "zeroed_moments_time_ratio": c["wall_s"] / z["wall_s"],
               "zeroed_moments_peak_rss_ratio": c["peak_rss_gb"] / z["peak_rss_gb"],
               "same_scores_as_zeroed": c["all"] == z["all"] and c["new"] == z["new"]}
    meta = {"command": "python bench/continual_scale.py " + " ".join(sys.argv[1:]),
            "machine": f"{platform.machine()} {os.cpu_count()} cpus, torch {torch.__version__}, 1 thread",
            "labels": args.labels, "features": FEATURES, "rows": args.rows, "test_rows": TEST_ROWS,
            "seed": args.seed, "defaults": TrainParams().to_json_dict()}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "continual_scale.json").write_text(json.dumps(
        stamped(st, {"meta": meta, "summary": summary, "runs": runs}), indent=1))
    write_md(RESULTS / "continual_scale.md", meta, runs, summary)
    md = RESULTS / "continual_scale.md"
    md.write_text(under_title(md.read_text(), st))
    print(json.dumps(summary), flush=True)


def write_md(path: Path, meta: dict[str, Any], runs: dict[str, dict[str, Any]],
             summary: dict[str, Any]) -> None:
    lines = ["# Continual training at scale", "",
             f"Command: `{meta['command']}`  ",
             f"Machine: {meta['machine']}  ",
             f"Data: planted, {meta['labels']:,} labels, {meta['features']:,} features, {meta['rows']:,} "
             f"training rows, {meta['test_rows']:,} test rows; 20 % of the labels held out (seed "
             f"{meta['seed']}); default parameters throughout. Each run in its own process; times are "
             "medians of the repeats.", "",
             "| run | new P@1 | old P@1 | all P@1 | all P@5 | wall s | cpu s | setup / train / save s "
             "| peak RSS GB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for run, r in runs.items():
        ph = r["phases"]
        lines.append(f"| {run} | {r['new']['p@1']:.4f} | {r['old']['p@1']:.4f} | {r['all']['p@1']:.4f} | "
                     f"{r['all']['p@5']:.4f} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {ph['setup_s']:.2f} / "
                     f"{ph['train_s']:.2f} / {ph['save_s']:.2f} | {r['peak_rss_gb']:.2f} |")
    lines += ["", "| figure | value |", "|---|---|"]
    lines += [f"| {k} | {v:.4f} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in summary.items()]
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
