"""Hyper-parameter sweep on Bibtex and Corel5k: the evidence behind the `TrainParams` defaults.

Each configuration is a JSON object of `TrainParams` overrides applied on top of the defaults; it is
trained through `trainer.train.train` (the code path of `ovex train`) on both sets and scored on the
test split with `trainer.metrics`. Every run appends one line to a JSONL log, so a sweep can be cut
short and resumed, and `--table` turns the log into the markdown table of bench/results/accuracy_sweep.md.

    .venv/bin/python bench/sweep.py --config '{"lr": 0.02}' --config '{"dim": 512}' [--seeds 0 1]
    .venv/bin/python bench/sweep.py --table
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.data import Dataset, read_xc  # noqa: E402
from trainer.hooks import QuietHooks  # noqa: E402
from trainer.params import TrainParams  # noqa: E402
from trainer.train import train  # noqa: E402

SETS = ("bibtex", "corel5k")
DEFAULT_LOG = ROOT / "bench" / "results" / "accuracy_sweep.jsonl"


def load_sets(data_dir: Path, names: tuple[str, ...]) -> dict[str, tuple[Dataset, Dataset]]:
    return {n: (read_xc(data_dir / f"{n}_train.txt"), read_xc(data_dir / f"{n}_test.txt")) for n in names}


def run_one(overrides: dict[str, Any], tr: Dataset, te: Dataset, seed: int) -> dict[str, Any]:
    """Train with defaults + overrides (no evaluation until the end) and return the test metrics."""
    params = TrainParams(**{"eval_every": 0, **overrides, "seed": seed})
    t0 = time.perf_counter()
    result = train(params, tr, te, out_dir=None, hooks=QuietHooks())
    curve = [round(h["metrics"]["p@1"], 4) for h in result.history if "metrics" in h]
    return {"metrics": result.metrics, "seconds": time.perf_counter() - t0, "p1_curve": curve}


def sweep(configs: list[dict[str, Any]], sets: dict[str, tuple[Dataset, Dataset]], seeds: list[int],
          log_path: Path, tag: str) -> None:
    for cfg in configs:
        for name, (tr, te) in sets.items():
            for seed in seeds:
                out = run_one(cfg, tr, te, seed)
                rec = {"tag": tag, "set": name, "seed": seed, "config": cfg, **out,
                       "params": TrainParams(**{**cfg, "seed": seed}).to_json_dict()}
                with log_path.open("a") as fh:
                    fh.write(json.dumps(rec) + "\n")
                m = out["metrics"]
                curve = out["p1_curve"] if len(out["p1_curve"]) > 1 else ""
                print(f"{name:8s} seed {seed} p@1 {m['p@1']:.4f} p@3 {m['p@3']:.4f} p@5 {m['p@5']:.4f} "
                      f"{out['seconds']:5.1f}s  {json.dumps(cfg)} {curve}", flush=True)


def base_of(rec: dict[str, Any]) -> str:
    """Which defaults a run's overrides apply to: from its logged params, or as annotated by hand."""
    params = rec.get("params")
    if params is None:
        return str(rec.get("base", "?"))
    p = params
    base = f"{p['optimizer']} lr {p['lr']}, {p['label_weighting']}"
    if "group_size" in p:  # round v7 on: grouped ove; show the base values, not the overridden ones
        cfg, now = rec.get("config", {}), TrainParams()
        group = now.group_size if "group_size" in cfg else p["group_size"]
        epochs = now.epochs if "epochs" in cfg else p["epochs"]
        base += f", groups {group}, {epochs} ep"
    return base


def table(log_path: Path) -> str:
    """Mean P@1 (and P@5) per configuration and set, in the order configurations were first tried."""
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {}
    tags: dict[str, str] = {}
    for line in log_path.read_text().splitlines():
        rec = json.loads(line)
        cfg = {k: v for k, v in rec["config"].items() if k != "eval_every"}
        key = json.dumps([base_of(rec), cfg], sort_keys=True)
        rows.setdefault(key, {}).setdefault(rec["set"], []).append(rec)
        tags.setdefault(key, rec.get("tag", ""))
    out = ["| # | base | group | overrides of the base defaults | bibtex P@1 | bibtex P@5 | corel5k P@1 "
           "| corel5k P@5 | seeds (bibtex/corel5k) | s/run (bibtex) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for i, (key, by_set) in enumerate(rows.items(), 1):
        cells = []
        for name in SETS:
            recs = by_set.get(name, [])
            if recs:
                p1 = np.array([r["metrics"]["p@1"] for r in recs])
                p5 = np.array([r["metrics"]["p@5"] for r in recs])
                cells += [f"{p1.mean():.4f}", f"{p5.mean():.4f}"]
            else:
                cells += ["–", "–"]
        n = "/".join(str(len(by_set.get(name, []))) for name in SETS)
        secs = [r["seconds"] for r in by_set.get("bibtex", [])]
        sec = f"{np.mean(secs):.0f}" if secs else "–"
        base, overrides = json.loads(key)
        shown = f"`{json.dumps(overrides)}`" if overrides else "(base defaults)"
        out.append(f"| {i} | {base} | {tags[key]} | {shown} | " + " | ".join(cells) + f" | {n} | {sec} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    ap.add_argument("--config", action="append", default=[], help="JSON object of TrainParams overrides")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--tag", default="", help="group name written with each run")
    ap.add_argument("--log", type=Path, default=DEFAULT_LOG)
    ap.add_argument("--table", action="store_true", help="print the markdown table of the log and exit")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the CPU is shared)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.table:
        print(table(args.log))
        return
    configs = [json.loads(c) for c in args.config] or [{}]
    sets = load_sets(args.data_dir, tuple(args.sets))
    args.log.parent.mkdir(parents=True, exist_ok=True)
    sweep(configs, sets, args.seeds, args.log, args.tag)


if __name__ == "__main__":
    main()
