"""Where the continual model's old-label P@1 goes: old labels ranked worse, or new labels ranked first?

`bench/continual.py` compares the continual model's P@1 on the old-label test rows (rows whose labels
were all kept) with the base's. The base cannot name a new label at all; the continual model, like a
full retrain, sometimes ranks a new label first on such a row, which is a miss there. For each set and
seed this script trains the same three models with the defaults (base, continual from it, full retrain)
and, on the old-label rows, scores every label exactly to report:

* P@1 as the benchmark counts it;
* P@1 with the new labels masked out: how well the model ranks the old labels among themselves;
* the share of rows whose first label is a new one;
* the trade-off of one shift δ added to every new label's score of the continual model (δ < 0 ranks
  them first less often): new-label P@1 as a share of the full retrain's, and old-label P@1 − base,
  the two targets of the benchmark that pull against each other.

    .venv/bin/python bench/continual_old_rows.py [--sets bibtex corel5k] [--seeds 0 1 2]

Results: bench/results/continual_old_rows.json and .md.
"""

from __future__ import annotations

import argparse
import json
import shutil
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

from continual import PhaseHooks, base_split, load_set  # noqa: E402
from stamp import RESULTS, stamp, stamped, under_title  # noqa: E402

from trainer.artifact import load_artifact  # noqa: E402
from trainer.params import TrainParams  # noqa: E402
from trainer.train import train  # noqa: E402

DELTAS = (0.0, -0.1, -0.2, -0.3, -0.5, -0.75, -1.0)


def scores(model_dir: Path, test: Any) -> tuple[np.ndarray, np.ndarray]:
    """Every test row's score for every label (the sets here are small), and the labels' original ids."""
    m = load_artifact(model_dir)
    orig = np.array([int(n) for n in m.label_names], dtype=np.int64)
    h = m.model.encode(m.featurizer.transform(test)).numpy()
    return h @ m.head_weight.T + m.head_bias, orig


def hit_rate(s: np.ndarray, orig: np.ndarray, y: sp.csr_matrix, rows: np.ndarray, held: np.ndarray,
             shift: float = 0.0) -> tuple[float, float]:
    """(P@1 on `rows`, share of them whose first label is a new one) with `shift` added to every new
    label's score (-inf: the new labels masked out)."""
    if not rows.size:
        return 0.0, 0.0
    first = orig[(s[rows] + np.where(held[orig], shift, 0.0)).argmax(1)]
    return float(np.mean(np.asarray(y[rows, first]).ravel() > 0)), float(np.mean(held[first]))


def run_set(name: str, seeds: list[int], data_dir: Path, tmp: Path) -> list[dict[str, Any]]:
    train_ds, test_ds = load_set(name, data_dir)
    y = sp.csr_matrix(test_ds.Y)
    out = []
    for seed in seeds:
        base_ds, held = base_split(train_ds, seed)
        carries_new = np.asarray(y[:, np.flatnonzero(held)].sum(axis=1)).ravel() > 0
        labelled = np.diff(y.indptr) > 0
        old_rows, new_rows = np.flatnonzero(labelled & ~carries_new), np.flatnonzero(carries_new)
        d = tmp / f"{name}-{seed}"
        params = TrainParams(seed=seed)
        train(params, base_ds, None, out_dir=d / "base", hooks=PhaseHooks())
        train(params, train_ds, None, out_dir=d / "continual", hooks=PhaseHooks(), base=d / "base")
        train(params, train_ds, None, out_dir=d / "full", hooks=PhaseHooks())
        scored = {run: scores(d / run, test_ds) for run in ("base", "continual", "full")}
        r: dict[str, Any] = {"set": name, "seed": seed, "old_rows": int(old_rows.size),
                             "new_rows": int(new_rows.size)}
        for run, (s, orig) in scored.items():
            p1, new_first = hit_rate(s, orig, y, old_rows, held)
            r[run] = {"old_p@1": p1, "old_p@1_masked": hit_rate(s, orig, y, old_rows, held, -np.inf)[0],
                      "new_first": new_first}
        full_new = hit_rate(*scored["full"], y, new_rows, held)[0]
        s, orig = scored["continual"]
        r["shift"] = {f"{dl:+.2f}": {"new_p@1_ratio": hit_rate(s, orig, y, new_rows, held, dl)[0] / full_new,
                                     "old_p@1_delta_vs_base": hit_rate(s, orig, y, old_rows, held, dl)[0]
                                     - r["base"]["old_p@1"]}
                      for dl in DELTAS}
        shutil.rmtree(d, ignore_errors=True)
        print(json.dumps(r), flush=True)
        out.append(r)
    return out


def write_md(results: list[dict[str, Any]], command: str) -> None:
    lines = ["# Continual training: old-label rows, where the P@1 goes", "",
             f"Command: `{command}`  ", "Defaults throughout (only `seed` set); three models per seed as in "
             "`bench/continual.py` (base on the rows without a held-out label, continual from it on the full "
             "training set, full retrain). Old-label rows: test rows whose labels were all kept. Every label "
             "scored exactly. Means over seeds, each seed in brackets.", ""]
    for name in dict.fromkeys(r["set"] for r in results):
        rs = [r for r in results if r["set"] == name]

        def cell(get: Any, rs: list[dict[str, Any]] = rs) -> str:
            v = [get(r) for r in rs]
            return f"{np.mean(v):.4f} ({' / '.join(f'{x:.4f}' for x in v)})"

        lines += [f"## {name} ({' / '.join(str(r['old_rows']) for r in rs)} old-label test rows)", "",
                  "| model | old P@1 | old P@1, new labels masked | new label first |", "|---|---|---|---|"]
        for run in ("base", "continual", "full"):
            lines.append(f"| {run} | {cell(lambda r, run=run: r[run]['old_p@1'])} | "
                         f"{cell(lambda r, run=run: r[run]['old_p@1_masked'])} | "
                         f"{cell(lambda r, run=run: r[run]['new_first'])} |")
        lines += ["", "One shift δ added to every new label's score of the continual model (0: as served):",
                  "",
                  "| δ | new P@1 / full retrain's (target ≥ 0.95) | old P@1 − base (target ≥ −0.01) |",
                  "|---|---|---|"]
        for dl in DELTAS:
            key = f"{dl:+.2f}"
            lines.append(f"| {key} | {cell(lambda r, key=key: r['shift'][key]['new_p@1_ratio'])} | "
                         f"{cell(lambda r, key=key: r['shift'][key]['old_p@1_delta_vs_base'])} |")
        lines.append("")
    (RESULTS / "continual_old_rows.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--sets", nargs="+", default=["bibtex", "corel5k"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    args = ap.parse_args()
    st = stamp()
    torch.set_num_threads(1)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ovex-old-rows-") as tmp:
        for name in args.sets:
            results += run_set(name, args.seeds, Path(args.data_dir), Path(tmp))
    command = "python bench/continual_old_rows.py " + " ".join(sys.argv[1:])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "continual_old_rows.json").write_text(json.dumps(
        stamped(st, {"deltas": DELTAS, "runs": results}), indent=1))
    write_md(results, command)
    md = RESULTS / "continual_old_rows.md"
    md.write_text(under_title(md.read_text(), st))


if __name__ == "__main__":
    main()
