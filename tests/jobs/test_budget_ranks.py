"""The memory budget of a sharded job is one rank's: a head too big for one process is accepted on enough
ranks, and a shard too big for one process is refused with the per-rank figures."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.training import budget
from tests.jobs.conftest import Backend, Server
from trainer.label_shards import shard_bounds
from trainer.params import MAX_BATCH, MAX_NEGATIVES, TrainParams

BUDGET = 1 << 20  # 1 MiB
LABELS = 60_000  # at dim 1, batch 1, one negative: 1.4 MiB of head and Adam state, 0.7 MiB a rank


def test_per_rank_estimate_by_hand() -> None:
    """K=10^7, D=10^5, d=32, batch 512, 1024 negatives, Adam, 2 ranks: a rank holds 5·10^6 rows."""
    p = TrainParams(dim=32, batch_size=512, negatives=1024, nproc_per_node=2)
    est = budget.estimate(p, 10**7, 10**5)
    shard = 5 * 10**6
    candidates = 512 + 512  # the shard's ⌈1024 · K_r / K⌉ negatives + the batch's positives
    step = 512 * candidates * 4 + candidates * 33 * 2 + 512 * 32 * 2 + 10**5 * 32 * 2
    assert (est.head, est.ranks, est.labels_per_rank) == (shard * 33, 2, shard)
    assert est.bytes == ((shard * 33 + 10**5 * 32) * 3 + step) * 4 + (shard + 10**5) * 8  # Adam's step a row
    whole = budget.estimate(p.model_copy(update={"nproc_per_node": 1}), 10**7, 10**5)
    assert whole.head == 2 * est.head and whole.bytes > 1.9 * est.bytes
    assert "per rank (2 ranks, the largest holding 5000000 of the 10000000 labels)" in est.explain()
    assert "per rank" not in whole.explain()


@settings(deadline=None)  # an estimate per example; a loaded machine must not fail it on time
@given(
    labels=st.integers(1, 10**8),
    ranks=st.integers(1, 64),
    dim=st.integers(1, 1024),
    batch=st.integers(1, MAX_BATCH),
    negatives=st.integers(1, MAX_NEGATIVES),
)
def test_a_rank_holds_its_shard_and_never_more_than_one_process(
    labels: int, ranks: int, dim: int, batch: int, negatives: int
) -> None:
    """The head term is the largest shard's rows (as `shard_bounds` cuts them), its step never scores more
    columns than one process would, and more ranks never need more memory a rank."""
    ranks = min(ranks, labels)
    p = TrainParams(dim=dim, batch_size=batch, negatives=negatives, nproc_per_node=ranks, group_size=1)
    est = budget.estimate(p, labels, 1000)
    largest = shard_bounds(labels, ranks, 0)  # the first shard is never the smaller one
    assert est.head == largest.size * (dim + 1)
    assert est.scores == batch * min(largest.size, largest.negatives(negatives) + batch) * budget.SCORE_COPIES
    one = budget.estimate(p.model_copy(update={"nproc_per_node": 1}), labels, 1000)
    assert est.bytes <= one.bytes
    assert est.tables >= one.tables // ranks


# ---------------------------------------------------------------------------------------- the API
@pytest.fixture(scope="module")
def srv(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(
        tmp_path_factory.mktemp("ranks"),
        backend,
        embedded_worker=False,
        extra_env={"OVEX_MEMORY_BUDGET_BYTES": str(BUDGET)},
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def wide_id(srv: Server, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two rows of a 60,000-label dataset: the head, not the data, sets the memory."""
    path = tmp_path_factory.mktemp("wide") / "wide.txt"
    path.write_text(f"2 10 {LABELS}\n0 1:1.0\n{LABELS - 1} 2:1.0\n")
    return str(srv.upload(path)["id"])


def _job(wide_id: str, **params: Any) -> dict[str, Any]:
    return {"model": "wide", "train_dataset": wide_id,
            "params": {"dim": 1, "batch_size": 1, "negatives": 1, **params}}


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two ranks need a worker with two CPU cores")
def test_a_head_too_big_for_one_process_is_accepted_on_two_ranks(srv: Server, wide_id: str) -> None:
    r = srv.client.post("/v1/jobs", json=_job(wide_id))
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["type"] == "memory_budget" and err["loc"] == ["body", "params", "dim"], err
    assert err["need_bytes"] > BUDGET and "nproc_per_node" in err["msg"], err["msg"]

    r = srv.client.post("/v1/jobs", json=_job(wide_id, nproc_per_node=2))
    assert r.status_code == 202, r.text
    job = srv.client.get(f"/v1/jobs/{r.json()['id']}").json()
    assert job["state"] == "queued" and job["params"]["nproc_per_node"] == 2, job


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two ranks need a worker with two CPU cores")
def test_a_shard_too_big_for_one_process_is_refused_per_rank(srv: Server, wide_id: str) -> None:
    before = srv.client.get("/v1/jobs").json()["jobs"]
    r = srv.client.post("/v1/jobs", json=_job(wide_id, dim=2, nproc_per_node=2))
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["type"] == "memory_budget" and err["budget_bytes"] == BUDGET, err
    one_process = budget.estimate(TrainParams(dim=2, batch_size=1, negatives=1), LABELS, 10)
    assert BUDGET < err["need_bytes"] < one_process.bytes
    msg = err["msg"]
    assert f"per rank (2 ranks, the largest holding {LABELS // 2} of the {LABELS} labels)" in msg, msg
    assert "over the memory budget of 1.0 MiB a process" in msg, msg
    assert srv.client.get("/v1/jobs").json()["jobs"] == before


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two ranks need a worker with two CPU cores")
def test_what_ranks_would_refuse_is_refused_at_submission(srv: Server, wide_id: str, tmp_path: Path) -> None:
    r = srv.client.post("/v1/jobs", json=_job(wide_id, nproc_per_node=2, loss="sparsemax"))
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["loc"] == ["body", "params", "loss"] and "runs on one rank only" in err["msg"], err

    one = tmp_path / "one.txt"  # one label cannot be cut into two shards
    one.write_text("1 10 1\n0 1:1.0\n")
    r = srv.client.post("/v1/jobs", json=_job(str(srv.upload(one)["id"]), nproc_per_node=2))
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["loc"] == ["body", "params", "nproc_per_node"], err
    assert "1 labels cannot be sharded across 2 ranks" in err["msg"], err
