"""The GPU path measured: training rate at 10^5, 10^6 and 10^7 planted labels (d = 256, the other
defaults), peak device memory per label against the weights-plus-optimizer arithmetic, and WordNet
trained with the defaults through `ovex train`; the same rows on the CPU give the comparison.

On a device machine (its torch with CUDA; the project's other wheels carried, see /work/.library/device):
    python bench/gpu.py --device cuda --data DIR_WITH_WORDNET --out $OUT/gpu.json
Here, the CPU rows of the same settings (`make bench` runs this one; 10^7 labels does not fit here):
    python bench/gpu.py --device cpu --labels 100000 1000000 --extra-batch 8192 --extra-precision fp32 \
        --wordnet-runs defaults= --no-profile --data ../shared/data --out bench/results/gpu_cpu.json
Then `python bench/gpu.py --render bench/results/gpu.json bench/results/gpu_cpu.json` writes gpu.md.

Rates are the second epoch's examples/s (the first pays for CUDA's start and the allocator's warm-up);
a hand-picked batch size or bfloat16 is an extra row, never the headline.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from real import machine  # noqa: E402
from stamp import source  # noqa: E402

import trainer.train as train_module  # noqa: E402
from trainer.capacity import run_bytes  # noqa: E402
from trainer.hooks import QuietHooks  # noqa: E402
from trainer.params import TrainParams  # noqa: E402
from trainer.step import low_precision  # noqa: E402
from trainer.synth import synth_dataset  # noqa: E402
from trainer.train import train  # noqa: E402

FEATURES = 100_000
DIM = 256
BIG_BATCH_RUN = "b8192 e56=--batch-size 8192 --epochs 56 --eval-every 0"  # the GPU's fast extra row


def _machine(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {**machine(), "python": platform.python_version(), "torch": torch.__version__}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update({"gpu": props.name, "gpu_memory_bytes": props.total_memory,
                     "multiprocessors": props.multi_processor_count})
    return info


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def speed_row(labels: int, rows: int, device: torch.device, batch: int | None, precision: str,
              data: dict[int, Any], inline: bool = False) -> dict[str, Any]:
    """Two epochs on planted data through `train` (no test split, no artifact): the rate and memory.
    `inline`: the steps' host part made in turn with the device part, not ahead on a thread."""
    if labels not in data:
        data.clear()  # one planted set in memory at a time
        data[labels] = synth_dataset(labels, FEATURES, rows, seed=1)
    ds = data[labels]
    update: dict[str, Any] = {"dim": DIM, "epochs": 2, "seed": 0, "device": device.type,
                              "precision": precision}
    if batch is not None:
        update["batch_size"] = batch
    params = TrainParams(**update)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    ahead = train_module.steps_made_ahead
    if inline:
        train_module.steps_made_ahead = lambda device, group: False
    try:
        result = train(params, ds, None, out_dir=None, hooks=QuietHooks())
    finally:
        train_module.steps_made_ahead = ahead
    wall = time.perf_counter() - t0
    estimate = run_bytes(labels, FEATURES, params)
    row: dict[str, Any] = {
        "labels": labels, "rows": ds.n_rows, "dim": DIM, "batch_size": params.batch_for(ds.n_rows),
        "precision": "bf16" if low_precision(precision, device) else "fp32", "requested": precision,
        "device": device.type, "inline": inline,
        "default": batch is None and precision == "auto" and not inline,
        "examples_per_s": result.history[-1]["examples_per_s"],
        "examples_per_s_epoch1": result.history[0]["examples_per_s"],
        "steps": result.steps, "wall_s": wall, "final_loss": result.final_loss,
        "estimate_tables_bytes": estimate.tables,
    }
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        row.update({"peak_device_bytes": peak, "peak_bytes_per_label": peak / labels,
                    "estimate_bytes_per_label": estimate.tables / labels})
    print(json.dumps({k: row[k] for k in ("labels", "batch_size", "precision", "inline", "examples_per_s",
                                          "wall_s")}),
          flush=True)
    return row


def _timed(device: torch.device, fn: Any) -> float:
    """Seconds `fn()` takes, the device's queued work included."""
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def step_anatomy(device: torch.device, data: dict[int, Any], labels: int, steps: int = 40) -> dict[str, Any]:
    """Where a default step's time goes at `labels` labels: the whole step, its host part (`inputs`: the
    index work and the copies, with torch on all threads and on one) and its device part (`learn` on
    inputs made ahead), the cost of one kernel launch, the kernels a step launches, what makes the host
    wait, and the profiler's top operations."""
    from torch.profiler import ProfilerActivity, profile

    from trainer.losses import get_loss
    from trainer.model import ModelShape, XCModel
    from trainer.negatives import NegativeSampler
    from trainer.step import EpochData, Stepper, _as_csr32

    ds = data[labels]
    params = TrainParams(dim=DIM, device="cuda" if device.type == "cuda" else "cpu")
    model = XCModel(ModelShape(FEATURES, labels, DIM, dropout=params.dropout)).to(device)
    stepper = Stepper(model, get_loss(params.loss), params, NegativeSampler(labels, seed=1))
    ep = EpochData(_as_csr32(ds.X), _as_csr32(ds.Y), torch.randperm(ds.n_rows).numpy())
    bs, lr = params.batch_for(ds.n_rows), params.lr
    at = itertools.cycle(range(ds.n_rows // bs))

    def run_steps(n: int) -> None:
        for _ in range(n):
            s = next(at)
            stepper.step(ep, s * bs, (s + 1) * bs, lr)

    run_steps(20)
    out: dict[str, Any] = {"labels": labels, "batch_size": bs, "steps": steps,
                           "host_threads": torch.get_num_threads()}
    out["step_ms"] = _timed(device, lambda: run_steps(steps)) / steps * 1e3
    made: list[Any] = []
    threads = torch.get_num_threads()
    for n_threads, key in ((threads, "inputs_ms_all_threads"), (1, "inputs_ms_one_thread")):
        torch.set_num_threads(n_threads)
        try:
            def inputs() -> None:
                made.clear()
                for _ in range(steps):
                    s = next(at)
                    made.append(stepper.inputs(ep, s * bs, (s + 1) * bs))
            out[key] = _timed(device, inputs) / steps * 1e3
        finally:
            torch.set_num_threads(threads)
    out["learn_ms"] = _timed(device, lambda: [stepper.learn(m, lr) for m in made]) / steps * 1e3
    if device.type == "cuda":
        x = torch.zeros(1, device=device)
        out["launch_us"] = _timed(device, lambda: [x.add_(1.0) for _ in range(2000)]) / 2000 * 1e6
        import warnings

        with warnings.catch_warnings(record=True) as caught:  # operations that make the host wait
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                run_steps(5)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        out["host_waits"] = sorted({str(w.message)[:300] for w in caught
                                    if "prototype" not in str(w.message)})
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        run_steps(steps)
        _sync(device)
    if device.type == "cuda":
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        out["device_ops_per_step"] = len(kernels) / steps
        out["device_busy_ms_per_step"] = sum(e.device_time_total for e in kernels) / steps / 1e3
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0.0), reverse=True)[:12]
    out["top_ops"] = [{"op": e.key[:80], "calls": e.count, "self_cpu_us": e.self_cpu_time_total,
                       "self_device_us": getattr(e, "self_device_time_total", 0.0)} for e in events]
    print(json.dumps({k: v for k, v in out.items() if k not in ("top_ops", "host_waits")}), flush=True)
    return out


def wordnet_row(data_dir: Path, device: torch.device, out_dir: Path, extra: list[str], label: str
                ) -> dict[str, Any]:
    """`ovex train` on the WordNet texts with the defaults (seed 0), its test split evaluated."""
    from trainer.cli import add_commands

    ap = argparse.ArgumentParser()
    add_commands(ap.add_subparsers())
    args = ap.parse_args(["train", "--train", str(data_dir / "wordnet_train.jsonl"),
                          "--test", str(data_dir / "wordnet_test.jsonl"), "--out", str(out_dir),
                          "--device", device.type, "--seed", "0", "--quiet", *extra])
    printed = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(printed):
        args.func(args)
    wall = time.perf_counter() - t0
    metrics = json.loads(printed.getvalue().strip().splitlines()[-1])
    row = {"set": "wordnet", "device": device.type, "label": label, "args": extra, "wall_s": wall,
           **{k: metrics[k] for k in ("p@1", "p@3", "p@5") if k in metrics}, "extra": bool(extra)}
    print(json.dumps(row), flush=True)
    return row


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    started = time.perf_counter()
    out: dict[str, Any] = {"command": " ".join(sys.argv), **source(),
                           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "torch": torch.__version__,
                           "loadavg_before": os.getloadavg(),
                           "machine": _machine(device), "speed": [], "wordnet": [], "errors": []}

    def attempt(what: str, fn: Any) -> Any:
        try:
            return fn()
        except Exception as exc:  # a failed measurement is a row that says so; the others still run
            out["errors"].append({"what": what, "error": f"{type(exc).__name__}: {exc}"[:2000]})
            print(f"FAILED {what}: {exc}", flush=True)
            return None

    def save() -> None:
        out["wall_s"] = time.perf_counter() - started
        out["loadavg_after"] = os.getloadavg()
        Path(args.out).write_text(json.dumps(out, indent=1))

    data: dict[int, Any] = {}
    if args.data:
        for label, _, flags in (run.partition("=") for run in args.wordnet_runs):
            extra = shlex.split(flags)
            row = attempt(f"wordnet {label}", lambda e=extra, lb=label: wordnet_row(
                Path(args.data), device, Path(args.scratch) / f"wordnet-{lb}", e, lb))
            if row:
                out["wordnet"].append(row)
            save()
    for labels in args.labels:
        settings = [(None, "auto", False), *[(b, "auto", False) for b in args.extra_batch],
                    *[(None, p, False) for p in args.extra_precision],
                    *[(b, "auto", True) for b in [None, *args.extra_batch] if labels in args.inline_at]]
        for batch, precision, inline in settings:
            row = attempt(f"speed {labels} {batch} {precision}{' inline' if inline else ''}",
                          lambda k=labels, b=batch, p=precision, i=inline:
                          speed_row(k, args.rows, device, b, p, data, i))
            if row:
                out["speed"].append(row)
            save()
        if labels == min(args.labels, key=lambda k: abs(k - 1_000_000)) and args.profile:
            out["anatomy"] = attempt("anatomy", lambda k=labels: step_anatomy(device, data, k))
            save()
    save()
    return out


# ------------------------------------------------------------------------------------ report


def _fmt(n: float | None, digits: int = 0) -> str:
    return "–" if n is None else f"{n:,.{digits}f}"


def _gib(n: float | None) -> str:
    return "–" if n is None else f"{n / 2**30:.1f}"


def _where(run: dict[str, Any]) -> str:
    m = run["machine"]
    return str(m.get("gpu") or f"{m['cores']}-core CPU")


def render(paths: list[Path]) -> str:
    runs = [json.loads(p.read_text()) for p in paths]
    lines = ["# The GPU path: training rate, memory, WordNet", ""]
    for r, p in zip(runs, paths, strict=True):
        m = r["machine"]
        lines.append(f"- `{p.name}`: {_where(r)}, torch {m['torch']}, commit `{(r.get('commit') or '?')[:7]}`"
                     f"{' (dirty tree)' if r.get('dirty') else ''}, {r['date']}; `{r['command']}`")
    cpu = {(s["labels"], s["batch_size"], s["requested"]): s["examples_per_s"]
           for r in runs if "gpu" not in r["machine"] for s in r["speed"] if not s.get("inline")}
    lines += ["", "## Training rate (planted data, 100,000 features, d = 256; second epoch's examples/s)", "",
              "Rows marked *extra* change one setting from the defaults (batch 256, `--precision auto`: "
              "float32 on a GPU, bfloat16 on a CPU that multiplies it natively; the column says which ran).",
              "",
              "| device | labels | batch | precision | examples/s | × the CPU's | peak device GiB "
              "| peak device bytes / label | estimate / label (weights + Adam, with the input table's "
              "share) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        dev = _where(r)
        for s in r["speed"]:
            tag = "" if s["default"] else " (extra, steps inline)" if s.get("inline") else " (extra)"
            base = cpu.get((s["labels"], s["batch_size"], s["requested"])) if "gpu" in r["machine"] else None
            ratio = f"{s['examples_per_s'] / base:.1f}" if base else "–"
            lines.append(f"| {dev}{tag} | {s['labels']:,} | {s['batch_size']} | {s['precision']} | "
                         f"{_fmt(s['examples_per_s'])} | {ratio} | {_gib(s.get('peak_device_bytes'))} | "
                         f"{_fmt(s.get('peak_bytes_per_label'))} | "
                         f"{_fmt(s['estimate_tables_bytes'] / s['labels'])} |")
    wordnet = [w for r in runs for w in r["wordnet"]]
    if wordnet:
        lines += ["", "## WordNet (`ovex train`, seed 0, test split)", "",
                  "Rows marked *extra* change the batch (b), the learning rates (lr: `--lr`, `--dense-lr` a "
                  "fifth of it) and the epochs (e) from the defaults, and evaluate once, at the end.", "",
                  "| device | run | P@1 | P@3 | P@5 | wall s (featurize, train, evaluate) |",
                  "|---|---|---|---|---|---|"]
        for r in runs:
            dev = _where(r)
            for w in r["wordnet"]:
                tag = " (extra)" if w.get("extra") else ""
                run_label = w["label"] + (f" (at `{w['commit'][:7]}`)" if w.get("commit") else "")
                lines.append(f"| {dev}{tag} | {run_label} | {w['p@1']:.4f} | {w['p@3']:.4f} | "
                             f"{w['p@5']:.4f} | {w['wall_s']:.1f} |")
    for r in runs:
        a = r.get("anatomy")
        if a:
            dev = _where(r)
            lines += ["", f"## Anatomy of a default step at {a['labels']:,} labels on {dev} "
                      f"(means over {a['steps']} steps)",
                      "", f"- whole step: {a['step_ms']:.2f} ms; host part (index work and copies): "
                      f"{a['inputs_ms_all_threads']:.2f} ms with torch on {a['host_threads']} threads, "
                      f"{a['inputs_ms_one_thread']:.2f} ms on one; device part on inputs made ahead: "
                      f"{a['learn_ms']:.2f} ms"]
            if "launch_us" in a:
                lines.append(f"- one kernel launch: {a['launch_us']:.1f} µs; kernels a step launches: "
                             f"{a.get('device_ops_per_step', 0):.0f}, busy on the device "
                             f"{a.get('device_busy_ms_per_step', 0):.2f} ms a step; operations that made the "
                             f"host wait: {', '.join(a['host_waits']) or 'none'}")
            lines += ["", "| op | calls | self CPU µs | self device µs |", "|---|---|---|---|"]
            lines += [f"| `{o['op']}` | {o['calls']} | {o['self_cpu_us']:,.0f} | {o['self_device_us']:,.0f} |"
                      for o in a["top_ops"]]
        failed: dict[str, list[str]] = {}  # one line per distinct error, naming every row it stopped
        for e in r["errors"]:
            failed.setdefault(e["error"], []).append(e["what"])
        where = _where(r)
        for error, what in failed.items():
            lines.append(f"\n- not measured on the {where} ({'; '.join(what)}): {error}")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--labels", type=int, nargs="*", default=[100_000, 1_000_000, 10_000_000])
    ap.add_argument("--rows", type=int, default=100_000, help="planted training rows per label count")
    ap.add_argument("--extra-batch", type=int, nargs="*", default=[2048],
                    help="extra rows at these batch sizes")
    ap.add_argument("--extra-precision", nargs="*", default=["bf16"],
                    help="extra rows in these precisions (the default row takes `auto`)")
    ap.add_argument("--inline-at", type=int, nargs="*", default=[],
                    help="at these label counts, extra rows with each step's host part made inline")
    ap.add_argument("--data", help="a folder with wordnet_train.jsonl and wordnet_test.jsonl")
    ap.add_argument("--wordnet-runs", nargs="*", default=["defaults=", BIG_BATCH_RUN],
                    help="WordNet runs, each LABEL=FLAGS (flags given to `ovex train` beside the defaults)")
    ap.add_argument("--scratch", default="/tmp/ovex-gpu-bench")
    ap.add_argument("--no-profile", dest="profile", action="store_false",
                    help="no step anatomy (made at the label count nearest 10^6)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu.json"))
    ap.add_argument("--render", nargs="+", type=Path, help="write gpu.md from these results files")
    args = ap.parse_args()
    if args.render:
        md = args.render[0].with_name("gpu.md")
        md.write_text(render(args.render))
        print(md)
        return
    run(args)


if __name__ == "__main__":
    main()
