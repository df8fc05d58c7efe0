"""Must-show 1: a training step's cost is flat in K for OVE and linear in K for exact softmax.

Synthetic data (trainer.synth), d=128, ~50 non-zeros per row, the same batches and number of negatives
at every K: the input rows are those generated for the largest K and only the label matrix changes with K,
so the encoder does identical work and any change in throughput comes from the label space. (With each
K's own rows, small K would also get fewer distinct features per batch: its rows share fewer label
prototypes, 11k vs 15k distinct features per 512-row batch at 1e3 vs 1e6.) Reports examples/s of OVE and
of exact softmax at K = 1e3 … 1e6 from one run and writes bench/results/step_cost.json and .md.

    .venv/bin/python bench/step_cost.py [--ks 1000,10000,100000,1000000] [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from stamp import RESULTS, markdown_line, stamp, stamped  # noqa: E402

from trainer.data import label_counts  # noqa: E402
from trainer.losses import get_loss  # noqa: E402
from trainer.model import ModelShape, XCModel  # noqa: E402
from trainer.negatives import NegativeSampler  # noqa: E402
from trainer.params import TrainParams  # noqa: E402
from trainer.step import EpochData, Stepper  # noqa: E402
from trainer.synth import synth  # noqa: E402
from trainer.train import tune_malloc  # noqa: E402


def l2_rows(x: sp.csr_matrix) -> sp.csr_matrix:
    x = sp.csr_matrix(x, dtype=np.float32)
    norms = np.sqrt(np.asarray(x.multiply(x).sum(axis=1)).ravel())
    norms[norms == 0] = 1.0
    out: sp.csr_matrix = sp.csr_matrix(sp.diags(1.0 / norms) @ x, dtype=np.float32)
    out.sort_indices()
    return out


def measure(
    loss: str,
    x: sp.csr_matrix,
    y: sp.csr_matrix,
    k: int,
    params: TrainParams,
    seconds: float,
    max_steps: int,
    warmup: int,
    label: str | None = None,
) -> dict[str, Any]:
    """Examples/s of the training step alone (sampling, scoring, backward, row updates)."""
    label = label or loss
    spec = get_loss(loss)
    shape = ModelShape(n_features=x.shape[1], n_labels=k, dim=params.dim, extra_heads=spec.extra_heads)
    model = XCModel(shape, seed=params.seed)
    sampler = NegativeSampler(k, params.sampler, params.alpha, label_counts(y), seed=1)
    stepper = Stepper(model, spec, params.model_copy(update={"loss": loss}), sampler)
    n = x.shape[0]
    ep = EpochData(x, y, np.random.default_rng(0).permutation(n))
    bs = params.batch_size
    n_batches = n // bs

    def run(count: int, start: int) -> tuple[int, float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        done = 0
        for s in range(count):
            pos = (start + s) % n_batches
            stepper.step(ep, pos * bs, (pos + 1) * bs, params.lr)
            done += 1
            if time.perf_counter() - t0 > seconds:
                break
        return done, time.perf_counter() - t0, time.process_time() - c0

    run(warmup, 0)
    steps, dt, cpu = run(max_steps, warmup)
    rate, cpu_rate = steps * bs / dt, steps * bs / cpu
    print(f"  {label:9s} K={k:>9,d}: {steps:5d} steps in {dt:6.2f}s wall, {cpu:6.2f}s cpu -> "
          f"{rate:10,.0f} examples/s wall, {cpu_rate:10,.0f} examples per cpu-second", flush=True)
    return {"loss": label, "group_size": params.group_size, "k": k, "steps": steps, "seconds": dt,
            "cpu_seconds": cpu, "examples_per_s": rate, "examples_per_cpu_s": cpu_rate}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", default="1000,10000,100000,1000000")
    ap.add_argument("--rows", type=int, default=40_000)
    ap.add_argument("--features", type=int, default=100_000)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--negatives", type=int, default=512)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--softmax-seconds", type=float, default=6.0)
    ap.add_argument("--skip-softmax", action="store_true", help="OVE only (exploring settings)")
    ap.add_argument("--optimizer", default=TrainParams().optimizer, choices=["adam", "adagrad"])
    ap.add_argument("--group-size", type=int, default=TrainParams().group_size, help="ove's group size")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default: all cores)")
    ap.add_argument("--out", default=str(RESULTS / "step_cost"))
    args = ap.parse_args()
    st = stamp()
    tune_malloc()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    torch.manual_seed(0)
    ks = [int(v) for v in args.ks.split(",")]
    params = TrainParams(
        dim=args.dim, batch_size=args.batch_size, negatives=args.negatives, lr=0.01, optimizer=args.optimizer,
        group_size=args.group_size,
    )
    pairs = params.model_copy(update={"group_size": 1})
    results: list[dict[str, Any]] = []
    x = l2_rows(synth(max(ks), args.features, args.rows, seed=0)[0])
    nnz = x.nnz / x.shape[0]
    for k in ks:
        t0 = time.perf_counter()
        y = sp.csr_matrix(synth(k, args.features, args.rows, seed=0)[1], dtype=np.float32)
        print(f"K={k:,}: data {time.perf_counter() - t0:.1f}s, {nnz:.1f} nnz/row, "
              f"{y.nnz / y.shape[0]:.2f} labels/row", flush=True)
        results.append(measure("ove", x, y, k, params, args.seconds, 100_000, warmup=5))
        # the pairwise bound beside it: grouping must not change the step cost
        results.append(measure("ove", x, y, k, pairs, args.seconds, 100_000, warmup=5, label="ove-pairs"))
        if args.skip_softmax:
            continue
        results.append(measure("softmax", x, y, k, params, args.softmax_seconds, 100_000, warmup=1))
        del y

    load_after = os.getloadavg()
    if args.skip_softmax:
        return
    rate = {(r["loss"], r["k"]): r["examples_per_s"] for r in results}
    cpu_rate = {(r["loss"], r["k"]): r["examples_per_cpu_s"] for r in results}
    kmin, kmax = min(ks), max(ks)
    summary = {
        "ove_flatness_wall": rate[("ove", kmax)] / rate[("ove", kmin)],
        "ove_flatness_cpu": cpu_rate[("ove", kmax)] / cpu_rate[("ove", kmin)],
        "ove_vs_softmax_at_kmax_wall": rate[("ove", kmax)] / rate[("softmax", kmax)],
        "ove_vs_softmax_at_kmax_cpu": cpu_rate[("ove", kmax)] / cpu_rate[("softmax", kmax)],
        "ove_examples_per_s_at_kmax": rate[("ove", kmax)],
        "ove_examples_per_cpu_s_at_kmax": cpu_rate[("ove", kmax)],
        "targets": {"flatness": ">= 0.8", "ove_vs_softmax_at_kmax": ">= 100", "ove_ex_per_s": ">= 20000"},
    }
    report = {
        "setup": {
            "dim": args.dim,
            "batch_size": args.batch_size,
            "negatives": args.negatives,
            "optimizer": args.optimizer,
            "group_size": args.group_size,
            "rows": args.rows,
            "features": args.features,
            "nnz_per_row": nnz,
            "threads": torch.get_num_threads(),
            "cpus": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": load_after,
            "torch": torch.__version__,
            "machine": platform.machine(),
        },
        "results": results,
        "summary": summary,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(stamped(st, report), indent=2))
    lines = [
        "# Step cost vs number of labels K",
        "",
        markdown_line(st),
        "",
        f"d={args.dim}, batch {args.batch_size}, {args.negatives} negatives (OVE), ~{nnz:.0f} nnz/row over "
        f"{args.features:,} features, OVE in groups of {args.group_size} (`ove-pairs`: groups of 1), "
        f"table optimizer {args.optimizer}, "
        f"{torch.get_num_threads()} torch threads, the same input rows at every K, "
        f"torch {torch.__version__}. Load average {load_before[0]:.1f} before / {load_after[0]:.1f} after on "
        f"{os.cpu_count()} CPUs: wall-clock rates depend on what else runs; examples per CPU-second do not.",
        "",
        "| K | OVE ex/s (wall) | ove-pairs ex/s (wall) | softmax ex/s (wall) | OVE ex/cpu-s "
        "| ove-pairs ex/cpu-s | softmax ex/cpu-s | OVE/softmax (cpu) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for k in ks:
        o, s_, oc, sc = rate[("ove", k)], rate[("softmax", k)], cpu_rate[("ove", k)], cpu_rate[("softmax", k)]
        pw, pc = rate[("ove-pairs", k)], cpu_rate[("ove-pairs", k)]
        lines.append(f"| {k:,} | {o:,.0f} | {pw:,.0f} | {s_:,.0f} | {oc:,.0f} | {pc:,.0f} | {sc:,.0f} "
                     f"| {oc / sc:,.1f}x |")
    lines += [
        "",
        f"OVE at K={kmax:,} keeps {summary['ove_flatness_cpu']:.2f}x (cpu) / "
        f"{summary['ove_flatness_wall']:.2f}x "
        f"(wall) of its K={kmin:,} throughput (target >= 0.8) and is "
        f"{summary['ove_vs_softmax_at_kmax_cpu']:,.0f}x (cpu) / "
        f"{summary['ove_vs_softmax_at_kmax_wall']:,.0f}x "
        f"(wall) faster than exact softmax at K={kmax:,} (target >= 100).",
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
