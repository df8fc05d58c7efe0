"""The synchronous client: one method per endpoint of the ovex API."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import IO, Any, TypeVar

import httpx

from . import _api
from .errors import RequestTimeout, TransportError
from .models import (
    ACTIVATION_EVENTS,
    ActivateResult,
    DatasetInfo,
    DefaultModel,
    Job,
    JobEvent,
    LabelsAdded,
    ModelDeactivated,
    ModelDeleted,
    ModelInfo,
    ModelVersion,
    PredictInput,
    PredictResponse,
)
from .sse import SSEDecoder

T = TypeVar("T")


class Client:
    """Talks to an ovex server.

    `url` and `api_key` default to the `OVEX_URL` and `OVEX_API_KEY` environment variables.
    Idempotent calls (reads, predict, activate, cancel) are retried with backoff on connection errors
    and 429/502/503/504; uploads and job submissions are never retried, so they never happen twice.
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout | None = 30.0,
        retries: int = 3,
        backoff: float = 0.25,
        transport: httpx.BaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.url = _api.resolve_url(url)
        self.retry = _api.RetryPolicy(retries=retries, backoff=backoff)
        self._sleep: Callable[[float], None] = time.sleep
        self._http = httpx.Client(
            base_url=self.url,
            timeout=_api.make_timeout(timeout),
            transport=transport,
            headers={**_api.auth_headers(_api.resolve_key(api_key)), **(headers or {})},
        )

    # -- plumbing ---------------------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, req: _api.Request) -> httpx.Response:
        attempts = 1 + (self.retry.retries if req.idempotent else 0)
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                response = self._http.request(
                    req.method, req.path, json=req.json, params=req.params, files=req.files, data=req.data
                )
            except httpx.TimeoutException as exc:
                if last:
                    raise RequestTimeout(f"{req.method} {self.url}{req.path} timed out: {exc}") from exc
                self._sleep(self.retry.delay(attempt))
                continue
            except httpx.TransportError as exc:
                if last:
                    raise TransportError(f"{req.method} {self.url}{req.path} failed: {exc}") from exc
                self._sleep(self.retry.delay(attempt))
                continue
            if response.status_code in self.retry.statuses and not last:
                self._sleep(self.retry.delay(attempt, response.headers.get("retry-after")))
                continue
            return _api.check(response)
        raise AssertionError("unreachable")  # pragma: no cover

    def _call(self, req: _api.Request, parse: Callable[[httpx.Response], T]) -> T:
        return parse(self._send(req))

    def _pages(
        self,
        page: Callable[[str | None], _api.Request],
        parse: Callable[[httpx.Response], tuple[list[T], str | None]],
    ) -> Iterator[T]:
        """Every item of a paged listing: `page(cursor)` asks for one page, from the first to the last."""
        cursor: str | None = None
        while True:
            items, cursor = self._call(page(cursor), parse)
            yield from items
            if cursor is None:
                return

    # -- health -----------------------------------------------------------------------------------

    def health(self) -> Any:
        """`GET /healthz`: the process is up."""
        return self._call(_api.Request("GET", "/healthz", idempotent=True), _api.as_json)

    def ready(self) -> bool:
        """`GET /readyz` once, without retries: True when a model is loaded and warmed."""
        try:
            return self._http.get("/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    def wait_until_ready(self, timeout: float = 60.0, interval: float = 0.2) -> None:
        """Poll `/readyz` until it answers 200; raises `RequestTimeout` after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise RequestTimeout(f"{self.url} was not ready within {timeout:g} s")
            self._sleep(interval)

    def metrics(self) -> str:
        """`GET /metrics`: the Prometheus exposition text."""
        return self._call(_api.Request("GET", "/metrics", idempotent=True), lambda r: r.text)

    def openapi(self) -> Any:
        """`GET /openapi.json`: the server's API schema (the CLI checks trainer options against it)."""
        return self._call(_api.Request("GET", "/openapi.json", idempotent=True), _api.as_json)

    # -- predict ----------------------------------------------------------------------------------

    def predict(
        self,
        inputs: PredictInput | Sequence[PredictInput],
        *,
        model: str | None = None,
        top_k: int | None = None,
        normalization: str | None = None,
        exact: bool | None = None,
        explain: bool | None = None,
    ) -> PredictResponse:
        """Top labels with sparse probabilities for one input or a batch.

        An input is text (`str`), sparse `Features`, or a mapping `{"text": ...}` /
        `{"features": {"indices": [...], "values": [...]}}`. Without `model`, the active default model
        answers. `explain=True` gives each label an `explanation`: its bias and the input words (or feature
        ids) that contributed most to its score.
        """
        req = _api.predict(inputs, model=model, top_k=top_k, normalization=normalization, exact=exact,
                           explain=explain)
        return self._call(req, _api.PARSE_PREDICT)

    # -- models -----------------------------------------------------------------------------------

    def list_models(self) -> list[ModelInfo]:
        """Every model, by name (fetched a page at a time), each with its newest versions."""
        return list(self.iter_models())

    def iter_models(self, *, page_size: int = 100, versions: int | None = None) -> Iterator[ModelInfo]:
        """Every model, by name, a page at a time; each shows its newest `versions` versions (server
        default: 20) and `n_versions`; `iter_versions` walks all of one model's."""
        yield from self._pages(lambda c: _api.list_models(page_size, c, versions), _api.PAGE_MODELS)

    def default_model(self) -> str | None:
        """Name of the model that answers `predict` calls made without a model name."""
        return self._call(_api.list_models(1, None, 0), _api.PARSE_DEFAULT)

    def list_versions(self, name: str, *, limit: int | None = None, cursor: str | None = None
                      ) -> list[ModelVersion]:
        """One page of a model's versions, newest first; `iter_versions` walks every page."""
        return self._call(_api.list_versions(name, limit, cursor), _api.PAGE_VERSIONS)[0]

    def iter_versions(self, name: str, *, page_size: int = 100) -> Iterator[ModelVersion]:
        """Every version of a model, newest first, fetched a page at a time."""
        yield from self._pages(lambda c: _api.list_versions(name, page_size, c), _api.PAGE_VERSIONS)

    def get_model(self, name: str) -> ModelInfo:
        return self._call(_api.get_model(name), _api.PARSE_MODEL)

    def activate(self, name: str, version: str | int) -> ActivateResult:
        """Make `version` of `name` the one that answers (hot swap, no restart)."""
        return self._call(_api.activate(name, version), _api.PARSE_ACTIVATE)

    def add_labels(
        self,
        name: str,
        labels: Iterable[Mapping[str, str] | tuple[str, str]],
        *,
        activate: bool | None = None,
        base_version: str | int | None = None,
    ) -> LabelsAdded:
        """Add labels by their texts (`(name, text)` pairs or `{"name", "text"}` mappings) to a model trained
        with label texts: the server writes its next version with them appended to the active version (or
        `base_version`), and activates it when `activate`."""
        return self._call(_api.add_labels(name, labels, activate, base_version), _api.PARSE_LABELS)

    def delete_model(self, name: str, *, force: bool = False) -> ModelDeleted:
        """Delete a model with every version; `Conflict` naming the queued/running jobs that use it, unless
        `force` cancels them first."""
        return self._call(_api.delete_model(name, force), _api.PARSE_MODEL_DELETED)

    def deactivate_model(self, name: str) -> ModelDeactivated:
        """Stop serving a model (its versions stay); activating one of its versions serves it again."""
        return self._call(_api.deactivate_model(name), _api.PARSE_DEACTIVATED)

    def get_default_model(self) -> DefaultModel:
        """The model behind `predict` without a model name, and why (`source`)."""
        return self._call(_api.get_default_model(), _api.PARSE_DEFAULT_MODEL)

    def set_default_model(self, name: str | None) -> DefaultModel:
        """Make `name` the default model for every worker; `None` returns to the automatic choice. The
        answer says which model is the default now (OVEX_DEFAULT_MODEL, when set, still wins)."""
        return self._call(_api.set_default_model(name), _api.PARSE_DEFAULT_MODEL)

    def delete_version(self, name: str, version: str | int) -> None:
        """Remove a model version's files; 409 for the active version."""
        self._call(_api.delete_version(name, version), _api.no_content)

    # -- datasets ---------------------------------------------------------------------------------

    def upload_dataset(
        self,
        file: str | os.PathLike[str] | bytes | IO[bytes],
        *,
        filename: str | None = None,
        name: str | None = None,
        kind: str | None = None,
    ) -> DatasetInfo:
        """Upload an XC-format or JSONL file; the server validates it before accepting it."""
        req, opened = _api.upload_file(file, filename, name, kind)
        try:
            return self._call(req, _api.PARSE_DATASET)
        finally:
            if opened is not None:
                opened.close()

    def list_datasets(self, *, limit: int | None = None, cursor: str | None = None) -> list[DatasetInfo]:
        """One page, newest first; `iter_datasets` walks every page."""
        return self._call(_api.list_datasets(limit, cursor), _api.PARSE_DATASETS)

    def iter_datasets(self, *, page_size: int = 100) -> Iterator[DatasetInfo]:
        """Every dataset, newest first, fetched a page at a time."""
        yield from self._pages(lambda c: _api.list_datasets(page_size, c), _api.PAGE_DATASETS)

    def delete_dataset(self, dataset_id: str | int) -> None:
        """Remove a dataset and its file; 409 (`Conflict`) while a job still names it."""
        self._call(_api.delete_dataset(dataset_id), _api.no_content)

    def get_dataset(self, dataset_id: str | int) -> DatasetInfo:
        return self._call(_api.get_dataset(dataset_id), _api.PARSE_DATASET)

    # -- jobs -------------------------------------------------------------------------------------

    def submit_job(
        self,
        model: str,
        train_dataset: str | int,
        *,
        test_dataset: str | int | None = None,
        params: Mapping[str, Any] | None = None,
        activate: bool | None = None,
        base: Mapping[str, Any] | None = None,
        label_texts: str | int | None = None,
    ) -> Job:
        """Queue a training job; `params` are trainer options (e.g. `{"epochs": 2, "dim": 64}`); `base`
        (`{"model": ..., "version": ...}`, `{}` = the model's active version) continues a stored version."""
        req = _api.submit_job(
            model, train_dataset, test_dataset=test_dataset, params=params, activate=activate, base=base,
            label_texts=label_texts,
        )
        return self._call(req, _api.PARSE_JOB)

    def get_job(self, job_id: str | int) -> Job:
        return self._call(_api.get_job(job_id), _api.PARSE_JOB)

    def list_jobs(
        self,
        state: str | None = None,
        *,
        model: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> list[Job]:
        """One page, newest first; `iter_jobs` walks every page."""
        return self._call(_api.list_jobs(state, model, limit, cursor), _api.PARSE_JOBS)

    def iter_jobs(
        self, state: str | None = None, *, model: str | None = None, page_size: int = 100
    ) -> Iterator[Job]:
        """Every job (matching the filters), newest first, fetched a page at a time."""
        yield from self._pages(lambda c: _api.list_jobs(state, model, page_size, c), _api.PAGE_JOBS)

    def delete_job(self, job_id: str | int) -> None:
        """Remove an ended job with its logs and checkpoints; 409 while it is queued or running."""
        self._call(_api.delete_job(job_id), _api.no_content)

    def cancel_job(self, job_id: str | int) -> Job:
        return self._call(_api.cancel_job(job_id), _api.PARSE_JOB)

    def job_logs(self, job_id: str | int) -> str:
        return self._call(_api.job_logs(job_id), _api.as_logs)

    def watch(self, job_id: str | int, *, idle_timeout: float = 300.0) -> Iterator[JobEvent]:
        """Follow the job's event stream to its end: the terminal state and, for a succeeded job that asked
        to be activated, the `activated` (or `activation_failed`) event after it, so the new version
        serves once this returns.

        A dropped stream is resumed (with `Last-Event-ID`); if it ends without a terminal event the job is
        read once and, when finished, a final `state` event carrying the job is yielded.
        """
        decoder = SSEDecoder()
        failures = 0
        ended = False  # the terminal state came; the stream may still bring the version's activation
        timeout = httpx.Timeout(self._http.timeout.connect, read=idle_timeout)
        while True:
            headers = {"Accept": "text/event-stream"}
            if decoder.last_event_id:
                headers["Last-Event-ID"] = decoder.last_event_id
            try:
                with self._http.stream(
                    "GET", _api.events_path(job_id), headers=headers, timeout=timeout
                ) as response:
                    if response.is_error:
                        response.read()
                        _api.check(response)
                    for line in response.iter_lines():
                        event = decoder.feed(line)
                        if event is None:
                            continue
                        failures = 0
                        if ended and event.event not in ACTIVATION_EVENTS:
                            continue
                        yield event
                        ended = ended or event.terminal
                    event = decoder.feed("")
                    if event is not None and not (ended and event.event not in ACTIVATION_EVENTS):
                        yield event
                        ended = ended or event.terminal
                    if ended:
                        return
            except httpx.TransportError as exc:
                if ended:
                    return
                failures += 1
                if failures > self.retry.retries:
                    raise TransportError(f"event stream of job {job_id} broke: {exc}") from exc
                self._sleep(self.retry.delay(failures - 1))
            job = self.get_job(job_id)
            if job.done:
                yield JobEvent(event="state", data=job.model_dump(mode="json"), id=decoder.last_event_id)
                return
            self._sleep(self.retry.delay(0))  # the stream closed early: do not reconnect in a tight loop

    def wait_for_job(self, job_id: str | int, *, on_event: Callable[[JobEvent], None] | None = None) -> Job:
        """Follow the stream until the job finishes; returns the final job record."""
        for event in self.watch(job_id):
            if on_event is not None:
                on_event(event)
        return self.get_job(job_id)
