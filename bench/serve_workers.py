"""`ovex serve --workers 1` against `--workers 2`: throughput, latency and the memory of the group.

The model is what a user gets: synthetic data from `ovex synth`, trained by `ovex train` with every
default (d=512), served with the default settings (threads, retrieval) except the job worker (off: it
is not serving). Per server it reports req/s at concurrency 32, p50/p99 at concurrency 1, the RSS, PSS
and private memory (/proc/<pid>/smaps_rollup) of every process of the group (the supervisor included),
and what the group holds: its distinct resident pages, each counted once however many processes map it
(the memory-mapped weights, the pages workers share with the supervisor that forked them). PSS would
also split library pages with unrelated processes that map the same files. It also loads the artifact
in fresh processes, memory-mapped (schema 2) and through the copying loader of schema-1 files, to show
what the mapping saves at load time.

    .venv/bin/python bench/serve_workers.py --prepare  # train and cache the index (CPU-heavy, once)
    .venv/bin/python bench/serve_workers.py            # the measurement: ~3 minutes (run it alone)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from stamp import RESULTS, markdown_line, stamp, stamped  # noqa: E402  (bench/ is on the path now)

from bench.serve_load import free_port, group, run_cell  # noqa: E402  (the same load generator)

OVEX = [sys.executable, "-m", "service.cli"]
MODEL = "big"  # the name bench/serve_load's generator posts to


def sh(cmd: list[str], **kw: Any) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=dict(os.environ, PYTHONPATH=str(REPO)), **kw)


def train(work: Path, labels: int, features: int, rows: int) -> Path:
    art = work / "models" / MODEL / "1"
    if (art / "config.json").exists():
        return art
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    sh(
        [
            *OVEX,
            "synth",
            "--labels",
            str(labels),
            "--features",
            str(features),
            "--rows",
            str(rows),
            "--out",
            str(data / "train.txt"),
            "--test-out",
            str(data / "test.txt"),
            "--test-rows",
            "1000",
        ]
    )
    sh(
        [
            *OVEX,
            "train",
            "--train",
            str(data / "train.txt"),
            "--test",
            str(data / "test.txt"),
            "--out",
            str(art),
        ]
    )
    return art


def bodies(work: Path, n: int) -> list[bytes]:
    from trainer.data import read_dataset

    ds = read_dataset(work / "data" / "test.txt")
    x = ds.X
    out = []
    for r in range(min(n, x.shape[0])):
        s, e = x.indptr[r], x.indptr[r + 1]
        feats = {"indices": x.indices[s:e].tolist(), "values": [round(float(v), 4) for v in x.data[s:e]]}
        out.append(json.dumps({"inputs": [{"features": feats}], "top_k": 10}).encode())
    return out


# ------------------------------------------------------------------------------------------------
# memory


def rollup(pid: int) -> dict[str, int]:
    """Rss and Pss in bytes from /proc/<pid>/smaps_rollup."""
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss", "Shared_Clean", "Shared_Dirty", "Private_Clean", "Private_Dirty"):
            out[key.lower()] = int(rest.split()[0]) * 1024
    return out


PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_frames(pid: int) -> Any:
    """The physical page frames a process has resident, from /proc/<pid>/pagemap (frame numbers need
    root; elsewhere they read as 0). Only mappings with resident pages (smaps' Rss) are read."""
    import numpy as np

    ranges, lo = [], 0
    hi = 0
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            a, _, b = head.partition("-")
            lo, hi = int(a, 16) // PAGE, int(b, 16) // PAGE
        elif head == "Rss:" and int(line.split()[1]) > 0:
            ranges.append((lo, hi))
    parts = []
    with open(f"/proc/{pid}/pagemap", "rb") as f:
        for lo, hi in ranges:
            f.seek(lo * 8)
            entries = np.frombuffer(f.read((hi - lo) * 8), dtype=np.uint64)
            present = entries[(entries >> np.uint64(63)) == 1]
            parts.append(present & np.uint64((1 << 55) - 1))
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.uint64)


def group_unique_bytes(pids: list[int]) -> int | None:
    """Bytes of the distinct resident pages of the whole group: a page two processes share (the
    memory-mapped weights, copy-on-write pages after a fork) counts once, a private one once each.
    None where frame numbers are hidden (not root)."""
    import numpy as np

    frames = [resident_frames(pid) for pid in pids]
    if any(len(f) and int(f.max()) == 0 for f in frames):
        return None
    return int(len(np.unique(np.concatenate(frames))) * PAGE)


# peak RSS from VmHWM: it starts afresh at exec, while getrusage's ru_maxrss keeps the parent's peak
HWM = "int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) * 1024"
LOAD_PROBE = f"""
import sys, time
from trainer.artifact import load_artifact
import trainer.featurize, trainer.model
t0 = time.perf_counter()
m = load_artifact(sys.argv[1])
s = float(m.head_weight[:, 0].sum())  # touch the head once, as a first prediction would
dt = time.perf_counter() - t0
rss = int(open('/proc/self/statm').read().split()[1]) * 4096
print(dt, {HWM}, rss)
"""
BASELINE_PROBE = f"""
import trainer.artifact, trainer.featurize, trainer.model  # the loader's imports, without a model
print(0.0, {HWM}, 0)
"""


def schema1_copy(art: Path, dest: Path) -> Path:
    """The same model in the schema-1 layout (split head), which the loader copies instead of mapping."""
    import torch
    from safetensors.torch import load_file, save_file

    if (dest / "config.json").exists():
        return dest
    shutil.copytree(art, dest, ignore=shutil.ignore_patterns("index", "weights.safetensors"))
    tensors = load_file(str(art / "weights.safetensors"))
    head = tensors.pop("head")
    d = head.shape[1] - 1
    tensors["head.weight"], tensors["head.bias"] = head[:, :d].contiguous(), head[:, d].contiguous()
    save_file({k: torch.as_tensor(v) for k, v in tensors.items()}, str(dest / "weights.safetensors"))
    cfg = json.loads((dest / "config.json").read_text())
    cfg["schema_version"] = 1
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def probe(code: str, path: Path | None) -> dict[str, float]:
    args = [sys.executable, "-c", code] + ([str(path)] if path else [])
    out = subprocess.run(
        args, check=True, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO))
    )
    seconds, peak, rss = out.stdout.split()
    return {"seconds": round(float(seconds), 3), "peak_rss_bytes": int(peak), "rss_after_bytes": int(rss)}


def load_cost(art: Path, work: Path) -> dict[str, Any]:
    legacy = schema1_copy(art, work / "schema1" / MODEL / "1")
    for p in (art / "weights.safetensors", legacy / "weights.safetensors"):
        p.read_bytes()  # both files in the page cache: the comparison is of copies, not of the disk
    base = probe(BASELINE_PROBE, None)
    mapped = probe(LOAD_PROBE, art)
    copied = probe(LOAD_PROBE, legacy)
    w = (art / "weights.safetensors").stat().st_size
    for row in (mapped, copied):
        row["peak_over_imports_bytes"] = row["peak_rss_bytes"] - base["peak_rss_bytes"]
        row["peak_over_imports_per_weights"] = round(row["peak_over_imports_bytes"] / w, 2)
    return {
        "weights_bytes": w,
        "imports_only_peak_rss_bytes": base["peak_rss_bytes"],
        "mapped": mapped,
        "copied_schema1": copied,
    }


# ------------------------------------------------------------------------------------------------
# one server


def serve(
    work: Path, workers: int, reqs: list[bytes], seconds: float, measure: bool = True
) -> dict[str, Any]:
    """Start `ovex serve --workers N`, load it, measure it, stop it (`measure=False`: only start it, so
    the model's index is built and cached in the artifact)."""
    import httpx

    port = free_port()
    shutil.rmtree(work / "state", ignore_errors=True)  # a job database of this run only
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        OVEX_EMBEDDED_WORKER="false",
        OVEX_DATA_DIR=str(work / "state"),
        OVEX_LOG_LEVEL="warning",
    )
    log = open(work / f"server-w{workers}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            *OVEX,
            "serve",
            "--models-dir",
            str(work / "models"),
            "--port",
            str(port),
            "--workers",
            str(workers),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    t0 = time.perf_counter()
    try:
        pids: set[str] = set()
        while len(pids) < workers:
            if proc.poll() is not None or time.perf_counter() - t0 > 900:
                raise RuntimeError(f"server with {workers} workers did not start; see {log.name}")
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
                if r.status_code == 200:
                    pids.add(r.headers["x-ovex-worker"])
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        ready_s = time.perf_counter() - t0
        if not measure:
            return {"workers": workers, "ready_s": round(ready_s, 1)}
        warm = asyncio.run(run_cell("127.0.0.1", port, reqs, 8, 400, 30))  # every worker warm
        c32 = asyncio.run(run_cell("127.0.0.1", port, reqs, 32, 10**9, seconds))
        c1 = asyncio.run(run_cell("127.0.0.1", port, reqs, 1, 2000, seconds))
        procs = []
        for pid in group(proc.pid):
            role = "worker" if str(pid) in pids else ("supervisor" if pid == proc.pid else "helper")
            procs.append({"pid": pid, "role": role, **rollup(pid)})
        for cell in (warm, c32, c1):
            cell.pop("_answers", None)
        for p in procs:
            p["private"] = p.get("private_clean", 0) + p.get("private_dirty", 0)
        total: dict[str, int | None] = {k: sum(p[k] for p in procs) for k in ("rss", "pss", "private")}
        # what the group costs on its own: every distinct resident page once, wherever it is mapped
        # (PSS would also split library pages with unrelated processes that map the same files, which
        # on a shared machine flatters a single process)
        total["unique"] = group_unique_bytes([p["pid"] for p in procs])
        return {
            "workers": workers,
            "ready_s": round(ready_s, 1),
            "concurrency_32": c32,
            "concurrency_1": c1,
            "errors": warm["errors"] + c32["errors"] + c1["errors"],
            "processes": procs,
            "group": total,
            "workers_pss": sum(p["pss"] for p in procs if p["role"] == "worker"),
        }
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def mib(b: float) -> str:
    return f"{b / 2**20:,.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--labels", type=int, default=100_000)
    ap.add_argument("--features", type=int, default=20_000)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each load cell")
    ap.add_argument("--work", type=Path, default=Path("/tmp/ovex_bench_workers"))
    ap.add_argument("--out", type=Path, default=RESULTS / "serve_workers")
    ap.add_argument("--note", default="shared machine (other jobs running)", help="how busy the machine was")
    ap.add_argument(
        "--prepare", action="store_true", help="only train and cache the index (CPU-heavy, no figures)"
    )
    args = ap.parse_args()
    st = stamp()

    art = train(args.work, args.labels, args.features, args.rows)
    reqs = bodies(args.work, 1000)
    if not (art / "index").is_dir():
        # both measured runs then map the cached index, as every start after the first one does
        print("building the index once (cached in the artifact)", flush=True)
        serve(args.work, 1, reqs, 0, measure=False)
    if args.prepare:
        return 0
    loads = load_cost(art, args.work)
    load_before = os.getloadavg()
    runs = [serve(args.work, w, reqs, args.seconds) for w in (1, 2)]
    one, two = runs
    result = {
        "model": {
            "labels": args.labels,
            "features": args.features,
            "rows": args.rows,
            "dim": 512,
            "trained_with": "ovex synth + ovex train (defaults)",
            "weights_bytes": loads["weights_bytes"],
        },
        "load": loads,
        "runs": runs,
        "ratios": {
            "req_per_s_c32_two_over_one": round(
                two["concurrency_32"]["req_per_s"] / one["concurrency_32"]["req_per_s"], 2
            ),
            "p99_c1_two_over_one": round(two["concurrency_1"]["p99_ms"] / one["concurrency_1"]["p99_ms"], 2),
            "group_unique_two_over_one": (
                round(two["group"]["unique"] / one["group"]["unique"], 3) if one["group"]["unique"] else None
            ),
            "group_pss_two_over_one": round(two["group"]["pss"] / one["group"]["pss"], 3),
            "workers_pss_two_over_one": round(two["workers_pss"] / one["workers_pss"], 3),
            "group_rss_two_over_one": round(two["group"]["rss"] / one["group"]["rss"], 3),
        },
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_before": load_before,
            "load_avg_after": os.getloadavg(),
            "python": platform.python_version(),
            "note": args.note,
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(stamped(st, result), indent=2))
    lines = [
        "# ovex serve --workers 1 vs 2",
        "",
        markdown_line(st),
        "",
        f"Model: {args.labels:,} labels, {args.features:,} features, d=512, "
        "trained by `ovex train` with defaults; "
        f"weights.safetensors {mib(loads['weights_bytes'])} MiB. Load average before/after: "
        f"{load_before[0]:.2f} / {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs ({args.note}). "
        "Both runs map the model's cached index; two workers are forked by one supervisor.",
        "",
        "Group unique: the distinct resident pages of all the group's processes, each counted once "
        "(from /proc/<pid>/pagemap).",
        "",
        "| workers | req/s @32 | p50 ms @1 | p99 ms @1 | errors "
        "| group RSS MiB | group PSS MiB | workers' PSS MiB | group private MiB | group unique MiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['workers']} | {r['concurrency_32']['req_per_s']} | {r['concurrency_1']['p50_ms']} | "
            f"{r['concurrency_1']['p99_ms']} | {r['errors']} | {mib(r['group']['rss'])} | "
            f"{mib(r['group']['pss'])} | {mib(r['workers_pss'])} | {mib(r['group']['private'])} | "
            f"{mib(r['group']['unique']) if r['group']['unique'] else 'n/a'} |"
        )
    lines += ["", "Processes (RSS / PSS / private MiB):", ""]
    for r in runs:
        for p in r["processes"]:
            lines.append(
                f"- workers={r['workers']} {p['role']} {p['pid']}: "
                f"{mib(p['rss'])} / {mib(p['pss'])} / {mib(p['private'])}"
            )
    lines += [
        "",
        "Ratios (two workers / one): " + ", ".join(f"{k} {v}" for k, v in result["ratios"].items()),
        "",
    ]
    m, c = loads["mapped"], loads["copied_schema1"]
    lines += [
        "Loading the artifact in a fresh process (peak RSS above the imports alone, in weights-file sizes):",
        "",
        f"- memory-mapped (schema 2): {m['seconds']} s, +{mib(m['peak_over_imports_bytes'])} MiB "
        f"({m['peak_over_imports_per_weights']}x)",
        f"- copied (schema 1 loader): {c['seconds']} s, +{mib(c['peak_over_imports_bytes'])} MiB "
        f"({c['peak_over_imports_per_weights']}x)",
    ]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
