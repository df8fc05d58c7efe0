"""Label-sharded training across ranks: traffic and step time against K, throughput at R = 1 and 2,
memory per rank against K, and a 10^7-label model trained on 2 ranks and served.

    .venv/bin/python bench/distributed.py [--part traffic|throughput|scale|all] [--ks 1e4,1e5,1e6,1e7]

traffic: R = 2 ranks, the real `Stepper` on random sparse rows (the same rows at every K), d=32, batch 512
(256 a rank), 1024 negatives in groups of 128: bytes each rank sends into collectives per step (payload)
and the step time; peak RSS of each rank at R = 1 and 2. throughput: examples/s at R = 1 and 2 with
the same K and the same batch per rank (one thread a rank), one run. scale: `ovex train --nproc-per-node 2`
on a 10^7-label synthetic set (d=32: each rank's head, Adam state and artifact copy stay under ~3 GiB),
then `ovex serve` loads the artifact and answers a request. Writes bench/results/distributed.json and .md.
d=32 throughout: the machine is shared (2 cores, 24 GiB, other jobs), a 10^7-label rank must stay
under ~5 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.collectives import join_group, launch  # noqa: E402
from trainer.label_shards import shard_bounds  # noqa: E402
from trainer.losses import get_loss  # noqa: E402
from trainer.model import ModelShape, XCModel  # noqa: E402
from trainer.negatives import NegativeSampler  # noqa: E402
from trainer.params import TrainParams  # noqa: E402
from trainer.train import EpochData, Stepper, tune_malloc  # noqa: E402

OUT = ROOT / "bench" / "results" / "distributed"
DIM = 32
FEATURES = 100_000


def load() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def rows(n: int, k: int, seed: int = 0) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Random rows, ~50 non-zeros over FEATURES, 1-5 labels in [0, K): cost only, not learning."""
    rng = np.random.default_rng(seed)
    nnz = 50
    x = sp.csr_matrix(
        (rng.random(n * nnz, dtype=np.float32), rng.integers(0, FEATURES, n * nnz),
         np.arange(0, n * nnz + 1, nnz)),
        shape=(n, FEATURES),
    )
    x.sum_duplicates()
    counts = rng.integers(1, 6, n)
    ptr = np.concatenate([[0], np.cumsum(counts)])
    ids = rng.integers(0, k, int(ptr[-1]))
    y = sp.csr_matrix((np.ones(len(ids), dtype=np.float32), ids, ptr), shape=(n, k))
    y.sum_duplicates()
    return x, y


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def step_rank(k: int, batch_per_rank: int, steps: int, negatives: int) -> dict[str, Any]:
    """One rank: build its shard of a K-label model, time `steps` steps, count the bytes it sent."""
    import torch.distributed as dist

    tune_malloc()
    group = join_group(torch.device("cpu"))
    torch.set_num_threads(1)
    rss0 = rss_mb()
    shard = shard_bounds(k, group.world, group.rank)
    params = TrainParams(dim=DIM, batch_size=batch_per_rank * group.world, negatives=negatives)
    batch = params.batch_size
    x, y = rows(batch * (steps + 5), k)
    shape = ModelShape(n_features=FEATURES, n_labels=k, dim=DIM)
    model = XCModel(shape, seed=0, label_rows=(shard.lo, shard.hi))
    sampler = NegativeSampler(shard.size, "uniform", seed=1 + group.rank)
    stepper = Stepper(model, get_loss("ove"), params, sampler, group, shard)
    ep = EpochData(x, y, np.arange(x.shape[0]), torch.device("cpu"))
    for s in range(5):  # warm-up: optimizer state allocated, kernels compiled
        stepper.step(ep, s * batch, (s + 1) * batch, 0.01)
    group.barrier()
    stats0 = (group.stats.bytes, group.stats.calls)
    t0, c0 = time.perf_counter(), time.process_time()
    for s in range(5, steps + 5):
        stepper.step(ep, s * batch, (s + 1) * batch, 0.01)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out = {
        "rank": group.rank, "world": group.world, "k": k, "labels_on_rank": shard.size,
        "bytes_per_step": (group.stats.bytes - stats0[0]) / steps,
        "collectives_per_step": (group.stats.calls - stats0[1]) / steps,
        "step_ms": 1000 * wall / steps, "cpu_ms": 1000 * cpu / steps,
        "examples_per_s": steps * batch / wall,
        "peak_rss_mb": rss_mb(), "rss_before_model_mb": rss0,
    }
    if group.world == 1:
        return {"ranks": [out]}
    gathered: list[Any] = [None] * group.world
    dist.all_gather_object(gathered, out)
    return {"ranks": gathered}


def run_ranks(nproc: int, *args: Any) -> dict[str, Any]:
    result: dict[str, Any] = launch(nproc, step_rank, args, run_id=f"bench-{nproc}")
    return result


def part_traffic(ks: list[int], steps: int) -> list[dict[str, Any]]:
    out = []
    for k in ks:
        for nproc in (1, 2):
            r = run_ranks(nproc, k, 256 * (2 // nproc), steps, 1024)  # the same global batch of 512
            row = {"k": k, "ranks": nproc, "load": load(), "per_rank": r["ranks"]}
            out.append(row)
            worst = max(x["peak_rss_mb"] for x in r["ranks"])
            sent = r["ranks"][0]["bytes_per_step"] / 1024
            print(f"K={k:>10,} R={nproc}: {sent:8.1f} KiB/step sent by rank 0, "
                  f"{np.mean([x['step_ms'] for x in r['ranks']]):7.1f} ms/step, peak RSS {worst:,.0f} MB "
                  f"(load {load()})", flush=True)
    return out


def part_throughput(k: int, batch_per_rank: int, steps: int) -> list[dict[str, Any]]:
    out = []
    for nproc in (1, 2):
        r = run_ranks(nproc, k, batch_per_rank, steps, 1024)
        rate = sum(x["examples_per_s"] for x in r["ranks"]) / nproc  # every rank sees the whole batch rate
        row = {"k": k, "ranks": nproc, "batch_per_rank": batch_per_rank, "examples_per_s": rate,
               "load": load(), "per_rank": r["ranks"]}
        out.append(row)
        print(f"throughput K={k:,} R={nproc} batch/rank {batch_per_rank}: {rate:,.0f} examples/s "
              f"(load {load()})", flush=True)
    return out


def part_scale(labels: int, train_rows: int, test_rows: int, epochs: int, port: int) -> dict[str, Any]:
    """The real entry points: `ovex synth`, `ovex train --nproc-per-node 2`, `ovex serve`."""
    ovex = [sys.executable, "-m", "service.cli"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'clients' / 'python'}"}
    work = Path(tempfile.mkdtemp(prefix="ovex-dist-"))
    try:
        train_p, test_p = work / "train.txt", work / "test.txt"
        subprocess.run([*ovex, "synth", "--labels", str(labels), "--features", str(FEATURES), "--rows",
                        str(train_rows), "--out", str(train_p), "--seed", "7", "--test-out", str(test_p),
                        "--test-rows", str(test_rows)], check=True, env=env)
        model_dir = work / "models" / "big" / "1"
        t0 = time.perf_counter()
        cmd = [*ovex, "train", "--train", str(train_p), "--test", str(test_p), "--out", str(model_dir),
               "--nproc-per-node", "2", "--dim", str(DIM), "--epochs", str(epochs), "--batch-size", "512",
               "--eval-every", "0"]
        proc = subprocess.run(["/usr/bin/time", "-v", *cmd], env=env, capture_output=True, text=True)
        train_s = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-3000:])
        metrics = json.loads(proc.stdout.strip().splitlines()[-1])
        print(proc.stderr[-1500:], flush=True)
        y_counts = np.zeros(labels)
        test_first: list[tuple[list[int], list[float]]] = []
        with open(train_p) as fh:
            next(fh)
            for line in fh:
                head = line.split(" ", 1)[0]
                if head and ":" not in head:
                    for lab in head.split(","):
                        y_counts[int(lab)] += 1
        top = int(np.argmax(y_counts))
        hits = n = 0
        with open(test_p) as fh:
            next(fh)
            for line in fh:
                head = line.split(" ", 1)[0]
                labs = [] if ":" in head else [int(v) for v in head.split(",") if v]
                n += 1
                hits += top in labs
                if len(test_first) < 1:
                    feats = [t.split(":") for t in line.split()[1:]]
                    test_first.append(([int(a) for a, _ in feats], [float(b) for _, b in feats]))
        most_frequent = hits / max(n, 1)
        art_mb = sum(f.stat().st_size for f in model_dir.rglob("*") if f.is_file()) / 2**20

        t0 = time.perf_counter()
        server = subprocess.Popen([*ovex, "serve", "--models-dir", str(work / "models"), "--port", str(port),
                                   "--retrieval", "exact"], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
        try:
            answer = None
            while time.perf_counter() - t0 < 900:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(1)
                assert server.poll() is None, server.communicate()[1][-2000:]
            load_s = time.perf_counter() - t0
            idx, vals = test_first[0]
            inputs = [{"features": {"indices": idx, "values": vals}}]
            body = json.dumps({"inputs": inputs, "top_k": 5}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/predict", data=body,
                                         headers={"Content-Type": "application/json"})
            t1 = time.perf_counter()
            with urllib.request.urlopen(req, timeout=120) as r:
                answer = json.loads(r.read())
            request_ms = 1000 * (time.perf_counter() - t1)
            server_rss = _rss_of(server.pid)
        finally:
            server.terminate()
            server.wait(timeout=60)
        rank_rss = [float(line.split(":")[1]) / 1024 for line in proc.stderr.splitlines()
                    if "Maximum resident set size" in line]
        return {
            "labels": labels, "train_rows": train_rows, "test_rows": test_rows, "epochs": epochs, "dim": DIM,
            "ranks": 2, "metrics": metrics, "most_frequent_p@1": most_frequent, "train_s": train_s,
            "train_log_tail": proc.stderr[-800:], "max_rss_any_process_mb": rank_rss,
            "artifact_mb": art_mb, "serve_load_s": load_s, "request_ms": request_ms,
            "server_rss_mb": server_rss, "answer": answer["predictions"][0]["labels"][:3] if answer else None,
            "load": load(),
        }
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


def _rss_of(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) / 1024
    return float("nan")


def write(results: dict[str, Any]) -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(OUT.with_suffix(".json").read_text()) if OUT.with_suffix(".json").exists() else {}
    old.update(results)
    old["torch"] = torch.__version__
    OUT.with_suffix(".json").write_text(json.dumps(old, indent=1))
    lines = ["# Distributed training: a label-sharded head across ranks", "",
             f"Shared machine ({os.cpu_count()} CPUs, other jobs running; load averages beside each row), "
             f"torch {torch.__version__}, gloo on loopback, d={DIM}, one thread a rank.", ""]
    if "traffic" in old:
        lines += ["## Traffic, step time and memory against K", "",
                  "Global batch 512 (256 a rank at R = 2), 1024 negatives (512 a rank), groups of 128, adam. "
                  "Bytes: payload each rank puts into collectives per step (forward and backward).", "",
                  "| K | R | labels a rank | KiB sent / step / rank | collectives / step | ms / step | "
                  "peak RSS / rank MB | load |", "|---:|---:|---:|---:|---:|---:|---:|---|"]
        for row in old["traffic"]:
            r = row["per_rank"]
            lines.append(
                f"| {row['k']:,} | {row['ranks']} | {r[0]['labels_on_rank']:,} | "
                f"{np.mean([x['bytes_per_step'] for x in r]) / 1024:,.1f} | "
                f"{r[0]['collectives_per_step']:.0f} | "
                f"{np.mean([x['step_ms'] for x in r]):.1f} | {max(x['peak_rss_mb'] for x in r):,.0f} | "
                f"{row['load']} |")
        lines.append("")
    if "throughput" in old:
        lines += ["## Examples/s at R = 1 and 2 (same K, same batch per rank, one run)", "",
                  "| K | R | batch / rank | examples/s | load |", "|---:|---:|---:|---:|---|"]
        for row in old["throughput"]:
            lines.append(f"| {row['k']:,} | {row['ranks']} | {row['batch_per_rank']} | "
                         f"{row['examples_per_s']:,.0f} | {row['load']} |")
        rates = [row["examples_per_s"] for row in old["throughput"]]
        if len(rates) == 2:
            lines += ["", f"R = 2 / R = 1: {rates[1] / rates[0]:.2f}x."]
        lines.append("")
    for key in sorted(k for k in old if k.startswith("scale")):
        s = old[key]
        lines += [f"## A 10^7-label model on 2 ranks, served ({s['epochs']} epochs)", "",
                  f"`ovex synth` ({s['labels']:,} labels, {s['train_rows']:,} training rows, "
                  f"{s['test_rows']:,} test rows, seed 7), `ovex train --nproc-per-node 2 --dim {s['dim']} "
                  f"--epochs {s['epochs']} "
                  f"--batch-size 512` (other parameters default), `ovex serve --retrieval exact`.", "",
                  "| P@1 | P@5 | most-frequent P@1 | train s | max RSS of a process MB | artifact MB | "
                  "serve load s | request ms | server RSS MB |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
                  f"| {s['metrics']['p@1']:.4f} | {s['metrics']['p@5']:.4f} | {s['most_frequent_p@1']:.4f} | "
                  f"{s['train_s']:.0f} | {max(s['max_rss_any_process_mb'] or [float('nan')]):,.0f} | "
                  f"{s['artifact_mb']:,.0f} | {s['serve_load_s']:.1f} | {s['request_ms']:.0f} | "
                  f"{s['server_rss_mb']:,.0f} |", "", f"Load average {s['load']}.", ""]
    OUT.with_suffix(".md").write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", default="all", choices=["traffic", "throughput", "scale", "all"])
    ap.add_argument("--ks", default="1e4,1e5,1e6,1e7")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--throughput-k", type=float, default=1e5)
    ap.add_argument("--labels", type=float, default=1e7)
    ap.add_argument("--train-rows", type=int, default=200_000)
    ap.add_argument("--test-rows", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--port", type=int, default=8125)
    args = ap.parse_args()
    if args.part in ("traffic", "all"):
        write({"traffic": part_traffic([int(float(k)) for k in args.ks.split(",")], args.steps)})
    if args.part in ("throughput", "all"):
        write({"throughput": part_throughput(int(args.throughput_k), 256, args.steps * 3)})
    if args.part in ("scale", "all"):
        scale = part_scale(int(args.labels), args.train_rows, args.test_rows, args.epochs, args.port)
        write({"scale" if args.epochs == 2 else f"scale_{args.epochs}_epochs": scale})


if __name__ == "__main__":
    main()
