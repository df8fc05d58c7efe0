"""How synth scales: time and peak memory to generate K labels × N rows in memory.

    .venv/bin/python bench/synth_scale.py [--labels 1000000 --features 100000 --rows 200000,1000000]

Each size is generated in its own process (so each peak RSS is its own) and written as one row of
bench/results/synth_scale.json and .md. CPU seconds are reported beside wall-clock seconds because the
machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from stamp import RESULTS, markdown_line, stamp, stamped  # noqa: E402

from trainer.synth import synth  # noqa: E402


def one(labels: int, features: int, rows: int, seed: int) -> dict[str, Any]:
    t, c = time.perf_counter(), time.process_time()
    X, Y = synth(labels, features, rows, seed)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    csr = sum(a.nbytes for m in (X, Y) for a in (m.data, m.indices, m.indptr))
    return {
        "labels": labels, "features": features, "rows": rows, "seed": seed,
        "nnz_per_row": round(X.nnz / max(rows, 1), 2),
        "labels_per_row": round(Y.nnz / max(rows, 1), 2),
        "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "csr_mb": round(csr / 2**20, 1), "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--labels", type=int, default=1_000_000)
    ap.add_argument("--features", type=int, default=100_000)
    ap.add_argument("--rows", default="200000,1000000", help="row counts, one process each")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(RESULTS / "synth_scale"), help="prefix of the .json and .md")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.labels, args.features, int(args.rows), args.seed)))
        return
    st = stamp()
    rows = []
    for n in (int(r) for r in args.rows.split(",")):
        done = subprocess.run([sys.executable, __file__, "--one", "--labels", str(args.labels), "--features",
                               str(args.features), "--rows", str(n), "--seed", str(args.seed)],
                              check=True, capture_output=True, text=True)
        rows.append(json.loads(done.stdout.splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(stamped(st, {"rows": rows}), indent=1) + "\n")
    lines = ["# Generating planted data in memory (trainer.synth)", "", markdown_line(st), "",
             "| labels | features | rows | non-zeros / row | labels / row | s | CPU-s | peak RSS MB "
             "| CSR MB |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['labels']:,} | {r['features']:,} | {r['rows']:,} | {r['nnz_per_row']} | "
              f"{r['labels_per_row']} | {r['wall_s']} | {r['cpu_s']} | {r['peak_rss_mb']} | {r['csr_mb']} |"
              for r in rows]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
