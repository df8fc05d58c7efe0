"""Must-show 3: a 10^6-label synthetic model trains to P@1 far above chance and its artifact loads back.

    .venv/bin/python bench/scale.py [--labels 1000000] [--rows 200000] [--epochs 2]

Writes bench/results/scale.json and .md. The model directory goes to a temporary directory (it is large)
unless --model-dir is given.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from stamp import RESULTS, markdown_line, stamp, stamped  # noqa: E402

from trainer.artifact import load_artifact  # noqa: E402
from trainer.hooks import Progress  # noqa: E402
from trainer.metrics import evaluate_topk  # noqa: E402
from trainer.params import TrainParams  # noqa: E402
from trainer.synth import synth_dataset  # noqa: E402
from trainer.train import train  # noqa: E402


class PrintHooks:
    def on_progress(self, progress: Progress) -> None:
        pass

    def on_log(self, message: str) -> None:
        print(message, flush=True)

    def should_stop(self) -> bool:
        return False


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--labels", type=int, default=1_000_000)
    ap.add_argument("--features", type=int, default=100_000)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--test-rows", type=int, default=2_000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--negatives", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=None, help="default: TrainParams' default")
    ap.add_argument("--optimizer", choices=["adam", "adagrad"], default=None, help="default: TrainParams'")
    ap.add_argument("--input-lr", type=float, default=None, help="default: by the run length")
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--out", default=str(RESULTS / "scale"))
    args = ap.parse_args()
    st = stamp()

    t0 = time.perf_counter()
    train_ds = synth_dataset(args.labels, args.features, args.rows, seed=7)
    test_ds = synth_dataset(args.labels, args.features, args.test_rows, seed=7, part=1)
    t_data = time.perf_counter() - t0
    labels_per_row = train_ds.Y.nnz / train_ds.n_rows
    seen = int((np.bincount(train_ds.Y.indices, minlength=args.labels) > 0).sum())
    print(f"data: {args.rows:,} rows, {labels_per_row:.2f} labels/row, {seen:,} distinct labels seen, "
          f"{t_data:.1f}s", flush=True)

    extra: dict[str, Any] = {} if args.lr is None else {"lr": args.lr}
    if args.optimizer is not None:
        extra["optimizer"] = args.optimizer
    if args.input_lr is not None:
        extra["input_lr"] = args.input_lr
    params = TrainParams(
        dim=args.dim, epochs=args.epochs, batch_size=args.batch_size, negatives=args.negatives, eval_every=0,
        **extra,
    )
    tmp = Path(tempfile.mkdtemp(prefix="ovex-scale-")) if args.model_dir is None else None
    model_dir = Path(args.model_dir) if args.model_dir else (tmp or Path()) / "model"
    try:
        result = train(params, train_ds, test_ds, out_dir=model_dir, hooks=PrintHooks())
        t1 = time.perf_counter()
        loaded = load_artifact(model_dir)
        t_load = time.perf_counter() - t1
        x_test = loaded.featurizer.transform(test_ds)
        top, _ = loaded.topk(x_test, 5)
        reloaded = evaluate_topk(top, test_ds.Y, loaded.propensities())
        size = dir_size(model_dir)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    # chance: a random label is right with probability (labels per row) / K; the most frequent label
    # predicted for everyone is the stronger trivial baseline
    counts = np.bincount(train_ds.Y.indices, minlength=args.labels)
    top_label = int(np.argmax(counts))
    y_test = test_ds.Y.tocsc()
    majority_p1 = float(y_test[:, top_label].sum()) / test_ds.n_rows
    top5 = np.argsort(-counts)[:5]
    majority_p5 = float(y_test[:, top5].sum()) / (5 * test_ds.n_rows)
    report: dict[str, Any] = {
        "labels": args.labels,
        "features": args.features,
        "rows": args.rows,
        "test_rows": args.test_rows,
        "params": params.to_json_dict(),
        "threads": torch.get_num_threads(),
        "train_seconds": result.seconds,
        "examples_per_s": result.examples_per_s,
        "metrics": result.metrics,
        "metrics_after_reload": reloaded,
        "reload_matches": all(abs(reloaded[k] - result.metrics[k]) < 1e-9 for k in ("p@1", "p@3", "p@5")),
        "chance_p1": labels_per_row / args.labels,
        "majority_label_p1": majority_p1,
        "majority_top5_p5": majority_p5,
        "artifact_bytes": size,
        "load_seconds": t_load,
        "head_shape": list(loaded.head_weight.shape),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(stamped(st, report), indent=2))
    m = result.metrics
    md = [
        "# Scale: a 10^6-label model",
        "",
        markdown_line(st),
        "",
        f"Synthetic data (trainer.synth, seed 7): {args.labels:,} labels, {args.features:,} features, "
        f"{args.rows:,} training rows ({labels_per_row:.2f} labels/row, {seen:,} distinct labels seen), "
        f"{args.test_rows:,} test rows. d={args.dim}, {args.epochs} epochs, batch {args.batch_size}, "
        f"{args.negatives} negatives, loss {params.loss} in groups of {params.group_size}, "
        f"table optimizer {params.optimizer} lr {params.lr}, input table lr "
        f"{params.input_lr or 'by the run length (the default)'}.",
        "",
        "| P@1 | P@3 | P@5 | chance P@1 | most-frequent P@1 | top-5 frequent P@5 | train s | examples/s "
        "| artifact MB | load s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {m['p@1']:.4f} | {m['p@3']:.4f} | {m['p@5']:.4f} | {report['chance_p1']:.2e} | {majority_p1:.4f} "
        f"| {majority_p5:.4f} "
        f"| {result.seconds:.0f} | {result.examples_per_s:,.0f} | {size / 1e6:.0f} | {t_load:.1f} |",
        "",
        f"Reloaded artifact gives the same metrics: {report['reload_matches']} "
        f"(head {report['head_shape']}).",
    ]
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
