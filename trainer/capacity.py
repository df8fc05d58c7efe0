"""Whether a run fits the memory of the machine and device it trains on, checked before anything
label-sized exists.

The label space comes from the data, and for XC files from a header that only claims it (`N D L`): a
header that says 10^9 labels, or a typo in it, would otherwise allocate label-sized structures until the
machine kills the process. The estimate covers what a run holds per label and per input feature: the
label head, the input projection and their optimizer state (sharded over ranks), and, on every rank, the
label names with their index, the label-sized arrays (counts, propensities, sampler tables, masks, the
names file being written) and, for a continual run, its base's tables and the draw of the new head rows.
Every step needs working memory on top, so a run over the memory free cannot finish: it is refused with
what to change, not started. Free memory is the kernel's MemAvailable, or less where a cgroup (a
container's memory limit) allows less.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from trainer.data import Dataset
from trainer.errors import DataFormatError, ParamsError
from trainer.params import TrainParams

__all__ = ["RunBytes", "check_fits", "free_bytes", "run_bytes"]

# floats kept per weight of a big table: the weight and its optimizer state (two Adam moments; row-wise
# Adagrad keeps none per weight)
_FLOATS_PER_WEIGHT = {"adam": 3, "adagrad": 1}
# bytes of optimizer state per row of a big table: Adam's step of the row's last update (float64),
# Adagrad's sum of squared gradients of the row (float32)
_BYTES_PER_ROW = {"adam": 8, "adagrad": 4}
# a label's name, held by every rank: a short Python string and its list slot (about 63 bytes) and its
# entry in a name -> id index (about 59 bytes), as measured for ids as names with tracemalloc
_NAME_BYTES = 128
# a label's other host arrays, held by every rank: counts (int64 and float64), propensities, the
# sampler's tables and masks, a per-label learning-rate scale, the second list of names a data set moved
# into the model's label space holds, the label's line of labels.txt while it is written, and the
# allocator's slack around them (sized so a run's measured peak stays under the estimate)
_LABEL_BYTES = 160
# an input feature's host arrays beside its projection row: document frequency and idf weight
_FEATURE_BYTES = 16


@dataclass(frozen=True)
class RunBytes:
    """Bytes one rank of a run takes: `tables` on its training device (the host when that is the CPU),
    `host` in the machine's memory whatever the device."""

    tables: int
    host: int

    @property
    def total(self) -> int:
        return self.tables + self.host


def run_bytes(labels: int, features: int, params: TrainParams, extra_heads: int = 0, ranks: int = 1,
              base_labels: int | None = None) -> RunBytes:
    """What one of `ranks` ranks of a run of `labels` labels and `features` input columns takes.

    Its share of the label head (and loss-owned heads) and the whole input projection, each weight and
    row with its optimizer state and, with model selection (`valid_fraction`), the kept best epoch's copy;
    every label's name and arrays, every feature's; an ensemble's merged model, if larger. A continual run
    (`base_labels`: its base's label count) also holds the base's head and projection and draws its new
    head rows before copying them in."""
    d = params.dim
    shard = -(-labels // max(ranks, 1))
    rows = shard * (1 + extra_heads) + features
    per_weight = _FLOATS_PER_WEIGHT[params.optimizer] + (1 if params.valid_fraction > 0 else 0)
    floats = per_weight * (shard * (d + 1) * (1 + extra_heads) + features * d)
    host = labels * (_NAME_BYTES + _LABEL_BYTES) + features * _FEATURE_BYTES
    if base_labels is not None:
        floats += shard * (d + 1)  # the drawn rows, copied into the head
        host += 4 * (base_labels * (d + 1) * (1 + extra_heads) + features * d)
    if params.ensemble > 1:  # after its members trained: the merged model with one member loaded beside it
        floats = max(floats, (params.ensemble + 1) * (labels * (d + 1) + features * d))
    return RunBytes(tables=4 * floats + _BYTES_PER_ROW[params.optimizer] * rows, host=host)


# ------------------------------------------------------------------------------------ free memory

_PROC = Path("/proc")
_CGROUP_ROOT = Path("/sys/fs/cgroup")
# (limit, usage, the memory.stat key of reclaimable page cache) of each cgroup version
_V2 = ("memory.max", "memory.current", "inactive_file")
_V1 = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")


def free_bytes(device: torch.device, *, proc: Path = _PROC, cgroup_root: Path = _CGROUP_ROOT) -> int | None:
    """Memory a run could still take on `device` (None when it cannot be told): free GPU memory, or on
    the host the kernel's estimate of allocatable memory (MemAvailable: free pages plus reclaimable
    cache), or less where this process's memory cgroup (a container's limit, v1 or v2) leaves less."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    found = [v for v in (_mem_available(proc), _cgroup_free(proc, cgroup_root)) if v is not None]
    return min(found) if found else None


def _mem_available(proc: Path) -> int | None:
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_free(proc: Path, root: Path) -> int | None:
    """The least room left under a limit of this process's memory cgroup or any cgroup above it (limit
    minus usage, reclaimable page cache counted as room); None without a limit."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    places: list[tuple[Path, Path, tuple[str, str, str]]] = []  # (cgroup, its hierarchy's root, files)
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2: mounted at the root, or beside v1 hierarchies as "unified"
            top = root if (root / "cgroup.controllers").exists() else root / "unified"
            places.append((top / path.lstrip("/"), top, _V2))
        elif "memory" in controllers.split(","):
            places.append((root / "memory" / path.lstrip("/"), root / "memory", _V1))
    rooms = [r for where, top, files in places for r in (_room(c, files) for c in _up_to(where, top))
             if r is not None]
    return min(rooms) if rooms else None


def _up_to(start: Path, top: Path) -> list[Path]:
    """`start` and its parents up to `top` (inside a container the path often names a cgroup of the host,
    absent from the container's view: then `top` alone)."""
    out, at = [], start
    while True:
        out.append(at)
        if at == top or at.parent == at:
            return out
        at = at.parent


def _room(cgroup: Path, files: tuple[str, str, str]) -> int | None:
    limit_file, usage_file, cache_key = files
    try:
        raw = (cgroup / limit_file).read_text().strip()
        if raw == "max":
            return None
        limit, usage = int(raw), int((cgroup / usage_file).read_text().strip())
    except (OSError, ValueError):
        return None
    cache = 0
    try:
        for line in (cgroup / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == cache_key:
                cache = int(value)
    except (OSError, ValueError):
        pass
    return max(0, limit - max(0, usage - cache))


# ------------------------------------------------------------------------------------ the check


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} TiB"


def check_fits(ds: Dataset, params: TrainParams, device: torch.device, *, labels: int | None = None,
               features: int | None = None, ranks: int = 1, extra_heads: int = 0,
               base_labels: int | None = None) -> None:
    """Refuse a run on `ds` that needs more memory than is free: `labels` (default: the set's) split over
    `ranks`, `features` input columns (default: an XC file's D, the hashing size for texts; a vocabulary
    is bounded by the texts already in memory and is left out). A continual run (`base_labels` given)
    keeps its base's dim, so the error does not suggest another.

    The ranks of one machine share its memory (`LOCAL_WORLD_SIZE` of them when launched, else all); on a
    GPU the tables are checked against the GPU's free memory and the rest against the host's.
    For an XC file the error points at its header and says what its rows use, since a header claiming far
    more labels or features than the file holds is the likely cause."""
    labels = ds.n_labels if labels is None else labels
    if features is None:
        features = params.hash_size if ds.is_text else ds.n_features
    need = run_bytes(labels, features, params, extra_heads, ranks, base_labels)
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", ranks)))
    checks = ([(need.tables, device), (local * need.host, torch.device("cpu"))] if device.type == "cuda"
              else [(local * need.total, device)])
    for needed, where in checks:
        free = free_bytes(where)
        if free is not None and needed > free:
            _refuse(ds, params, labels, features, needed, free, where, local, need,
                    continual=base_labels is not None)


def _refuse(ds: Dataset, params: TrainParams, labels: int, features: int, needed: int, free: int,
            where: torch.device, local: int, need: RunBytes, *, continual: bool) -> None:
    parts = (f"its weights and their {params.optimizer} state" if where.type == "cuda" else
             f"its weights, their {params.optimizer} state, the label names and the other per-label arrays")
    ranks = f" on {local} ranks" if local > 1 else ""
    what = (f"a model of {labels:,} labels and {features:,} input features at dim {params.dim} needs "
            f"{_size(needed)}{ranks} for {parts} alone, and {where} has {_size(free)} free")
    options = [] if continual else ["lower --dim"]
    if params.ensemble > 1:
        options.append("lower --ensemble")
    if params.optimizer == "adam":
        options.append("use --optimizer adagrad")
    head, projection = labels * (params.dim + 1), features * params.dim
    if ds.is_text and params.hash_size > 0 and projection > head and not continual:
        options.append("lower --hash-size")
    if continual:
        options.append("train on a machine with more free memory (a continual run keeps its base's dim)")
    elif head > projection and (need.tables > need.host or where.type == "cuda"):
        options.append("shard the labels over more ranks (--nproc-per-node)")  # only the head is split
    else:
        options.append("train on a machine with more free memory")
    remedy = ", or ".join([", ".join(options[:-1]), options[-1]]) if len(options) > 1 else options[0]
    if ds.X is None or not ds.path:
        raise ParamsError(f"{what}: {remedy}")
    used_l = int(ds.Y.indices.max()) + 1 if ds.Y.nnz else 0
    used_d = int(ds.X.indices.max()) + 1 if ds.X.nnz else 0
    raise DataFormatError(ds.path, 1, f"the header declares L={ds.n_labels:,} labels and D={ds.n_features:,} "
                          f"features, and its rows use label ids below {used_l:,} and feature ids below "
                          f"{used_d:,}: {what}. If the header claims more than the file holds, lower L or D "
                          f"to what the rows use; if not, {remedy}")
