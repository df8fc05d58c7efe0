"""Data-layer speed: synth generation, XC writing and XC reading at scale.

Generates a planted-structure data set (default K=10^6 labels, 200k rows, ~50 non-zeros per row),
writes it in XC format, and reads it back in a fresh process (so its peak memory is the reader's
own). Wall-clock figures depend on what else runs on the machine; CPU seconds (process time) are
reported beside them as the steadier figure. Writes bench/results/data_read.json.

    .venv/bin/python bench/read_speed.py [--rows 200000 --labels 1000000 --features 100000]
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from stamp import RESULTS, markdown_line, stamp, stamped  # noqa: E402

from trainer.synth import synth, write_synth  # noqa: E402

READER = """
import json, sys, time
sys.path.insert(0, {root!r})
from trainer.data import read_xc

def _hwm_mb():
    # VmHWM is reset by exec (ru_maxrss is not), so this is the reader's own peak
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")

base = _hwm_mb()
t, c = time.perf_counter(), time.process_time()
ds = read_xc({path!r})
dt, dc = time.perf_counter() - t, time.process_time() - c
print(json.dumps({{"seconds": dt, "cpu_seconds": dc, "baseline_rss_mb": base, "rows": ds.n_rows,
                  "nnz": int(ds.X.nnz), "label_nnz": int(ds.Y.nnz),
                  "peak_rss_mb": _hwm_mb(),
                  "csr_mb": (ds.X.data.nbytes + ds.X.indices.nbytes + ds.X.indptr.nbytes
                             + ds.Y.indices.nbytes + ds.Y.indptr.nbytes + ds.Y.data.nbytes) / 2**20}}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--labels", type=int, default=1_000_000)
    ap.add_argument("--features", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2, help="reads to time (best is reported)")
    ap.add_argument("--out", default=str(RESULTS / "data_read.json"), help="the JSON (.md beside)")
    args = ap.parse_args()
    st = stamp()

    t, c = time.perf_counter(), time.process_time()
    X, Y = synth(args.labels, args.features, args.rows, args.seed)
    synth_s, synth_cpu = time.perf_counter() - t, time.process_time() - c
    synth_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    nnz, label_nnz = int(X.nnz), int(Y.nnz)
    del X, Y

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "synth.txt")
        t, c = time.perf_counter(), time.process_time()
        write_synth(path, args.labels, args.features, args.rows, args.seed)
        write_s, write_cpu = time.perf_counter() - t, time.process_time() - c
        size_mb = os.path.getsize(path) / 2**20
        reads = []
        for _ in range(args.repeats):
            out = subprocess.run([sys.executable, "-c", READER.format(root=str(ROOT), path=path)],
                                 check=True, capture_output=True, text=True)
            reads.append(json.loads(out.stdout))
    best = min(reads, key=lambda r: r["seconds"])
    assert best["nnz"] == nnz and best["rows"] == args.rows, "read back a different matrix"
    result = {
        "labels": args.labels, "features": args.features, "rows": args.rows, "seed": args.seed,
        "nnz": nnz, "nnz_per_row": nnz / max(args.rows, 1), "labels_per_row": label_nnz / max(args.rows, 1),
        "synth_seconds": round(synth_s, 3), "synth_cpu_seconds": round(synth_cpu, 3),
        "synth_peak_rss_mb": round(synth_rss, 1),
        "write_seconds_incl_generation": round(write_s, 3), "write_cpu_seconds": round(write_cpu, 3),
        "file_mb": round(size_mb, 1),
        "read_seconds": round(best["seconds"], 3), "read_cpu_seconds": round(best["cpu_seconds"], 3),
        "read_seconds_all": [round(r["seconds"], 3) for r in reads],
        "read_rows_per_s": round(args.rows / best["seconds"]),
        "read_mb_per_s": round(size_mb / best["seconds"], 1),
        "read_nnz_per_s": round(nnz / best["seconds"]),
        "read_rows_per_cpu_s": round(args.rows / best["cpu_seconds"]),
        "read_mb_per_cpu_s": round(size_mb / best["cpu_seconds"], 1),
        "read_peak_rss_mb": round(best["peak_rss_mb"], 1), "csr_mb": round(best["csr_mb"], 1),
        "reader_baseline_rss_mb": round(best["baseline_rss_mb"], 1),
        "python": platform.python_version(),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(stamped(st, result), indent=2) + "\n")
    out.with_suffix(".md").write_text("\n".join([
        "# Reading an XC file (trainer.data.read_xc)", "", markdown_line(st), "",
        "| rows | labels | features | non-zeros / row | file MB | read s | read CPU-s | peak RSS MB "
        "| CSR MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {args.rows:,} | {args.labels:,} | {args.features:,} | {result['nnz_per_row']:.2f} "
        f"| {result['file_mb']:.1f} | {result['read_seconds']:.3f} | {result['read_cpu_seconds']:.3f} "
        f"| {result['read_peak_rss_mb']:.1f} | {result['csr_mb']:.1f} |", ""]))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
