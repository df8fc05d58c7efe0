"""Serving load test over HTTP: trained models, every retrieval path side by side in one run.

For each model (a trained artifact: `--artifact DIR`, repeatable; without one, a *constructed* 10^6-label
head as an extra row) and each retrieval path (`--paths`, default exact, int8, ivf), one `ovex serve`
process is started with `OVEX_RETRIEVAL=<path>`; it answers single-input requests at concurrency 1, 8
and 32 for normalization `none` (recall@10 against full scoring of the same inputs in this process)
and `sparsemax` (the share of answers the server certifies exact). Per cell: p50/p99, req/s, server
CPU ms per request; per server: time to ready (index from cache or built) and peak RSS.

Requests are the synthetic test rows of the model's own planted data (`trainer.synth`, part 1), sent as
raw sparse features. The load generator is a minimal asyncio HTTP/1.1 keep-alive client in this
process (a few µs per request, so the measurement is the server's cost). Each cell is bounded in
requests and time.

    .venv/bin/python bench/scale.py --labels 100000 --rows 100000 --dim 512 --epochs 7 \
        --batch-size 256 --model-dir /tmp/m/t1e5/1 --out bench/results/serve_train_1e5
    .venv/bin/python bench/serve_load.py --artifact /tmp/m/t1e5/1 --train-report \
        bench/results/serve_train_1e5.json --out bench/results/serve_load_trained
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from stamp import RESULTS, stamp, stamped, under_title  # noqa: E402

SPREAD = ("p50_ms", "p99_ms", "req_per_s", "server_cpu_ms_per_req")  # the figures a repeated cell spreads

# ------------------------------------------------------------------------------------------------
# the model


def build_model(out: Path, n_labels: int, dim: int, clusters: int, seed: int) -> dict[str, Any]:
    import scipy.sparse as sp
    import torch

    from trainer.artifact import save_artifact
    from trainer.data import Dataset
    from trainer.featurize import Featurizer, FeaturizerConfig
    from trainer.model import ModelShape, XCModel
    from trainer.params import TrainParams

    n_features = clusters * 4
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dim)).astype(np.float32) / np.sqrt(dim) * 3.0
    model = XCModel(ModelShape(n_features=n_features, n_labels=n_labels, dim=dim))
    head = model.head.data.numpy()  # K × (d+1), bias last
    chunk = 65536
    for s in range(0, n_labels, chunk):
        e = min(s + chunk, n_labels)
        a = rng.integers(0, clusters, e - s)
        head[s:e, :dim] = centres[a] + rng.normal(scale=0.6 / np.sqrt(dim), size=(e - s, dim)).astype(
            np.float32
        )
        head[s:e, dim] = rng.normal(scale=0.1, size=e - s).astype(np.float32)
    iw = model.input_weight.data.numpy()
    iw[:] = centres[np.arange(n_features) % clusters] + rng.normal(
        scale=0.3 / np.sqrt(dim), size=(n_features, dim)
    ).astype(np.float32)
    with torch.no_grad():
        model.input_bias.zero_()
    fit_x = sp.random(2000, n_features, density=0.01, format="csr", dtype=np.float32, random_state=seed)
    fz = Featurizer(FeaturizerConfig(tfidf=False, l2=True)).fit(
        Dataset(Y=sp.csr_matrix((2000, 1), dtype=np.float32), n_features=n_features, n_labels=1, X=fit_x)
    )
    names = [f"label-{i:07d}" for i in range(n_labels)]
    save_artifact(out, model, fz, names, TrainParams(dim=dim), {"synthetic": True, "clusters": clusters})
    return {"n_features": n_features}


def make_requests(n: int, clusters: int, n_features: int, seed: int) -> list[bytes]:
    """Bodies of single-input requests: 4 features of one cluster group plus 2 stray ones."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        c = int(rng.integers(clusters))
        idx = [c + clusters * j for j in range(4)] + rng.integers(0, n_features, 2).tolist()
        vals = rng.uniform(0.5, 2.0, 4).round(3).tolist() + rng.uniform(0.1, 0.4, 2).round(3).tolist()
        out.append(json.dumps({"indices": idx, "values": vals}).encode())
    return out


def body_for(features: bytes, exact: bool, normalization: str, top_k: int = 10) -> bytes:
    return (
        b'{"inputs":[{"features":'
        + features
        + b'}],"top_k":'
        + str(top_k).encode()
        + b',"normalization":"'
        + normalization.encode()
        + b'","exact":'
        + (b"true" if exact else b"false")
        + b"}"
    )


# ------------------------------------------------------------------------------------------------
# the load generator


class Conn:
    """One keep-alive HTTP/1.1 connection; enough protocol for our own server's JSON answers."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def post(self, path: str, body: bytes, method: str = "POST") -> tuple[int, bytes]:
        status, _, raw = await self.request(path, body, method)
        return status, raw

    async def request(self, path: str, body: bytes, method: str = "POST") -> tuple[int, str, bytes]:
        """Status, the answering worker's pid (`X-Ovex-Worker`) and the body."""
        assert self.reader is not None and self.writer is not None
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        length, worker = 0, ""
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            k, _, v = line.partition(b":")
            k = k.strip().lower()
            if k == b"content-length":
                length = int(v)
            elif k == b"x-ovex-worker":
                worker = v.strip().decode()
        return status, worker, await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def run_cell(
    host: str, port: int, bodies: list[bytes], concurrency: int, max_requests: int, max_seconds: float
) -> dict[str, Any]:
    conns = [Conn(host, port) for _ in range(concurrency)]
    await asyncio.gather(*(c.open() for c in conns))
    lat: list[float] = []
    answers: dict[int, list[int]] = {}
    exact_flags: list[bool] = []
    by_worker: dict[str, int] = {}
    errors = 0
    next_i = 0
    t_start = time.perf_counter()
    deadline = t_start + max_seconds

    async def worker(conn: Conn) -> None:
        nonlocal next_i, errors
        while next_i < max_requests and time.perf_counter() < deadline:
            i = next_i
            next_i += 1
            t0 = time.perf_counter()
            status, pid, raw = await conn.request(path, bodies[i % len(bodies)])
            lat.append(time.perf_counter() - t0)
            by_worker[pid] = by_worker.get(pid, 0) + 1
            if status != 200:
                errors += 1
                continue
            pred = json.loads(raw)["predictions"][0]
            answers[i % len(bodies)] = [lb["id"] for lb in pred["labels"]]
            exact_flags.append(bool(pred["exact"]))

    path = "/v1/models/big/predict"
    await asyncio.gather(*(worker(c) for c in conns))
    wall = time.perf_counter() - t_start
    for c in conns:
        c.close()
    return {
        "concurrency": concurrency,
        "errors": errors,
        "seconds": round(wall, 3),
        **_timing(lat, wall),
        "mean_ms": round(float(np.mean(lat) * 1000), 3),
        "exact_share": round(float(np.mean(exact_flags)), 4),
        "requests_per_worker": sorted(by_worker.values(), reverse=True),
        "_answers": answers,
    }


def _timing(lat: list[float], wall: float) -> dict[str, Any]:
    arr = np.asarray(lat) * 1000
    return {
        "requests": len(lat),
        "req_per_s": round(len(lat) / wall, 1),
        "p50_ms": round(float(np.percentile(arr, 50)), 3),
        "p99_ms": round(float(np.percentile(arr, 99)), 3),
    }


async def run_plain(
    host: str, port: int, method: str, path: str, body: bytes, concurrency: int, max_requests: int,
    max_seconds: float,
) -> dict[str, Any]:
    """The same client against a request that does no scoring: what the HTTP stack alone allows."""
    conns = [Conn(host, port) for _ in range(concurrency)]
    await asyncio.gather(*(c.open() for c in conns))
    lat: list[float] = []
    statuses: dict[int, int] = {}
    t_start = time.perf_counter()
    deadline = t_start + max_seconds

    async def worker(conn: Conn) -> None:
        while len(lat) < max_requests and time.perf_counter() < deadline:
            t0 = time.perf_counter()
            status, _ = await conn.post(path, body, method)
            lat.append(time.perf_counter() - t0)
            statuses[status] = statuses.get(status, 0) + 1

    await asyncio.gather(*(worker(c) for c in conns))
    wall = time.perf_counter() - t_start
    for c in conns:
        c.close()
    return {
        "request": f"{method} {path}",
        "concurrency": concurrency,
        "statuses": {str(k): v for k, v in statuses.items()},
        **_timing(lat, wall),
    }


def http_ceiling(port: int, pid: int, feats: list[bytes], args: argparse.Namespace) -> list[dict[str, Any]]:
    """req/s of GET /healthz and of a predict request refused after parsing and validation (top_k over
    the server's limit: 422), at each concurrency: the ceiling the HTTP stack puts on any predict path."""
    refused = body_for(feats[0], False, "sparsemax", top_k=10**6)
    rows = []
    for method, path, body in (
        ("GET", "/healthz", b""),
        ("POST", "/v1/models/big/predict", refused),
    ):
        for conc in args.concurrency:
            asyncio.run(run_plain("127.0.0.1", port, method, path, body, conc, 50, 5))  # warm-up
            cpu0 = cpu_seconds(pid)
            row = asyncio.run(
                run_plain("127.0.0.1", port, method, path, body, conc, args.max_requests, args.cell_seconds)
            )
            cpu_ms = 1000 * (cpu_seconds(pid) - cpu0) / max(row["requests"], 1)
            row["server_cpu_ms_per_req"] = round(cpu_ms, 3)
            row["loadavg_1m"] = round(os.getloadavg()[0], 2)
            rows.append(row)
            print(
                f"  http  {row['request']:30s} c={conc:2d}: {row['req_per_s']:8.1f} req/s"
                f"  p50 {row['p50_ms']:7.2f} ms  p99 {row['p99_ms']:7.2f} ms  {row['statuses']}"
                f"  cpu {row['server_cpu_ms_per_req']} ms/req",
                flush=True,
            )
    return rows


# ------------------------------------------------------------------------------------------------
# the server and its memory


def group_memory(pid: int, field: str) -> int:
    """`VmRSS` (now) or `VmHWM` (the kernel's record of the peak) of the server and its workers, summed:
    read once, so nothing polls the server while it is measured."""
    total = 0
    for p in group(pid):
        with contextlib.suppress(OSError), open(f"/proc/{p}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    total += int(line.split()[1]) * 1024
    return total


def start_server(
    models: Path, work: Path, port: int, threads: int, window_ms: float, retrieval: str, workers: int = 1
) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(
        {
            "OVEX_EMBEDDED_WORKER": "false",
            "OVEX_DATA_DIR": str(work / "data"),
            "OVEX_THREADS": str(threads),
            "OVEX_BATCH_WINDOW_MS": str(window_ms),
            "OVEX_LOG_LEVEL": "info",
            "OVEX_RETRIEVAL": retrieval,
            "PYTHONPATH": str(REPO),
        }
    )
    log = open(work / "server.log", "ab")  # noqa: SIM115 - owned by the child
    return subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--models-dir", str(models), "--port", str(port),
         "--workers", str(workers)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=work,
    )


def wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float) -> float:
    import httpx

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError("server not ready in time")


def group(pid: int) -> list[int]:
    """The process and all its descendants (a server's workers); one that exits meanwhile is skipped."""
    pids, i = [pid], 0
    while i < len(pids):
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pids[i]}/task").iterdir():
                pids.extend(int(k) for k in (task / "children").read_text().split())
        i += 1
    return pids


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads) and of its workers (`--workers N`): the server's CPU
    cost whatever else the machine runs."""
    total = 0.0
    for p in group(pid):
        with contextlib.suppress(OSError), open(f"/proc/{p}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def memory_bandwidth() -> dict[str, float]:
    """Streaming read of 512 MiB (16× the L3): the rate a full scan of a head can reach, best and median."""
    a = np.ones(512 << 20, dtype=np.int8).view(np.int64)
    ts = []
    for _ in range(7):
        t0 = time.perf_counter()
        a.sum()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    gbs = [round(a.nbytes / t / 1e9, 2) for t in (ts[0], ts[3])]
    return {"best_gb_per_s": gbs[0], "median_gb_per_s": gbs[1]}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------------------------


def synth_requests(labels: int, features: int, n: int) -> list[bytes]:
    """Raw-feature bodies of the planted test rows (part 1) of `bench/scale.py`'s data (seed 7)."""
    from trainer.synth import synth_dataset

    x = synth_dataset(labels, features, n, seed=7, part=1).X
    assert x is not None
    out = []
    for r in range(n):
        a, b = x.indptr[r], x.indptr[r + 1]
        body = {"indices": x.indices[a:b].tolist(), "values": np.round(x.data[a:b], 4).tolist()}
        out.append(json.dumps(body).encode())
    return out


def serve_path(
    models: Path, art: Path, path: str, feats: list[bytes], truth: list[list[int]], args: argparse.Namespace
) -> dict[str, Any]:
    """One server with `OVEX_RETRIEVAL=path`: ready time, peak RSS, and every (normalization, c) cell."""
    port = free_port()
    from service.serving.retrieval import INDEX_FORMAT

    meta_path = art / "index" / path / "meta.json"
    had = path == "exact" or (
        meta_path.exists() and json.loads(meta_path.read_text()).get("format") == INDEX_FORMAT
    )
    proc = start_server(models, args.work, port, args.threads, args.window_ms, path, args.workers)
    cells = []
    try:
        ready_s = wait_ready(port, proc, timeout=1800)
        rss_ready = group_memory(proc.pid, "VmRSS")
        for norm in ("none", "sparsemax"):
            bodies = [body_for(f, False, norm) for f in feats]
            for conc in args.concurrency:
                asyncio.run(run_cell("127.0.0.1", port, bodies[:16], conc, 16, 10))  # warm-up, discarded
                runs = []
                for _ in range(args.repeats):
                    cpu0 = cpu_seconds(proc.pid)
                    run = asyncio.run(
                        run_cell("127.0.0.1", port, bodies, conc, args.max_requests, args.cell_seconds)
                    )
                    cpu1 = cpu_seconds(proc.pid)
                    run["server_cpu_ms_per_req"] = round(1000 * (cpu1 - cpu0) / max(run["requests"], 1), 3)
                    runs.append(run)
                cell = runs[0]
                got = cell.pop("_answers")
                cell.update({"normalization": norm, "loadavg_1m": round(os.getloadavg()[0], 2)})
                if len(runs) > 1:  # the median of each figure, and its spread over the runs
                    cell["repeats"] = len(runs)
                    cell["spread"] = {}
                    for key in SPREAD:
                        vals = sorted(r[key] for r in runs)
                        cell[key] = round(statistics.median(vals), 3)
                        cell["spread"][key] = {"min": vals[0], "median": cell[key], "max": vals[-1]}
                if norm == "none":
                    cell["recall_at_10"] = round(
                        float(np.mean([len(set(got[i]) & set(truth[i])) / 10 for i in got])), 4
                    )
                else:
                    cell["certified_exact_share"] = cell["exact_share"]
                cells.append(cell)
                print(
                    f"  {path:5s} {norm:9s} c={conc:2d}: {cell['req_per_s']:8.1f} req/s"
                    f"  p50 {cell['p50_ms']:7.2f} ms  p99 {cell['p99_ms']:7.2f} ms"
                    f"  exact {cell['exact_share']:.3f}  recall {cell.get('recall_at_10', '')}"
                    f"  cpu {cell['server_cpu_ms_per_req']} ms/req  load {cell['loadavg_1m']}",
                    flush=True,
                )
        ceiling = http_ceiling(port, proc.pid, feats, args) if path == args.ceiling_path else []
        peak = group_memory(proc.pid, "VmHWM")
    finally:
        proc.terminate()
        proc.wait(30)
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    return {
        "path": path,
        "ready_seconds": round(ready_s, 2),
        "index_from_cache": had,
        "index": {k: v for k, v in meta.items() if k != "fingerprint"},
        "rss_ready_bytes": rss_ready,
        "rss_peak_bytes": peak,
        "cells": cells,
        "http_ceiling": ceiling,
    }


def run_model(art: Path, args: argparse.Namespace, constructed: bool) -> dict[str, Any]:
    from trainer.artifact import load_artifact

    models = args.work / "models"
    link = models / "big" / "1"
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink() if link.is_symlink() else shutil.rmtree(link)
    link.symlink_to(art.resolve())
    cfg = json.loads((art / "config.json").read_text())
    m = load_artifact(art)
    labels, dim, n_features = m.n_labels, m.dim, m.n_features
    del m
    n_bodies = 300 if args.quick else 1000
    if constructed:
        feats = make_requests(n_bodies, args.clusters, n_features, seed=1)
    else:
        feats = synth_requests(labels, n_features, n_bodies)
    truth = local_truth(art, feats)
    report = json.loads(Path(args.train_report).read_text()) if args.train_report and not constructed else {}
    print(f"model {art}: {labels:,} labels, d={dim}", flush=True)
    servers = [serve_path(models, art, p, feats, truth, args) for p in args.paths]
    return {
        "artifact": str(art),
        "labels": labels,
        "dim": dim,
        "n_features": n_features,
        "constructed_not_trained": constructed,
        "weights_file_bytes": (art / "weights.safetensors").stat().st_size,
        "train": {
            k: report.get(k)
            for k in ("train_seconds", "metrics", "rows", "params")
            if k in report
        },
        "params": cfg.get("params", {}),
        "servers": servers,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifact", type=Path, action="append", default=[], help="a trained model directory")
    ap.add_argument("--train-report", action="append", default=[], help="bench/scale.py JSON, per artifact")
    ap.add_argument("--paths", default="exact,int8,ivf")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--labels", type=int, default=1_000_000, help="constructed model only")
    ap.add_argument("--dim", type=int, default=128, help="constructed model only")
    ap.add_argument("--clusters", type=int, default=4096, help="constructed model only")
    ap.add_argument("--work", type=Path, default=Path("/tmp/ovex_bench_serve"))
    ap.add_argument("--threads", type=int, default=1, help="server torch/faiss threads")
    ap.add_argument("--workers", type=int, default=1, help="`ovex serve --workers N`")
    ap.add_argument("--window-ms", type=float, default=1.0)
    ap.add_argument("--max-requests", type=int, default=2000)
    ap.add_argument("--cell-seconds", type=float, default=10.0)
    ap.add_argument("--quick", action="store_true", help="fewer request bodies")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of each cell; figures are medians, with min and max beside them")
    ap.add_argument("--alone", action="store_true", help="nothing else ran on the machine (reported)")
    ap.add_argument(
        "--ceiling-path", default="int8", help="the path whose server also measures the HTTP stack alone"
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "serve_load")
    args = ap.parse_args()
    st = stamp()
    args.paths = args.paths.split(",")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.work.mkdir(parents=True, exist_ok=True)

    results = []
    load_start = os.getloadavg()
    bandwidth = memory_bandwidth()
    if args.artifact:
        reports = args.train_report + [None] * (len(args.artifact) - len(args.train_report))
        for art, rep in zip(args.artifact, reports, strict=True):
            args.train_report = rep
            results.append(run_model(art, args, constructed=False))
    else:
        art = args.work / "constructed" / "1"
        if not (art / "config.json").exists():
            print(f"building a {args.labels:,}-label model (d={args.dim}) …", flush=True)
            build_model(art, args.labels, args.dim, args.clusters, seed=0)
        results.append(run_model(art, args, constructed=True))
    result = {
        "models": results,
        "server": {"threads": args.threads, "batch_window_ms": args.window_ms, "workers": args.workers},
        "client": "asyncio HTTP/1.1 keep-alive, one connection per concurrent request, same machine",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_at_start": [round(x, 2) for x in load_start],
            "memory_bandwidth": bandwidth,
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
            "alone": args.alone,
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(stamped(st, result), indent=1))
    args.out.with_suffix(".md").write_text(under_title(render_md(result), st))
    print(render_md(result))
    return 0


def local_truth(art: Path, feats: list[bytes]) -> list[list[int]]:
    """Exact top-10 label ids of every request body from the stored weights, in blocks of queries."""
    import scipy.sparse as sp
    import torch

    from trainer.artifact import load_artifact

    m = load_artifact(art)
    rows = [json.loads(f) for f in feats]
    x = sp.csr_matrix(
        (
            np.concatenate([r["values"] for r in rows]).astype(np.float32),
            np.concatenate([r["indices"] for r in rows]),
            np.cumsum([0] + [len(r["indices"]) for r in rows]),
        ),
        shape=(len(rows), m.n_features),
    )
    h = torch.from_numpy(m.encode(m.featurizer.transform_sparse(x)))
    w = torch.from_numpy(m.head_weight)
    b = torch.from_numpy(np.ascontiguousarray(m.head_bias))
    out: list[list[int]] = []
    with torch.no_grad():
        for s in range(0, len(rows), 64):
            scores = torch.addmm(b, h[s : s + 64], w.T)
            out += torch.topk(scores, 10, dim=1).indices.tolist()
    return out


def _spread(cell: dict[str, Any], key: str) -> str:
    """A figure of a cell, with its min-max over the runs when the cell was run more than once."""
    s = cell.get("spread", {}).get(key)
    return f"{cell[key]} ({s['min']}-{s['max']})" if s else f"{cell[key]}"


def render_md(r: dict[str, Any]) -> str:
    gib = 1024**3
    mach = r["machine"]
    lines = [
        "# Serving load: trained models over HTTP, every retrieval path (bench/serve_load.py)",
        "",
        f"Server: `ovex serve --workers {r['server'].get('workers', 1)}`, {r['server']['threads']} compute "
        f"thread(s) per process, batch window "
        f"{r['server']['batch_window_ms']} ms; client on the same machine (asyncio, keep-alive).",
        (
            f"Machine: {mach['cpus']} CPUs, run alone (other jobs held back for the run): load average "
            f"{mach['loadavg_at_start']} at the start (the 1-minute average still counts the jobs that "
            f"ended just before), {mach['loadavg_at_end']} at the end, and per cell in the table."
            if mach.get("alone")
            else f"Machine: {mach['cpus']} CPUs, **shared** with other jobs: load average "
            f"{mach['loadavg_at_start']} at the start, {mach['loadavg_at_end']} at the end, and per cell in "
            "the table. Absolute latencies are inflated by that load; compare paths within a model "
            "(same run) and the server CPU ms per request, which counts only the server's own CPU time."
        ),
        f"Memory read bandwidth (one thread streaming 512 MiB): {mach['memory_bandwidth']['best_gb_per_s']} "
        f"GB/s best, {mach['memory_bandwidth']['median_gb_per_s']} GB/s median of 7.",
        "",
    ]
    for m in r["models"]:
        tr = m.get("train", {})
        kind = "constructed (clustered), not trained" if m["constructed_not_trained"] else "trained"
        head = f"## {m['labels']:,} labels, d={m['dim']}, {kind}"
        lines += [head, ""]
        if tr:
            met = tr.get("metrics", {})
            pr = tr.get("params", {})
            shown = {k: pr[k] for k in ("dim", "epochs", "batch_size", "negatives", "loss") if k in pr}
            lines.append(
                f"Trained by `bench/scale.py` ({json.dumps(shown)}) on {tr.get('rows', 0):,} "
                f"synthetic rows in {tr.get('train_seconds', 0):.0f} s; "
                f"P@1 {met.get('p@1', float('nan')):.4f}."
            )
        lines += [
            f"Weights file {m['weights_file_bytes'] / gib:.2f} GiB.",
            "",
            "| path | ready s (index) | peak RSS GiB | normalization | c | req/s | p50 ms | p99 ms "
            "| recall@10 | certified exact | server CPU ms/req | requests per worker | load 1m |",
            "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
        ]
        for sv in m["servers"]:
            idx = "cached" if sv["index_from_cache"] else "built"
            for c in sv["cells"]:
                lines.append(
                    f"| {sv['path']} | {sv['ready_seconds']} ({idx}) | {sv['rss_peak_bytes'] / gib:.2f} "
                    f"| {c['normalization']} | {c['concurrency']} | {_spread(c, 'req_per_s')} "
                    f"| {_spread(c, 'p50_ms')} | {_spread(c, 'p99_ms')} | {c.get('recall_at_10', '')} "
                    f"| {c['exact_share']} "
                    f"| {c['server_cpu_ms_per_req']} | {c.get('requests_per_worker', '')} "
                    f"| {c['loadavg_1m']} |"
                )
        lines.append("")
        ceil = [(sv["path"], c) for sv in m["servers"] for c in sv.get("http_ceiling", [])]
        if ceil:
            lines += [
                "HTTP alone, same server and client (no scoring): GET /healthz, and a predict request "
                "refused after parsing and validation (top_k over the limit: 422).",
                "",
                "| server | request | c | req/s | p50 ms | p99 ms | server CPU ms/req | load 1m |",
                "|---|---|---:|---:|---:|---:|---:|---:|",
            ]
            for path, c in ceil:
                lines.append(
                    f"| {path} | {c['request']} | {c['concurrency']} | {c['req_per_s']} | {c['p50_ms']} "
                    f"| {c['p99_ms']} | {c['server_cpu_ms_per_req']} | {c['loadavg_1m']} |"
                )
            lines.append("")
    lines += [
        "recall@10: the served top-10 (normalization none) against an exact float32 scoring of the same",
        "inputs in the benchmark process. Certified exact: the share of answers the server flagged",
        "`exact` (equal to the normalization over all labels). Server CPU ms/req: the server process's",
        "CPU time (all threads) per request during the cell; 1000 / that is what one free core sustains.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
