"""The SDK against a real `ovex serve` on 127.0.0.1: every endpoint, sync and async, and its errors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from live_server import TOPICS, LiveServer
from ovex_client import (
    AsyncClient,
    AuthenticationError,
    Client,
    Features,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    ValidationError,
)
from ovex_client.models import PredictInput


@pytest.fixture
def client(live: LiveServer) -> Client:
    return Client(live.url, live.api_key, timeout=30)


def test_health_readiness_and_metrics(client: Client) -> None:
    assert client.health() == {"status": "ok"}
    assert client.ready() is True
    client.wait_until_ready(timeout=5)
    text = client.metrics()
    assert "# TYPE" in text and "/healthz" in text  # the health call above was counted


def test_models_and_predictions(client: Client) -> None:
    models = {m.name: m for m in client.list_models()}
    assert "demo" in models and models["demo"].active_version is not None
    demo = client.get_model("demo")
    assert demo.n_labels == len(TOPICS) and [v.version for v in demo.versions] == ["1"]

    resp = client.predict("a kitten and a cat purr", model="demo", top_k=3)
    assert resp.model == "demo" and resp.version == demo.active_version
    assert resp.predictions[0].labels[0].name == "cats"
    texts = client.predict(["rocket to a planet", "bake a recipe with sugar"], model="demo")
    assert [p.labels[0].name for p in texts.predictions] == ["space", "cooking"]
    rows: list[PredictInput] = [
        Features(indices=[1, 5, 9], values=[1.0, 0.5, 0.25]),
        {"indices": [2, 3], "values": [1.0, 1.0]},
    ]
    batch = client.predict(rows, model="sparse", top_k=5, normalization="sparsemax")
    whole = client.predict(rows, model="sparse", top_k=24, normalization="sparsemax")  # K = 24: all
    assert len(batch.predictions) == len(whole.predictions) == 2
    for pred, full in zip(batch.predictions, whole.predictions, strict=True):
        # a small model: every label is scored, so both answers are the exact sparsemax
        assert pred.exact is True and full.exact is True
        assert 1 <= len(pred.labels) <= 5 and len(pred.labels) == min(5, len(full.labels))
        top = full.labels[: len(pred.labels)]  # the top 5 of the same distribution
        assert [lab.id for lab in pred.labels] == [lab.id for lab in top]
        assert [lab.prob for lab in pred.labels] == pytest.approx([lab.prob for lab in top], abs=1e-6)
        scores = [lab.score for lab in full.labels]
        assert scores == sorted(scores, reverse=True)
        probs = [lab.prob for lab in full.labels]
        assert all(p is not None and p > 0 for p in probs)
        assert sum(p for p in probs if p is not None) == pytest.approx(1.0, abs=1e-4)  # the whole support
        assert all(lab.name for lab in full.labels)
    exact = client.predict(rows[0], model="sparse", top_k=3, exact=True, normalization="softmax")
    assert exact.predictions[0].exact is True
    default = client.predict("purr", top_k=3)  # the active default model
    assert default.model == client.default_model() == "demo"


def test_errors_are_typed_with_the_server_message(live: LiveServer, client: Client) -> None:
    with pytest.raises(NotFound) as nf:
        client.get_model("no-such-model")
    assert nf.value.status_code == 404 and "no-such-model" in nf.value.message
    with pytest.raises(NotFound):
        client.predict({"indices": [1], "values": [1.0]}, model="no-such-model")
    with pytest.raises(ValidationError) as bad:
        client.predict({"indices": [1], "values": [1.0]}, model="sparse", top_k=0)
    assert "top_k" in bad.value.message and bad.value.status_code == 422
    with pytest.raises(ValidationError) as far:
        client.predict({"indices": [10**6], "values": [1.0]}, model="sparse")
    assert "indices" in far.value.message
    with pytest.raises(PayloadTooLarge):
        client.predict("x" * (2 << 20), model="demo")
    with pytest.raises(AuthenticationError) as unauth:
        Client(live.url, "", retries=0).upload_dataset(b"1 2 2\n0 0:1\n", filename="t.txt")
    assert "API key" in unauth.value.message
    with pytest.raises(PermissionDenied):
        Client(live.url, "wrong-key", retries=0).activate("demo", "1")
    with pytest.raises(ValidationError) as invalid:
        client.upload_dataset(b"2 5 3\n0 1:1\n9 2:1\n", filename="broken.txt")
    assert "line" in invalid.value.message or ":3" in invalid.value.message
    with pytest.raises(NotFound):
        client.submit_job("m", "no-such-dataset")
    with pytest.raises(NotFound):
        client.get_job("no-such-job")


def test_train_watch_predict_activate(client: Client, train_file: Path) -> None:
    ds = client.upload_dataset(train_file)
    assert ds.rows == 300 and ds.labels == 16 and ds.features == 200
    assert ds.id in {d.id for d in client.list_datasets()}
    assert client.get_dataset(ds.id).checksum == ds.checksum

    job = client.submit_job("sdk-sync", ds.id, params={"epochs": 2, "dim": 32}, activate=True)
    assert job.state == "queued"
    events = list(client.watch(job.id))
    assert [e.state for e in events if e.state][-1] == "succeeded", client.job_logs(job.id)
    # asked to be activated: the stream ends once the version serves, so predicting right away works
    assert events[-1].event == "activated", events[-3:]
    assert any(e.progress is not None for e in events)
    final = client.get_job(job.id)
    assert final.state == "succeeded" and final.model_version is not None
    assert job.id in {j.id for j in client.list_jobs(model="sdk-sync")}
    assert "succeeded" in client.job_logs(job.id)

    resp = client.predict({"indices": [3, 4], "values": [1.0, 1.0]}, model="sdk-sync", top_k=3)
    assert resp.version == final.model_version
    again = client.activate("sdk-sync", final.model_version)
    assert again.active_version == final.model_version


def test_cancel_a_job(client: Client, train_file: Path) -> None:
    ds = client.upload_dataset(train_file)  # the same bytes again: the same record
    job = client.submit_job("sdk-cancel", ds.id, params={"epochs": 500})
    cancelled = client.cancel_job(job.id)
    assert cancelled.id == job.id
    final = client.wait_for_job(job.id)
    assert final.state == "cancelled"


def test_async_client_end_to_end(live: LiveServer, train_file: Path) -> None:
    async def run() -> None:
        async with AsyncClient(live.url, live.api_key) as client:
            assert await client.ready()
            assert (await client.health())["status"] == "ok"
            models, pred = await asyncio.gather(
                client.list_models(),
                client.predict([{"indices": [1], "values": [1.0]}] * 3, model="sparse", top_k=2),
            )
            assert "demo" in {m.name for m in models} and len(pred.predictions) == 3
            with pytest.raises(NotFound):
                await client.get_model("no-such-model")
            ds = await client.upload_dataset(train_file, name="async-upload")
            job = await client.submit_job("sdk-async", ds.id, params={"epochs": 1, "dim": 16}, activate=True)
            states = [e.state async for e in client.watch(job.id) if e.state]
            assert states[-1] == "succeeded"
            final = await client.get_job(job.id)
            assert final.model_version is not None
            answer = await client.predict({"indices": [0], "values": [1.0]}, model="sdk-async")
            assert answer.version == final.model_version
            logs = await client.job_logs(job.id)
            assert job.id and "state: succeeded" in logs
            assert [j.id for j in await client.list_jobs(state="succeeded", model="sdk-async")] == [job.id]

    asyncio.run(run())
