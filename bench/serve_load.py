"""Serving load test: a 10^6-label, d=128 model behind `ovex serve`, single-input requests on loopback.

Measures p50/p99 latency, requests/s, recall@10 of the served answers against exact scoring and the
server's RSS, for the index path and the exact path (`"exact": true`) side by side in one run.

The model is *constructed*, not trained (training 10^6 labels here would take hours): label vectors are
drawn around 4,096 random cluster centres (trained XC heads are clustered like this), biases small, and
the input projection maps each group of 4 feature ids near one centre, so a request built from a group's
features asks for that region of the label space, as a real input would. It is written with the
trainer's own `save_artifact`, so the server loads it exactly like a trained one.

The load generator is a minimal asyncio HTTP/1.1 keep-alive client in this process (a few µs per request,
so the measurement is the server's cost, not the client's). Each cell is bounded in requests and time.

    .venv/bin/python bench/serve_load.py                # full run (~10 minutes on 2 cores)
    .venv/bin/python bench/serve_load.py --labels 100000 --quick
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
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


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
    fz = Featurizer(FeaturizerConfig(sparse_idf=False, sparse_l2=True)).fit(
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

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        assert self.reader is not None and self.writer is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v)
        return status, await self.reader.readexactly(length)

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
            status, raw = await conn.post(path, bodies[i % len(bodies)])
            lat.append(time.perf_counter() - t0)
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
    arr = np.asarray(lat) * 1000
    return {
        "concurrency": concurrency,
        "requests": len(lat),
        "errors": errors,
        "seconds": round(wall, 3),
        "req_per_s": round(len(lat) / wall, 1),
        "p50_ms": round(float(np.percentile(arr, 50)), 3),
        "p99_ms": round(float(np.percentile(arr, 99)), 3),
        "mean_ms": round(float(arr.mean()), 3),
        "exact_share": round(float(np.mean(exact_flags)), 4),
        "_answers": answers,
    }


# ------------------------------------------------------------------------------------------------
# the server and its memory


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.stop = threading.Event()

    def rss(self) -> int:
        with open(f"/proc/{self.pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def hwm(self) -> int:
        with open(f"/proc/{self.pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return 0

    def run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                self.peak = max(self.peak, self.rss())
            except OSError:
                return


def start_server(
    models: Path, work: Path, port: int, threads: int, window_ms: float
) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(
        {
            "OVEX_EMBEDDED_WORKER": "false",
            "OVEX_DATA_DIR": str(work / "data"),
            "OVEX_THREADS": str(threads),
            "OVEX_BATCH_WINDOW_MS": str(window_ms),
            "OVEX_LOG_LEVEL": "info",
            "PYTHONPATH": str(REPO),
        }
    )
    log = open(work / "server.log", "ab")  # noqa: SIM115 - owned by the child
    return subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--models-dir", str(models), "--port", str(port)],
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


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads): its CPU cost whatever else the machine runs."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--labels", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--clusters", type=int, default=4096)
    ap.add_argument("--work", type=Path, default=Path("/tmp/ovex_bench_serve"))
    ap.add_argument("--rebuild", action="store_true", help="rebuild the model and its index")
    ap.add_argument("--threads", type=int, default=1, help="server torch/faiss threads")
    ap.add_argument("--window-ms", type=float, default=1.0)
    ap.add_argument("--quick", action="store_true", help="fewer requests per cell")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "serve_load")
    args = ap.parse_args()

    models = args.work / "models"
    art = models / "big" / "1"
    if args.rebuild and args.work.exists():
        shutil.rmtree(args.work)
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if not (art / "config.json").exists():
        print(f"building a {args.labels:,}-label model (d={args.dim}) …", flush=True)
        build_model(art, args.labels, args.dim, args.clusters, seed=0)
    build_s = time.perf_counter() - t0
    n_features = args.clusters * 4
    weights_bytes = (art / "weights.safetensors").stat().st_size
    head_bytes = args.labels * (args.dim + 1) * 4

    port = free_port()
    meta_path = art / "index" / "meta.json"
    from service.retrieval import INDEX_FORMAT

    had_index = meta_path.exists() and json.loads(meta_path.read_text()).get("format") == INDEX_FORMAT
    proc = start_server(models, args.work, port, args.threads, args.window_ms)
    sampler = RssSampler(proc.pid)
    sampler.start()
    try:
        ready_s = wait_ready(port, proc, timeout=1800)
        rss_ready = sampler.rss()
        load_peak, sampler.peak = sampler.peak, 0  # from here on: the peak while serving
        print(
            f"server ready in {ready_s:.1f}s (index {'loaded from cache' if had_index else 'built'})",
            flush=True,
        )
        n_bodies = 600 if args.quick else 2000
        feats = make_requests(n_bodies, args.clusters, n_features, seed=1)
        scale = 0.3 if args.quick else 1.0
        plan = [  # (path, normalization, concurrency, max requests, max seconds)
            ("index", "none", 1, int(1000 * scale), 20 * scale),
            ("exact", "none", 1, int(300 * scale), 20 * scale),
            ("index", "none", 8, int(3000 * scale), 20 * scale),
            ("exact", "none", 8, int(600 * scale), 20 * scale),
            ("index", "none", 32, int(6000 * scale), 20 * scale),
            ("exact", "none", 32, int(1200 * scale), 25 * scale),
            ("index", "sparsemax", 8, int(2000 * scale), 20 * scale),
        ]
        cells = []
        for path, norm, conc, nmax, tmax in plan:
            bodies = [body_for(f, path == "exact", norm) for f in feats]
            asyncio.run(run_cell("127.0.0.1", port, bodies[:20], conc, 20, 10))  # warm-up, discarded
            cpu0, own0 = cpu_seconds(proc.pid), time.process_time()
            cell = asyncio.run(run_cell("127.0.0.1", port, bodies, conc, nmax, tmax))
            cpu1, own1 = cpu_seconds(proc.pid), time.process_time()
            n_req = max(cell["requests"], 1)
            cell.update(
                {
                    "path": path,
                    "normalization": norm,
                    "server_cpu_ms_per_req": round(1000 * (cpu1 - cpu0) / n_req, 3),
                    "client_cpu_ms_per_req": round(1000 * (own1 - own0) / n_req, 3),
                }
            )
            cells.append(cell)
            print(
                f"{path:5s} {norm:9s} c={conc:2d}: {cell['req_per_s']:8.1f} req/s"
                f"  p50 {cell['p50_ms']:7.2f} ms  p99 {cell['p99_ms']:7.2f} ms"
                f"  n={cell['requests']} errors={cell['errors']}"
                f"  server cpu {cell['server_cpu_ms_per_req']} ms/req",
                flush=True,
            )
        with open(f"/proc/{proc.pid}/status") as fh:
            hwm = next(int(ln.split()[1]) * 1024 for ln in fh if ln.startswith("VmHWM:"))
        index_meta = json.loads((art / "index" / "meta.json").read_text()) if (art / "index").exists() else {}
    finally:
        sampler.stop.set()
        proc.terminate()
        proc.wait(30)

    # recall@10 against an independent exact scoring of every request body (numpy/torch, this process,
    # after the server stopped); the server's exact path is checked against the same truth.
    truth = local_truth(art, feats)
    for c in cells:
        if c["normalization"] != "none":
            continue
        got = c["_answers"]
        score = float(np.mean([len(set(got[i]) & set(truth[i])) / 10 for i in got]))
        c["recall_at_10" if c["path"] == "index" else "agreement_with_numpy_top10"] = round(score, 4)
        c["recall_queries"] = len(got)
    check = {
        "queries": sum(
            len(c["_answers"]) for c in cells if c["path"] == "exact" and c["normalization"] == "none"
        )
    }
    load = os.getloadavg()
    result = {
        "model": {
            "labels": args.labels,
            "dim": args.dim,
            "clusters": args.clusters,
            "n_features": n_features,
            "weights_file_bytes": weights_bytes,
            "head_bytes": head_bytes,
            "constructed_not_trained": True,
        },
        "server": {
            "threads": args.threads,
            "batch_window_ms": args.window_ms,
            "ready_seconds": round(ready_s, 1),
            "index_from_cache": had_index,
            "index": {k: v for k, v in index_meta.items() if k != "fingerprint"},
            "rss_ready_bytes": rss_ready,
            "rss_peak_loading_bytes": load_peak,
            "rss_peak_serving_bytes": sampler.peak,
            "vm_hwm_bytes": hwm,
            "rss_peak_serving_over_weights": round(sampler.peak / weights_bytes, 2),
            "vm_hwm_over_weights": round(hwm / weights_bytes, 2),
        },
        "exact_path_queries": check,
        "cells": [{k: v for k, v in c.items() if not k.startswith("_")} for c in cells],
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_at_end": [round(x, 2) for x in load],
        },
        "model_build_seconds": round(build_s, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    args.out.with_suffix(".md").write_text(render_md(result))
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


def render_md(r: dict[str, Any]) -> str:
    m, s = r["model"], r["server"]
    gib = 1024**3
    idx, mach = s["index"], r["machine"]
    built = "from cache" if s["index_from_cache"] else "built at first load"
    lines = [
        "# Serving load: 10^6 labels over HTTP (bench/serve_load.py)",
        "",
        f"Model: {m['labels']:,} labels, d={m['dim']}, constructed (clustered label vectors around "
        f"{m['clusters']} centres), not trained; weights file {m['weights_file_bytes'] / gib:.2f} GiB.",
        f"Server: `ovex serve`, one process, {s['threads']} compute thread(s), batch window "
        f"{s['batch_window_ms']} ms; ready in {s['ready_seconds']} s (index {built}); "
        f"index {idx.get('kind', '?')} nlist={idx.get('nlist')} nprobe={idx.get('nprobe')}.",
        f"Machine: {mach['cpus']} CPUs, shared with other work (load average at the end "
        f"{mach['loadavg_at_end']}); client on the same machine (asyncio, keep-alive).",
        "",
        "| path | normalization | concurrency | requests | req/s | p50 ms | p99 ms | recall@10 "
        "| exact flag share | server CPU ms/req |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in r["cells"]:
        rec = c.get("recall_at_10")
        lines.append(
            f"| {c['path']} | {c['normalization']} | {c['concurrency']} | {c['requests']} "
            f"| {c['req_per_s']} | {c['p50_ms']} | {c['p99_ms']} | {'' if rec is None else rec} "
            f"| {c['exact_share']} | {c['server_cpu_ms_per_req']} |"
        )
    lines += [
        "",
        f"Server RSS: {s['rss_ready_bytes'] / gib:.2f} GiB when ready, peak while serving "
        f"{s['rss_peak_serving_bytes'] / gib:.2f} GiB = {s['rss_peak_serving_over_weights']}× the weights "
        f"file; high-water mark including model loading {s['vm_hwm_bytes'] / gib:.2f} GiB = "
        f"{s['vm_hwm_over_weights']}× (the loader reads the weights file whole, then copies each "
        "tensor into the model and drops it; the faiss index loads beside them).",
        "recall@10: the index path's top-10 vs an exact scoring of the same inputs computed in the "
        "benchmark process from the stored weights (torch, blocked); the exact path's answers agree with "
        "that scoring as listed in the JSON (`agreement_with_numpy_top10`).",
        "Server CPU ms/req: the server process's CPU time (all threads) per request during the cell — its "
        "cost independent of what else the shared machine runs; 1000 / that figure is the request rate "
        "one dedicated core could sustain.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
