"""Where does the training time go: a profile of one `ovex train` run on WordNet, default parameters.

The run is what `ovex train --train wordnet_train.jsonl --out DIR` does (`trainer.data.read_dataset`, then
`trainer.train.train` with no test set, so no evaluation), in this process, with timers wrapped around the
functions the run calls: nothing in trainer/ changes, and the timed code is the code users run. Reports:

1. phases of the whole run, wall and CPU seconds: reading the data, checks before fitting, fitting the
   featurizer and featurizing the training rows with it (`fit_featurizer`, one tokenization), setup (CSR
   conversion, propensities, model, sampler, optimizer), the epochs (split into the steps, the per-epoch
   shuffle `EpochData` and the loop's own bookkeeping) and saving the artifact (`_save_model`);
2. per training step: ms per step (first step apart: it loads or compiles the numba kernels), and over a
   window of steps (`--window START:END`, global 0-based step indices) a `torch.profiler` table of the
   ops by self CPU time, the numba row-wise optimizer kernels beside them (they are not torch ops, so the
   profiler sees them only through the `record_function` labels this script puts around them), the
   Python between ops (the self time of an `ovex::step` label around each step) and the rate of the score
   GEMMs: FLOPs of the three products a step makes (forward h·Wᵀ, backward go·W and hᵀ·go, each
   2·B·C·(d+1) with C the scored columns) over the `aten::mm` self time;
3. a microbenchmark of those three GEMM shapes alone in float32 and bfloat16 (`torch.mm` on random
   tensors after warm-up, on 1 thread and on 2), to show what a lower-precision product and a second
   thread buy on this CPU.

The profiled window runs slower than the others (the profiler records every op); the step statistics
therefore report the unprofiled steps and the window apart. Wall times depend on what else runs on the
machine: the load average before and after is recorded, and CPU seconds beside wall seconds.

    .venv/bin/python bench/profile_train.py [--data ../shared/data/wordnet_train.jsonl] [--seed 0]
        [--set KEY=VALUE ...] [--variant KEY=VALUE[,KEY=VALUE...] ...] [--window 300:500]
        [--out bench/results/profile_train]

`--set` overrides a `TrainParams` field for every run (e.g. `--set epochs=1` for a short check);
`--variant` adds one more profiled run with those overrides (on top of `--set`), reported as its own row.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch
from torch.profiler import ProfilerActivity, record_function

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from real import _git, _version, machine  # noqa: E402
from stamp import dirty  # noqa: E402

import trainer.featurize  # noqa: E402
import trainer.optim  # noqa: E402
import trainer.row_kernels  # noqa: E402
import trainer.step  # noqa: E402
import trainer.train  # noqa: E402
from trainer.data import Dataset, read_dataset  # noqa: E402
from trainer.hooks import QuietHooks  # noqa: E402
from trainer.params import TrainParams  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "wordnet_train.jsonl"
RESULTS = ROOT / "bench" / "results"
STEP_LABEL = "ovex::step"  # record_function around each profiled step: its self time is Python between ops
KERNEL_PREFIX = "numba::"  # record_function around each fused optimizer kernel
GEMM_OPS = ("aten::mm",)  # the score products (with hidden layers, their GEMMs run as aten::addmm)
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")


# ------------------------------------------------------------------------------------ recording


@dataclass
class Window:
    """Global step indices [start, end) profiled with torch.profiler."""

    start: int
    end: int

    @property
    def steps(self) -> int:
        return self.end - self.start


@dataclass
class Recorder:
    """What the wrappers around the run's functions record: timestamps (perf_counter, process_time) of the
    phase boundaries and per-step durations, columns and optimizer times.

    Why timestamps rather than one timer per phase: the phases are then the gaps between known calls, so
    the run's code between them (checks, CSR conversion, model init) is counted too, not lost.
    """

    window: Window
    marks: dict[str, tuple[float, float]] = field(default_factory=dict)  # first occurrence of each
    epoch_data_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    step_cpu_s: list[float] = field(default_factory=list)
    step_rows: list[int] = field(default_factory=list)
    step_epoch: list[int] = field(default_factory=list)
    step_cols: list[dict[str, int]] = field(default_factory=list)  # scored, label_ids, n_sampled
    step_opt_s: list[dict[str, float]] = field(default_factory=list)  # RowAdam/RowAdagrad.step per table
    step_kernel_s: list[dict[str, float]] = field(default_factory=list)  # the numba kernel alone
    threads_in_step: int | None = None
    profiler: Any = None
    profiler_overhead_s: float = 0.0  # profiler start/stop, outside the step timers
    averages: Any = None  # key_averages() of the window
    window_steps: int = 0
    _cols: dict[str, int] = field(default_factory=dict)
    _opt: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    _kernel: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    _opt_name: str = ""

    def mark(self, name: str) -> None:
        if name not in self.marks:
            self.marks[name] = (time.perf_counter(), time.process_time())

    @property
    def profiling(self) -> bool:
        return self.profiler is not None

    def start_profiler(self) -> None:
        t0 = time.perf_counter()
        self.profiler = torch.profiler.profile(activities=[ProfilerActivity.CPU])
        self.profiler.start()
        self.profiler_overhead_s += time.perf_counter() - t0

    def stop_profiler(self) -> None:
        if self.profiler is None:
            return
        t0 = time.perf_counter()
        self.profiler.stop()
        self.averages = self.profiler.key_averages()
        self.profiler = None
        self.profiler_overhead_s += time.perf_counter() - t0


@contextlib.contextmanager
def instrumented(rec: Recorder) -> Iterator[None]:
    """Wrap the functions `trainer.train._fit` calls with timers (patched where `_fit` looks them up,
    restored on exit), so the run is the unmodified training code."""
    tt = trainer.train
    fit0, save0 = tt.fit_featurizer, tt._save_model
    epoch_init0, step0, cand0 = tt.EpochData.__init__, tt.Stepper.step, trainer.step.shard_candidates
    adam0, adagrad0 = trainer.optim.RowAdam.step, trainer.optim.RowAdagrad.step
    adam_rows0, adagrad_rows0 = trainer.row_kernels.adam_rows, trainer.row_kernels.adagrad_rows

    def marked(name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        """`orig` with the phase marks `<name>_start` / `<name>_end` around its first call."""
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            rec.mark(f"{name}_start")
            out = orig(*args, **kwargs)
            rec.mark(f"{name}_end")
            return out
        return wrapped

    def epoch_init(self: Any, *args: Any, **kwargs: Any) -> None:
        rec.mark("epochs_start")
        t0 = time.perf_counter()
        epoch_init0(self, *args, **kwargs)
        rec.epoch_data_s.append(time.perf_counter() - t0)

    def step(self: Any, ep: Any, i: int, j: int, lr: float) -> Any:
        k = len(rec.step_s)
        if k == rec.window.start:
            rec.start_profiler()
        rec._cols, rec._opt, rec._kernel = {}, defaultdict(float), defaultdict(float)
        label = record_function(STEP_LABEL) if rec.profiling else contextlib.nullcontext()
        t0, c0 = time.perf_counter(), time.process_time()
        with label:
            out = step0(self, ep, i, j, lr)
        rec.step_s.append(time.perf_counter() - t0)
        rec.step_cpu_s.append(time.process_time() - c0)
        if rec.profiling:
            rec.window_steps += 1
        rec.step_rows.append(j - i)
        rec.step_epoch.append(len(rec.epoch_data_s) - 1)
        cols = dict(rec._cols)
        if cols:  # the columns the score GEMM multiplies: only the sampled ones when the loss says so
            cols["scored"] = cols["n_sampled"] if self.spec.sampled_scores_only and not self.exhaustive \
                else cols["label_ids"]
        rec.step_cols.append(cols)
        rec.step_opt_s.append(dict(rec._opt))
        rec.step_kernel_s.append(dict(rec._kernel))
        if len(rec.step_s) == rec.window.end:
            rec.stop_profiler()
        return out

    def shard_candidates(*args: Any, **kwargs: Any) -> Any:
        sc = cand0(*args, **kwargs)
        rec._cols = {"label_ids": int(sc.cand.label_ids.numel()), "n_sampled": int(sc.cand.n_sampled)}
        rec.threads_in_step = torch.get_num_threads()  # torch's threads while a step runs
        return sc

    def optimizer_step(orig: Callable[..., None]) -> Callable[..., None]:
        def wrapped(self: Any, name: str, *args: Any, **kwargs: Any) -> None:
            rec._opt_name = name
            t0 = time.perf_counter()
            try:
                orig(self, name, *args, **kwargs)
            finally:
                rec._opt[name] += time.perf_counter() - t0
                rec._opt_name = ""
        return wrapped

    def kernel(orig: Callable[..., None], kind: str) -> Callable[..., None]:
        def wrapped(*args: Any, **kwargs: Any) -> None:
            name = rec._opt_name or "?"
            label = record_function(f"{KERNEL_PREFIX}{kind}[{name}]") if rec.profiling \
                else contextlib.nullcontext()
            t0 = time.perf_counter()
            with label:
                orig(*args, **kwargs)
            rec._kernel[name] += time.perf_counter() - t0
        return wrapped

    patches = [
        mock.patch.object(tt, "fit_featurizer", marked("fit", fit0)),
        mock.patch.object(tt, "_save_model", marked("save", save0)),
        mock.patch.object(tt.EpochData, "__init__", epoch_init),
        mock.patch.object(tt.Stepper, "step", step),
        mock.patch.object(trainer.step, "shard_candidates", shard_candidates),
        mock.patch.object(trainer.optim.RowAdam, "step", optimizer_step(adam0)),
        mock.patch.object(trainer.optim.RowAdagrad, "step", optimizer_step(adagrad0)),
        mock.patch.object(trainer.row_kernels, "adam_rows", kernel(adam_rows0, "adam_rows")),
        mock.patch.object(trainer.row_kernels, "adagrad_rows", kernel(adagrad_rows0, "adagrad_rows")),
    ]
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        try:
            yield
        finally:
            rec.stop_profiler()  # a window past the last step ends with the run


# ------------------------------------------------------------------------------------ one run


def expected_steps(params: TrainParams, n_rows: int) -> int | None:
    """Stepper.step calls of a plain run (None where the count depends on the run: a held-out split)."""
    if params.valid_fraction > 0:
        return None
    return math.ceil(n_rows / params.batch_size) * (params.stop_epoch or params.epochs)


def gemm_flops(batch: int, cols: int, dim: int) -> float:
    """FLOPs of a step's three score products: forward h·Wᵀ and backward go·W, hᵀ·go, each B×C×(d+1)×2."""
    return 2.0 * 3.0 * batch * cols * (dim + 1)


def _span(rec: Recorder, a: str, b: str) -> tuple[float, float]:
    """(wall, cpu) seconds between two marks (0 when either is missing)."""
    if a not in rec.marks or b not in rec.marks:
        return 0.0, 0.0
    return rec.marks[b][0] - rec.marks[a][0], rec.marks[b][1] - rec.marks[a][1]


def phases(rec: Recorder) -> dict[str, dict[str, float]]:
    """The run cut at its marks; the epochs split into steps, shuffles and the rest of the loop."""
    names = [
        ("checks", "train_start", "fit_start"),  # out dir, capacity check
        ("fit_featurizer", "fit_start", "fit_end"),  # and the training rows through it
        ("setup", "fit_end", "epochs_start"),  # CSR, propensities, model init, sampler, optimizer
        ("epochs", "epochs_start", "save_start"),
        ("save", "save_start", "save_end"),
        ("after_save", "save_end", "train_end"),
    ]
    out = {name: dict(zip(("wall_s", "cpu_s"), _span(rec, a, b), strict=True)) for name, a, b in names}
    steps = sum(rec.step_s)
    shuffles = sum(rec.epoch_data_s)
    epochs = out["epochs"]["wall_s"]
    out["epochs"].update({
        "steps_s": steps,
        "epoch_data_s": shuffles,
        "profiler_start_stop_s": rec.profiler_overhead_s,
        "loop_other_s": epochs - steps - shuffles - rec.profiler_overhead_s,
    })
    return out


def step_stats(rec: Recorder, dim: int) -> dict[str, Any]:
    """ms per step: the first step, the unprofiled steps after it, the profiled window; per epoch."""
    ms = np.asarray(rec.step_s) * 1e3
    cpu_ms = np.asarray(rec.step_cpu_s) * 1e3
    w = rec.window
    idx = np.arange(ms.size)
    plain = (idx >= 1) & ((idx < w.start) | (idx >= w.end))
    in_win = (idx >= w.start) & (idx < w.end)
    cols = [c.get("scored", 0) for c in rec.step_cols]
    per_epoch = []
    for e in sorted(set(rec.step_epoch)):
        sel = np.asarray(rec.step_epoch) == e
        per_epoch.append({"epoch": e + 1, "steps": int(sel.sum()), "steps_s": float(ms[sel].sum() / 1e3),
                          "mean_ms": float(ms[sel].mean())})

    def summary(sel: np.ndarray) -> dict[str, float]:
        if not sel.any():
            return {"steps": 0}
        v = ms[sel]
        return {"steps": int(sel.sum()), "mean_ms": float(v.mean()), "median_ms": float(np.median(v)),
                "p10_ms": float(np.percentile(v, 10)), "p90_ms": float(np.percentile(v, 90)),
                "cpu_mean_ms": float(cpu_ms[sel].mean())}

    return {
        "steps": int(ms.size),
        "first_step_ms": float(ms[0]) if ms.size else None,
        "all": summary(idx >= 0),
        "unprofiled": summary(plain),  # the figure to quote for ms per step
        "window": summary(in_win),
        "per_epoch": per_epoch,
        "mean_rows": float(np.mean(rec.step_rows)) if rec.step_rows else 0.0,
        "mean_scored_columns": float(np.mean(cols)) if cols else 0.0,
        "mean_label_ids": float(np.mean([c.get("label_ids", 0) for c in rec.step_cols])) if cols else 0.0,
        "torch_threads_in_step": rec.threads_in_step,
        "gemm_gflop_per_step": float(np.mean([gemm_flops(b, c, dim) for b, c in zip(rec.step_rows, cols,
                                                                                      strict=True)]) / 1e9)
        if cols else 0.0,
    }


def optimizer_stats(rec: Recorder, sel: range) -> dict[str, Any]:
    """Per table: ms per step in RowAdam/RowAdagrad.step and in its numba kernel, over steps `sel`."""
    n = max(len(sel), 1)
    opt: dict[str, float] = defaultdict(float)
    ker: dict[str, float] = defaultdict(float)
    for k in sel:
        for name, s in rec.step_opt_s[k].items():
            opt[name] += s
        for name, s in rec.step_kernel_s[k].items():
            ker[name] += s
    tables = {name: {"optimizer_ms_per_step": opt[name] * 1e3 / n,
                     "kernel_ms_per_step": ker.get(name, 0.0) * 1e3 / n} for name in sorted(opt)}
    return {"steps": len(sel), "tables": tables,
            "optimizer_ms_per_step": sum(opt.values()) * 1e3 / n,
            "kernel_ms_per_step": sum(ker.values()) * 1e3 / n}


def profile_table(rec: Recorder, dim: int, top: int) -> dict[str, Any]:
    """The window's ops by self CPU time, with the numba kernels and the Python between ops among them,
    and the GEMM rate of the score products."""
    w = rec.window
    n = rec.window_steps
    if rec.averages is None or n == 0:
        return {"steps": 0, "note": "the window was not reached"}
    window_s = sum(rec.step_s[w.start : w.start + n])
    rows = []
    for ev in rec.averages:
        self_ms = ev.self_cpu_time_total / 1e3
        kind = "python" if ev.key == STEP_LABEL else "numba" if ev.key.startswith(KERNEL_PREFIX) else "torch"
        rows.append({"name": ev.key, "kind": kind, "calls_per_step": ev.count / n, "self_ms": self_ms,
                     "ms_per_step": self_ms / n, "share": self_ms / 1e3 / window_s if window_s else 0.0})
    rows.sort(key=lambda r: -r["self_ms"])
    by_kind = {k: sum(r["self_ms"] for r in rows if r["kind"] == k) / n for k in ("torch", "numba", "python")}
    sel = range(w.start, w.start + n)
    flops = sum(gemm_flops(rec.step_rows[k], rec.step_cols[k].get("scored", 0), dim) for k in sel)
    mm = [r for r in rows if r["name"] in GEMM_OPS]
    mm_ms = sum(r["self_ms"] for r in mm)
    return {
        "steps": n,
        "window": [w.start, w.start + n],
        "wall_ms_per_step": window_s * 1e3 / n,  # with the profiler on: slower than the unprofiled steps
        "self_ms_per_step_by_kind": by_kind,
        "unrecorded_ms_per_step": window_s * 1e3 / n - sum(by_kind.values()),
        "top": rows[:top],
        "ops_total": len(rows),
        "optimizer": optimizer_stats(rec, sel),
        "gemm": {
            "ops": list(GEMM_OPS),
            "calls_per_step": sum(r["calls_per_step"] for r in mm),
            "ms_per_step": mm_ms / n,
            "gflop_per_step": flops / n / 1e9,
            "gflop_per_s": flops / 1e9 / (mm_ms / 1e3) if mm_ms else None,
            "share": mm_ms / 1e3 / window_s if window_s else 0.0,
        },
    }


def profile_run(label: str, params: TrainParams, ds: Dataset, window: Window, top: int) -> dict[str, Any]:
    """One `train()` as `ovex train` runs it (no test set, quiet hooks), every phase and step timed."""
    total = expected_steps(params, ds.n_rows)
    if total is not None and window.start >= total:
        raise SystemExit(f"--window {window.start}:{window.end} starts after the run's last step "
                         f"({total} steps); pick an earlier window")
    rec = Recorder(window)
    print(f"{label}: training ({total or '?'} steps, profiling steps {window.start}..{window.end})",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="ovex-profile-") as tmp, instrumented(rec):
        out = Path(tmp) / "model"
        rec.mark("train_start")
        result = trainer.train.train(params, ds, None, out_dir=out, hooks=QuietHooks())
        rec.mark("train_end")
        artifact_bytes = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    wall, cpu = _span(rec, "train_start", "train_end")
    history = [{**h, "seconds": ds.n_rows / h["examples_per_s"] if h.get("examples_per_s") else None}
               for h in result.history]
    steps = step_stats(rec, params.dim)
    prof = profile_table(rec, params.dim, top)
    return {
        "label": label,
        "params": params.to_json_dict(),
        "train_wall_s": wall,
        "train_cpu_s": cpu,
        "phases": phases(rec),
        "steps": steps,
        "optimizer_all_steps": optimizer_stats(rec, range(1, len(rec.step_s))),
        "profile": prof,
        "history": history,
        "final_loss": result.final_loss,
        "artifact_bytes": artifact_bytes,
    }


# ------------------------------------------------------------------------------------ GEMM microbenchmark


def _time_call(fn: Callable[[], Any], seconds: float, warmup: int) -> tuple[float, float, int]:
    """(median ms per call, fastest ms, calls timed) after `warmup` untimed calls; at least 5 calls.

    The fastest call beside the median: on a loaded machine a multi-threaded product waits for a thread
    the scheduler gave away, and the gap between the two shows it."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    t_end = time.perf_counter() + seconds
    while len(times) < 5 or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, min(times) * 1e3, len(times)


def gemm_bench(batch: int, cols: int, dim: int, threads: list[int], seconds: float) -> dict[str, Any]:
    """The step's three score products alone, float32 against bfloat16, on random data.

    Same shapes and operand layouts as autograd runs them for `scores = h_aug @ W.T`: forward mm(h, Wᵀ
    view), grad of h mm(go, W), grad of W mm(hᵀ view, go). Operands are cast before timing, so the
    bfloat16 figures leave out the casts a mixed-precision step would add.
    """
    k = dim + 1
    gen = torch.Generator().manual_seed(0)
    base = {"h": torch.randn(batch, k, generator=gen), "w": torch.randn(cols, k, generator=gen),
            "go": torch.randn(batch, cols, generator=gen)}
    flop = 2.0 * batch * cols * k
    before = torch.get_num_threads()
    rows = []
    try:
        for t in threads:
            torch.set_num_threads(t)
            for dtype in (torch.float32, torch.bfloat16):
                h, w, go = (base[n].to(dtype) for n in ("h", "w", "go"))
                products: dict[str, Callable[[], Any]] = {
                    "forward h·Wᵀ": lambda h=h, w=w: torch.mm(h, w.t()),
                    "grad h = go·W": lambda go=go, w=w: torch.mm(go, w),
                    "grad W = hᵀ·go": lambda h=h, go=go: torch.mm(h.t(), go),
                }
                total = total_min = 0.0
                for name, fn in products.items():
                    ms, fastest, calls = _time_call(fn, seconds, warmup=10)
                    total += ms
                    total_min += fastest
                    rows.append({"threads": t, "dtype": str(dtype).removeprefix("torch."), "product": name,
                                 "ms": ms, "min_ms": fastest, "gflop_per_s": flop / 1e9 / (ms / 1e3),
                                 "calls": calls})
                rows.append({"threads": t, "dtype": str(dtype).removeprefix("torch."), "product": "all three",
                             "ms": total, "min_ms": total_min, "gflop_per_s": 3 * flop / 1e9 / (total / 1e3),
                             "calls": None})
    finally:
        torch.set_num_threads(before)
    return {"batch": batch, "columns": cols, "k": k, "gflop_per_product": flop / 1e9, "rows": rows}


# ------------------------------------------------------------------------------------ report


def cpu_flags() -> list[str]:
    """The vector/matrix extensions that decide GEMM speed per dtype (AVX-512 BF16, AMX)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            have = set(line.split(":", 1)[1].split())
            return [f for f in CPU_FLAGS if f in have]
    return []


def parse_overrides(items: list[str]) -> dict[str, str]:
    """KEY=VALUE strings (KEY a TrainParams field, dashes allowed) as a dict; pydantic converts values."""
    out: dict[str, str] = {}
    for item in items:
        for part in (p for p in item.split(",") if p.strip()):
            key, sep, value = part.partition("=")
            key = key.strip().removeprefix("--").replace("-", "_")
            if not sep or key not in TrainParams.model_fields:
                raise SystemExit(f"bad override {part!r}: want KEY=VALUE with KEY a TrainParams field")
            out[key] = value.strip()
    return out


def parse_window(text: str) -> Window:
    """START:END, global 0-based step indices (the run's steps counted across epochs)."""
    start, sep, end = text.partition(":")
    try:
        if not sep:
            raise ValueError(text)
        w = Window(int(start), int(end))
    except ValueError:
        raise SystemExit(f"--window {text!r}: want START:END (global step indices)") from None
    if w.start < 1 or w.end <= w.start:
        raise SystemExit("--window: want 1 <= START < END (step 0 loads the numba kernels)")
    return w


def _f(v: float | None, fmt: str = ".2f") -> str:
    return "n/a" if v is None else format(v, fmt)


def _microbench_note(report: dict[str, Any], p: dict[str, Any], st: dict[str, Any]) -> str:
    """The microbenchmark's rates for this run's shape on the step's thread count, to set beside the
    rate the step's own GEMMs reached."""
    t = st["torch_threads_in_step"]
    for mb in report["gemm_microbench"]:
        if (mb["batch"], mb["columns"], mb["k"]) != (p["batch_size"], round(st["mean_scored_columns"]),
                                                     p["dim"] + 1):
            continue
        rate = {r["dtype"]: r["gflop_per_s"] for r in mb["rows"]
                if r["threads"] == t and r["product"] == "all three"}
        if "float32" in rate and "bfloat16" in rate:
            return (f" (the same shape alone on {t} thread(s): float32 {rate['float32']:.1f}, bfloat16 "
                    f"{rate['bfloat16']:.1f} GFLOP/s)")
    return ""


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        "# Where the training time goes: one `ovex train` run on WordNet",
        "",
        f"Commit `{report['commit'][:12]}`{' (dirty work tree)' if report['dirty'] else ''}, "
        f"{report['date']}; "
        f"{m['cpu']}, {m['cores']} cores ({', '.join(m['cpu_flags'])}), {m['memory_gib']:.0f} GiB; "
        f"torch {report['torch']}, numba {report['numba']}. Load average before "
        f"{report['loadavg_before'][0]:.2f}, after {report['loadavg_after'][0]:.2f} (1 min) on "
        f"{m['cores']} cores: wall times count whatever else ran; CPU seconds are this process's, "
        "all threads.",
        "",
        f"Data: `{report['data']['path']}`, {report['data']['rows']:,} rows, {report['data']['labels']:,} "
        f"labels, read in {report['data']['read_s']:.2f} s wall ({report['data']['read_cpu_s']:.2f} s CPU). "
        f"Command: `{' '.join(report['command'])}`.",
    ]
    for run in report["runs"]:
        p, ph, st, pr = run["params"], run["phases"], run["steps"], run["profile"]
        changed = {k: v for k, v in p.items() if v != report["defaults"].get(k)}
        lines += [
            "",
            f"## {run['label']}",
            "",
            "Parameters: TrainParams defaults" + (f" except {json.dumps(changed)}" if changed else "")
            + f" (loss {p['loss']}, group size {p['group_size']}, d={p['dim']}, batch {p['batch_size']}, "
            f"{p['negatives']} negatives, "
            f"{p['epochs']} epochs, optimizer {p['optimizer']}). train() {run['train_wall_s']:.2f} s wall, "
            f"{run['train_cpu_s']:.2f} s CPU; final loss {run['final_loss']:.4f}; artifact "
            f"{run['artifact_bytes'] / 2**20:.1f} MiB.",
            "",
            "### Phases",
            "",
            "| phase | wall s | CPU s | share of run |",
            "|---|---:|---:|---:|",
        ]
        whole = report["data"]["read_s"] + run["train_wall_s"]
        rows = [("read data (read_dataset)", report["data"]["read_s"], report["data"]["read_cpu_s"])]
        names = {"checks": "checks (out dir, capacity)",
                 "fit_featurizer": "fit featurizer, featurize training rows",
                 "setup": "setup (CSR, model, sampler, optimizer)",
                 "epochs": "epochs", "save": "save artifact", "after_save": "after saving"}
        rows += [(names[k], v["wall_s"], v["cpu_s"]) for k, v in ph.items()]
        for name, wall, cpu in rows:
            lines.append(f"| {name} | {wall:.2f} | {cpu:.2f} | {wall / whole:.1%} |")
        e = ph["epochs"]
        lines += [
            f"| total | {whole:.2f} | | |",
            "",
            f"Epochs: {e['steps_s']:.2f} s in {st['steps']} `Stepper.step` calls, {e['epoch_data_s']:.2f} s "
            f"shuffling (`EpochData`, once per epoch), {e['profiler_start_stop_s']:.2f} s starting and "
            f"stopping the profiler, {e['loop_other_s']:.2f} s the loop's own bookkeeping. The window's "
            f"steps run under the profiler (slower); at the unprofiled rate the steps would take "
            f"{st['unprofiled'].get('mean_ms', 0) * st['steps'] / 1e3:.2f} s.",
            "",
            "### Per step",
            "",
            "| steps | count | mean ms | median ms | p10 ms | p90 ms | CPU ms (mean) |",
            "|---|---:|---:|---:|---:|---:|---:|",
            f"| first (loads the numba kernels) | 1 | {_f(st['first_step_ms'])} | | | | |",
        ]
        for key, name in (("unprofiled", "unprofiled (not the first)"), ("window", "profiled window"),
                          ("all", "all")):
            s = st[key]
            if s.get("steps"):
                lines.append(f"| {name} | {s['steps']} | {s['mean_ms']:.2f} | {s['median_ms']:.2f} | "
                             f"{s['p10_ms']:.2f} | {s['p90_ms']:.2f} | {s['cpu_mean_ms']:.2f} |")
        lines += [
            "",
            f"A step: {st['mean_rows']:.0f} rows on average, {st['mean_scored_columns']:.0f} scored columns "
            f"({st['mean_label_ids']:.0f} candidate labels), {st['gemm_gflop_per_step']:.3f} GFLOP in the "
            f"three score GEMMs; torch runs on {st['torch_threads_in_step']} thread(s) inside the step. "
            "Per epoch (ms per step): "
            + ", ".join(f"{x['epoch']}: {x['mean_ms']:.2f}" for x in st["per_epoch"]) + ".",
        ]
        if pr.get("steps"):
            g, by = pr["gemm"], pr["self_ms_per_step_by_kind"]
            lines += [
                "",
                f"### Profile of steps {pr['window'][0]}..{pr['window'][1]} ({pr['steps']} steps, "
                f"{pr['wall_ms_per_step']:.2f} ms per step with the profiler on)",
                "",
                f"Self CPU time per step: torch ops {by['torch']:.2f} ms, numba optimizer kernels "
                f"{by['numba']:.2f} ms, Python between ops (self time of `{STEP_LABEL}`) "
                f"{by['python']:.2f} ms, "
                f"not inside any recorded event {pr['unrecorded_ms_per_step']:.2f} ms. Top {len(pr['top'])} "
                f"of {pr['ops_total']} events; share = of the window's wall time.",
                "",
                "| op | kind | calls/step | total ms | ms/step | share |",
                "|---|---|---:|---:|---:|---:|",
            ]
            for r in pr["top"]:
                lines.append(f"| `{r['name']}` | {r['kind']} | {r['calls_per_step']:.1f} | "
                             f"{r['self_ms']:.1f} | {r['ms_per_step']:.3f} | {r['share']:.1%} |")
            o = pr["optimizer"]
            lines += [
                "",
                f"Row-wise optimizer over the window (wall time of `RowAdam.step`/`RowAdagrad.step`, and of "
                f"the numba kernel inside it): {o['optimizer_ms_per_step']:.2f} ms per step, of which "
                f"kernels {o['kernel_ms_per_step']:.2f} ms.",
                "",
                "| table | optimizer ms/step | kernel ms/step |",
                "|---|---:|---:|",
            ]
            for name, t in o["tables"].items():
                lines.append(f"| {name} | {t['optimizer_ms_per_step']:.3f} | {t['kernel_ms_per_step']:.3f} |")
            lines += [
                "",
                f"Score GEMMs (`{'`, `'.join(g['ops'])}`): {g['calls_per_step']:.1f} calls per step, "
                f"{g['ms_per_step']:.2f} ms per step ({g['share']:.1%} of the window), "
                f"{g['gflop_per_step']:.3f} GFLOP per step -> {_f(g['gflop_per_s'], '.1f')} GFLOP/s"
                + _microbench_note(report, p, st) + ".",
            ]
        else:
            lines += ["", f"Profile: {pr.get('note', 'none')}."]
    for mb in report["gemm_microbench"]:
        lines += [
            "",
            f"## Score GEMM microbenchmark: B={mb['batch']}, C={mb['columns']}, d+1={mb['k']} "
            f"({mb['gflop_per_product']:.3f} GFLOP per product)",
            "",
            "`torch.mm` on random tensors after 10 warm-up calls, median of calls over "
            f"{report['mm_seconds']} s per product; operands already in the dtype (no casts timed).",
            "",
            "| threads | dtype | product | median ms | fastest ms | GFLOP/s (median) |",
            "|---:|---|---|---:|---:|---:|",
        ]
        for r in mb["rows"]:
            lines.append(f"| {r['threads']} | {r['dtype']} | {r['product']} | {r['ms']:.3f} | "
                         f"{r['min_ms']:.3f} | {r['gflop_per_s']:.1f} |")
        three = {(r["threads"], r["dtype"]): r["ms"] for r in mb["rows"] if r["product"] == "all three"}
        for t in sorted({r["threads"] for r in mb["rows"]}):
            f32, b16 = three.get((t, "float32")), three.get((t, "bfloat16"))
            if f32 and b16:
                lines.append(f"\n{t} thread(s): bfloat16 takes {b16 / f32:.2f}x the float32 time of the "
                             f"three products, {f32 - b16:.3f} ms less per step (median).")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA, help="training JSONL or XC file (default: WordNet)")
    ap.add_argument("--seed", type=int, default=TrainParams().seed)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a TrainParams field for every run (repeatable)")
    ap.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                    help="one more profiled run with these overrides (repeatable)")
    ap.add_argument("--window", default="300:500", help="profiled steps START:END (global, 0-based)")
    ap.add_argument("--top", type=int, default=25, help="ops listed in the profile table")
    ap.add_argument("--mm-threads", default="1,2", help="thread counts of the GEMM microbenchmark")
    ap.add_argument("--mm-seconds", type=float, default=0.5, help="timing per product and dtype")
    ap.add_argument("--out", type=Path, default=RESULTS / "profile_train", help="prefix of the .json and .md")
    args = ap.parse_args()
    window = parse_window(args.window)
    common = parse_overrides(args.overrides)
    runs_spec = [("defaults" if not common else f"defaults + {args.overrides}", {})]
    runs_spec += [(f"variant {v}", parse_overrides([v])) for v in args.variant]
    all_params = [TrainParams.model_validate({**common, **extra, "seed": args.seed})
                  for _, extra in runs_spec]
    for p in all_params:
        if p.nproc_per_node > 1:
            raise SystemExit("nproc_per_node > 1 trains in other processes, which this profile cannot see")

    load_before = list(os.getloadavg())
    t0, c0 = time.perf_counter(), time.process_time()
    ds = read_dataset(args.data)
    read_s, read_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    print(f"read {args.data}: {ds.n_rows:,} rows, {ds.n_labels:,} labels in {read_s:.2f} s", flush=True)
    # the batch each run takes (`batch_size` 0 is the rule by the epoch's rows), for its step count and shapes
    all_params = [p.model_copy(update={"batch_size": p.batch_for(ds.n_rows)}) for p in all_params]

    runs = []
    for (label, _), params in zip(runs_spec, all_params, strict=True):
        run = profile_run(label, params, ds, window, args.top)
        st = run["steps"]
        print(f"{label}: train {run['train_wall_s']:.2f} s, {st['steps']} steps, "
              f"{_f(st['unprofiled'].get('mean_ms'))} ms/step unprofiled", flush=True)
        runs.append(run)

    shapes = []
    for run, params in zip(runs, all_params, strict=True):
        shape = (params.batch_size, round(run["steps"]["mean_scored_columns"]), params.dim)
        if shape not in shapes and shape[1] > 0:
            shapes.append(shape)
    threads = [int(t) for t in args.mm_threads.split(",") if t.strip()]
    microbench = [gemm_bench(b, c, d, threads, args.mm_seconds) for b, c, d in shapes]

    report: dict[str, Any] = {
        "command": [sys.executable, *sys.argv],
        "commit": _git("rev-parse", "HEAD"),
        "dirty": dirty(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {**machine(), "cpu_flags": cpu_flags(), "platform": platform.platform()},
        "loadavg_before": load_before,
        "loadavg_after": list(os.getloadavg()),
        "torch": torch.__version__,
        "numba": _version("numba"),
        "numpy": np.__version__,
        "python": platform.python_version(),
        "params": all_params[0].to_json_dict(),
        "overrides": common,
        "defaults": TrainParams().to_json_dict(),
        "window": [window.start, window.end],
        "mm_seconds": args.mm_seconds,
        "data": {"path": str(args.data), "rows": ds.n_rows, "labels": ds.n_labels, "read_s": read_s,
                 "read_cpu_s": read_cpu_s},
        "runs": runs,
        "gemm_microbench": microbench,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    text = markdown(report)
    args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
