"""Micro-batching between the HTTP layer and the predictor.

Requests wait in an asyncio queue; one loop takes the first, gathers more for at most `window` seconds
(or until `max_rows` input rows; no wait when the previous batch was a lone request), and runs them in
one predictor call on a single compute thread. While that call runs, new requests queue up and form the
next batch, so under load batches grow by themselves and at concurrency 1 a request waits at most the
window. A single-input request that came alone, with nothing queued behind it, after a batch that was
alone too, is computed on the event loop's own thread instead: the hand-off to the compute thread and
back costs two thread wake-ups, a visible share of such a request's latency, and there is nothing for
the loop to read meanwhile. One input takes milliseconds even at 10^7 labels, so the loop is never held
long; that computation cannot time out midway (the request gets its answer when it ends). Each queued
item carries the predictor it pinned when it arrived, so a hot swap never mixes versions within a
request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from service.serving.predictor import Predictor, Query, RowPrediction

log = logging.getLogger("ovex.batching")

JobResult = list[RowPrediction] | Exception


@dataclass
class _Item:
    predictor: Predictor
    query: Query
    future: asyncio.Future[JobResult]
    enqueued: float = field(default_factory=time.perf_counter)


class MicroBatcher:
    """One queue, one compute thread (and the loop's own for a lone request): never two computes at once.
    `submit` never hangs: it times out with `TimeoutError`."""

    def __init__(
        self,
        window_s: float,
        max_rows: int,
        on_batch: Callable[[int, int], None] | None = None,
        thread_init: Callable[[], None] | None = None,
    ) -> None:
        self.window_s = window_s
        self.max_rows = max_rows
        self.on_batch = on_batch
        self._queue: asyncio.Queue[_Item] | None = None
        self._last_requests = 0
        self._task: asyncio.Task[None] | None = None
        # OpenMP thread counts are per calling thread: the compute thread must set its own (thread_init)
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="ovex-predict", initializer=thread_init
        )

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self._run(), name="ovex-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, predictor: Predictor, query: Query, timeout_s: float) -> list[RowPrediction]:
        """Queue one request's rows; returns its predictions or raises what the predictor raised for it."""
        if self._queue is None:
            raise RuntimeError("batcher not started")
        fut: asyncio.Future[JobResult] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Item(predictor, query, fut))
        res = await asyncio.wait_for(fut, timeout_s)
        if isinstance(res, Exception):
            raise res
        return res

    async def _gather(self, first: _Item) -> list[_Item]:
        assert self._queue is not None
        batch = [first]
        rows = len(first.query.rows)
        # Wait for company only when the last batch had some: a lone client (concurrency 1) would
        # otherwise pay the whole window on every request for nothing.
        window = self.window_s if self._last_requests > 1 else 0.0
        deadline = time.perf_counter() + window
        while rows < self.max_rows:
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
            batch.append(item)
            rows += len(item.query.rows)
        return batch

    async def _run(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            first = await self._queue.get()
            batch = await self._gather(first)
            # inline only in a lone streak: under load one lone batch is chance, and computing it on the
            # loop would stop the loop reading the requests that make the next batch big
            streak = self._last_requests == 1
            self._last_requests = len(batch)
            live = [it for it in batch if not it.future.done()]  # timed-out callers are gone
            if not live:
                continue
            try:
                if streak and len(live) == 1 and len(live[0].query.rows) == 1 and self._queue.empty():
                    results = self._compute(live)
                else:
                    results = await loop.run_in_executor(self._executor, self._compute, live)
            except Exception as exc:  # the executor itself failed: fail this batch, keep serving
                log.exception("batch failed")
                results = [exc] * len(live)
            for it, res in zip(live, results, strict=True):
                if not it.future.done():
                    it.future.set_result(res)

    def _compute(self, items: list[_Item]) -> list[JobResult]:
        """One predictor call per distinct pinned model in the batch (on the compute thread, or on the
        loop's for a lone request; the app gives both threads the same torch/BLAS settings)."""
        groups: dict[int, list[int]] = {}
        for i, it in enumerate(items):
            groups.setdefault(id(it.predictor), []).append(i)
        out: list[JobResult] = [RuntimeError("not computed")] * len(items)
        for idx in groups.values():
            pred = items[idx[0]].predictor
            queries = [items[i].query for i in idx]
            n_rows = sum(len(j.rows) for j in queries)
            if self.on_batch is not None:
                self.on_batch(n_rows, len(queries))
            for i, res in zip(idx, pred.predict_queries_safe(queries), strict=True):
                out[i] = res
        return out
