"""Files that survive a crash: safetensors written straight to disk, and fsync before every commit point.

A rename is atomic for other processes, but after a power loss or kernel crash the renamed directory may
hold files whose data never left the page cache (zero-length or zero-filled weights under a version the
registry already serves, a checkpoint that `latest.json` names but cannot load). So every writer here
flushes file data and directory entries before the rename that publishes them, and the rename itself
before the caller records it anywhere else.

Weights files of a buffer (8 MB) or more go through `O_DIRECT` where the file system takes it: the bytes
reach the disk once, with no page-cache copy to fill and flush (on a virtual machine whose fresh memory is
slow to first touch, that copy costs more than the disk), and a big training write does not evict the
pages a server on the same machine is answering from. Smaller files, and files where `O_DIRECT` is
refused (tmpfs, some overlay file systems), are written through the page cache and fsync'd.
"""

from __future__ import annotations

import errno
import json
import math
import mmap
import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

DTYPES = {
    torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}
_ALIGN = 4096  # O_DIRECT: buffer address, file offset and length in multiples of the logical block
CHUNK = 8 << 20  # bytes per write; a multiple of _ALIGN


def safetensors_layout(
    specs: dict[str, tuple[torch.dtype, list[int]]],
) -> tuple[bytes, dict[str, int]]:
    """(header bytes with its length prefix, name -> absolute byte offset) for tensors of these dtypes and
    shapes. Widest dtypes first, then by name, so every tensor starts aligned to its element size and can
    be mapped without a copy."""
    entries: dict[str, dict[str, object]] = {}
    where: dict[str, int] = {}
    offset = 0
    for name in sorted(specs, key=lambda n: (-specs[n][0].itemsize, n)):
        dtype, shape = specs[name]
        size = math.prod(shape) * dtype.itemsize
        entries[name] = {"dtype": DTYPES[dtype], "shape": list(shape),
                         "data_offsets": [offset, offset + size]}
        where[name] = offset
        offset += size
    header = json.dumps(entries, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    start = 8 + len(header)
    return struct.pack("<Q", len(header)) + header, {k: start + o for k, o in where.items()}


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of a CPU tensor (copied only if it is not contiguous)."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data


def write_safetensors(path: str | Path, tensors: dict[str, torch.Tensor]) -> dict[str, list[int]]:
    """Write `tensors` as one safetensors file, durably (data on disk when this returns; the caller
    still fsyncs the directory that names it). Returns each tensor's shape."""
    specs = {name: (t.dtype, list(t.shape)) for name, t in tensors.items()}
    shapes = {name: shape for name, (_, shape) in specs.items()}
    header, where = safetensors_layout(specs)
    pieces = [memoryview(header)] + [tensor_bytes(tensors[n]) for n in sorted(where, key=where.__getitem__)]
    total = sum(p.nbytes for p in pieces)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    direct = getattr(os, "O_DIRECT", 0)
    if direct and total >= CHUNK:  # below one buffer, first touching the buffer costs more than it saves
        try:
            fd = os.open(path, flags | direct, 0o644)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
        else:
            try:
                if _write_direct(fd, pieces, total):
                    return shapes
            finally:
                os.close(fd)
    fd = os.open(path, flags, 0o644)
    try:
        for piece in pieces:
            _write_all(fd, piece)
        os.fsync(fd)
    finally:
        os.close(fd)
    return shapes


def _write_direct(fd: int, pieces: list[memoryview], total: int) -> bool:
    """Stream `pieces` through one page-aligned buffer in whole blocks, pad the last block, cut the file
    to `total` and fsync. False if the file system refuses the first direct write (nothing written)."""
    buf = mmap.mmap(-1, CHUNK)
    view = memoryview(buf)
    try:
        first = True
        for block in _fill(view, pieces):
            padded = block + (-block % _ALIGN)
            view[block:padded] = bytes(padded - block)
            try:
                _write_all(fd, view[:padded])
            except OSError as exc:
                if first and exc.errno == errno.EINVAL:
                    return False
                raise
            first = False
        os.ftruncate(fd, total)
        os.fsync(fd)
        return True
    finally:
        view.release()
        buf.close()


def _fill(view: memoryview, pieces: Iterable[memoryview]) -> Iterator[int]:
    """Copy `pieces` into `view` one after the other; yield the filled length each time it is full and
    once more for the remainder."""
    used = 0
    for piece in pieces:
        off = 0
        while off < piece.nbytes:
            n = min(view.nbytes - used, piece.nbytes - off)
            view[used : used + n] = piece[off : off + n]
            used, off = used + n, off + n
            if used == view.nbytes:
                yield used
                used = 0
    if used:
        yield used


def _write_all(fd: int, data: memoryview) -> None:
    while data.nbytes:
        n = os.write(fd, data)
        data = data[n:]


def fsync_path(path: str | Path) -> None:
    """Flush one file's data, or one directory's entries, to disk."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if Path(path).is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit_file(src: str | Path, dst: str | Path) -> None:
    """Rename a written file into place durably: its data, then the rename, flushed to disk."""
    fsync_path(src)
    os.replace(src, dst)
    fsync_path(Path(dst).parent)


def fsync_tree(root: str | Path) -> None:
    """fsync every file and directory under `root`, and `root` itself: a tree about to be renamed into
    place. Files already written durably cost a system call each."""
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            fsync_path(os.path.join(dirpath, name))
        fsync_path(dirpath)

