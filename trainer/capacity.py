"""Whether a run's tables fit the memory of the device it trains on, checked before any of them exists.

The label space comes from the data, and for XC files from a header that only claims it (`N D L`): a
header that says 10^9 labels, or a typo in it, would otherwise allocate label-sized arrays until the
machine kills the process. The label head, the input projection and their optimizer state are a lower
bound of what a run holds (every step needs working memory on top), so a run whose tables alone exceed
the memory free on its device cannot finish: it is refused with what to change, not started.
"""

from __future__ import annotations

from pathlib import Path

import torch

from trainer.data import Dataset
from trainer.errors import DataFormatError, ParamsError
from trainer.params import TrainParams

__all__ = ["check_fits", "free_bytes", "table_bytes"]

# floats kept per weight of a big table: the weight and its optimizer state (two Adam moments, one
# Adagrad sum)
_FLOATS_PER_WEIGHT = {"adam": 3, "adagrad": 2}
# a label's name, held by every rank: a short Python string and its list slot (about 63 bytes) and its
# entry in a name -> id index (about 59 bytes), as measured for ids as names with tracemalloc
_NAME_BYTES = 128


def table_bytes(labels: int, features: int, params: TrainParams, extra_heads: int = 0, ranks: int = 1) -> int:
    """Bytes of one of `ranks` ranks: its share of the label head (and loss-owned heads), the input
    projection, their optimizer state, and the names of all `labels`."""
    d = params.dim
    floats = -(-labels // max(ranks, 1)) * (d + 1) * (1 + extra_heads) + features * d
    return 4 * _FLOATS_PER_WEIGHT[params.optimizer] * floats + labels * _NAME_BYTES


def free_bytes(device: torch.device) -> int | None:
    """Memory a run could still take on `device` (None when it cannot be told): free GPU memory, or the
    kernel's estimate of allocatable memory (MemAvailable: free pages plus reclaimable cache)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} TiB"


def check_fits(ds: Dataset, params: TrainParams, device: torch.device, *, labels: int | None = None,
               features: int | None = None, ranks: int = 1, extra_heads: int = 0,
               continual: bool = False) -> None:
    """Refuse a run on `ds` whose tables need more than `device` has free: `labels` (default: the set's)
    split over `ranks`, `features` input columns (default: an XC file's D, the hashing size for texts;
    a vocabulary is bounded by the texts already in memory and is left out). A `continual` run keeps its
    base's dim, so the error does not suggest another.

    For an XC file the error points at its header and says what its rows use, since a header claiming far
    more labels or features than the file holds is the likely cause."""
    labels = ds.n_labels if labels is None else labels
    if features is None:
        features = params.hash_size if ds.is_text else ds.n_features
    need = table_bytes(labels, features, params, extra_heads, ranks)
    free = free_bytes(device)
    if free is None or need <= free:
        return
    where = f" a rank ({ranks} ranks)" if ranks > 1 else ""
    what = (f"a model of {labels:,} labels and {features:,} input features at dim {params.dim} needs "
            f"{_size(need)}{where} for its weights, their {params.optimizer} state and the label names "
            f"alone, and {device} has {_size(free)} free")
    options = [] if continual else ["lower --dim"]
    if params.optimizer == "adam":
        options.append("use --optimizer adagrad")
    options.append("train on a machine with more free memory (a continual run keeps its base's dim)"
                   if continual else "shard the labels over more ranks (--nproc-per-node)")
    remedy = ", or ".join([", ".join(options[:-1]), options[-1]]) if len(options) > 1 else options[0]
    if ds.X is None or not ds.path:
        raise ParamsError(f"{what}: {remedy}")
    used_l = int(ds.Y.indices.max()) + 1 if ds.Y.nnz else 0
    used_d = int(ds.X.indices.max()) + 1 if ds.X.nnz else 0
    raise DataFormatError(ds.path, 1, f"the header declares L={ds.n_labels:,} labels and D={ds.n_features:,} "
                          f"features, and its rows use label ids below {used_l:,} and feature ids below "
                          f"{used_d:,}: {what}. If the header claims more than the file holds, lower L or D "
                          f"to what the rows use; if not, {remedy}")
