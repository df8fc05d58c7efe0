"""A job that ends between the event stream's two reads (events, then the job row) still ends the stream
with its real final event and its activation, not a made-up final state without one."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from service.db.engine import make_engine, migrate
from service.db.tables import SUCCEEDED, DatasetRow
from service.settings import Settings
from service.training.config import JobsConfig
from service.training.service import JobsService
from service.training.store import JobStore


def test_a_job_ending_between_the_two_reads_ends_the_stream_with_its_activation(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'jobs.db'}")
    migrate(engine)
    store = JobStore(engine)
    store.add_dataset(
        DatasetRow(id="ds_1", name="d", checksum="0" * 64, format="xc", filename="d.txt", size_bytes=10,
                   rows=3, features=4, labels=5, created_at=time.time())
    )
    job = store.create_job(model="m", train_dataset="ds_1", test_dataset=None, params={}, activate=True)
    assert store.claim_next("w1") is not None
    settings = Settings(data_dir=tmp_path, models_dir=tmp_path / "models", job_poll_s=0.01)
    jobs = JobsService(JobsConfig(settings), store)

    real = store.events_since
    ended = False

    def racing(job_id: str, after: int, kinds: Any = None, limit: int = 1000) -> list[Any]:
        """The first read that finds nothing new lets the job end right after it returns."""
        nonlocal ended
        out = real(job_id, after, kinds, limit)
        if not out and not ended:
            ended = True
            assert store.finish(job_id, "w1", SUCCEEDED, model_version="1")
            store.mark_activated(job_id, "1")
        return out

    store.events_since = racing  # type: ignore[method-assign]

    async def follow() -> list[tuple[str | None, dict[str, Any]]]:
        async def gone() -> bool:
            return False

        stream = await jobs.follow(job.id, None, gone)
        return [(e.kind, e.data) async for e in stream]

    events = asyncio.run(follow())
    engine.dispose()
    assert ended
    assert events[-2] == ("state", {"state": SUCCEEDED, "model_version": "1"}), events
    assert events[-1] == ("activated", {"model_version": "1"}), events
