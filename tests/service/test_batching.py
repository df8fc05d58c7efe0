"""Micro-batcher: concurrent requests share predictor calls, versions never mix, callers never hang."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from service.serving.batching import MicroBatcher
from service.serving.predictor import InputRow, Options, Query, RowPrediction


class FakePredictor:
    """Records the queries of each call; answers every row with its own tag so mixing would show."""

    def __init__(self, tag: str, delay: float = 0.0) -> None:
        self.tag = tag
        self.delay = delay
        self.calls: list[int] = []
        self.threads: set[str] = set()

    def predict_queries_safe(self, queries: list[Query]) -> list[Any]:
        self.calls.append(len(queries))
        self.threads.add(threading.current_thread().name)
        time.sleep(self.delay)
        out: list[Any] = []
        for j in queries:
            if j.rows and j.rows[0].text == "boom":
                out.append(ValueError("bad row"))
            else:
                out.append([RowPrediction([], certified=self.tag == "a")] * len(j.rows))
        return out


def _query(text: str = "x", n: int = 1) -> Query:
    return Query([InputRow(text=text)] * n, Options())


def test_concurrent_requests_are_batched_per_predictor() -> None:
    a, b = FakePredictor("a", delay=0.02), FakePredictor("b", delay=0.02)
    calls: list[tuple[int, int]] = []

    async def main() -> list[Any]:
        mb = MicroBatcher(0.005, 64, on_batch=lambda rows, reqs: calls.append((rows, reqs)))
        await mb.start()
        try:
            return await asyncio.gather(*[mb.submit(a if i % 2 else b, _query(), 5) for i in range(40)])
        finally:
            await mb.stop()

    res = asyncio.run(main())
    assert [r[0].certified for r in res] == [bool(i % 2) for i in range(40)]  # each answered by its own
    assert sum(a.calls) == 20 and sum(b.calls) == 20
    assert max(a.calls) > 1  # batched, not one call per request
    assert a.threads == b.threads and len(a.threads) == 1  # one compute thread
    assert sum(r for r, _ in calls) == 40


def test_max_rows_bounds_a_batch_and_errors_stay_with_their_request() -> None:
    p = FakePredictor("a", delay=0.01)

    async def main() -> list[Any]:
        mb = MicroBatcher(0.01, 4, None)
        await mb.start()
        try:
            queries = [_query("boom" if i == 3 else "x", 2) for i in range(10)]
            return await asyncio.gather(*[mb.submit(p, j, 5) for j in queries], return_exceptions=True)
        finally:
            await mb.stop()

    res = asyncio.run(main())
    assert isinstance(res[3], ValueError)
    assert all(isinstance(r, list) and len(r) == 2 for i, r in enumerate(res) if i != 3)
    assert max(p.calls) <= 2  # 4 rows at most: two 2-row queries


def test_submit_times_out_instead_of_hanging() -> None:
    slow = FakePredictor("a", delay=0.5)

    async def main() -> None:
        mb = MicroBatcher(0.0, 8, None)
        await mb.start()
        try:
            with pytest.raises(TimeoutError):  # two inputs: computed on the compute thread
                await mb.submit(slow, _query(n=2), 0.05)
        finally:
            await mb.stop()

    asyncio.run(main())


def test_a_lone_request_is_computed_on_the_loop_thread_and_a_batch_on_the_compute_thread() -> None:
    """A single-input request alone (nothing queued behind it), after a batch that was alone too, skips
    the two thread hand-offs. Requests that queue up together, one that carries several inputs, and a
    lone one right after a batch go to the compute thread, so under load the loop keeps reading requests
    while a batch computes."""
    a = FakePredictor("a", delay=0.02)

    async def main() -> dict[str, set[str]]:
        mb = MicroBatcher(0.005, 64)
        await mb.start()
        seen: dict[str, set[str]] = {}

        async def threads(name: str, *queries: Query) -> None:
            a.threads.clear()
            await asyncio.gather(*[mb.submit(a, j, 5) for j in queries])
            seen[name] = set(a.threads)

        try:
            await threads("first", _query())  # alone, but no lone batch before it
            await threads("lone", _query())
            await threads("together", *[_query() for _ in range(6)])
            await threads("after a batch", _query())
            await threads("three inputs", _query(n=3))
            await threads("lone again", _query())
        finally:
            await mb.stop()
        return seen

    seen = asyncio.run(main())
    loop_thread = {threading.current_thread().name}
    assert seen["lone"] == seen["lone again"] == loop_thread, seen
    for name in ("first", "together", "after a batch", "three inputs"):
        assert len(seen[name]) == 1 and next(iter(seen[name])).startswith("ovex-predict"), (name, seen)
