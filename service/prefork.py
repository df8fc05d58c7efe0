"""`ovex serve --workers N`: a supervisor imports the serving code once, then forks N serving processes.

Forked serving processes share the supervisor's imported code and data (torch, faiss, numpy, numba, the app's
modules) copy-on-write, and the weights are memory-mapped, so N serving processes cost about one copy of both
plus what each builds for itself. Before a fork the supervisor only imports: it starts no thread, runs no
torch/OpenMP parallel region, builds no app and loads no model. Each serving process sets its own thread
counts, builds its app, loads its models and indexes, follows the active versions, and serves the socket the
supervisor bound. The supervisor replaces a serving process that dies or whose event loop stops beating, hands
SIGTERM/SIGINT on to every serving process, and runs the one job worker for the group. It also keeps, in
shared memory, which serving process serves in which slot (`service.serving.peers`): an activation waits for
the live ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import importlib
import logging
import mmap
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, NoReturn

import uvicorn

from service.serving.peers import Peers, join

if TYPE_CHECKING:
    from service.training.runtime import EmbeddedWorker

log = logging.getLogger("ovex.serve")

# what a serving process imports on its way to serving, imported once here so every fork shares it; each is
# import-only: no thread pool, no model, no connection
PRELOAD = (
    "service.app",
    "trainer.artifact",
    "trainer.featurize",
    "safetensors.torch",
    "sqlalchemy.dialects.sqlite",
    "service.serving.quantized_scan",
    "numba",
    "uvicorn.lifespan.on",
    "uvicorn.loops.asyncio",
    "uvicorn.protocols.http.h11_impl",
    "uvicorn.protocols.http.httptools_impl",
    "uvicorn.protocols.websockets.auto",
)

GRACE_S = 15.0  # a serving process told to stop gets this long (uvicorn's own graceful shutdown is shorter)
FAST_EXIT_S = 10.0  # a serving process that dies this soon after its start is restarted with a back-off
MAX_BACKOFF_S = 30.0
TICK_S = 0.1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
BEAT_TICKS = 10  # uvicorn ticks every 0.1 s: one heartbeat a second
START_GRACE_S = 60.0  # to import the app and start its lifespan, before the first heartbeat


def preload() -> None:
    """Import what every serving process needs (modules that are not installed are left to the process),
    and compile the int8 scan kernel, whose machine code the processes then share instead of each loading
    it."""
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    _compile_scan_kernel()


def _compile_scan_kernel() -> None:
    """One tiny scan per kind of arrays a serving process passes (all writable when it built the index; codes
    copied, the small arrays and the cell offsets read-only when it read the cache): one thread, no model."""
    import numpy as np

    from service.serving.quantized_scan import Int8Head, quantize_query, scan_cells

    d = 4
    for from_cache in (False, True):
        small = [np.ones(2, np.float32) for _ in range(4)]
        offsets = np.array([0, 2], np.int64)
        for a in small:
            a.setflags(write=not from_cache)
        offsets.setflags(write=not from_cache)
        head = Int8Head(np.zeros((2, d), np.int8), *small)
        h, cells = np.ones(d, np.float32), np.array([0], np.int64)
        scan_cells(head, offsets, quantize_query(h), cells, np.full(1, np.inf), 1, None)


def _die_with_parent() -> None:
    """Ask Linux to send this serving process SIGTERM when the supervisor dies, even by SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


@dataclass
class Slot:
    """One of the N places of a serving process: the process in it now and how its last restarts went."""

    index: int
    pid: int | None = None
    beats: int | None = None  # read end of the serving process's heartbeat pipe
    last_beat: float = 0.0
    beating: bool = False  # its event loop has run (before that it is starting: more time allowed)
    started: float = 0.0
    restart_at: float = 0.0
    backoff_s: float = 0.0
    restarts: int = 0


NOT_LISTENING = 2**62  # the open-connection count of a serving process slot that takes no connections
DEFER_S = 0.002  # a serving process holding more connections than another leaves a new one to it this long...
MAX_DEFERS = 10  # ...this many times in a row at most (a busy or hung serving process never strands a client)


class Loads:
    """Open connections per serving process, in an anonymous shared mapping made before the first fork, so
    each process sees the others' counts. A slot whose process takes no connections (not started, loading,
    stopped, dead) reads NOT_LISTENING."""

    def __init__(self, n: int) -> None:
        self._mm = mmap.mmap(-1, 8 * max(n, 1))
        self.counts = (ctypes.c_int64 * max(n, 1)).from_buffer(self._mm)
        for i in range(n):
            self.counts[i] = NOT_LISTENING

    def least_other(self, index: int) -> int:
        return min((c for i, c in enumerate(self.counts) if i != index), default=NOT_LISTENING)


class FairAcceptor:
    """Takes connections from the listening socket the serving processes share, one per wake-up of this
    process's event loop, and only while no other process holds fewer (`Loads`); hands each to the protocol as
    asyncio's own server would.

    Why not `loop.create_server`: it accepts every pending connection at each wake-up, so when a client
    opens its pool of connections at once, the first process to wake takes all of them and keeps them for
    their whole life, while the other processes idle. Here a process with more connections than another
    leaves a new one to it, for at most DEFER_S × MAX_DEFERS."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol: Callable[[], asyncio.Protocol],
        open_connections: Callable[[], int],
        loads: Loads,
        index: int,
    ) -> None:
        self.loop, self.sock, self.protocol = loop, sock, protocol
        self.open_connections, self.loads, self.index = open_connections, loads, index
        self.closed = False
        self._deferred = 0
        self._handshakes: set[asyncio.Task[object]] = set()
        sock.setblocking(False)
        self.publish()
        loop.add_reader(sock.fileno(), self._accept)

    def publish(self) -> int:
        """Write this process's open connections (set up or being set up) where the others read them."""
        mine = self.open_connections() + len(self._handshakes)
        self.loads.counts[self.index] = NOT_LISTENING if self.closed else mine
        return mine

    def _accept(self) -> None:
        if self.publish() > self.loads.least_other(self.index) and self._deferred < MAX_DEFERS:
            self._deferred += 1
            self._pause(DEFER_S)
            return
        self._deferred = 0
        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return  # another serving process took it, or the client gave up
        except OSError as exc:  # out of file descriptors, say: pause rather than spin on a readable socket
            log.warning("accept failed; pausing new connections for 0.1 s", extra={"error": str(exc)})
            self._pause(0.1)
            return
        conn.setblocking(False)
        task = self.loop.create_task(self.loop.connect_accepted_socket(self.protocol, conn))
        self._handshakes.add(task)
        task.add_done_callback(self._connected)
        self.publish()

    def _connected(self, task: asyncio.Task[object]) -> None:
        self._handshakes.discard(task)
        if not task.cancelled() and task.exception() is not None:  # reset before it was set up: gone
            log.debug("connection lost while being set up", extra={"error": str(task.exception())})
        self.publish()

    def _pause(self, seconds: float) -> None:
        """Stop watching the socket for a while (it stays readable: watching it would spin)."""
        self.loop.remove_reader(self.sock.fileno())
        self.loop.call_later(seconds, self._resume)

    def _resume(self) -> None:
        if not self.closed:
            self.loop.add_reader(self.sock.fileno(), self._accept)

    def close(self) -> None:
        """Stop taking connections (uvicorn's shutdown calls this, as it would on its own servers)."""
        if not self.closed:
            self.closed = True
            self.loop.remove_reader(self.sock.fileno())
            self.publish()

    async def wait_closed(self) -> None:
        return None


class HeartbeatServer(uvicorn.Server):
    """uvicorn's server, telling the supervisor once a second that its event loop still runs, and taking
    connections from the shared socket so that the serving processes hold about as many each (`FairAcceptor`).

    A replacement serving process takes connections only once its models are loaded: until then the
    processes already serving answer everything on the shared socket, where a connection it took would get
    503s."""

    def __init__(
        self, config: uvicorn.Config, beat_fd: int, listen_when_loaded: bool, loads: Loads, index: int
    ) -> None:
        super().__init__(config)
        self.beat_fd = beat_fd
        self.listen_when_loaded = listen_when_loaded
        self.loads, self.index = loads, index
        self.acceptors: list[FairAcceptor] = []

    def _beat(self) -> None:
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(self.beat_fd, b".")

    async def on_tick(self, counter: int) -> bool:
        if counter % BEAT_TICKS == 0:
            self._beat()
        for acceptor in self.acceptors:  # connections closed since the last accept leave the count
            acceptor.publish()
        return await super().on_tick(counter)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        from service.app import MODELS_LOADED  # imported by the serving process: after metrics mode is set

        await super().startup(sockets=[])  # the lifespan only (models load in its thread), no listener yet
        if self.listen_when_loaded:
            loaded = self.lifespan.state.get(MODELS_LOADED)
            while loaded is not None and not loaded.is_set() and not self.should_exit:
                self._beat()
                await asyncio.sleep(TICK_S)
        if self.should_exit:
            return
        config, loop = self.config, asyncio.get_running_loop()

        def protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )

        for sock in sockets or []:
            sock.listen(config.backlog)
            acceptor = FairAcceptor(
                loop, sock, protocol, lambda: len(self.server_state.connections), self.loads, self.index
            )
            self.acceptors.append(acceptor)
            self.servers.append(acceptor)  # type: ignore[arg-type]  # uvicorn's shutdown closes it


class Supervisor:
    """Forks and watches the serving processes; single-threaded, so every fork happens with no other
    thread."""

    def __init__(
        self,
        config: uvicorn.Config,
        sock: socket.socket,
        processes: int,
        jobs: EmbeddedWorker | None,
        metrics_dir: Path,
        hang_s: float,
    ) -> None:
        self.config = config
        self.hang_s = hang_s
        self.metrics_dir = metrics_dir
        self.sock = sock
        self.slots = [Slot(i) for i in range(processes)]
        self.loads = Loads(processes)
        self.peers = Peers(processes)
        self.jobs = jobs
        self.stop_signal: int | None = None

    # -- the serving process side --------------------------------------------------------------------------
    def _serve_in_child(self, index: int, beat_fd: int, listen_when_loaded: bool) -> NoReturn:
        code = 1
        try:
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)  # uvicorn installs its own while it serves
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            _die_with_parent()
            if os.getppid() == 1:  # the supervisor died before the death signal was asked for
                os._exit(0)
            for slot in self.slots:  # the other serving processes' heartbeats are the supervisor's to read
                if slot.beats is not None:
                    os.close(slot.beats)
            join(self.peers, index)  # before the app is built: its registry follows from this slot
            server = HeartbeatServer(self.config, beat_fd, listen_when_loaded, self.loads, index)
            server.run(sockets=[self.sock])
            code = 0
        except BaseException:
            log.exception("serving process failed")
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code)

    # -- the supervisor side ----------------------------------------------------------------------
    def _fork(self, slot: Slot) -> None:
        # blocked across the fork: a stop signal reaches the child only once its own handlers are set
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        os.set_blocking(write_end, False)
        self.loads.counts[slot.index] = NOT_LISTENING  # until the new serving process listens
        self.peers.starting(slot.index)  # the new serving process has followed nothing yet
        pid = os.fork()
        if pid == 0:
            self._serve_in_child(slot.index, write_end, listen_when_loaded=slot.restarts > 0)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        os.close(write_end)
        self.peers.occupy(slot.index, pid)  # (the child writes the same)
        slot.pid, slot.beats = pid, read_end
        slot.started = slot.last_beat = time.monotonic()
        slot.beating = False
        log.info("serving process started", extra={"slot": slot.index, "pid": pid})

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self.stop_signal = sig

    def _reap(self) -> None:
        # imported here, after run_serving_processes switched the library to its multiprocess mode
        from prometheus_client.multiprocess import mark_process_dead

        now = time.monotonic()
        for slot in self.slots:
            if slot.pid is None:
                continue
            pid, status = os.waitpid(slot.pid, os.WNOHANG)
            if pid == 0:
                continue
            lived = now - slot.started
            slot.pid = None
            self.loads.counts[slot.index] = NOT_LISTENING  # its connections died with it
            self.peers.vacate(slot.index)  # an activation no longer waits for it
            if slot.beats is not None:
                os.close(slot.beats)
                slot.beats = None
            # its gauges leave the sum (its counters stay: what it served was served)
            mark_process_dead(pid, str(self.metrics_dir))
            slot.restarts += 1
            # a serving process that keeps dying at start (a model that crashes it) is not restarted in a
            # hot loop
            slot.backoff_s = min(MAX_BACKOFF_S, max(1.0, 2 * slot.backoff_s)) if lived < FAST_EXIT_S else 0.0
            slot.restart_at = now + slot.backoff_s
            log.warning(
                "serving process exited; restarting",
                extra={
                    "slot": slot.index,
                    "pid": pid,
                    "status": _describe(status),
                    "restart_in_s": slot.backoff_s,
                    "restarts": slot.restarts,
                },
            )

    def _check_beats(self) -> None:
        """SIGKILL a serving process whose event loop has not beaten for `hang_s` (it is then replaced)."""
        now = time.monotonic()
        for slot in self.slots:
            if slot.pid is None or slot.beats is None:
                continue
            try:
                if os.read(slot.beats, 4096):
                    slot.last_beat, slot.beating = now, True
            except BlockingIOError:
                pass
            silent = now - slot.last_beat
            if silent > (self.hang_s if slot.beating else max(self.hang_s, START_GRACE_S)):
                log.warning(
                    "serving process unresponsive; killing it",
                    extra={"slot": slot.index, "pid": slot.pid, "silent_s": round(silent, 1)},
                )
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.pid, signal.SIGKILL)
                slot.last_beat = now

    def run(self) -> int:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        # libuv (uvloop) accepts one connection per wakeup and yields: every idle serving process wakes on the
        # shared socket, so a burst of connections is dealt out instead of taken by the first awake
        os.environ.setdefault("UV_TCP_SINGLE_ACCEPT", "1")
        gc.collect()
        gc.freeze()  # the collector never writes to the imported objects, so their pages stay shared
        try:
            for slot in self.slots:
                self._fork(slot)
            if self.jobs is not None:
                self.jobs.start(watch=False)  # restarted from this loop: no thread in a process that forks
            while self.stop_signal is None:
                self._check_beats()
                self._reap()
                now = time.monotonic()
                for slot in self.slots:
                    if slot.pid is None and now >= slot.restart_at and self.stop_signal is None:
                        self._fork(slot)
                if self.jobs is not None:
                    self.jobs.check()
                time.sleep(TICK_S)
        finally:
            self._shutdown()
        return 0

    def _shutdown(self) -> None:
        """SIGTERM to every serving process (and the job worker), then SIGKILL to whatever outlives the
        grace."""
        live = [s.pid for s in self.slots if s.pid is not None]
        log.info("stopping serving processes", extra={"signal": self.stop_signal, "processes": len(live)})
        for pid in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        if self.jobs is not None:
            self.jobs.stop()
        deadline = time.monotonic() + GRACE_S
        while live:
            live = [pid for pid in live if os.waitpid(pid, os.WNOHANG)[0] == 0]
            if live and time.monotonic() > deadline:
                for pid in live:
                    log.warning("serving process did not stop in time; killing it", extra={"pid": pid})
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                live = []
            time.sleep(TICK_S)
        self.sock.close()


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"
