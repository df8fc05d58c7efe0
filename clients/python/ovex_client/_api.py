"""What each endpoint sends and how its answer is read, shared by the sync and async clients.

Keeping the request shapes in one place means `Client` and `AsyncClient` cannot drift apart.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from .errors import error_from_response
from .models import (
    ActivateResult,
    DatasetInfo,
    DefaultModel,
    Job,
    LabelsAdded,
    ModelDeactivated,
    ModelDeleted,
    ModelInfo,
    ModelVersion,
    PredictInput,
    PredictResponse,
    inputs_to_wire,
)

DEFAULT_URL = "http://127.0.0.1:8000"
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Request:
    """One HTTP call; `idempotent` decides whether it may be retried."""

    method: str
    path: str
    idempotent: bool
    json: Any = None
    params: Mapping[str, Any] | None = None
    files: Mapping[str, Any] | None = None
    data: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter; only idempotent calls are ever retried.

    Retried: connection failures, timeouts, and the statuses a busy or restarting server answers with.
    """

    retries: int = 3
    backoff: float = 0.25
    max_backoff: float = 5.0
    statuses: frozenset[int] = field(default_factory=lambda: frozenset({429, 502, 503, 504}))

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        if retry_after:
            try:
                return min(self.max_backoff, max(0.0, float(retry_after)))
            except ValueError:
                pass
        base = min(self.max_backoff, self.backoff * (2**attempt))
        return base * (0.5 + random.random() / 2)


def resolve_url(url: str | None) -> str:
    return (url or os.environ.get("OVEX_URL") or DEFAULT_URL).rstrip("/")


def resolve_key(api_key: str | None) -> str | None:
    return api_key if api_key is not None else (os.environ.get("OVEX_API_KEY") or None)


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The key goes both as a bearer token and as X-API-Key, so either server convention accepts it."""
    if not api_key:
        return {}
    return {"Authorization": f"Bearer {api_key}", "X-API-Key": api_key}


def make_timeout(timeout: float | httpx.Timeout | None) -> httpx.Timeout:
    if isinstance(timeout, httpx.Timeout):
        return timeout
    return httpx.Timeout(timeout, connect=min(timeout, 10.0) if timeout else 10.0)


def seg(value: str | int) -> str:
    """A path segment, escaped so a name like `a/b` cannot walk the URL."""
    return quote(str(value), safe="")


def check(response: httpx.Response) -> httpx.Response:
    if response.is_error:
        raise error_from_response(response)
    return response


def as_model(cls: type[M]) -> Callable[[httpx.Response], M]:
    return lambda r: cls.model_validate(r.json())


def _items(body: Any, *keys: str) -> list[Any]:
    if isinstance(body, list):
        return body
    if isinstance(body, dict):
        for key in (*keys, "items", "data", "results"):
            value = body.get(key)
            if isinstance(value, list):
                return value
    raise ValueError(f"expected a list in the answer, got {type(body).__name__}")


def as_list(cls: type[M], *keys: str) -> Callable[[httpx.Response], list[M]]:
    return lambda r: [cls.model_validate(x) for x in _items(r.json(), *keys)]


def as_json(r: httpx.Response) -> Any:
    return r.json()


def as_logs(r: httpx.Response) -> str:
    """Logs may come as text or as JSON (`{"lines": [...]}`, `{"logs": "..."}` or a list)."""
    if "json" not in r.headers.get("content-type", ""):
        return r.text
    body = r.json()
    if isinstance(body, dict):
        for key in ("lines", "logs", "log", "text"):
            if key in body:
                body = body[key]
                break
    if isinstance(body, list):
        return "".join(s if str(s).endswith("\n") else f"{s}\n" for s in map(str, body))
    return str(body)


# --- endpoint builders -------------------------------------------------------------------------


def predict(
    inputs: PredictInput | Sequence[PredictInput],
    *,
    model: str | None,
    top_k: int | None,
    normalization: str | None,
    exact: bool | None,
    explain: bool | None = None,
) -> Request:
    body: dict[str, Any] = {"inputs": inputs_to_wire(inputs)}
    if explain is not None:
        body["explain"] = explain
    if top_k is not None:
        body["top_k"] = top_k
    if normalization is not None:
        body["normalization"] = normalization
    if exact is not None:
        body["exact"] = exact
    path = f"/v1/models/{seg(model)}/predict" if model else "/v1/predict"
    # Predicting changes nothing on the server, so a retry is safe.
    return Request("POST", path, idempotent=True, json=body)


def list_models(limit: int | None = None, cursor: str | None = None, versions: int | None = None) -> Request:
    params = _page_params(limit, cursor, versions=versions)
    return Request("GET", "/v1/models", idempotent=True, params=params)


def list_versions(name: str, limit: int | None = None, cursor: str | None = None) -> Request:
    params = _page_params(limit, cursor)
    return Request("GET", f"/v1/models/{seg(name)}/versions", idempotent=True, params=params)


def get_model(name: str) -> Request:
    return Request("GET", f"/v1/models/{seg(name)}", idempotent=True)


def activate(name: str, version: str | int) -> Request:
    # Activating the same version twice leaves the same state: idempotent.
    return Request("POST", f"/v1/models/{seg(name)}/versions/{seg(version)}/activate", idempotent=True)


def delete_model(name: str, force: bool = False) -> Request:
    # Deleting twice leaves the same state (the second answers 404): safe to retry.
    params = {"force": "true"} if force else None
    return Request("DELETE", f"/v1/models/{seg(name)}", idempotent=True, params=params)


def deactivate_model(name: str) -> Request:
    return Request("POST", f"/v1/models/{seg(name)}/deactivate", idempotent=True)


def get_default_model() -> Request:
    return Request("GET", "/v1/default-model", idempotent=True)


def set_default_model(name: str | None) -> Request:
    # Setting the same value twice leaves the same state: idempotent.
    return Request("PUT", "/v1/default-model", idempotent=True, json={"model": name})


def add_labels(
    name: str,
    labels: Iterable[Mapping[str, str] | tuple[str, str]],
    activate: bool | None = None,
    base_version: str | int | None = None,
) -> Request:
    body: dict[str, Any] = {"labels": [_label(x) for x in labels]}
    if activate is not None:
        body["activate"] = activate
    if base_version is not None:
        body["base_version"] = str(base_version)
    # Each call writes a new version: never retried.
    return Request("POST", f"/v1/models/{seg(name)}/labels", idempotent=False, json=body)


def _label(x: Mapping[str, str] | tuple[str, str]) -> dict[str, str]:
    """A label to add as the server takes it: a `(name, text)` pair or a mapping with both keys."""
    if isinstance(x, tuple):
        name, text = x
        return {"name": name, "text": text}
    return {"name": x["name"], "text": x["text"]}


def upload_file(
    file: str | os.PathLike[str] | bytes | IO[bytes], filename: str | None, name: str | None = None,
    kind: str | None = None,
) -> tuple[Request, IO[bytes] | None]:
    """The multipart upload; returns the file object it opened (the caller closes it)."""
    opened: IO[bytes] | None = None
    content: bytes | IO[bytes]
    if isinstance(file, bytes):
        content, name = file, filename or "dataset.txt"
    elif isinstance(file, str | os.PathLike):
        path = Path(file)
        opened = path.open("rb")
        content, name = opened, filename or path.name
    else:
        content, name = file, filename or Path(getattr(file, "name", "dataset.txt")).name
    files = {"file": (name, content, "application/octet-stream")}
    # Uploading creates a dataset: never retried.
    data = {"name": name} if name else {}
    if kind:
        data["kind"] = kind
    return Request("POST", "/v1/datasets", idempotent=False, files=files, data=data or None), opened


def _page_params(limit: int | None, cursor: str | None, **filters: Any) -> dict[str, Any] | None:
    params = {k: v for k, v in (("limit", limit), ("cursor", cursor), *filters.items()) if v is not None}
    return params or None


def list_datasets(limit: int | None = None, cursor: str | None = None) -> Request:
    return Request("GET", "/v1/datasets", idempotent=True, params=_page_params(limit, cursor))


def delete_dataset(dataset_id: str | int) -> Request:
    # Deleting twice leaves the same state (the second answers 404): safe to retry.
    return Request("DELETE", f"/v1/datasets/{seg(dataset_id)}", idempotent=True)


def delete_job(job_id: str | int) -> Request:
    return Request("DELETE", f"/v1/jobs/{seg(job_id)}", idempotent=True)


def delete_version(name: str, version: str | int) -> Request:
    return Request("DELETE", f"/v1/models/{seg(name)}/versions/{seg(version)}", idempotent=True)


def get_dataset(dataset_id: str | int) -> Request:
    return Request("GET", f"/v1/datasets/{seg(dataset_id)}", idempotent=True)


def _base_body(base: Mapping[str, Any]) -> dict[str, Any]:
    """`base` as the server takes it: versions and dataset ids are strings there, numbers here too (as
    `train_dataset` is)."""
    if not isinstance(base, Mapping):
        raise TypeError("base must be a mapping such as {'model': 'm', 'version': '3'} ({} = the model's "
                        f"active version), not {type(base).__name__}")
    out = dict(base)
    for key in ("version", "replay_dataset"):
        if isinstance(out.get(key), int) and not isinstance(out[key], bool):
            out[key] = str(out[key])
    return out


def submit_job(
    model: str,
    train_dataset: str | int,
    *,
    test_dataset: str | int | None,
    params: Mapping[str, Any] | None,
    activate: bool | None,
    base: Mapping[str, Any] | None = None,
    label_texts: str | int | None = None,
) -> Request:
    body: dict[str, Any] = {"model": model, "train_dataset": str(train_dataset)}
    if label_texts is not None:
        body["label_texts"] = str(label_texts)
    if base is not None:
        body["base"] = _base_body(base)
    if test_dataset is not None:
        body["test_dataset"] = str(test_dataset)
    if params:
        body["params"] = dict(params)
    if activate is not None:
        body["activate"] = activate
    # Submitting twice would train twice: never retried.
    return Request("POST", "/v1/jobs", idempotent=False, json=body)


def get_job(job_id: str | int) -> Request:
    return Request("GET", f"/v1/jobs/{seg(job_id)}", idempotent=True)


def list_jobs(
    state: str | None, model: str | None = None, limit: int | None = None, cursor: str | None = None
) -> Request:
    params = _page_params(limit, cursor, state=state, model=model)
    return Request("GET", "/v1/jobs", idempotent=True, params=params)


def cancel_job(job_id: str | int) -> Request:
    # Cancelling a cancelled job answers the same (202): idempotent.
    return Request("POST", f"/v1/jobs/{seg(job_id)}/cancel", idempotent=True)


def job_logs(job_id: str | int) -> Request:
    return Request("GET", f"/v1/jobs/{seg(job_id)}/logs", idempotent=True)


def events_path(job_id: str | int) -> str:
    return f"/v1/jobs/{seg(job_id)}/events"


PARSE_PREDICT = as_model(PredictResponse)
PARSE_MODEL = as_model(ModelInfo)


def PARSE_DEFAULT(r: httpx.Response) -> str | None:
    body = r.json()
    value = body.get("default") if isinstance(body, dict) else None
    return value if isinstance(value, str) else None


PARSE_ACTIVATE = as_model(ActivateResult)
PARSE_LABELS = as_model(LabelsAdded)
PARSE_DEFAULT_MODEL = as_model(DefaultModel)
PARSE_MODEL_DELETED = as_model(ModelDeleted)
PARSE_DEACTIVATED = as_model(ModelDeactivated)
PARSE_DATASET = as_model(DatasetInfo)
PARSE_DATASETS = as_list(DatasetInfo, "datasets")
PARSE_JOB = as_model(Job)
PARSE_JOBS = as_list(Job, "jobs")


def next_cursor(r: httpx.Response) -> str | None:
    """The cursor of the page after this one (None on the last page)."""
    body = r.json()
    value = body.get("next_cursor") if isinstance(body, dict) else None
    return value if isinstance(value, str) else None


def as_page(cls: type[M], key: str) -> Callable[[httpx.Response], tuple[list[M], str | None]]:
    return lambda r: (as_list(cls, key)(r), next_cursor(r))


def no_content(r: httpx.Response) -> None:
    return None


PAGE_MODELS = as_page(ModelInfo, "models")
PAGE_VERSIONS = as_page(ModelVersion, "versions")
PAGE_DATASETS = as_page(DatasetInfo, "datasets")
PAGE_JOBS = as_page(Job, "jobs")
