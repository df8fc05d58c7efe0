"""Objectives × encoders × output maps on Bibtex and Corel5k (issue 3).

For every loss (ove, softmax, sparsemax, evsoftmax, dropmax) and encoder (linear; maxout with one hidden
layer) it trains with the default `TrainParams` (the code path of `ovex train`), saves and reloads the
artifact, scores the test set exactly and applies each output map (softmax, sparsemax, ev-softmax) to the
full score rows. Reported per map: P@1/3/5 (maps are monotone, so these depend on the model only), the
mean number of labels with non-zero probability, the share of test rows whose true labels all keep
non-zero probability, the largest deviation of a row's sum from 1, and how often a top-10 answer would be
certified exact by `trainer.sparse_maps` (bound = the 11th score, as exact retrieval gives).

    .venv/bin/python bench/objectives.py [--data-dir ../shared/data] [--sets bibtex corel5k] [--epochs E]

Results go to bench/results/objectives.json (rewritten after every run, so a long run can be watched or
cut short) and bench/results/objectives.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from stamp import RESULTS, stamp, stamped, under_title  # noqa: E402

from trainer import metrics as xc_metrics  # noqa: E402
from trainer.artifact import load_artifact  # noqa: E402
from trainer.data import read_xc  # noqa: E402
from trainer.params import TrainParams  # noqa: E402
from trainer.sparse_maps import (  # noqa: E402
    evsoftmax,
    evsoftmax_threshold_linear,
    evsoftmax_topk,
    linear_head_means,
    softmax,
    sparsemax,
    sparsemax_topk,
)
from trainer.train import train  # noqa: E402

LOSSES = ("ove", "softmax", "sparsemax", "evsoftmax", "dropmax")
ENCODERS = ("linear", "maxout")
MAPS = ("softmax", "sparsemax", "evsoftmax")
TOPK_SERVE = 10


def encoder_params(encoder: str) -> dict[str, Any]:
    """Maxout: one hidden layer of maxout units (default pieces) with dropout, as in Goodfellow et al."""
    if encoder == "maxout":
        return {"encoder": "maxout", "hidden": 1, "dropout": 0.2}
    return {"encoder": "linear"}


def map_stats(name: str, scores: np.ndarray, y: sp.csr_matrix) -> dict[str, float]:
    fn = {"softmax": softmax, "sparsemax": sparsemax, "evsoftmax": evsoftmax}[name]
    p = fn(scores)
    nz = p > 0
    y = y.tocsr()
    has = np.diff(y.indptr) > 0
    labels = [y.indices[y.indptr[i] : y.indptr[i + 1]] for i in range(y.shape[0])]
    covered = np.array([bool(nz[i, lab].all()) for i, lab in enumerate(labels)])
    return {
        "nnz_mean": float(nz.sum(axis=1).mean()),
        "nnz_median": float(np.median(nz.sum(axis=1))),
        "true_labels_covered": float(covered[has].mean()) if has.any() else float("nan"),
        "true_label_any_mass": float(
            np.mean([p[i, y.indices[y.indptr[i] : y.indptr[i + 1]]].sum() > 0 for i in np.flatnonzero(has)])
        ),
        "max_sum_error": float(np.abs(p.sum(axis=1) - 1.0).max()),
    }


def topk_exactness(loaded: Any, h: np.ndarray, scores: np.ndarray, dropmax_model: bool) -> dict[str, float]:
    """Share of rows a top-10 answer certifies exact, with the bound exact retrieval gives (11th score)."""
    order = np.argsort(-scores, axis=1, kind="stable")
    srt = np.take_along_axis(scores, order, axis=1)
    k = min(TOPK_SERVE, scores.shape[1] - 1)
    top, bound = srt[:, :k], srt[:, k]
    _, ex_sp = sparsemax_topk(top, bound)
    if dropmax_model:  # effective scores are not linear in h: the threshold is the mean of exact scores
        t = scores.astype(np.float64).mean(axis=1)
    else:
        w_mean, b_mean = linear_head_means(loaded.head_weight, loaded.head_bias)
        t = evsoftmax_threshold_linear(h, w_mean, b_mean)
    ev = evsoftmax_topk(top, t, bound, scores.shape[1])
    return {
        "sparsemax_top10_exact": float(ex_sp.mean()),
        "evsoftmax_top10_exact": float(ev.exact.mean()),
        "evsoftmax_top10_rest_mass_bound_mean": float(ev.rest_mass_bound.mean()),
    }


def run_one(
    name: str, data_dir: Path, loss: str, encoder: str, epochs: int | None, seed: int
) -> dict[str, Any]:
    tr = read_xc(str(data_dir / f"{name}_train.txt"))
    te = read_xc(str(data_dir / f"{name}_test.txt"))
    kw: dict[str, Any] = {"loss": loss, "seed": seed, "eval_every": 0, **encoder_params(encoder)}
    if epochs is not None:
        kw["epochs"] = epochs
    params = TrainParams(**kw)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "model"
        result = train(params, tr, None, out_dir=out)
        seconds = time.perf_counter() - t0
        loaded = load_artifact(out)
        x = loaded.featurizer.transform(te)
        h = loaded.encode(x)
        scores = loaded.scores(x).astype(np.float64)
    y = te.Y.tocsr()
    top5 = np.argsort(-scores, axis=1, kind="stable")[:, :5]
    m = xc_metrics.evaluate_topk(top5, y, xc_metrics.propensities(tr.Y.tocsr()))
    row: dict[str, Any] = {
        "set": name,
        "loss": loss,
        "encoder": encoder,
        "seed": seed,
        "train_seconds": round(seconds, 1),
        "examples_per_s": round(result.examples_per_s, 1),
        "n_labels": int(y.shape[1]),
        "p@1": m["p@1"],
        "p@3": m["p@3"],
        "p@5": m["p@5"],
        "maps": {mp: map_stats(mp, scores, y) for mp in MAPS},
        **topk_exactness(loaded, h, scores, "dropmax" in loaded.model.extra),
    }
    return row


def write_md(rows: list[dict[str, Any]], path: Path, argv: list[str]) -> None:
    lines = [
        "# Objectives × encoders × output maps",
        "",
        f"Command: `.venv/bin/python bench/objectives.py {' '.join(argv)}` — default `TrainParams` "
        "(maxout: 1 hidden layer, dropout 0.2); exact scores over all labels; one seed.",
        "P@k depends only on the model (every map is monotone in the scores). nnz = mean number of labels "
        "with non-zero probability; covered = share of test rows whose true labels all keep non-zero "
        "probability; top-10 exact = share of rows whose top-10 answer is certified exact "
        "(bound = 11th score).",
        "",
        "| set | loss | encoder | P@1 | P@3 | P@5 | nnz softmax | nnz sparsemax | nnz ev-softmax "
        "| covered sparsemax | covered ev-softmax | top-10 exact sparsemax | top-10 exact ev | train s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mp = r["maps"]
        lines.append(
            f"| {r['set']} | {r['loss']} | {r['encoder']} | {r['p@1']:.4f} | {r['p@3']:.4f} | {r['p@5']:.4f} "
            f"| {mp['softmax']['nnz_mean']:.1f} | {mp['sparsemax']['nnz_mean']:.2f} "
            f"| {mp['evsoftmax']['nnz_mean']:.1f} | {mp['sparsemax']['true_labels_covered']:.3f} "
            f"| {mp['evsoftmax']['true_labels_covered']:.3f} | {r['sparsemax_top10_exact']:.3f} "
            f"| {r['evsoftmax_top10_exact']:.3f} | {r['train_seconds']:.0f} |"
        )
    lines += ["", "## Targets", ""]
    for name in sorted({r["set"] for r in rows}):
        sub = [r for r in rows if r["set"] == name]
        ove = [r["p@1"] for r in sub if r["loss"] == "ove"]
        seeds = [r for r in sub if r["loss"] in ("sparsemax", "evsoftmax", "dropmax")]
        if ove and seeds:
            best = max(seeds, key=lambda r: r["p@1"])
            lines.append(
                f"- {name}: best research objective {best['loss']}/{best['encoder']} P@1 {best['p@1']:.4f} "
                f"vs best plain OVE {max(ove):.4f} ({best['p@1'] - max(ove):+.4f})"
            )
        sm = [r["maps"]["sparsemax"] for r in sub]
        if sm:
            lines.append(
                f"- {name}: sparsemax answers average {np.mean([s['nnz_mean'] for s in sm]):.2f} "
                "non-zero labels "
                f"(max over models {max(s['nnz_mean'] for s in sm):.2f}); largest |sum − 1| "
                f"{max(s['max_sum_error'] for s in sm):.1e}"
            )
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--sets", nargs="+", default=["bibtex", "corel5k"])
    ap.add_argument("--losses", nargs="+", default=list(LOSSES), choices=LOSSES)
    ap.add_argument("--encoders", nargs="+", default=list(ENCODERS), choices=ENCODERS)
    ap.add_argument("--epochs", type=int, default=None, help="override the default epochs (smoke runs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "objectives")
    args = ap.parse_args(argv)
    raw_argv = sys.argv[1:] if argv is None else argv
    args.out.parent.mkdir(parents=True, exist_ok=True)
    st = stamp()
    rows: list[dict[str, Any]] = []
    for name in args.sets:
        if not (args.data_dir / f"{name}_train.txt").exists():
            print(f"skip {name}: no {name}_train.txt in {args.data_dir}", file=sys.stderr)
            continue
        for loss in args.losses:
            for enc in args.encoders:
                row = run_one(name, args.data_dir, loss, enc, args.epochs, args.seed)
                rows.append(row)
                sm, ev = row["maps"]["sparsemax"], row["maps"]["evsoftmax"]
                print(
                    f"{name:8s} {loss:9s} {enc:7s} P@1 {row['p@1']:.4f} P@3 {row['p@3']:.4f} "
                    f"P@5 {row['p@5']:.4f} nnz sparsemax {sm['nnz_mean']:.2f} ev {ev['nnz_mean']:.1f} "
                    f"covered sparsemax {sm['true_labels_covered']:.3f} ({row['train_seconds']:.0f}s)",
                    flush=True,
                )
                blob = json.dumps(stamped(st, {"argv": raw_argv, "rows": rows}), indent=1)
                args.out.with_suffix(".json").write_text(blob)
                write_md(rows, args.out.with_suffix(".md"), raw_argv)
                md = args.out.with_suffix(".md")
                md.write_text(under_title(md.read_text(), st))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
