"""`train(...)` with `nproc_per_node > 1`: start the ranks here and be their caller's single training run.

Why here and not in each caller: the CLI, the job worker and the benchmarks all call `train(...)`;
launching inside it keeps one entry point. The ranks are started by torch's elastic launcher (as torchrun
does) and receive the datasets as arguments; rank 0's log lines and progress come back over a queue to
the caller's hooks, and the caller's `should_stop()` is passed on as an event every rank checks between
steps. A rank that dies (killed, out of memory) makes the launcher stop the others; the caller then gets
`RankFailed` naming the rank, or `TrainingCancelled` when it had asked the run to stop.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from trainer.checkpoints import remove_partials
from trainer.collectives import launch, resolve_device
from trainer.data import Dataset
from trainer.errors import OvexError, ParamsError, RankFailed, TrainingCancelled
from trainer.hooks import Progress
from trainer.label_shards import check_shardable
from trainer.params import TrainParams

POLL_S = 0.2


class _RankHooks:
    """Hooks inside a rank: messages and progress to the caller's queue, stop when the caller says so
    or is gone (a launcher on a thread cannot trap signals, so a killed caller must not leave ranks)."""

    def __init__(self, events: Any, stop: Any) -> None:
        self.events, self.stop = events, stop
        self.parent = os.getppid()

    def on_progress(self, progress: Any) -> None:
        self.events.put(("progress", asdict(progress)))

    def on_log(self, message: str) -> None:
        self.events.put(("log", message))

    def should_stop(self) -> bool:
        return bool(self.stop.is_set()) or os.getppid() != self.parent


def _rank_main(
    entry: Callable[..., Any],
    params: TrainParams,
    train_ds: Dataset,
    test_ds: Dataset | None,
    options: dict[str, Any],
    events: Any,
    stop: Any,
) -> Any:
    try:
        return entry(params, train_ds, test_ds, hooks=_RankHooks(events, stop), **options)
    except OvexError as exc:  # the caller reports this message rather than the launcher's summary
        events.put(("error", (int(os.environ.get("RANK", "0")), str(exc))))
        raise


def _check_gpus(params: TrainParams) -> None:
    """A CUDA run needs a GPU a rank (NCCL): say so before any rank starts."""
    import torch

    gpus = torch.cuda.device_count()
    if resolve_device(params.device).type == "cuda" and params.nproc_per_node > gpus:
        raise ParamsError(
            f"nproc_per_node {params.nproc_per_node} on CUDA needs a GPU a rank; this machine has {gpus}"
        )


def _run_params(params: TrainParams, base: str | Path | None, base_name: str | None) -> TrainParams:
    """The parameters the ranks will train with: a continual run's are merged with its base's (its loss
    is the base's), and a conflict is an error here, before any rank starts."""
    if base is None:
        return params
    from trainer.artifact import read_params
    from trainer.continual import continual_params

    name = base_name or str(base)
    base_params, kind = read_params(base, name)
    return continual_params(base_params, params, name, kind)


def train_on_ranks(
    entry: Callable[..., Any],
    params: TrainParams,
    train_ds: Dataset,
    test_ds: Dataset | None,
    *,
    out_dir: str | Path | None,
    hooks: Any,
    checkpoint_dir: str | Path | None,
    checkpoint_every: int,
    base: str | Path | None = None,
    base_name: str | None = None,
    replay_ds: Dataset | None = None,
) -> Any:
    """Run `entry` (a module-level function, called as `train` is) on `params.nproc_per_node` ranks of this
    machine; returns rank 0's result. With `base`, every rank continues that model (`trainer.continual`)
    and holds its shard of the grown label space."""
    merged = _run_params(params, base, base_name)
    check_shardable(merged.loss, params.nproc_per_node)
    _check_gpus(merged)
    ctx = mp.get_context("spawn")
    events, stop = ctx.Queue(), ctx.Event()
    options = {"out_dir": out_dir, "checkpoint_dir": checkpoint_dir, "checkpoint_every": checkpoint_every,
               "base": base, "base_name": base_name, "replay_ds": replay_ds}
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = launch(
                params.nproc_per_node, _rank_main, (entry, params, train_ds, test_ds, options, events, stop),
                run_id="ovex-train",
            )
        except BaseException as exc:
            outcome["error"] = exc

    runner = threading.Thread(target=run, name="ovex-ranks", daemon=True)
    runner.start()
    rank_error: tuple[int, str] | None = None
    cancelled = False
    while runner.is_alive() or not events.empty():
        try:
            kind, value = events.get(timeout=POLL_S)
        except queue.Empty:
            kind, value = "", None
        if kind == "log":
            hooks.on_log(value)
        elif kind == "progress":
            hooks.on_progress(Progress(**value))
        elif kind == "error":
            rank_error = value
        if not cancelled and hooks.should_stop():
            cancelled = True
            stop.set()
    runner.join()
    error = outcome.get("error")
    if error is not None:
        if checkpoint_dir is not None:  # no rank writes any more: a half-written checkpoint goes, as on one
            remove_partials(Path(checkpoint_dir))
        if cancelled:
            raise TrainingCancelled("training stopped on every rank") from None
        if rank_error is not None and isinstance(error, RankFailed):
            rank, message = rank_error
            raise RankFailed(f"rank {rank} of {params.nproc_per_node} failed: {message}") from None
        raise error
    return outcome["result"]
