"""A step's host tensors to the training device in one copy per dtype, from pinned memory, asynchronously.

Why: on a GPU a step's index work (distinct input features, sampled negatives, positive pairs) is done on
the host, where its data-dependent sizes never make the device wait; what it yields is a dozen small
tensors. Sent one by one they cost a dozen transfers, each stalling the host when it leaves pageable
memory; packed into one pinned buffer per dtype they cost one asynchronous copy each, queued behind the
previous step's kernels. On the CPU nothing moves.
"""

from __future__ import annotations

import torch

__all__ = ["Packed", "pack", "to_device", "unpack"]

# per dtype: the buffer holding every tensor of that dtype flattened end to end, their names and shapes
Packed = dict[torch.dtype, tuple[torch.Tensor, list[tuple[str, torch.Size]]]]


def pack(tensors: dict[str, torch.Tensor], pin: bool = False) -> Packed:
    """The tensors grouped by dtype, each group concatenated (flattened) into one (pinned) buffer."""
    groups: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
    for name, t in tensors.items():
        groups.setdefault(t.dtype, []).append((name, t))
    out: Packed = {}
    for dtype, items in groups.items():
        size = sum(t.numel() for _, t in items)
        buf = torch.empty(size, dtype=dtype, pin_memory=pin)
        torch.cat([t.reshape(-1) for _, t in items], out=buf)
        out[dtype] = (buf, [(name, t.shape) for name, t in items])
    return out


def unpack(packed: Packed) -> dict[str, torch.Tensor]:
    """The named tensors back from their buffers (views of them, in the buffers' device)."""
    out: dict[str, torch.Tensor] = {}
    for buf, layout in packed.values():
        start = 0
        for name, shape in layout:
            n = shape.numel()
            out[name] = buf[start : start + n].view(shape)
            start += n
    return out


def to_device(tensors: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """The tensors on `device` (those already there as they are): to a GPU, one non-blocking copy per
    dtype from a pinned buffer, so the host goes on queueing work."""
    away = {name: t for name, t in tensors.items() if t.device != device}
    if not away:
        return tensors
    if device.type != "cuda":
        moved = {name: t.to(device) for name, t in away.items()}
    else:
        packed = pack({name: t.cpu() for name, t in away.items()}, pin=True)
        moved = unpack({dtype: (buf.to(device, non_blocking=True), layout)
                        for dtype, (buf, layout) in packed.items()})
    return {**tensors, **moved}
