"""The routers in-process, where a live server is not the point: the app `create_app` builds, driven by
starlette's `TestClient` (its lifespan runs: the registry loads, the job database is migrated; the
embedded job worker is off).

Every error kind of `service.api.errors.STATUS` is answered with its status, in the /v1 shape
(`{"detail": ...}`, request locations where the error names a field) and the /v2 shape (`{"error": ...}`),
with `Retry-After` where it carries a retry hint, and no body shows a class name, a path or a traceback.
Kinds a route raises naturally are triggered through that route; the few no route raises without a
fault (a full disk, a broken artifact) through a tiny route added to this test's app. Then the predict
router's checks: each mistake a client can make is a 4xx naming the field to fix.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest
import scipy.sparse as sp
from fastapi import APIRouter
from fastapi.testclient import TestClient
from pydantic import SecretStr

from service.api.errors import INTERNAL_ERROR, STATUS
from service.app import create_app
from service.errors import (
    Conflict,
    Forbidden,
    InputError,
    InsufficientStorage,
    Invalid,
    Malformed,
    NotFound,
    TooLarge,
    Unauthorized,
    Unavailable,
    Unsupported,
)
from service.settings import Settings
from tests.service.conftest import API_KEY, REPO, copy_version, train_small
from trainer.errors import ArtifactError, DataFormatError, OvexError, ParamsError

N_FEATURES = 60
MAX_TOP_K = 50
MAX_EXPLAIN_TOP_K = 5
MAX_BATCH = 32
MAX_BODY = 64 << 10
KEY = {"X-API-Key": API_KEY}


def _train_text(out: Path) -> None:
    """A tiny text model: four topics of three words each."""
    from trainer.data import Dataset
    from trainer.params import TrainParams
    from trainer.train import train

    topics = ["alpha beta gamma", "delta epsilon zeta", "eta theta iota", "kappa lambda mu"]
    n = 80
    y = sp.csr_matrix(([1.0] * n, (list(range(n)), [i % 4 for i in range(n)])), shape=(n, 4))
    ds = Dataset(Y=y, n_features=0, n_labels=4, texts=[topics[i % 4] for i in range(n)], path="<in-process>")
    train(TrainParams(dim=8, epochs=1, negatives=4, batch_size=32, device="cpu", eval_every=0), ds, None,
          out_dir=out)


# Raised by the tiny routes below: kinds no route raises without a fault (a full disk, a broken stored
# version, a trainer error the domain would wrap), and an unhandled exception carrying a server path.
def _faults(secret: Path) -> dict[str, Callable[[], Exception]]:
    return {
        "insufficient_storage": lambda: InsufficientStorage(
            "the server's disk is full while writing the upload; free space or ask the operator"),
        "artifact": lambda: ArtifactError("demo/2", "config.json is missing; continue another version"),
        "data_format": lambda: DataFormatError("train.txt", 3, "expected label:value, got 'x'"),
        "params": lambda: ParamsError("dim must be at least 1, got 0"),
        "too_large": lambda: TooLarge("upload exceeds the limit of 1024 bytes", field=("file",)),
        "retry": lambda: Unavailable("the job database is unavailable; retry later", retry_after=7),
        "fields": lambda: InputError([(("top_k",), "top_k must be at most 50, got 99"),
                                      (("inputs", 1, "text"), "text is blank")]),
        "crash": lambda: RuntimeError(f"cannot open {secret}/weights.bin"),
    }


def _fault_router(secret: Path) -> APIRouter:
    faults = _faults(secret)
    router = APIRouter()

    def raise_it(kind: str) -> None:
        raise faults[kind]()

    router.add_api_route("/v1/_test/raise/{kind}", raise_it, methods=["GET"])
    router.add_api_route("/v2/_test/raise/{kind}", raise_it, methods=["GET"])
    return router


class Response(Protocol):
    """What these tests read of an answer (`TestClient` answers with httpx2's or httpx's `Response`,
    whichever is installed)."""

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def text(self) -> str: ...
    def json(self, **kwargs: Any) -> Any: ...


@dataclass
class App:
    client: TestClient
    root: Path
    models: Path
    store: Path

    def post(self, path: str, body: Any, **kw: Any) -> Response:
        return self.client.post(path, json=body, **kw)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    """Models `sparse` (the default), `words` (text) and `pinned`, served by an app in this process."""
    root = tmp_path_factory.mktemp("inprocess")
    store, models = root / "trained", root / "models"
    train_small(store / "sparse" / "1", labels=20, features=N_FEATURES, rows=200, dim=8)
    copy_version(store, models, "sparse", "1")
    copy_version(store, models, "sparse", "1", as_name="pinned")
    _train_text(models / "words" / "1")
    settings = Settings(
        models_dir=models,
        data_dir=root / "data",
        api_key=SecretStr(API_KEY),
        default_model="sparse",
        embedded_worker=False,
        warmup=False,
        threads=1,
        lone_scan_threads=1,
        active_poll_s=60,  # a version copied in later stays unloaded (its model "still loading")
        job_poll_s=10,
        max_top_k=MAX_TOP_K,
        max_explain_top_k=MAX_EXPLAIN_TOP_K,
        max_batch=MAX_BATCH,
        max_body_bytes=MAX_BODY,
    )
    fastapi_app = create_app(settings)
    fastapi_app.include_router(_fault_router(models))
    with TestClient(fastapi_app, raise_server_exceptions=False) as client:
        assert fastapi_app.state.registry.started.wait(60), "the registry's start-up load did not finish"
        assert set(fastapi_app.state.registry.active()) == {"sparse", "words", "pinned"}
        yield App(client, root, models, store)


# ------------------------------------------------------------------------------------------------
# what no error body may show

CLASS_NAMES = sorted(
    ({cls.__name__ for cls, _ in STATUS}
     | {"InputError", "DomainError", "OvexError", "RuntimeError", "ValidationError", "HTTPException"})
    - {"Invalid"}  # also an English word ("Invalid JSON"); `Invalid(` is checked below
)


HOST = socket.gethostname()


def assert_clean(r: Response, app: App) -> None:
    """No class name, server path, traceback or host name (one long enough not to be any word) shown."""
    text = r.text
    host = [HOST] if len(HOST) >= 6 else []
    for shown in (*CLASS_NAMES, "Invalid(", "Traceback", 'File "', "<class", str(app.root), str(REPO),
                  "/tmp/", ".py", *host):
        assert shown not in text, (shown, text)


def only_detail(r: Response) -> Any:
    body = r.json()
    assert set(body) == {"detail"}, body
    return body["detail"]


def only_error(r: Response) -> str:
    body = r.json()
    assert set(body) == {"error"}, body
    assert isinstance(body["error"], str)
    return str(body["error"])


# ------------------------------------------------------------------------------------------------
# every kind of the STATUS table, through a real route where one raises it


@dataclass(frozen=True)
class Case:
    """One request that makes the app raise `kind`, and what its /v1 answer must be."""

    kind: type[OvexError]
    status: int
    method: str
    path: str
    says: str  # in the message
    loc: list[str | int] | None = None  # the first field error's location; None: a plain string detail
    retry_after: str | None = None
    request: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    setup: Callable[[App], None] | None = None


def _late_model(app: App) -> None:
    """A model whose version appears after start-up: found on disk, not loaded until the next refresh."""
    if not (app.models / "late").exists():
        copy_version(app.store, app.models, "sparse", "1", as_name="late")


NOT_A_DATASET = {"file": ("bad.txt", b"this is not a dataset\n", "text/plain")}
UPLOAD = {"files": NOT_A_DATASET}
SPARSE_ROW = {"features": {"indices": [1, 2], "values": [1.0, 0.5]}}

CASES = [
    Case(Malformed, 400, "POST", "/v1/datasets", "malformed multipart body", loc=["body"], headers={
        **KEY, "content-type": "multipart/form-data; boundary=xyz"}, request={"content": b"--xyz\r\nno end"}),
    Case(Unauthorized, 401, "POST", "/v1/datasets", "missing API key", request=UPLOAD),
    Case(Forbidden, 403, "POST", "/v1/datasets", "wrong key", request=UPLOAD,
         headers={"X-API-Key": "not-the-key"}),
    Case(NotFound, 404, "POST", "/v1/models/nope/predict", "unknown model 'nope'",
         request={"json": {"inputs": [SPARSE_ROW]}}),
    Case(NotFound, 404, "GET", "/v1/datasets/ds_0000", "dataset 'ds_0000' not found",
         loc=["path", "dataset_id"]),
    Case(Conflict, 409, "DELETE", "/v1/models/pinned/versions/1", "is the active one", headers=KEY),
    Case(TooLarge, 413, "GET", "/v1/_test/raise/too_large", "limit of 1024 bytes", loc=["body", "file"]),
    Case(Unsupported, 415, "POST", "/v1/datasets", "multipart/form-data", loc=["header", "content-type"],
         headers={**KEY, "content-type": "application/json"}, request={"content": b"{}"}),
    Case(Invalid, 422, "POST", "/v1/models/sparse/predict", f"top_k must be at most {MAX_TOP_K}",
         loc=["body", "top_k"], request={"json": {"inputs": [SPARSE_ROW], "top_k": MAX_TOP_K + 1}}),
    Case(Invalid, 422, "POST", "/v1/datasets", "bad.txt:1:", loc=["body", "file"], headers=KEY,
         request=UPLOAD),
    Case(Invalid, 422, "GET", "/v1/datasets?cursor=nonsense", "cursor is not one this server handed out",
         loc=["query", "cursor"]),
    Case(Unavailable, 503, "POST", "/v1/models/late/predict", "still loading", retry_after="1",
         request={"json": {"inputs": [SPARSE_ROW]}}, setup=_late_model),
    Case(Unavailable, 503, "GET", "/v1/_test/raise/retry", "retry later", retry_after="7"),
    Case(InsufficientStorage, 507, "GET", "/v1/_test/raise/insufficient_storage", "disk is full"),
    Case(DataFormatError, 422, "GET", "/v1/_test/raise/data_format", "train.txt:3: expected label:value"),
    Case(ParamsError, 422, "GET", "/v1/_test/raise/params", "dim must be at least 1"),
    Case(ArtifactError, 409, "GET", "/v1/_test/raise/artifact", "demo/2: config.json is missing"),
]


def test_every_kind_of_the_status_table_has_a_case() -> None:
    assert {cls for cls, _ in STATUS} <= {c.kind for c in CASES}


def _send(app: App, case: Case) -> Response:
    if case.setup is not None:
        case.setup(app)
    return app.client.request(case.method, case.path, headers=case.headers, **case.request)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.kind.__name__}-{c.method}-{c.path}")
def test_v1_answer_of_each_kind(app: App, case: Case) -> None:
    r = _send(app, case)
    assert r.status_code == case.status, r.text
    detail = only_detail(r)
    if case.loc is None:
        assert isinstance(detail, str) and case.says in detail, detail
    else:
        assert isinstance(detail, list) and detail, detail
        assert detail[0]["loc"] == case.loc, detail
        assert case.says in detail[0]["msg"], detail
    assert r.headers.get("retry-after") == case.retry_after
    assert_clean(r, app)


def test_unauthorized_says_how_to_authenticate(app: App) -> None:
    r = app.client.post("/v1/datasets", files=NOT_A_DATASET)
    assert r.status_code == 401
    assert r.headers.get("www-authenticate") == "Bearer"
    assert "X-API-Key" in only_detail(r)


def test_field_error_carries_its_kind_and_extras(app: App) -> None:
    """A domain error's kind is the entry's `type`, and its extras (the line at fault) sit beside it."""
    r = app.client.post("/v1/datasets", headers=KEY, files=NOT_A_DATASET)
    assert r.status_code == 422, r.text
    (entry,) = only_detail(r)
    assert entry["type"] == "dataset_invalid" and entry["line"] == 1, entry


def test_several_field_errors_each_located(app: App) -> None:
    r = app.client.get("/v1/_test/raise/fields")
    assert r.status_code == 422
    detail = only_detail(r)
    assert [d["loc"] for d in detail] == [["body", "top_k"], ["body", "inputs", 1, "text"]]
    assert all(d["type"] == "value_error" for d in detail)


# ---- the same kinds under /v2: `{"error": str}`, a 422 answered 400

V2_BODY = {"inputs": [{"name": "indices", "shape": [2], "datatype": "INT64", "data": [1, 2]},
                      {"name": "values", "shape": [2], "datatype": "FP32", "data": [1.0, 0.5]}]}
FLOAT_INDICES = {"inputs": [{**V2_BODY["inputs"][0], "datatype": "FP32", "data": [1.0, 2.0]},
                            V2_BODY["inputs"][1]]}

V2_CASES = [
    # (kind, status, method, path, body, in the message, Retry-After)
    (Malformed, 400, "POST", "/v2/models/sparse/infer", FLOAT_INDICES, "must be an integer tensor", None),
    (NotFound, 404, "POST", "/v2/models/nope/infer", V2_BODY, "unknown model 'nope'", None),
    (NotFound, 404, "POST", "/v2/models/sparse/versions/7/infer", V2_BODY, "has no version '7'", None),
    (Unavailable, 503, "POST", "/v2/models/late/infer", V2_BODY, "still loading", "1"),
    (Unavailable, 503, "GET", "/v2/_test/raise/retry", None, "retry later", "7"),
    (InsufficientStorage, 507, "GET", "/v2/_test/raise/insufficient_storage", None, "disk is full", None),
    (TooLarge, 413, "GET", "/v2/_test/raise/too_large", None, "file: upload exceeds the limit", None),
    (ArtifactError, 409, "GET", "/v2/_test/raise/artifact", None, "demo/2: config.json is missing", None),
    (DataFormatError, 400, "GET", "/v2/_test/raise/data_format", None, "train.txt:3:", None),
    (ParamsError, 400, "GET", "/v2/_test/raise/params", None, "dim must be at least 1", None),
    (InputError, 400, "GET", "/v2/_test/raise/fields", None,
     "top_k: top_k must be at most 50, got 99; inputs.1.text: text is blank", None),
]


@pytest.mark.parametrize(("kind", "status", "method", "path", "body", "says", "retry_after"), V2_CASES,
                         ids=[f"{c[0].__name__}-{c[3]}" for c in V2_CASES])
def test_v2_answer_of_each_kind(
    app: App, kind: type[OvexError], status: int, method: str, path: str, body: Any, says: str,
    retry_after: str | None,
) -> None:
    if "/late/" in path:
        _late_model(app)
    r = app.client.request(method, path, json=body)
    assert r.status_code == status, r.text
    assert says in only_error(r)
    assert r.headers.get("retry-after") == retry_after
    assert_clean(r, app)


def test_v2_malformed_when_the_version_is_not_the_active_one(app: App) -> None:
    copy_version(app.store, app.models, "sparse", "1", as_name="sparse", as_version="9")
    r = app.post("/v2/models/sparse/versions/9/infer", V2_BODY)
    assert r.status_code == 400, r.text
    assert "only the active version ('1') serves" in only_error(r)
    assert_clean(r, app)


# ---- what is not a domain error: an unknown route, a wrong method, a fault

@pytest.mark.parametrize(("path", "status"), [("/v1/nothing-here", 404), ("/v2/nothing-here", 404)])
def test_unknown_route_in_the_protocols_shape(app: App, path: str, status: int) -> None:
    r = app.client.get(path)
    assert r.status_code == status
    assert (only_error(r) if path.startswith("/v2/") else only_detail(r)) == "Not Found"


def test_wrong_method_in_the_protocols_shape(app: App) -> None:
    r = app.client.get("/v2/models/sparse/infer")
    assert r.status_code == 405
    assert only_error(r) == "Method Not Allowed"


@pytest.mark.parametrize("prefix", ["/v1", "/v2"])
def test_unhandled_fault_is_a_plain_500(app: App, prefix: str) -> None:
    r = app.client.get(f"{prefix}/_test/raise/crash")
    assert r.status_code == 500
    said = only_error(r) if prefix == "/v2" else only_detail(r)
    assert said == INTERNAL_ERROR
    assert "weights.bin" not in r.text
    assert_clean(r, app)


@pytest.mark.parametrize("path", ["/v1/models/sparse/predict", "/v2/models/sparse/infer"])
def test_body_over_the_limit_is_413_in_the_protocols_shape(app: App, path: str) -> None:
    body = b"{" + b" " * MAX_BODY + b"}"
    r = app.client.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413
    said = only_error(r) if path.startswith("/v2/") else only_detail(r)
    assert f"over the limit of {MAX_BODY} bytes" in said


# ------------------------------------------------------------------------------------------------
# the predict router: each mistake a 4xx naming what to fix


def _feat(indices: list[int], values: list[float] | None = None) -> dict[str, Any]:
    values = values if values is not None else [1.0] * len(indices)
    return {"features": {"indices": indices, "values": values}}


PREDICT_CASES = [
    # (id, path, body, first loc, in the first message)
    ("text to a features model", "/v1/models/sparse/predict", {"inputs": [{"text": "alpha"}]},
     ["body", "inputs", 0, "text"], "model 'sparse' takes sparse `features`, not text"),
    ("features to a text model", "/v1/models/words/predict", {"inputs": [_feat([1])]},
     ["body", "inputs", 0, "features"], "model 'words' takes `text`, not features"),
    ("index past the features", "/v1/models/sparse/predict", {"inputs": [_feat([3, N_FEATURES + 4])]},
     ["body", "inputs", 0, "features", "indices", 1], f"has {N_FEATURES} features (0..{N_FEATURES - 1})"),
    ("negative index", "/v1/models/sparse/predict", {"inputs": [_feat([-1])]},
     ["body", "inputs", 0, "features", "indices", 0], "greater than or equal to 0"),
    ("indices and values differ", "/v1/models/sparse/predict", {"inputs": [_feat([1, 2], [1.0])]},
     ["body", "inputs", 0, "features"], "differ in length (2 vs 1)"),
    ("top_k zero", "/v1/models/sparse/predict", {"inputs": [_feat([1])], "top_k": 0},
     ["body", "top_k"], "greater than or equal to 1"),
    ("top_k over the limit", "/v1/models/sparse/predict", {"inputs": [_feat([1])], "top_k": MAX_TOP_K + 1},
     ["body", "top_k"], f"top_k must be at most {MAX_TOP_K}, got {MAX_TOP_K + 1}"),
    ("top_k as a string", "/v1/models/sparse/predict", {"inputs": [_feat([1])], "top_k": "5"},
     ["body", "top_k"], "valid integer"),
    ("top_k over the explain limit", "/v1/models/sparse/predict",
     {"inputs": [_feat([1])], "top_k": MAX_EXPLAIN_TOP_K + 1, "explain": True},
     ["body", "top_k"], f"with explain, top_k must be at most {MAX_EXPLAIN_TOP_K}"),
    ("unknown normalization", "/v1/models/sparse/predict", {"inputs": [_feat([1])], "normalization": "gauss"},
     ["body", "normalization"], "'sparsemax', 'evsoftmax', 'softmax' or 'none'"),
    ("empty inputs", "/v1/models/sparse/predict", {"inputs": []}, ["body", "inputs"], "at least 1 item"),
    ("no inputs", "/v1/models/sparse/predict", {"top_k": 3}, ["body", "inputs"], "Field required"),
    ("too many inputs", "/v1/predict", {"inputs": [_feat([1])] * (MAX_BATCH + 1)},
     ["body", "inputs"], f"at most {MAX_BATCH} inputs per request, got {MAX_BATCH + 1}"),
    ("blank text", "/v1/models/words/predict", {"inputs": [{"text": "   "}]},
     ["body", "inputs", 0, "text"], "text is blank"),
    ("neither text nor features", "/v1/models/words/predict", {"inputs": [{}]},
     ["body", "inputs", 0], "give exactly one of `text` or `features`"),
    ("unknown field", "/v1/models/sparse/predict", {"inputs": [_feat([1])], "topk": 3},
     ["body", "topk"], "Extra inputs are not permitted"),
    ("default model, text to features", "/v1/predict", {"inputs": [_feat([1]), {"text": "alpha"}]},
     ["body", "inputs", 1, "text"], "model 'sparse' takes sparse `features`"),
]


@pytest.mark.parametrize(("path", "body", "loc", "says"), [c[1:] for c in PREDICT_CASES],
                         ids=[c[0] for c in PREDICT_CASES])
def test_predict_mistake_names_the_field(
    app: App, path: str, body: Any, loc: list[str | int], says: str
) -> None:
    r = app.post(path, body)
    assert r.status_code == 422, r.text
    detail = only_detail(r)
    assert detail[0]["loc"] == loc, detail
    assert says in detail[0]["msg"], detail
    assert_clean(r, app)


def test_a_good_request_is_answered(app: App) -> None:
    """The checks above refuse mistakes, not requests: the same models answer well-formed ones."""
    r = app.post("/v1/models/sparse/predict", {"inputs": [_feat([1, 2])], "top_k": 3})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "sparse" and len(r.json()["predictions"]) == 1
    r = app.post("/v1/models/words/predict", {"inputs": [{"text": "alpha beta"}], "top_k": MAX_TOP_K})
    assert r.status_code == 200, r.text
    assert r.json()["predictions"][0]["labels"][0]["name"]


def test_every_mistake_of_a_request_at_once(app: App) -> None:
    """The service's checks report all they find, so one round trip tells the client everything."""
    body = {"inputs": [{"text": "alpha"}, _feat([N_FEATURES])], "top_k": MAX_TOP_K + 1}
    r = app.post("/v1/models/sparse/predict", body)
    assert r.status_code == 422, r.text
    assert [d["loc"] for d in only_detail(r)] == [
        ["body", "top_k"], ["body", "inputs", 0, "text"], ["body", "inputs", 1, "features", "indices", 0]]


def test_many_mistakes_are_counted_not_listed(app: App) -> None:
    """Past MAX_FIELD_ERRORS (20) entries, one more counts the rest: a bad batch gets a small answer."""
    bad_rows = {"inputs": [_feat([N_FEATURES + i for i in range(5)])] * 8}  # 5 bad indices a row
    r = app.post("/v1/models/sparse/predict", bad_rows)
    assert r.status_code == 422, r.text
    detail = only_detail(r)
    assert len(detail) == 21 and detail[-1]["loc"] == ["body"] and detail[-1]["msg"] == "and 20 more errors"
    r = app.post("/v1/models/sparse/predict", {"inputs": [{}] * 30})  # pydantic's own errors
    assert r.status_code == 422, r.text
    detail = only_detail(r)
    assert len(detail) == 21 and detail[-1] == {"loc": ["body"], "msg": "and 10 more errors",
                                                "type": "too_many_errors"}


V2_PREDICT_CASES = [
    ("text to a features model", "/v2/models/sparse/infer",
     {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["alpha"]}]},
     "unknown input 'text'"),
    ("index past the features", "/v2/models/sparse/infer",
     {"inputs": [{**V2_BODY["inputs"][0], "data": [1, N_FEATURES]}, V2_BODY["inputs"][1]]},
     f"row 0: index {N_FEATURES} is out of range"),
    ("no inputs", "/v2/models/sparse/infer", {}, "inputs: Field required"),
    ("top_k over the limit", "/v2/models/sparse/infer", {**V2_BODY, "parameters": {"top_k": MAX_TOP_K + 1}},
     f"top_k must be at most {MAX_TOP_K}"),
]


@pytest.mark.parametrize(("path", "body", "says"), [c[1:] for c in V2_PREDICT_CASES],
                         ids=[c[0] for c in V2_PREDICT_CASES])
def test_v2_infer_mistake_is_400_saying_what(app: App, path: str, body: Any, says: str) -> None:
    r = app.post(path, body)
    assert r.status_code == 400, r.text
    assert says in only_error(r)
    assert_clean(r, app)
