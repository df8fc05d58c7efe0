"""Adding labels by their texts to a served model: seconds from the POST to the new version answering.

Planted data (`ovex synth --format jsonl --label-texts`) with K + M labels, every label's text its
prototype words; the last M labels are held out of the training rows altogether. A model of the first K
labels is trained with their texts (d = 512), served by `ovex serve` through the int8 scan (its cells built
at load), and asked for the top 5 of the test rows. Then the M held-out labels are POSTed by their texts
with `activate: true`; the clock runs from the POST until a prediction answers from the new version. The
test rows are asked again: P@k over the old labels (the held-out ones removed from the truth) before and
after, the share of answers certified exact before and after, and how often a test row that carries a
held-out label finds one in its top 5. For comparison, the same version's int8 index built from scratch.

    python bench/add_labels.py --labels 100000 --added 1000 --out bench/results/add_labels
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from stamp import RESULTS, markdown_line, stamp, stamped  # noqa: E402

API_KEY = "bench-add-labels"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_data(
    work: Path, k: int, m: int, features: int, rows: int, test_rows: int, seed: int
) -> dict[str, Any]:
    """Rows and label texts; the held-out labels (ids k..k+m-1) removed from the training rows."""
    from trainer.synth import write_label_texts, write_synth

    t0 = time.perf_counter()
    train, test, texts = work / "train.jsonl", work / "test.jsonl", work / "texts.jsonl"
    write_synth(train, k + m, features, rows, seed=seed, fmt="jsonl", test_path=test, test_rows=test_rows)
    write_label_texts(texts, k + m, features, seed=seed)
    kept = []
    with open(train) as fh:
        for line in fh:
            obj = json.loads(line)
            obj["labels"] = [n for n in obj["labels"] if int(n) < k]
            if obj["labels"]:
                kept.append(json.dumps(obj))
    train.write_text("\n".join(kept) + "\n")
    return {"train_rows": len(kept), "seconds": round(time.perf_counter() - t0, 1)}


def train_model(work: Path, out: Path, k: int, dim: int, epochs: int, seed: int) -> dict[str, Any]:
    from trainer.data import read_dataset
    from trainer.label_texts import read_label_texts
    from trainer.params import TrainParams
    from trainer.train import train

    pairs = read_label_texts(work / "texts.jsonl")[:k]
    params = TrainParams(dim=dim, epochs=epochs, seed=seed, device="cpu", eval_every=0)
    t0 = time.perf_counter()
    train(params, read_dataset(work / "train.jsonl"), None, out_dir=out, label_texts=pairs)
    return {"seconds": round(time.perf_counter() - t0, 1), "dim": dim, "epochs": epochs,
            "params": "defaults, dim and epochs as given"}


class Served:
    def __init__(self, models: Path, work: Path, threads: int) -> None:
        self.port = _free_port()
        env = dict(os.environ, OVEX_EMBEDDED_WORKER="false", OVEX_DATA_DIR=str(work / "data"),
                   OVEX_API_KEY=API_KEY, OVEX_THREADS=str(threads), OVEX_RETRIEVAL="int8",
                   PYTHONPATH=str(REPO))
        self.log = open(work / "server.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--models-dir", str(models), "--port",
             str(self.port)], cwd=work, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client(base_url=self.base, timeout=600, headers={"X-API-Key": API_KEY})

    def wait_ready(self, timeout: float = 3600) -> float:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited")
            try:
                if self.client.get("/readyz", timeout=5).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError("server not ready")

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def read_test(path: Path) -> tuple[list[str], list[set[str]]]:
    texts, labels = [], []
    with open(path) as fh:
        for line in fh:
            obj = json.loads(line)
            texts.append(obj["text"])
            labels.append(set(obj["labels"]))
    return texts, labels


def predict(srv: Served, texts: list[str], k: int = 5, batch: int = 64) -> tuple[list[list[str]], list[bool]]:
    names, exact = [], []
    for s in range(0, len(texts), batch):
        r = srv.client.post("/v1/models/m/predict", json={
            "inputs": [{"text": t} for t in texts[s : s + batch]], "top_k": k, "normalization": "none"})
        r.raise_for_status()
        for p in r.json()["predictions"]:
            names.append([lab["name"] for lab in p["labels"]])
            exact.append(bool(p["exact"]))
    return names, exact


def p_at(names: list[list[str]], truth: list[set[str]], k: int) -> float:
    rows = [(n, t) for n, t in zip(names, truth, strict=True) if t]
    return float(np.mean([len(set(n[:k]) & t) / k for n, t in rows])) if rows else float("nan")


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="ovex-add-labels-", dir=args.workdir))
    k, m = args.labels, args.added
    try:
        data = make_data(work, k, m, args.features, args.rows, args.test_rows, args.seed)
        print("data", data, flush=True)
        models = work / "models"
        trained = train_model(work, models / "m" / "1", k, args.dim, args.epochs, args.seed)
        print("trained", trained, flush=True)
        srv = Served(models, work, args.threads)
        try:
            ready_s = srv.wait_ready()
            print("served", ready_s, flush=True)
            texts, truth = read_test(work / "test.jsonl")
            old_truth = [{n for n in t if int(n) < k} for t in truth]
            new_truth = [{n for n in t if int(n) >= k} for t in truth]
            before, exact_before = predict(srv, texts)
            held = [json.loads(line) for line in (work / "texts.jsonl").read_text().splitlines()[k : k + m]]
            t0 = time.perf_counter()
            r = srv.client.post("/v1/models/m/labels", json={"labels": held, "activate": True})
            t_post = time.perf_counter() - t0
            r.raise_for_status()
            added = r.json()
            while True:  # the new version answering: a prediction that can name an added label
                got = srv.client.post("/v1/models/m/predict", json={"inputs": [{"text": held[0]["text"]}],
                                                                     "top_k": 5})
                got.raise_for_status()
                if srv.client.get("/v1/models/m").json()["active_version"] == added["version"]:
                    break
                time.sleep(0.05)
            t_answer = time.perf_counter() - t0
            print("added", added, t_post, t_answer, flush=True)
            after, exact_after = predict(srv, texts)
        finally:
            srv.stop()
        v2 = models / "m" / added["version"]
        rebuild_s = None
        if args.compare_rebuild:
            from service.serving.registry import build_serving_index
            from service.settings import Settings

            scratch = work / "scratch"
            shutil.copytree(v2, scratch, ignore=shutil.ignore_patterns("index"))
            t1 = time.perf_counter()
            build_serving_index(scratch, Settings(models_dir=models, retrieval="int8", threads=args.threads))
            rebuild_s = round(time.perf_counter() - t1, 2)
        old_after = [[n for n in row if int(n) < k] for row in after]
        carry = [i for i, t in enumerate(new_truth) if t]
        hit5 = float(np.mean([bool(set(after[i][:5]) & new_truth[i]) for i in carry])) if carry else None
        return {
            "labels_before": k,
            "labels_added": m,
            "features": args.features,
            "dim": args.dim,
            "data": data,
            "training": trained,
            "server_ready_s": round(ready_s, 1),
            "post_s": round(t_post, 2),
            "post_to_answer_s": round(t_answer, 2),
            "response": added,
            "rebuild_from_scratch_s": rebuild_s,
            "test_rows": len(texts),
            "certified_share_before": round(float(np.mean(exact_before)), 4),
            "certified_share_after": round(float(np.mean(exact_after)), 4),
            "old_labels": {
                "p_at_1_before": round(p_at(before, old_truth, 1), 4),
                "p_at_1_after": round(p_at(after, old_truth, 1), 4),
                "p_at_5_before": round(p_at(before, old_truth, 5), 4),
                "p_at_5_after": round(p_at(after, old_truth, 5), 4),
                "p_at_5_after_old_labels_only": round(p_at(old_after, old_truth, 5), 4),
                "top5_unchanged_share": round(float(np.mean(
                    [b == a for b, a in zip(before, old_after, strict=True)])), 4),
            },
            "rows_with_an_added_label": len(carry),
            "added_label_hit_at_5": None if hit5 is None else round(hit5, 4),
        }
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def write(result: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    o = result["old_labels"]
    lines = [
        "# Adding labels by their texts to a served model",
        "",
        markdown_line(result) + f" ({result['note']})",
        "",
        f"A model of {result['labels_before']:,} labels (d = {result['dim']}, {result['features']:,} words, "
        f"trained with label texts on {result['data']['train_rows']:,} planted rows in "
        f"{result['training']['seconds']} s) served through the int8 scan; "
        f"{result['labels_added']:,} labels held out of training added by their texts "
        "(POST /v1/models/{name}/labels, activate: true).",
        "",
        "| figure | value |",
        "|---|---|",
        f"| seconds from the POST to the new version answering | {result['post_to_answer_s']} |",
        f"| seconds of the POST (written, index {result['response']['index']}, activated) | "
        f"{result['post_s']} |",
        f"| seconds to build the new version's int8 index from scratch instead | "
        f"{result['rebuild_from_scratch_s']} |",
        f"| certified answers, before / after | {result['certified_share_before']} / "
        f"{result['certified_share_after']} |",
        f"| old labels P@1, before / after | {o['p_at_1_before']} / {o['p_at_1_after']} |",
        f"| old labels P@5, before / after | {o['p_at_5_before']} / {o['p_at_5_after']} |",
        f"| old labels P@5 after, added labels left out of the answers | "
        f"{o['p_at_5_after_old_labels_only']} |",
        f"| test rows whose top 5 is unchanged (no added label entered it) | {o['top5_unchanged_share']} |",
        f"| test rows carrying an added label: hit@5 on added labels | {result['added_label_hit_at_5']} "
        f"({result['rows_with_an_added_label']} rows) |",
        "",
    ]
    if result.get("note"):
        lines += [result["note"], ""]
    out.with_suffix(".md").write_text("\n".join(lines))


def rewrite(out: Path) -> None:
    """Write the .md again from the .json (the table's wording changed, not its figures)."""
    write(json.loads(out.with_suffix(".json").read_text()), out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--labels", type=int, default=100_000)
    ap.add_argument("--added", type=int, default=1000)
    ap.add_argument("--features", type=int, default=100_000)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--test-rows", type=int, default=2000)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compare-rebuild", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--note", default="shared machine (other jobs running)")
    ap.add_argument("--out", type=Path, default=RESULTS / "add_labels")
    args = ap.parse_args()
    st = stamp()
    result = stamped(st, {"note": args.note, "python": platform.python_version(), **run(args)})
    write(result, args.out)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
