"""Unit tests of the SDK against httpx.MockTransport: request shapes, typed errors, retry rules, SSE."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ovex_client import (
    AsyncClient,
    AuthenticationError,
    Client,
    Features,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
    ServerError,
    TransportError,
    ValidationError,
)
from ovex_client.models import inputs_to_wire
from ovex_client.sse import SSEDecoder

PRED = {
    "model": "demo",
    "version": 3,
    "predictions": [
        {"labels": [{"id": 4, "name": "cats", "score": 2.5, "prob": 0.75, "future": 1}], "exact": True}
    ],
    "latency_ms": 1.2,
}

Handler = Callable[[httpx.Request], httpx.Response]


def make_client(handler: Handler, **kw: Any) -> tuple[Client, list[float]]:
    sleeps: list[float] = []
    client = Client("http://ovex.test", kw.pop("api_key", "k"), transport=httpx.MockTransport(handler), **kw)
    client._sleep = sleeps.append
    return client, sleeps


def test_predict_sends_the_api_body_and_parses_extra_fields() -> None:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(200, json=PRED)

    client, _ = make_client(handler)
    resp = client.predict("a cat on a mat", top_k=5, normalization="sparsemax")
    assert seen[0].url.path == "/v1/predict"
    assert json.loads(seen[0].content) == {
        "inputs": [{"text": "a cat on a mat"}], "top_k": 5, "normalization": "sparsemax"
    }
    assert seen[0].headers["authorization"] == "Bearer k"
    assert seen[0].headers["x-api-key"] == "k"
    assert resp.model == "demo" and resp.version == "3"
    assert resp.predictions[0].labels[0].name == "cats"
    assert resp.predictions[0].labels[0].prob == pytest.approx(0.75)

    client.predict([Features(indices=[1, 7], values=[0.5, 1.0]), {"text": "b"}], model="a/b", exact=True)
    assert seen[1].url.raw_path == b"/v1/models/a%2Fb/predict"
    body = json.loads(seen[1].content)
    assert body == {
        "inputs": [{"features": {"indices": [1, 7], "values": [0.5, 1.0]}}, {"text": "b"}], "exact": True
    }


def test_inputs_are_checked_before_sending() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        Features(indices=[1, 2], values=[1.0])
    with pytest.raises(ValueError, match="not finite"):
        Features(indices=[1], values=[float("nan")])
    with pytest.raises(TypeError, match="a string, a Features"):
        inputs_to_wire([3.5])  # type: ignore[list-item]
    assert inputs_to_wire({"indices": [2], "values": [1.0]}) == [
        {"features": {"indices": [2], "values": [1.0]}}
    ]


@pytest.mark.parametrize(
    ("status", "body", "cls", "message"),
    [
        (404, {"detail": "unknown model 'nope'"}, NotFound, "unknown model 'nope'"),
        (401, {"detail": "missing API key"}, AuthenticationError, "missing API key"),
        (413, {"detail": "body over 1048576 bytes"}, PayloadTooLarge, "body over 1048576 bytes"),
        (
            422,
            {"detail": [{"loc": ["body", "inputs", 0, "text"], "msg": "empty text", "type": "value_error"}]},
            ValidationError,
            "body.inputs.0.text: empty text",
        ),
        (500, "Internal Server Error", ServerError, "Internal Server Error"),
    ],
)
def test_errors_are_typed_and_carry_the_server_message(
    status: int, body: Any, cls: type[Exception], message: str
) -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if isinstance(body, str):
            return httpx.Response(status, text=body)
        return httpx.Response(status, json=body)

    client, _ = make_client(handler, retries=0)
    with pytest.raises(cls) as info:
        client.get_model("nope")
    err = info.value
    assert err.status_code == status  # type: ignore[attr-defined]
    assert err.message == message  # type: ignore[attr-defined]
    assert message in str(err)
    if isinstance(err, ValidationError):
        assert err.errors[0]["loc"] == ["body", "inputs", 0, "text"]


def test_idempotent_calls_retry_with_backoff_then_succeed() -> None:
    calls: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req.url.path)
        if len(calls) < 3:
            return httpx.Response(503, json={"detail": "warming up"})
        models = [{"name": "demo", "active_version": 2, "versions": [1, 2]}]
        return httpx.Response(200, json={"models": models})

    client, sleeps = make_client(handler, retries=3, backoff=0.1)
    models = client.list_models()
    assert len(calls) == 3
    assert models[0].name == "demo" and [v.version for v in models[0].versions] == ["1", "2"]
    assert len(sleeps) == 2 and sleeps[1] > sleeps[0] * 0.9  # backoff grows (with jitter in [0.5, 1])


def test_retry_after_header_is_honoured() -> None:
    calls = 0

    def handler(req: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            return httpx.Response(429, headers={"Retry-After": "1.5"}, json={"detail": "slow down"})
        return httpx.Response(200, json=PRED)

    client, sleeps = make_client(handler)
    client.predict("x")
    assert sleeps == [1.5]


def test_job_submission_and_upload_are_never_retried() -> None:
    calls: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req.url.path)
        return httpx.Response(503, json={"detail": "busy"})

    client, sleeps = make_client(handler, retries=5)
    with pytest.raises(ServerError, match="busy"):
        client.submit_job("m", "d1")
    with pytest.raises(ServerError):
        client.upload_dataset(b"1 2 2\n0 0:1\n", filename="tiny.txt")
    assert calls == ["/v1/jobs", "/v1/datasets"]
    assert sleeps == []


def test_connection_errors_retry_then_raise_transport_error() -> None:
    calls = 0

    def handler(req: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ConnectError("connection refused", request=req)

    client, sleeps = make_client(handler, retries=2)
    with pytest.raises(TransportError, match="connection refused"):
        client.get_job("j1")
    assert calls == 3 and len(sleeps) == 2

    calls = 0
    with pytest.raises(TransportError):
        client.submit_job("m", "d1")
    assert calls == 1


def test_timeouts_become_request_timeout() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("too slow", request=req)

    client, _ = make_client(handler, retries=1)
    with pytest.raises(RequestTimeout, match="timed out"):
        client.health()


def test_url_and_key_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVEX_URL", "http://envhost:9999/")
    monkeypatch.setenv("OVEX_API_KEY", "secret")
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(200, json={"status": "ok"})

    client = Client(transport=httpx.MockTransport(handler))
    client.health()
    assert str(seen[0].url) == "http://envhost:9999/healthz"
    assert seen[0].headers["x-api-key"] == "secret"
    client2 = Client("http://flag:1", "flagkey", transport=httpx.MockTransport(handler))
    client2.health()
    assert str(seen[1].url) == "http://flag:1/healthz" and seen[1].headers["x-api-key"] == "flagkey"


def test_upload_is_multipart_with_field_file(tmp_path: Any) -> None:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(201, json={"id": 7, "name": "train.txt", "rows": 1, "features": 2, "labels": 2})

    path = tmp_path / "train.txt"
    path.write_bytes(b"1 2 2\n0,1 0:1 1:0.5\n")
    client, _ = make_client(handler)
    info = client.upload_dataset(path)
    assert info.id == "7" and info.rows == 1
    assert seen[0].headers["content-type"].startswith("multipart/form-data")
    assert b'name="file"; filename="train.txt"' in seen[0].content
    assert b"0,1 0:1 1:0.5" in seen[0].content


def test_logs_accept_text_and_json() -> None:
    answers = iter([
        httpx.Response(200, text="line one\nline two\n"),
        httpx.Response(200, json={"lines": ["line one", "line two"]}),
    ])
    client, _ = make_client(lambda req: next(answers))
    assert client.job_logs("j") == "line one\nline two\n"
    assert client.job_logs("j") == "line one\nline two\n"


# -- SSE ------------------------------------------------------------------------------------------


def sse(*events: tuple[str, Any], ids: bool = True) -> bytes:
    out = [": keep-alive\n\n"]
    for i, (name, data) in enumerate(events):
        head = f"id: {i + 1}\n" if ids else ""
        out.append(f"{head}event: {name}\ndata: {json.dumps(data)}\n\n")
    return "".join(out).encode()


def test_sse_decoder_handles_multiline_data_comments_and_crlf() -> None:
    dec = SSEDecoder()
    got = []
    for line in [": hi", "event: log", "data: first", "data: second", "id: 5", "", "data: {\"a\": 1}\r", ""]:
        ev = dec.feed(line)
        if ev is not None:
            got.append(ev)
    assert [(e.event, e.data, e.id) for e in got] == [
        ("log", "first\nsecond", "5"), ("message", {"a": 1}, "5")
    ]


@given(
    st.lists(
        st.tuples(
            st.from_regex(r"[a-z]{1,8}", fullmatch=True),
            st.recursive(
                st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                max_leaves=8,
            ),
        ),
        max_size=6,
    )
)
def test_sse_decoder_round_trips_any_json_payload(events: list[tuple[str, Any]]) -> None:
    dec = SSEDecoder()
    got = []
    for line in sse(*events).decode().split("\n"):
        ev = dec.feed(line)
        if ev is not None:
            got.append((ev.event, ev.data))
    assert got == events


def job_routes(
    stream_bodies: list[bytes | Exception], final_state: str = "succeeded"
) -> tuple[Handler, list[Any]]:
    """A fake server: each GET of the events endpoint serves the next body; GET job says `final_state`."""
    log: list[Any] = []

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path.endswith("/events"):
            log.append(req.headers.get("last-event-id"))
            body = stream_bodies.pop(0)
            if isinstance(body, Exception):
                raise body
            return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json={"id": "j1", "state": final_state, "model": "m", "model_version": 2})

    return handler, log


def test_watch_stops_at_the_terminal_event() -> None:
    body = sse(
        ("state", {"state": "running"}),
        ("progress", {"epoch": 1, "epochs": 2, "step": 5, "steps_total": 10, "loss": 0.5}),
        ("state", {"state": "succeeded", "model_version": 2}),
        ("progress", {"never": "seen"}),
    )
    handler, _ = job_routes([body])
    client, _ = make_client(handler)
    events = list(client.watch("j1"))
    assert [e.event for e in events] == ["state", "progress", "state"]
    assert events[1].progress is not None and events[1].progress.fraction == pytest.approx(0.5)
    assert events[-1].terminal and events[-1].state == "succeeded"


def test_watch_reads_on_to_the_activation_after_the_terminal_event() -> None:
    body = sse(
        ("state", {"state": "succeeded", "model_version": 2}),
        ("progress", {"never": "seen"}),
        ("activated", {"model_version": 2}),
    )
    handler, log = job_routes([body])
    client, _ = make_client(handler)
    events = list(client.watch("j1"))
    assert [e.event for e in events] == ["state", "activated"]
    assert events[-1].data == {"model_version": 2}
    assert log == [None]  # the stream ended after its terminal state: no reconnect


def test_watch_resumes_a_broken_stream_with_last_event_id() -> None:
    first = sse(("state", {"state": "running"}))
    second = sse(("state", {"state": "running"}), ("state", {"state": "failed", "error": "boom"}))
    handler, log = job_routes([first, httpx.ReadError("reset"), second], final_state="running")
    client, sleeps = make_client(handler)
    events = list(client.watch("j1"))
    assert events[-1].state == "failed" and events[-1].data["error"] == "boom"
    assert log == [None, "1", "1"]  # reconnects name the last event seen
    assert sleeps  # waited before reconnecting


def test_watch_ends_with_the_job_record_when_the_stream_closes_early() -> None:
    handler, _ = job_routes([sse(("state", {"state": "running"}))], final_state="cancelled")
    client, _ = make_client(handler)
    events = list(client.watch("j1"))
    assert events[-1].state == "cancelled" and events[-1].data["id"] == "j1"


# -- async ----------------------------------------------------------------------------------------


def test_async_client_mirrors_the_sync_one() -> None:
    calls: list[str] = []
    body = sse(("state", {"state": "running"}), ("state", {"state": "succeeded"}))

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(f"{req.method} {req.url.path}")
        if req.url.path == "/v1/predict":
            return httpx.Response(200, json=PRED)
        if req.url.path == "/v1/jobs" and req.method == "POST":
            return httpx.Response(503, json={"detail": "busy"})
        if req.url.path.endswith("/events"):
            return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})
        if req.url.path == "/v1/models/x":
            if calls.count("GET /v1/models/x") < 2:
                return httpx.Response(502)
            return httpx.Response(404, json={"detail": "unknown model 'x'"})
        return httpx.Response(200, json={"id": "j1", "state": "succeeded"})

    async def run() -> None:
        sleeps: list[float] = []

        async def fake_sleep(s: float) -> None:
            sleeps.append(s)

        async with AsyncClient("http://ovex.test", "k", transport=httpx.MockTransport(handler)) as client:
            client._sleep = fake_sleep
            resp = await client.predict(["a", "b"])
            assert resp.predictions[0].labels[0].id == 4
            with pytest.raises(ServerError):
                await client.submit_job("m", "d")
            with pytest.raises(NotFound, match="unknown model 'x'"):
                await client.get_model("x")
            states = [e.state async for e in client.watch("j1")]
            assert states == ["running", "succeeded"]
            assert len(sleeps) == 1  # one retry of the 502, none of the POST

    asyncio.run(run())
    assert calls.count("POST /v1/jobs") == 1


def test_model_management_and_explain_send_the_api_shapes_in_both_clients() -> None:
    """delete_model(force), deactivate_model, get/set_default_model and predict(explain) in Client and
    AsyncClient: the same method, path, query and body, and typed answers."""
    seen: list[tuple[str, str, str, Any]] = []
    why = {"method": "exact", "approximate": False, "bias": 0.5, "n_features": 2,
           "contributions": [{"feature": 7, "word": "cat", "value": 0.7, "contribution": 1.5}]}

    def handler(req: httpx.Request) -> httpx.Response:
        body = json.loads(req.content) if req.content else None
        path = req.url.raw_path.decode().split("?")[0]  # as sent: a "/" in a name stays escaped
        seen.append((req.method, path, req.url.query.decode(), body))
        if path == "/v1/models/a%2Fb":
            return httpx.Response(200, json={"name": "a/b", "versions": ["1", "2"], "cancelled_jobs": ["j9"]})
        if req.url.path.endswith("/deactivate"):
            return httpx.Response(200, json={"name": "m", "deactivated": True})
        if req.url.path == "/v1/default-model":
            return httpx.Response(200, json={"default": (body or {}).get("model", "demo"), "source": "api"})
        labels = [{"id": 1, "name": "cats", "score": 2.0, "prob": 1.0, "explanation": why}]
        answer = {"model": "demo", "version": "1", "predictions": [{"labels": labels}]}
        return httpx.Response(200, json=answer)

    def check(results: list[Any]) -> None:
        gone, off, now, setto, cleared, pred = results
        assert gone.versions == ["1", "2"] and gone.cancelled_jobs == ["j9"]
        assert off.deactivated is True and now.default == "demo" and setto.default == "m"
        assert cleared.default is None
        expl = pred.predictions[0].labels[0].explanation
        assert expl.method == "exact" and expl.contributions[0].word == "cat" and expl.n_features == 2
        assert seen == [
            ("DELETE", "/v1/models/a%2Fb", "force=true", None),
            ("POST", "/v1/models/m/deactivate", "", None),
            ("GET", "/v1/default-model", "", None),
            ("PUT", "/v1/default-model", "", {"model": "m"}),
            ("PUT", "/v1/default-model", "", {"model": None}),
            ("POST", "/v1/predict", "", {"inputs": [{"text": "a cat"}], "top_k": 3, "explain": True}),
        ]
        seen.clear()

    client, _ = make_client(handler)
    check([client.delete_model("a/b", force=True), client.deactivate_model("m"), client.get_default_model(),
           client.set_default_model("m"), client.set_default_model(None),
           client.predict("a cat", top_k=3, explain=True)])

    async def run() -> list[Any]:
        async with AsyncClient("http://ovex.test", "k", transport=httpx.MockTransport(handler)) as ac:
            return [await ac.delete_model("a/b", force=True), await ac.deactivate_model("m"),
                    await ac.get_default_model(), await ac.set_default_model("m"),
                    await ac.set_default_model(None), await ac.predict("a cat", top_k=3, explain=True)]

    check(asyncio.run(run()))


def test_params_are_checked_against_the_published_schema() -> None:
    from ovex_client.params_schema import param_errors, train_params_schema

    doc = {"components": {"schemas": {
        "JobCreate": {"properties": {
            "train_dataset": {"type": "string"},
            "params": {"anyOf": [{"$ref": "#/components/schemas/P"}, {"type": "null"}]}}},
        "P": {"properties": {"epochs": {"type": "integer", "minimum": 1}, "lr": {"type": "number"},
                             "tfidf": {"type": "boolean"}, "loss": {"enum": ["ove", "softmax"]},
                             "seed": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}},
    }}}
    schema = train_params_schema(doc)
    assert schema is doc["components"]["schemas"]["P"]
    ok = {"epochs": 2, "lr": 1, "tfidf": False, "loss": "ove", "seed": None}
    assert param_errors(ok, schema) == []
    assert param_errors({"epoch": 2, "epochs": True, "lr": "x", "loss": "x", "seed": 1.5, "tfidf": 0},
                        schema) == [
        "epoch: not a trainer option (did you mean epochs?)", "epochs=true: must be an integer",
        "lr=x: must be a number", "loss=x: must be one of ove, softmax", "seed=1.5: must be an integer",
        "tfidf=0: must be true or false",
    ]
    assert param_errors({"epochs": 0}, schema) == ["epochs=0: must be at least 1"]
    assert train_params_schema({"openapi": "3.1"}) is None
