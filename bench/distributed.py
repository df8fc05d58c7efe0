r"""Label-sharded training across ranks: traffic and step time against K, throughput at R = 1 and 2,
memory per rank against K, and a 10^7-label model trained on 2 ranks and served.

    .venv/bin/python bench/distributed.py [--part traffic|throughput|scale|proxy|all] [--ks 1e4,1e5,1e6,1e7]

traffic: R = 2 ranks, the real `Stepper` on random sparse rows (the same rows at every K), d=32, batch 512
(256 a rank), 1024 negatives in groups of 128: bytes each rank sends into collectives per step (payload)
and the step time; peak RSS of each rank at R = 1 and 2. throughput: examples/s at R = 1 and 2 with
the same K and the same batch per rank (one thread a rank), one run. Run these alone on the machine.
scale: `ovex synth`, `ovex train --nproc-per-node 2` (d=32: the default d=512 does not fit 10^7 labels
here; more flags with --train-flags), then `ovex serve` loads the artifact and answers requests; reports
P@1 against the most frequent label and the seen-label ceiling, each process's peak RSS, load time.
The headline run:

    bench/distributed.py --part scale --train-rows 600000 --epochs 4 --train-flags "--dropout 0" \
        --name 600k_rows_4_epochs_dropout_0

proxy: one process at fewer labels (--labels 1e6 --train-rows N --proxy '{"dim": 32, ...}'), the same
synthetic structure, to see what moves P@1 before a 10^7 run. Writes bench/results/distributed.json, .md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from stamp import RESULTS, STAMP_KEYS, finish, markdown_line, stamp  # noqa: E402

from bench.serve_load import group  # noqa: E402  (a process and its descendants)
from trainer.collectives import join_group, launch  # noqa: E402
from trainer.label_shards import shard_bounds  # noqa: E402
from trainer.losses import get_loss  # noqa: E402
from trainer.model import ModelShape, XCModel  # noqa: E402
from trainer.negatives import NegativeSampler  # noqa: E402
from trainer.params import TrainParams  # noqa: E402
from trainer.step import EpochData, Stepper  # noqa: E402
from trainer.train import tune_malloc  # noqa: E402

OUT = RESULTS / "distributed"
RUN: dict[str, Any] = {}  # this run's stamp (set in main); each part written keeps its own under "stamps"
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
    ep = EpochData(x, y, np.arange(x.shape[0]))
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


class PeakRss:
    """Peak RSS (VmHWM) of a process and its descendants, sampled every half second: one figure a rank."""

    def __init__(self, root: int) -> None:
        self.root, self.peaks = root, {}  # pid -> (peak MB, command line)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            for pid in group(self.root):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")[:120]
                    peak = _rss_of(pid)
                except OSError:
                    continue
                if peak == peak:  # not NaN
                    self.peaks[pid] = (max(peak, self.peaks.get(pid, (0.0, ""))[0]), cmd)

    def finish(self) -> list[dict[str, Any]]:
        self.stop.set()
        self.thread.join()
        return [{"pid": pid, "peak_rss_mb": mb, "cmd": cmd} for pid, (mb, cmd) in sorted(self.peaks.items())]


def label_stats(train_p: Path, test_p: Path, labels: int) -> dict[str, Any]:
    """Most-frequent-label P@1 and the ceiling set by labels never seen in training: the share of test
    rows with at least one label that occurs in the training rows (the P@1 of an oracle that knows the
    test labels but may only name seen ones)."""
    y_counts = np.zeros(labels, dtype=np.int64)
    with open(train_p) as fh:
        next(fh)
        for line in fh:
            head = line.split(" ", 1)[0]
            if head and ":" not in head:
                y_counts[np.array(head.split(","), dtype=np.int64)] += 1
    top = int(np.argmax(y_counts))
    hits = seen = n = 0
    first: tuple[list[int], list[float]] | None = None
    with open(test_p) as fh:
        next(fh)
        for line in fh:
            head = line.split(" ", 1)[0]
            labs = [] if ":" in head else [int(v) for v in head.split(",") if v]
            n += 1
            hits += top in labs
            seen += any(y_counts[v] > 0 for v in labs)
            if first is None:
                feats = [t.split(":") for t in line.split()[1:]]
                first = ([int(a) for a, _ in feats], [float(b) for _, b in feats])
    assert first is not None
    return {"most_frequent_p@1": hits / max(n, 1), "seen_ceiling_p@1": seen / max(n, 1),
            "labels_seen": int((y_counts > 0).sum()), "first_test_row": first}


def part_scale(labels: int, train_rows: int, test_rows: int, epochs: int, port: int,
               extra: list[str]) -> dict[str, Any]:
    """The real entry points: `ovex synth`, `ovex train --nproc-per-node 2`, `ovex serve`."""
    ovex = [sys.executable, "-m", "service.cli"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'clients' / 'python'}"}
    work = Path(tempfile.mkdtemp(prefix="ovex-dist-"))
    try:
        train_p, test_p = work / "train.txt", work / "test.txt"
        t0 = time.perf_counter()
        subprocess.run([*ovex, "synth", "--labels", str(labels), "--features", str(FEATURES), "--rows",
                        str(train_rows), "--out", str(train_p), "--seed", "7", "--test-out", str(test_p),
                        "--test-rows", str(test_rows)], check=True, env=env)
        print(f"synth: {time.perf_counter() - t0:.0f} s (load {load()})", flush=True)
        model_dir = work / "models" / "big" / "1"
        flags = ["--nproc-per-node", "2", "--dim", str(DIM), "--epochs", str(epochs), "--batch-size", "512",
                 "--eval-every", "0", *extra]
        t0 = time.perf_counter()
        cmd = [*ovex, "train", "--train", str(train_p), "--test", str(test_p), "--out", str(model_dir),
               *flags]
        train_proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sampler = PeakRss(train_proc.pid)
        out, err = train_proc.communicate()
        train_s = time.perf_counter() - t0
        processes = sampler.finish()
        if train_proc.returncode != 0:
            raise RuntimeError(err[-3000:])
        metrics = json.loads(out.strip().splitlines()[-1])
        print(err[-1500:], flush=True)
        stats = label_stats(train_p, test_p, labels)
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
                    time.sleep(0.2)
                assert server.poll() is None, server.communicate()[1][-2000:]
            load_s = time.perf_counter() - t0
            idx, vals = stats.pop("first_test_row")
            inputs = [{"features": {"indices": idx, "values": vals}}]
            body = json.dumps({"inputs": inputs, "top_k": 5}).encode()
            request_ms = []
            for _ in range(5):
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/predict", data=body,
                                             headers={"Content-Type": "application/json"})
                t1 = time.perf_counter()
                with urllib.request.urlopen(req, timeout=120) as r:
                    answer = json.loads(r.read())
                request_ms.append(1000 * (time.perf_counter() - t1))
            server_rss = _rss_of(server.pid)
        finally:
            server.terminate()
            server.wait(timeout=60)
        return {
            "labels": labels, "train_rows": train_rows, "test_rows": test_rows, "epochs": epochs, "dim": DIM,
            "ranks": 2, "flags": flags, "metrics": metrics, **stats, "train_s": train_s,
            "train_log_tail": err[-800:], "processes": processes,
            "artifact_mb": art_mb, "serve_load_s": load_s, "request_ms": request_ms,
            "server_rss_mb": server_rss, "answer": answer["predictions"][0]["labels"][:3] if answer else None,
            "load": load(),
        }
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


def part_proxy(labels: int, rows: int, overrides: dict[str, Any]) -> dict[str, Any]:
    """One process, in memory, on the same synthetic structure as the 10^7-label run (seed 7, 1000 test
    rows) at fewer labels: which of rows, epochs, d and dropout move P@1, before paying for a 10^7 run."""
    from trainer.synth import synth_dataset
    from trainer.train import train

    tr = synth_dataset(labels, FEATURES, rows, 7, part=0)
    te = synth_dataset(labels, FEATURES, 1000, 7, part=1)
    counts = np.asarray(tr.Y.sum(0)).ravel()
    top = int(np.argmax(counts))
    yt = sp.csr_matrix(te.Y)
    seen = [bool((counts[yt.indices[yt.indptr[i]:yt.indptr[i + 1]]] > 0).any()) for i in range(yt.shape[0])]
    t0 = time.time()
    r = train(TrainParams(**{"eval_every": 1, **overrides}), tr, te, out_dir=None)
    row = {"L": labels, "N": rows, **overrides, "p@1": r.metrics["p@1"],
           "hist": [h["metrics"]["p@1"] for h in r.history if "metrics" in h],
           "most_frequent": float((yt[:, top].toarray().ravel() > 0).mean()),
           "seen_ceiling": float(np.mean(seen)),
           "s": time.time() - t0, "ex_s": r.examples_per_s, "load": load()}
    print(json.dumps(row), flush=True)
    return row


def _rss_of(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) / 1024
    return float("nan")


def write(results: dict[str, Any]) -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(OUT.with_suffix(".json").read_text()) if OUT.with_suffix(".json").exists() else {}
    if "traffic" in results and "traffic" in old:  # K values measured in separate runs: replace by (K, R)
        fresh = {(row["k"], row["ranks"]) for row in results["traffic"]}
        kept = [row for row in old["traffic"] if (row["k"], row["ranks"]) not in fresh]
        rows = sorted(kept + results["traffic"], key=lambda r: (r["k"], r["ranks"]))
        results = {**results, "traffic": rows}
    if "proxy" in results:  # one configuration a run: appended
        results = {**results, "proxy": old.get("proxy", []) + results["proxy"]}
    # parts an earlier run wrote without a stamp: their commit is unknown
    earlier = {k: {"commit": None} for k in old if k not in (*STAMP_KEYS, "torch", "stamps")}
    old.update(results)
    old["torch"] = torch.__version__
    now = finish(RUN)
    old["stamps"] = {**earlier, **old.get("stamps", {}), **{key: now for key in results}}
    old.update(now)  # the top level: the latest run; the oldest part's commit is in "stamps"
    OUT.with_suffix(".json").write_text(json.dumps(old, indent=1))
    lines = ["# Distributed training: a label-sharded head across ranks", "", markdown_line(now),
             "Each part's own commit and load: `stamps` in the JSON.", "",
             f"{os.cpu_count()} CPUs, torch {torch.__version__}, gloo on loopback, d={DIM}, one thread a "
             "rank. "
             "Traffic and throughput were measured with no other test or benchmark running (one K or one "
             "part a run; the load average at the end of each row beside it); the 10^7-label runs shared "
             "the machine.", ""]
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
    if "proxy" in old:
        lines += ["## What limits P@1 at d=32: one process at 10^6 labels", "",
                  "`part_proxy`: the synthetic structure of the 10^7-label run (seed 7, 100,000 features, "
                  "1,000 "
                  "test rows) at 10^6 labels, one process, in memory; parameters not named are the defaults "
                  "(dropout 0.6, adam, lr 0.01, 1024 negatives in groups of 128).", "",
                  "| labels | rows | d | epochs | batch | dropout | P@1 by epoch | most-frequent P@1 | "
                  "seen-label ceiling | s | load |", "|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|"]
        for r in old["proxy"]:
            lines.append(f"| {r['L']:,} | {r['N']:,} | {r.get('dim', 512)} | {r.get('epochs', 7)} | "
                         f"{r.get('batch_size', 256)} | {r.get('dropout', 0.6)} | "
                         f"{' / '.join(f'{v:.3f}' for v in r['hist'])} | {r['most_frequent']:.3f} | "
                         f"{r['seen_ceiling']:.3f} | {r['s']:.0f} | {r.get('load', 'not recorded')} |")
        lines.append("")
    for key in sorted(k for k in old if k.startswith("scale")):
        lines += _scale_section(old[key])
    OUT.with_suffix(".md").write_text("\n".join(lines))


def _scale_section(s: dict[str, Any]) -> list[str]:
    flags = " ".join(s.get("flags") or ["--nproc-per-node", "2", "--dim", str(s["dim"]), "--epochs",
                                         str(s["epochs"]), "--batch-size", "512"])
    lines = [f"## A 10^7-label model on 2 ranks, served ({s['train_rows']:,} rows, {s['epochs']} epochs"
             + (", dropout 0)" if "--dropout" in flags else ")"), "",
             f"`ovex synth` ({s['labels']:,} labels, {s['train_rows']:,} training rows, {s['test_rows']:,} "
             f"test rows, seed 7), `ovex train {flags}` (other parameters default), "
             "`ovex serve --retrieval exact`.", ""]
    if "processes" not in s:  # an earlier run: one max RSS over all processes, one request
        lines += ["| P@1 | P@5 | most-frequent P@1 | train s | max RSS of a process MB | artifact MB | "
                  "serve load s | request ms | server RSS MB |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
                  f"| {s['metrics']['p@1']:.4f} | {s['metrics']['p@5']:.4f} | {s['most_frequent_p@1']:.4f} | "
                  f"{s['train_s']:.0f} | {max(s['max_rss_any_process_mb'] or [float('nan')]):,.0f} | "
                  f"{s['artifact_mb']:,.0f} | {s['serve_load_s']:.1f} | {s['request_ms']:.0f} | "
                  f"{s['server_rss_mb']:,.0f} |", "", f"Load average {s['load']}.", ""]
        return lines
    ranks = sorted((p for p in s["processes"] if "spawn_main" in p["cmd"]),
                   key=lambda p: p["pid"])
    parent = s["processes"][0]["peak_rss_mb"]
    rank_mb = " / ".join(f"{p['peak_rss_mb']:,.0f}" for p in ranks)
    m, mf, ceil = s["metrics"]["p@1"], s["most_frequent_p@1"], s["seen_ceiling_p@1"]
    lines += ["| P@1 | P@5 | most-frequent P@1 | P@1 / most-frequent | seen-label ceiling P@1 | "
              "share of ceiling | train s |", "|---:|---:|---:|---:|---:|---:|---:|",
              f"| {m:.4f} | {s['metrics']['p@5']:.4f} | {mf:.4f} | {m / mf:.2f}x | {ceil:.4f} | "
              f"{m / ceil:.0%} | {s['train_s']:.0f} |", "",
              "| peak RSS a rank MB | launcher MB | artifact MB | serve load s | request ms (5 in a row) | "
              "server RSS MB |", "|---|---:|---:|---:|---|---:|",
              f"| {rank_mb} | {parent:,.0f} | "
              f"{s['artifact_mb']:,.0f} | {s['serve_load_s']:.1f} | "
              f"{' / '.join(f'{v:.0f}' for v in s['request_ms'])} | {s['server_rss_mb']:,.0f} |", "",
              f"{s['labels_seen']:,} distinct labels occur in the training rows. Seen-label ceiling: the "
              "share of test rows with at least one label that occurs in training (no model can name a "
              f"label it never saw). Load average {s['load']}.", ""]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", default="all", choices=["traffic", "throughput", "scale", "proxy", "all"])
    ap.add_argument("--ks", default="1e4,1e5,1e6,1e7")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--throughput-k", type=float, default=1e5)
    ap.add_argument("--labels", type=float, default=1e7)
    ap.add_argument("--train-rows", type=int, default=200_000)
    ap.add_argument("--test-rows", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--port", type=int, default=8125)
    ap.add_argument("--train-flags", default="", help="scale: more `ovex train` flags, e.g. '--dropout 0'")
    ap.add_argument("--proxy", default="{}", help="proxy: TrainParams overrides as JSON")
    ap.add_argument("--name", default="", help="scale: results key suffix (default: from rows and epochs)")
    args = ap.parse_args()
    RUN.update(stamp())
    if args.part in ("traffic", "all"):
        write({"traffic": part_traffic([int(float(k)) for k in args.ks.split(",")], args.steps)})
    if args.part in ("throughput", "all"):
        write({"throughput": part_throughput(int(args.throughput_k), 256, args.steps * 3)})
    if args.part == "proxy":
        write({"proxy": [part_proxy(int(args.labels), args.train_rows, json.loads(args.proxy))]})
    if args.part in ("scale", "all"):
        scale = part_scale(int(args.labels), args.train_rows, args.test_rows, args.epochs, args.port,
                           args.train_flags.split())
        write({f"scale_{args.name or f'{args.train_rows}_rows_{args.epochs}_epochs'}": scale})


if __name__ == "__main__":
    main()
