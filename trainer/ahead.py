"""A run's next step inputs made on a host thread while the device learns from the current one.

Why: on a GPU a step's host part (sampling, index work, the packed copies) and the launches of its device
part each take milliseconds; one after the other they bound the step, side by side only the longer does.
One producer thread and a short queue keep the order, so the steps are the very steps of a run without
it: the sampler is drawn from that thread alone, and each input carries the sampler's state after it was
made, which is what a checkpoint taken after that step must record.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

import torch

__all__ = ["Made", "made_ahead"]

T = TypeVar("T")

# a queue this deep keeps the device fed through a slow host step without holding many batches' copies
DEPTH = 3
_POLL_S = 0.1


class Made(Generic[T]):
    """A step's position in the epoch, its inputs and the sampler's state once they were made; both None
    when nothing is made ahead (the step makes its own, and the sampler's state is the current one)."""

    __slots__ = ("inputs", "pos", "sampler_state")

    def __init__(self, pos: int, inputs: T | None, sampler_state: torch.Tensor | None) -> None:
        self.pos, self.inputs, self.sampler_state = pos, inputs, sampler_state


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_DONE = object()


@contextmanager
def made_ahead(make: Callable[[int], T], positions: range, sampler_state: Callable[[], torch.Tensor],
               threaded: bool) -> Iterator[Iterator[Made[T]]]:
    """Each position in order with its inputs `make(pos)` made up to DEPTH steps ahead on a thread
    (stopped and joined when the block ends, early or not); without `threaded`, the positions alone."""
    if not threaded:
        yield (Made(pos, None, None) for pos in positions)
        return
    ready: queue.Queue[object] = queue.Queue(maxsize=DEPTH)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for pos in positions:
                made = Made(pos, make(pos), sampler_state())
                if not put(made):
                    return
            put(_DONE)
        except BaseException as exc:  # the consumer re-raises it as its own
            put(_Failed(exc))

    thread = threading.Thread(target=produce, name="ovex-steps-ahead", daemon=True)
    thread.start()

    def consume() -> Iterator[Made[T]]:
        while True:
            item = ready.get()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.exc
            yield item  # type: ignore[misc]

    try:
        yield consume()
    finally:
        stop.set()
        thread.join()
