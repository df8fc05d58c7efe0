"""How the serving processes of one `ovex serve --workers N` confirm an activation to each other.

An activation is done by the serving process that received it (it loads, records in the database, swaps); the
others serve what the database says, which they read every `active_poll_s`. So that the activation's answer
holds for every serving process of the server, the activating serving process asks the others to follow now
and waits until each has.

The supervisor makes, before its first fork, one shared block with three numbers per slot: the pid serving in
it (0: none), the last time (`CLOCK_MONOTONIC`, one clock for every process of the machine) its serving
process *asked* the others to follow, and the time its serving process last started a read of the database
that it then *followed* completely. Each number has one writer (the slot's serving process; the supervisor
only when the slot has no live serving process), so no lock is needed. A pipe per slot wakes the serving
process in it at once. Asking is: take the time T after the record committed, publish it, wake the others;
confirming is: every slot that holds a live serving process has followed from a read started at T or later,
which therefore saw the record (or a later one).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import select
import time

FIELDS = 3  # pid, asked, followed
_PID, _ASKED, _FOLLOWED = range(FIELDS)
CONFIRM_TICK_S = 0.001  # how often a waiting activation re-reads the others' slots
STARTING = -1  # the pid of a slot whose serving process is being forked


class Peers:
    """The shared block and wake-up pipes of the N slots of serving processes; made by the supervisor
    before any fork, inherited by every process it forks (replacements included)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._mm = mmap.mmap(-1, 8 * FIELDS * max(n, 1))
        self._cells = (ctypes.c_int64 * (FIELDS * max(n, 1))).from_buffer(self._mm)
        self.pipes: list[tuple[int, int]] = []
        for _ in range(n):
            read_end, write_end = os.pipe()
            os.set_blocking(read_end, False)
            os.set_blocking(write_end, False)
            self.pipes.append((read_end, write_end))

    def read(self, index: int, field: int) -> int:
        return int(self._cells[FIELDS * index + field])

    def write(self, index: int, field: int, value: int) -> None:
        self._cells[FIELDS * index + field] = value

    # -- the supervisor's side ----------------------------------------------------------------------
    def vacate(self, index: int) -> None:
        """Slot `index` holds no live serving process (its process was reaped): nobody waits for it."""
        self.write(index, _PID, 0)
        self.write(index, _FOLLOWED, 0)

    def starting(self, index: int) -> None:
        """Slot `index` is about to get a new serving process, which has followed nothing yet: waited for
        from now on (it confirms once its start-up has read the database)."""
        self.write(index, _FOLLOWED, 0)
        self.write(index, _PID, STARTING)

    def occupy(self, index: int, pid: int) -> None:
        """Slot `index` now holds the serving process `pid` (written by the parent and the child alike)."""
        self.write(index, _PID, pid)

    # -- a serving process's side -------------------------------------------------------------------
    def process(self, index: int) -> Siblings:
        """The view of the serving process in slot `index`."""
        return Siblings(self, index)


class Siblings:
    """One serving process's side of `Peers`: ask the others to follow, confirm they did, follow when
    asked."""

    def __init__(self, peers: Peers, index: int) -> None:
        self.peers, self.index = peers, index

    @property
    def others(self) -> list[int]:
        return [i for i in range(self.peers.n) if i != self.index]

    def ask(self) -> int:
        """Ask every other serving process to follow the database now; returns the time to `confirm` against.
        Call it after the database committed what they must see."""
        stamp = time.monotonic_ns()
        self.peers.write(self.index, _ASKED, stamp)
        for i in self.others:
            with contextlib.suppress(BlockingIOError, BrokenPipeError):  # full: a wake-up is pending anyway
                os.write(self.peers.pipes[i][1], b"!")
        return stamp

    def pending(self, stamp: int) -> list[int]:
        """The slots whose live serving process has not followed from a read started at `stamp` or later."""
        p = self.peers
        return [i for i in self.others if p.read(i, _PID) != 0 and p.read(i, _FOLLOWED) < stamp]

    def confirm(self, stamp: int, timeout_s: float) -> tuple[int, int]:
        """Wait (blocking: call it off the event loop) until every live other serving process followed from a
        read started at `stamp` or later, for at most `timeout_s`. Returns (serving processes serving what was
        recorded, serving processes alive), this one included in both."""
        deadline = time.monotonic() + timeout_s
        while (behind := self.pending(stamp)) and time.monotonic() < deadline:
            time.sleep(CONFIRM_TICK_S)
        alive = 1 + sum(1 for i in self.others if self.peers.read(i, _PID) != 0)
        return alive - len(behind), alive

    def wait(self, timeout_s: float) -> bool:
        """Sleep until another serving process asks this one to follow, or `timeout_s` passes; True when
        asked."""
        fd = self.peers.pipes[self.index][0]
        with contextlib.suppress(InterruptedError):
            select.select([fd], [], [], max(0.0, timeout_s))
        with contextlib.suppress(BlockingIOError):
            while os.read(fd, 4096):
                pass
        return self.asked_since_followed()

    def asked_since_followed(self) -> bool:
        p = self.peers
        return max((p.read(i, _ASKED) for i in self.others), default=0) > p.read(self.index, _FOLLOWED)

    def followed(self, stamp: int) -> None:
        """This serving process serves what a database read started at `stamp` said."""
        if stamp > self.peers.read(self.index, _FOLLOWED):
            self.peers.write(self.index, _FOLLOWED, stamp)

    def wake(self) -> None:
        """Wake this serving process's own `wait` (to stop it)."""
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(self.peers.pipes[self.index][1], b"!")


_this_process: Siblings | None = None


def join(peers: Peers, index: int) -> Siblings:
    """In a forked serving process: take slot `index`; `this_process()` returns it from now on."""
    global _this_process
    peers.occupy(index, os.getpid())
    _this_process = peers.process(index)
    return _this_process


def this_process() -> Siblings | None:
    """This process's place among the serving processes of `ovex serve --workers N`; None when it serves
    alone."""
    return _this_process
