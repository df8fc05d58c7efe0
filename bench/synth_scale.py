"""How synth scales: time and peak memory to generate K labels × N rows in memory.

    .venv/bin/python bench/synth_scale.py [--labels 1000000 --features 100000 --rows 1000000]

Appends one JSON line per run to bench/results/synth_scale.jsonl. CPU seconds are reported beside
wall-clock seconds because the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.synth import synth  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--labels", type=int, default=1_000_000)
    ap.add_argument("--features", type=int, default=100_000)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "synth_scale.jsonl"))
    args = ap.parse_args()
    t, c = time.perf_counter(), time.process_time()
    X, Y = synth(args.labels, args.features, args.rows, args.seed)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    csr = sum(a.nbytes for m in (X, Y) for a in (m.data, m.indices, m.indptr))
    rec = {
        "labels": args.labels, "features": args.features, "rows": args.rows, "seed": args.seed,
        "nnz_per_row": round(X.nnz / max(args.rows, 1), 2),
        "labels_per_row": round(Y.nnz / max(args.rows, 1), 2),
        "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "csr_mb": round(csr / 2**20, 1), "load_average": os.getloadavg(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as fh:
        fh.write(json.dumps(rec) + "\n")
    print(json.dumps(rec))


if __name__ == "__main__":
    main()
