"""Continual training against a full retrain: new labels learned, old labels kept, time saved.

For each data set and seed, in one run: hold out 20 % of the label ids (seeded) and every training row
that carries one; train the *base* on the rest (its label names are the original ids, so labels match
by name later); then a *continual* run from the base on the full training set (`train(..., base=...)`,
the code path of `ovex train --init-from`), and a *full retrain* on the full training set. All three use
the default `TrainParams` a user gets (only `seed` set; the continual run's defaults are its own:
`continual_epochs`, `replay`, `continual_lr`, `new_label_lr`, `new_label_negatives`, `new_label_init`).
Every model is written as an artifact, loaded back and scored on the test split in the original label ids:

* new: P@k on the test rows carrying a held-out label (continual vs full retrain; target ≥ 95 %);
* old: P@1 on the test rows whose labels are all kept, continual vs the base (target: within 1 point);
* overall P@1, continual vs full retrain (target: within 1 point);
* wall time of the continual run (load base, featurize, train, save) over the full retrain's (≤ 1/3),
  and beside it the ratio of CPU times (`time.process_time`: every thread of this one process; torch
  runs one thread here). On a quiet machine the two agree; on a loaded one wall time also counts the
  other tenants, so the load average before and after each timed run is recorded with it. The
  continual run and the full retrain run back to back, `--repeats` times (default 3) in alternating
  order, and each time is the median of its repeats: a 0.5-second run's wall time moves by a tenth
  between runs of the same code, more than the margin the target leaves. Scores come from the first
  run (a seeded run repeats them exactly).

Extra rows, not the defaults: `--variants` adds continual runs with random new-label rows
(`new_label_init=random`), without replay (`replay=0`, to measure forgetting), with new label rows at
the common learning rate (`new_label_lr=1`), with uniform negatives (`new_label_negatives=0`; it changes
nothing where the negatives cover every label, as on Bibtex and Corel5k), on two ranks (`nproc_per_node=2`,
the head sharded: it should score as one rank does; its time on a 2-core machine says nothing), and, on
request, other
settings (`replay=0.5`, `replay=1`, `continual_epochs=3`, `continual_lr=1` (the base's own learning
rates), `continual_lr=1.5`, the base's cosine decay instead of `continual_schedule=linear`, and
`new_label_negatives` 0.1, 0.2, 0.25, 0.5, 0.75).

Sets: Bibtex and Corel5k from ../shared/data, and planted data at 10^5 labels with 10,000 rows (`synth`)
or 40,000 (`synth-40k`, not run by default).

    .venv/bin/python bench/continual.py [--sets bibtex corel5k synth synth-40k] [--seeds 0 1 2]
        [--variants ...] [--repeats 3] [--merge]

Results: bench/results/continual.json and bench/results/continual.md (one file per run name, `--name`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from stamp import RESULTS, finish, mean_std, stamp, under_title  # noqa: E402

from trainer import metrics as xc_metrics  # noqa: E402
from trainer.artifact import load_artifact  # noqa: E402
from trainer.data import Dataset, read_xc  # noqa: E402
from trainer.hooks import QuietHooks  # noqa: E402
from trainer.params import TrainParams  # noqa: E402
from trainer.synth import synth_dataset  # noqa: E402
from trainer.train import train  # noqa: E402

HOLD_OUT = 0.2
K = 5
VARIANTS: dict[str, dict[str, Any]] = {
    "random-init": {"new_label_init": "random"},
    "no-replay": {"replay": 0.0},
    "new-label-lr-1": {"new_label_lr": 1.0},
    "uniform-negatives": {"new_label_negatives": 0.0},
    "negatives-0.1": {"new_label_negatives": 0.1},
    "negatives-0.2": {"new_label_negatives": 0.2},
    "negatives-0.25": {"new_label_negatives": 0.25},
    "negatives-0.5": {"new_label_negatives": 0.5},
    "negatives-0.75": {"new_label_negatives": 0.75},
    "replay-0.5": {"replay": 0.5},
    "replay-1": {"replay": 1.0},
    "epochs-3": {"continual_epochs": 3},
    "lr-x1": {"continual_lr": 1.0},
    "lr-x1.5": {"continual_lr": 1.5},
    "cosine": {"schedule": "cosine"},
    "ranks-2": {"nproc_per_node": 2},
}
DEFAULT_VARIANTS = ["random-init", "no-replay", "new-label-lr-1", "uniform-negatives", "ranks-2"]
# 10^5 labels: `synth` has few rows (0.1 per label), so writing and first touching the 308 MB model are
# a large share of every run; `synth-40k` has four times the rows, the same model and test rows
SYNTH = {"labels": 100_000, "features": 50_000, "rows": 10_000, "test_rows": 1_000, "seed": 7}
SYNTH_SETS = {"synth": SYNTH, "synth-40k": {**SYNTH, "rows": 40_000}}


def load_set(name: str, data_dir: Path) -> tuple[Dataset, Dataset]:
    if name in SYNTH_SETS:
        s = SYNTH_SETS[name]
        tr = synth_dataset(s["labels"], s["features"], s["rows"], seed=s["seed"])
        te = synth_dataset(s["labels"], s["features"], s["test_rows"], seed=s["seed"], part=1)
        return tr, te
    return read_xc(data_dir / f"{name}_train.txt"), read_xc(data_dir / f"{name}_test.txt")


def base_split(ds: Dataset, seed: int) -> tuple[Dataset, np.ndarray]:
    """The base's training set: rows without a held-out label, labels renumbered, named by original id."""
    rng = np.random.default_rng([seed, 0xC0])
    held = np.zeros(ds.n_labels, dtype=bool)
    held[rng.choice(ds.n_labels, size=round(HOLD_OUT * ds.n_labels), replace=False)] = True
    y = sp.csr_matrix(ds.Y)
    rows = np.flatnonzero(np.asarray(y[:, np.flatnonzero(held)].sum(axis=1)).ravel() == 0)
    kept = np.flatnonzero(~held)
    sub = ds.take(rows)
    Y = sp.csr_matrix(sub.Y[:, kept])
    base = Dataset(Y=Y, n_features=ds.n_features, n_labels=kept.size, X=sub.X,
                   label_names=[str(i) for i in kept], path=ds.path)
    return base, held


def score(model_dir: Path, test: Dataset) -> np.ndarray:
    """Top-5 predictions of an artifact on the test rows, as ORIGINAL label ids (-1 = none)."""
    m = load_artifact(model_dir)
    top, _ = m.topk(m.featurizer.transform(test), K)
    orig = np.array([int(n) for n in m.label_names], dtype=np.int64)
    return np.asarray(orig[top])


def p_at(top: np.ndarray, y: sp.csr_matrix, rows: np.ndarray) -> dict[str, float]:
    out = xc_metrics.evaluate_topk(top[rows], y[rows], None, ks=(1, 3, 5))
    return {k: v for k, v in out.items() if k.startswith("p@")}


def old_p_at(top: np.ndarray, y: sp.csr_matrix, rows: np.ndarray, held: np.ndarray) -> dict[str, float]:
    """P@k on old-label rows, and the share of them whose first label is a held-out one (`new_first`):
    what a model that knows the new labels loses there, beside the old labels it ranks wrong."""
    first = top[rows, 0]
    return {**p_at(top, y, rows), "new_first": float(np.mean((first >= 0) & held[np.maximum(first, 0)]))}


class PhaseHooks(QuietHooks):
    """Silent hooks that note when each log line came: where a run's wall time goes."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, str]] = []

    def on_log(self, message: str) -> None:
        self.marks.append((time.perf_counter(), message))

    def phases(self, t0: float, t1: float) -> dict[str, float]:
        """setup (load a base, featurize, build and initialise the model), train (the epochs), save."""
        start = next(t for t, m in self.marks if m.startswith("training "))
        trained = max(t for t, m in self.marks if m.startswith("epoch "))
        return {"setup_s": start - t0, "train_s": trained - start, "save_s": t1 - trained}


def timed(fn: Any, hooks: PhaseHooks) -> tuple[Any, dict[str, Any]]:
    """(result, {wall_s, cpu_s, load, phases}): CPU seconds of this process (all its threads), and the
    1-minute load average before and after, since on a shared machine wall time also counts the other
    tenants; `fn` trains with `hooks`, whose log lines split the wall time into phases."""
    load0 = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    t1 = time.perf_counter()
    wall, cpu = t1 - t0, time.process_time() - c0
    return out, {"wall_s": wall, "cpu_s": cpu, "load": [round(load0, 2), round(os.getloadavg()[0], 2)],
                 "phases": hooks.phases(t0, t1)}


def median_time(ts: list[dict[str, Any]]) -> dict[str, Any]:
    """Timings of repeated runs: the median wall and CPU time and phases, every wall time, the load range."""
    return {"wall_s": float(np.median([t["wall_s"] for t in ts])),
            "cpu_s": float(np.median([t["cpu_s"] for t in ts])),
            "phases": {k: float(np.median([t["phases"][k] for t in ts])) for k in ts[0]["phases"]},
            "load": [min(min(t["load"]) for t in ts), max(max(t["load"]) for t in ts)],
            "wall_s_each": [round(t["wall_s"], 4) for t in ts]}


def run_one(name: str, train_ds: Dataset, test_ds: Dataset, seed: int, variants: list[str],
            tmp: Path, repeats: int = 1) -> dict[str, Any]:
    base_ds, held = base_split(train_ds, seed)
    y = sp.csr_matrix(test_ds.Y)
    carries_new = np.asarray(y[:, np.flatnonzero(held)].sum(axis=1)).ravel() > 0
    labelled = np.diff(y.indptr) > 0
    new_rows, old_rows = np.flatnonzero(carries_new), np.flatnonzero(labelled & ~carries_new)
    all_rows = np.arange(test_ds.n_rows)
    params = TrainParams(seed=seed)
    d = tmp / f"{name}-{seed}"
    hooks = PhaseHooks()
    _, t_base = timed(lambda: train(params, base_ds, None, out_dir=d / "base", hooks=hooks), hooks)
    # the base of a continual run is the served version: scored (read) before the timed runs, as a server
    # has read it (artifacts are written past the page cache, so an unread one would come from disk)
    base_top = score(d / "base", test_ds)
    runs: dict[str, dict[str, Any]] = {}
    times: dict[str, list[dict[str, Any]]] = {}
    pair: list[tuple[str, dict[str, Any] | None]] = [("continual", {}), ("full", None)]
    # the timed pair back to back, `repeats` times, in alternating order; then the extra rows once each
    pairs = [pair if (seed + i) % 2 == 0 else pair[::-1] for i in range(repeats)]
    plan = [run for p in pairs for run in p] + [(f"continual-{v}", VARIANTS[v]) for v in variants]
    for run, extra in plan:
        out = d / run
        hooks = PhaseHooks()
        if extra is None:
            res, t = timed(lambda out=out, h=hooks: train(params, train_ds, None, out_dir=out, hooks=h),
                           hooks)
        else:
            p = TrainParams(seed=seed, **extra)
            res, t = timed(lambda p=p, out=out, h=hooks: train(p, train_ds, None, out_dir=out, hooks=h,
                                                              base=d / "base"), hooks)
        times.setdefault(run, []).append(t)
        if run in runs:  # a repeat: the same seeded run, timed again (its scores are the first's)
            continue
        top = score(out, test_ds)
        runs[run] = {"steps": res.steps, "epochs": res.epochs,
                     "new": p_at(top, y, new_rows), "old": old_p_at(top, y, old_rows, held),
                     "all": p_at(top, y, all_rows)}
    for run, ts in times.items():
        runs[run].update(median_time(ts))
    runs["base"] = {**t_base, "old": old_p_at(base_top, y, old_rows, held),
                    "all": p_at(base_top, y, all_rows), "new": p_at(base_top, y, new_rows)}
    runs = {"continual": runs["continual"], "full": runs["full"],
            **{k: v for k, v in runs.items() if k not in ("continual", "full")}}
    shutil.rmtree(d, ignore_errors=True)
    c, f, b = runs["continual"], runs["full"], runs["base"]
    summary = {
        "new_p@1_ratio": c["new"]["p@1"] / max(f["new"]["p@1"], 1e-12),
        "new_p@5_ratio": c["new"]["p@5"] / max(f["new"]["p@5"], 1e-12),
        "old_p@1_delta_vs_base": c["old"]["p@1"] - b["old"]["p@1"],
        "all_p@1_delta_vs_full": c["all"]["p@1"] - f["all"]["p@1"],
        "time_ratio": c["wall_s"] / f["wall_s"],
        "cpu_time_ratio": c["cpu_s"] / f["cpu_s"],
        # not a target: what knowing the new labels costs old rows even with a full retrain
        "full_old_p@1_delta_vs_base": f["old"]["p@1"] - b["old"]["p@1"],
    }
    return {"set": name, "seed": seed, "held_labels": int(held.sum()), "base_rows": base_ds.n_rows,
            "train_rows": train_ds.n_rows, "test_new_rows": int(new_rows.size),
            "test_old_rows": int(old_rows.size), "runs": runs, "summary": summary,
            "load_average": list(os.getloadavg())}


TARGETS = {
    "new_p@1_ratio": (">=", 0.95), "new_p@5_ratio": (">=", 0.95), "old_p@1_delta_vs_base": (">=", -0.01),
    "all_p@1_delta_vs_full": (">=", -0.01), "time_ratio": ("<=", 1 / 3), "cpu_time_ratio": ("<=", 1 / 3),
}


def aggregate(results: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in dict.fromkeys(r["set"] for r in results):
        rs = [r for r in results if r["set"] == name]
        agg: dict[str, Any] = {}
        for key, (op, bound) in TARGETS.items():
            vals = np.array([r["summary"][key] for r in rs])
            mean = float(vals.mean())
            agg[key] = {"mean": mean, "std": float(vals.std(ddof=1)) if vals.size > 1 else 0.0,
                        "target": f"{op} {bound:.4g}", "met": mean >= bound if op == ">=" else mean <= bound}
        ref = np.array([r["summary"]["full_old_p@1_delta_vs_base"] for r in rs])
        agg["full_old_p@1_delta_vs_base"] = {"mean": float(ref.mean()), "target": "reference", "met": None,
                                             "std": float(ref.std(ddof=1)) if ref.size > 1 else 0.0}
        runs: dict[str, Any] = {}
        for run in rs[0]["runs"]:
            runs[run] = {part: {m: float(np.mean([r["runs"][run][part][m] for r in rs]))
                                for m in ("p@1", "p@3", "p@5")} for part in ("new", "old", "all")}
            runs[run]["old"]["new_first"] = float(np.mean([r["runs"][run]["old"]["new_first"] for r in rs]))
            for t in ("wall_s", "cpu_s"):
                runs[run][t] = float(np.mean([r["runs"][run][t] for r in rs]))
            runs[run]["phases"] = {k: float(np.mean([r["runs"][run]["phases"][k] for r in rs]))
                                   for k in ("setup_s", "train_s", "save_s")}
            runs[run]["load_max"] = float(max(max(r["runs"][run]["load"]) for r in rs))
        out[name] = {"targets": agg, "runs": runs, "seeds": [r["seed"] for r in rs]}
    return out


def write_md(path: Path, agg: dict[str, Any], meta: dict[str, Any]) -> None:
    lines = ["# Continual training vs a full retrain", "",
             f"Command: `{meta['command']}`  ",
             f"Machine: {meta['machine']}; load average at the start {meta['load_start']}, at the end "
             f"{meta['load_average']} (a shared 2-core machine; each run's 1-minute load before and after "
             "it is in the JSON, the highest per run in the table)  ",
             f"Defaults: `{json.dumps(meta['defaults'])}`  ",
             "Synthetic sets: " + "; ".join(
                 f"`{n}` {c['labels']:,} labels, {c['features']:,} features, {c['rows']:,} training rows, "
                 f"{c['test_rows']:,} test rows (seed {c['seed']})" for n, c in meta["synth"].items()), "",
             "Hold out 20 % of the labels (seeded) and every training row carrying one; base = default "
             "training on the rest; continual = `train(base=...)` from the base on the full training set; "
             "full = default training on the full set. Means over seeds; P@k in original label ids. "
             "`old: new 1st` = share of the old-label rows whose first label is a held-out one; setup = load "
             "the base (continual), featurize, build and initialise the model; save = write the model.", ""]
    for name, a in agg.items():
        lines += [f"## {name}", "",
                  "| run | new P@1 | new P@5 | old P@1 | old: new 1st | all P@1 | all P@5 | wall s | cpu s "
                  "| setup / train / save s | max load |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for run, r in a["runs"].items():
            ph = r["phases"]
            lines.append(f"| {run} | {r['new']['p@1']:.4f} | {r['new']['p@5']:.4f} | {r['old']['p@1']:.4f} | "
                         f"{r['old']['new_first']:.4f} | "
                         f"{r['all']['p@1']:.4f} | {r['all']['p@5']:.4f} | {r['wall_s']:.2f} | "
                         f"{r['cpu_s']:.2f} | {ph['setup_s']:.2f} / {ph['train_s']:.2f} / "
                         f"{ph['save_s']:.2f} | {r['load_max']:.1f} |")
        lines += ["", "| target | mean ± std | bound | met |", "|---|---|---|---|"]
        for key, t in a["targets"].items():
            met = "-" if t["met"] is None else "yes" if t["met"] else "NO"
            lines.append(f"| {key} | {mean_std(t)} | {t['target']} | {met} |")
        lines.append("")
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--sets", nargs="+", default=["bibtex", "corel5k", "synth"],
                    choices=["bibtex", "corel5k", *SYNTH_SETS])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--variants", nargs="*", default=DEFAULT_VARIANTS, choices=list(VARIANTS))
    ap.add_argument("--name", default="continual", help="results file stem under bench/results/")
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed runs of the continual/full pair per seed (median); scores: the first's")
    ap.add_argument("--merge", action="store_true",
                    help="keep the other sets already in the results file (a long run split by set)")
    args = ap.parse_args()
    st = stamp()
    torch.set_num_threads(1)
    load_start = [round(x, 2) for x in os.getloadavg()]
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ovex-continual-") as tmp:
        for name in args.sets:
            train_ds, test_ds = load_set(name, Path(args.data_dir))
            for seed in args.seeds:
                r = run_one(name, train_ds, test_ds, seed, args.variants, Path(tmp), args.repeats)
                results.append(r)
                s = r["summary"]
                print(f"{name} seed {seed}: " + " ".join(f"{k} {v:.4f}" for k, v in s.items())
                      + f" load {r['load_average'][0]:.1f}", flush=True)
            # after each set: a long run leaves what it has
            write_results(args.name, results, load_start, args.merge, st)


def write_results(name: str, results: list[dict[str, Any]], load_start: list[float], merge: bool,
                  st: dict[str, Any]) -> None:
    """The JSON and the table; with `merge`, the sets of the file's earlier runs not run now are kept
    (each set's stamp under `stamps`: the run that measured it)."""
    command = "python bench/continual.py " + " ".join(sys.argv[1:])
    commands = [command]
    path = RESULTS / f"{name}.json"
    now_stamp = finish(st)
    stamps = {r["set"]: now_stamp for r in results}
    if merge and path.exists():
        earlier = json.loads(path.read_text())
        stamps = {**{s: v for s, v in earlier.get("stamps", {}).items() if s not in stamps}, **stamps}
        now = {r["set"] for r in results}
        results = [r for r in earlier["runs"] if r["set"] not in now] + results
        commands = [c for c in earlier["meta"].get("commands", [earlier["meta"]["command"]])
                    if c != command] + [command]
    agg = aggregate(results)
    meta = {"command": "; ".join(commands), "commands": commands,
            "machine": f"{platform.machine()} {os.cpu_count()} cpus, torch {torch.__version__}, 1 thread",
            "load_start": load_start, "load_average": [round(x, 2) for x in os.getloadavg()],
            "defaults": TrainParams().to_json_dict(), "synth": SYNTH_SETS}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(
        {**now_stamp, "stamps": stamps, "meta": meta, "aggregate": agg, "runs": results}, indent=1))
    write_md(RESULTS / f"{name}.md", agg, meta)
    md = RESULTS / f"{name}.md"
    md.write_text(under_title(md.read_text(), now_stamp))
    print(json.dumps({n: {k: round(t["mean"], 4) for k, t in a["targets"].items()} for n, a in agg.items()}),
          flush=True)


if __name__ == "__main__":
    main()
