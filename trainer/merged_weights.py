"""One `weights.safetensors` written by every rank at once: the served artifact stays today's format.

Why merged: the service, the registry and every tool read one model directory; a sharded artifact would
need a new loader and would still have to be assembled to score all labels in one process. The cost
of merging is avoided rather than paid: rank 0 writes the safetensors header and the replicated tensors
and sizes the file, then each rank writes its own label rows straight to their byte range (a shard's rows
of a row-major [K, ...] tensor are one contiguous range), so no rank ever holds more than its shard.
The ranks need the model directory on a file system they all see (one machine, or a shared volume).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import BinaryIO

import torch

from trainer.collectives import RankGroup
from trainer.durable import safetensors_layout, tensor_bytes
from trainer.label_shards import LabelShard

CHUNK = 64 << 20  # bytes per write


def is_label_tensor(name: str) -> bool:
    """Artifact tensors with one row per label: the head ([K, d+1]) and the loss-owned heads."""
    return name == "head" or name.startswith(("head.", "extra."))


def _layout(
    tensors: dict[str, torch.Tensor], shard: LabelShard
) -> tuple[bytes, dict[str, tuple[int, list[int]]]]:
    """(header bytes, name -> (absolute offset, global shape)); identical on every rank."""
    specs: dict[str, tuple[torch.dtype, list[int]]] = {}
    for name, t in tensors.items():
        shape = list(t.shape)
        if is_label_tensor(name):
            shape[0] = shard.n_labels
        specs[name] = (t.dtype, shape)
    header, where = safetensors_layout(specs)
    return header, {k: (o, specs[k][1]) for k, o in where.items()}


def _write_at(fh: BinaryIO, offset: int, t: torch.Tensor) -> None:
    data = tensor_bytes(t)
    for i in range(0, data.nbytes, CHUNK):
        fh.seek(offset + i)
        fh.write(data[i : i + CHUNK])


def write_merged_weights(
    path: Path | None, tensors: dict[str, torch.Tensor], shard: LabelShard, group: RankGroup
) -> dict[str, list[int]]:
    """Collective: rank 0 passes the file to write, the others None; returns the merged shapes."""
    header, where = _layout(tensors, shard)
    if group.is_main:
        assert path is not None
        sizes = (o + math.prod(s) * tensors[n].element_size() for n, (o, s) in where.items())
        end = max(sizes, default=len(header))
        with open(path, "wb") as fh:
            fh.write(header)
            fh.truncate(end)
    target = Path(group.broadcast_object(None if path is None else str(path)))
    with open(target, "r+b") as fh:
        for name, t in tensors.items():
            offset, shape = where[name]
            if is_label_tensor(name):
                row_bytes = math.prod(shape[1:]) * t.element_size()
                _write_at(fh, offset + shard.lo * row_bytes, t)
            elif group.is_main:
                _write_at(fh, offset, t)
        fh.flush()
        os.fsync(fh.fileno())  # each rank flushes its own rows (on a shared volume no other rank can)
    group.barrier()
    return {name: shape for name, (_, shape) in where.items()}
