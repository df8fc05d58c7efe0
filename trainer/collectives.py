"""The process group a training run belongs to, its collectives, and the launcher that starts ranks.

One code path for every world size: a run of one process holds a `RankGroup` of world 1 whose
collectives return their input (no process group is created), so the training step calls the same
functions whether it runs alone or as one of R ranks. Ranks join from the environment that torch's
elastic launcher sets (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, ...): `launch` starts them on this machine the
way `torchrun --nproc-per-node N` does, and an external `torchrun` across machines sets the same variables.
Backend: NCCL when the run trains on CUDA, gloo otherwise.

The two collectives a step differentiates through are autograd functions: all-gathering rows of h
(backward: the gradient reduce-scattered back to the rank that owns each row) and summing a tensor over
ranks (backward: the gradient summed again, since every rank's loss depends on the sum).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from trainer.errors import ParamsError, RankFailed

MAX_NPROC = 1024  # sanity bound on ranks per machine (the job API bounds it by the worker's cores)


@dataclass
class CommStats:
    """Bytes this rank sent into collectives (payload, not protocol overhead) and how many calls."""

    bytes: int = 0
    calls: int = 0

    def add(self, t: torch.Tensor) -> None:
        self.bytes += t.numel() * t.element_size()
        self.calls += 1


class _AllGatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: RankGroup) -> torch.Tensor:
        ctx.group = group
        out = x.new_empty((group.world * x.shape[0], *x.shape[1:]))
        group.stats.add(x)
        dist.all_gather_single(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        group: RankGroup = ctx.group
        out = grad.new_empty((grad.shape[0] // group.world, *grad.shape[1:]))
        group.stats.add(grad)
        dist.reduce_scatter_single(out, grad.contiguous(), op=dist.ReduceOp.SUM)
        return out, None


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: RankGroup) -> torch.Tensor:
        ctx.group = group
        out = x.clone()
        group.stats.add(out)
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        out = grad.clone()
        ctx.group.stats.add(out)
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out, None


class RankGroup:
    """This process's place among the ranks of a run; collectives are identities when `world == 1`."""

    def __init__(self, rank: int = 0, world: int = 1, local_rank: int = 0) -> None:
        self.rank, self.world, self.local_rank = rank, world, local_rank
        self.stats = CommStats()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def gather_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's x ([n, ...], the same n on all ranks) stacked in rank order; differentiable."""
        if self.world == 1:
            return x
        out: torch.Tensor = _AllGatherRows.apply(x, self)
        return out

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """Σ over ranks of x; differentiable (every rank's gradient flows to every rank's x)."""
        if self.world == 1:
            return x
        out: torch.Tensor = _AllReduceSum.apply(x, self)
        return out

    def sum_(self, x: torch.Tensor) -> torch.Tensor:
        """In-place Σ over ranks (no autograd): dense gradients, loss values."""
        if self.world > 1:
            self.stats.add(x)
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
        return x

    def max_int(self, value: int) -> int:
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def sum_sparse_rows(self, ids: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(distinct ids, summed rows) over every rank's (ids [n], rows [n, w]): the all-reduce of a
        row-sparse gradient, whose traffic is the rows the batch touched, not the table. Every rank gets
        the same result in the same order, so replicas of the table stay identical."""
        if self.world == 1:
            return ids, rows
        n = self.max_int(ids.numel())
        pad_ids = torch.full((n,), -1, dtype=ids.dtype, device=ids.device)
        pad_ids[: ids.numel()] = ids
        pad_rows = rows.new_zeros((n, rows.shape[1]))
        pad_rows[: rows.shape[0]] = rows
        all_ids = self.gather_rows(pad_ids)
        all_rows = self.gather_rows(pad_rows)
        keep = all_ids >= 0
        all_ids, all_rows = all_ids[keep], all_rows[keep]
        uniq, inv = torch.unique(all_ids, return_inverse=True)
        out = rows.new_zeros((uniq.numel(), rows.shape[1]))
        out.index_add_(0, inv, all_rows)
        return uniq, out

    def broadcast_object(self, obj: Any) -> Any:
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    @property
    def device(self) -> torch.device:
        if self.world > 1 and dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


def in_launched_rank() -> bool:
    """True inside a process started by torchrun / the elastic launcher (the usual env vars are set)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def join_group(device: torch.device) -> RankGroup:
    """The group of this process: world 1 when not launched as a rank, else the env:// process group
    (created once; gloo on CPU, NCCL when training on CUDA)."""
    if not in_launched_rank():
        return RankGroup()
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if world == 1:
        return RankGroup()
    torch.set_num_threads(threads_per_rank(int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if backend == "nccl":
            gpus = torch.cuda.device_count()
            if local_rank >= gpus:
                raise ParamsError(
                    f"rank {rank} (local rank {local_rank}) needs CUDA device {local_rank}, but this machine "
                    f"has {gpus}: NCCL runs one rank a GPU, so use at most {gpus} ranks a machine"
                )
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30))
    return RankGroup(rank, world, local_rank)


def rank_device(device: torch.device, group: RankGroup) -> torch.device:
    """The CUDA device of this rank's local index (one GPU a rank); other devices unchanged."""
    if device.type == "cuda" and group.world > 1:
        return torch.device("cuda", group.local_rank)
    return device


def threads_per_rank(nproc: int) -> int:
    """CPU threads for each of `nproc` ranks on this machine (one at least): ranks must not oversubscribe."""
    return max(1, (os.cpu_count() or 1) // max(1, nproc))


def launch(nproc: int, entry: Callable[..., Any], args: tuple[Any, ...], run_id: str = "ovex") -> Any:
    """Start `nproc` ranks of `entry(*args)` on this machine with torch's elastic launcher (as torchrun
    --standalone does: a c10d rendezvous on a free local port) and return rank 0's return value.
    A rank that dies fails the whole run: the launcher stops the others and raises."""
    if not 1 <= nproc <= MAX_NPROC:
        raise ParamsError(f"nproc_per_node must be in 1..{MAX_NPROC}, got {nproc}")
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=run_id,
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=0,
        monitor_interval=0.2,
        start_method="spawn",
        local_addr="127.0.0.1",
    )
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        results = elastic_launch(config, entry)(*args)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        why = f"exit code {failure.exitcode}: {failure.message}"
        raise RankFailed(f"rank {rank} of {nproc} failed ({why})") from None
    return results[0]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ParamsError("--device cuda requested but no CUDA device is available")
    return torch.device(name)
