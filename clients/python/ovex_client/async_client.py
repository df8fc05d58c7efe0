"""The asyncio client: the same methods as `Client`, awaitable; `watch` is an async iterator."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
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


class AsyncClient:
    """Asynchronous twin of `Client` (same arguments, same retry rules, same errors)."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout | None = 30.0,
        retries: int = 3,
        backoff: float = 0.25,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.url = _api.resolve_url(url)
        self.retry = _api.RetryPolicy(retries=retries, backoff=backoff)
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
        self._http = httpx.AsyncClient(
            base_url=self.url,
            timeout=_api.make_timeout(timeout),
            transport=transport,
            headers={**_api.auth_headers(_api.resolve_key(api_key)), **(headers or {})},
        )

    # -- plumbing ---------------------------------------------------------------------------------

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, req: _api.Request) -> httpx.Response:
        attempts = 1 + (self.retry.retries if req.idempotent else 0)
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                response = await self._http.request(
                    req.method, req.path, json=req.json, params=req.params, files=req.files, data=req.data
                )
            except httpx.TimeoutException as exc:
                if last:
                    raise RequestTimeout(f"{req.method} {self.url}{req.path} timed out: {exc}") from exc
                await self._sleep(self.retry.delay(attempt))
                continue
            except httpx.TransportError as exc:
                if last:
                    raise TransportError(f"{req.method} {self.url}{req.path} failed: {exc}") from exc
                await self._sleep(self.retry.delay(attempt))
                continue
            if response.status_code in self.retry.statuses and not last:
                await self._sleep(self.retry.delay(attempt, response.headers.get("retry-after")))
                continue
            return _api.check(response)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _call(self, req: _api.Request, parse: Callable[[httpx.Response], T]) -> T:
        return parse(await self._send(req))

    async def _pages(
        self,
        page: Callable[[str | None], _api.Request],
        parse: Callable[[httpx.Response], tuple[list[T], str | None]],
    ) -> AsyncIterator[T]:
        """Every item of a paged listing: `page(cursor)` asks for one page, from the first to the last."""
        cursor: str | None = None
        while True:
            items, cursor = await self._call(page(cursor), parse)
            for item in items:
                yield item
            if cursor is None:
                return

    # -- health -----------------------------------------------------------------------------------

    async def health(self) -> Any:
        return await self._call(_api.Request("GET", "/healthz", idempotent=True), _api.as_json)

    async def ready(self) -> bool:
        try:
            return (await self._http.get("/readyz")).status_code == 200
        except httpx.HTTPError:
            return False

    async def wait_until_ready(self, timeout: float = 60.0, interval: float = 0.2) -> None:
        deadline = time.monotonic() + timeout
        while not await self.ready():
            if time.monotonic() > deadline:
                raise RequestTimeout(f"{self.url} was not ready within {timeout:g} s")
            await self._sleep(interval)

    async def metrics(self) -> str:
        return await self._call(_api.Request("GET", "/metrics", idempotent=True), lambda r: r.text)

    async def openapi(self) -> Any:
        """`GET /openapi.json`: the server's API schema (the CLI checks trainer options against it)."""
        return await self._call(_api.Request("GET", "/openapi.json", idempotent=True), _api.as_json)

    # -- predict ----------------------------------------------------------------------------------

    async def predict(
        self,
        inputs: PredictInput | Sequence[PredictInput],
        *,
        model: str | None = None,
        top_k: int | None = None,
        normalization: str | None = None,
        exact: bool | None = None,
        explain: bool | None = None,
    ) -> PredictResponse:
        req = _api.predict(inputs, model=model, top_k=top_k, normalization=normalization, exact=exact,
                           explain=explain)
        return await self._call(req, _api.PARSE_PREDICT)

    # -- models -----------------------------------------------------------------------------------

    async def list_models(self) -> list[ModelInfo]:
        """Every model, by name (fetched a page at a time), each with its newest versions."""
        return [m async for m in self.iter_models()]

    async def iter_models(self, *, page_size: int = 100, versions: int | None = None
                          ) -> AsyncIterator[ModelInfo]:
        async for item in self._pages(lambda c: _api.list_models(page_size, c, versions), _api.PAGE_MODELS):
            yield item

    async def default_model(self) -> str | None:
        """Name of the model that answers `predict` calls made without a model name."""
        return await self._call(_api.list_models(1, None, 0), _api.PARSE_DEFAULT)

    async def list_versions(self, name: str, *, limit: int | None = None, cursor: str | None = None
                            ) -> list[ModelVersion]:
        """One page of a model's versions, newest first; `iter_versions` walks every page."""
        return (await self._call(_api.list_versions(name, limit, cursor), _api.PAGE_VERSIONS))[0]

    async def iter_versions(self, name: str, *, page_size: int = 100) -> AsyncIterator[ModelVersion]:
        async for item in self._pages(lambda c: _api.list_versions(name, page_size, c), _api.PAGE_VERSIONS):
            yield item

    async def get_model(self, name: str) -> ModelInfo:
        return await self._call(_api.get_model(name), _api.PARSE_MODEL)

    async def activate(self, name: str, version: str | int) -> ActivateResult:
        return await self._call(_api.activate(name, version), _api.PARSE_ACTIVATE)

    async def add_labels(
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
        return await self._call(_api.add_labels(name, labels, activate, base_version), _api.PARSE_LABELS)

    async def delete_model(self, name: str, *, force: bool = False) -> ModelDeleted:
        """Delete a model with every version; `Conflict` naming the queued/running jobs that use it, unless
        `force` cancels them first."""
        return await self._call(_api.delete_model(name, force), _api.PARSE_MODEL_DELETED)

    async def deactivate_model(self, name: str) -> ModelDeactivated:
        """Stop serving a model (its versions stay); activating one of its versions serves it again."""
        return await self._call(_api.deactivate_model(name), _api.PARSE_DEACTIVATED)

    async def get_default_model(self) -> DefaultModel:
        """The model behind `predict` without a model name, and why (`source`)."""
        return await self._call(_api.get_default_model(), _api.PARSE_DEFAULT_MODEL)

    async def set_default_model(self, name: str | None) -> DefaultModel:
        """Make `name` the default model for every worker; `None` returns to the automatic choice. The
        answer says which model is the default now (OVEX_DEFAULT_MODEL, when set, still wins)."""
        return await self._call(_api.set_default_model(name), _api.PARSE_DEFAULT_MODEL)

    async def delete_version(self, name: str, version: str | int) -> None:
        await self._call(_api.delete_version(name, version), _api.no_content)

    # -- datasets ---------------------------------------------------------------------------------

    async def upload_dataset(
        self,
        file: str | os.PathLike[str] | bytes | IO[bytes],
        *,
        filename: str | None = None,
        name: str | None = None,
        kind: str | None = None,
    ) -> DatasetInfo:
        if isinstance(file, str | os.PathLike):
            # httpx's async multipart wants bytes, not a blocking file object.
            path = os.fspath(file)
            with open(path, "rb") as fh:
                content = fh.read()
            req, _ = _api.upload_file(content, filename or os.path.basename(path), name, kind)
        elif isinstance(file, bytes):
            req, _ = _api.upload_file(file, filename, name, kind)
        else:
            fname = filename or os.path.basename(getattr(file, "name", "")) or None
            req, _ = _api.upload_file(file.read(), fname, name, kind)
        return await self._call(req, _api.PARSE_DATASET)

    async def list_datasets(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> list[DatasetInfo]:
        """One page, newest first; `iter_datasets` walks every page."""
        return await self._call(_api.list_datasets(limit, cursor), _api.PARSE_DATASETS)

    async def iter_datasets(self, *, page_size: int = 100) -> AsyncIterator[DatasetInfo]:
        async for item in self._pages(lambda c: _api.list_datasets(page_size, c), _api.PAGE_DATASETS):
            yield item

    async def delete_dataset(self, dataset_id: str | int) -> None:
        await self._call(_api.delete_dataset(dataset_id), _api.no_content)

    async def get_dataset(self, dataset_id: str | int) -> DatasetInfo:
        return await self._call(_api.get_dataset(dataset_id), _api.PARSE_DATASET)

    # -- jobs -------------------------------------------------------------------------------------

    async def submit_job(
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
        req = _api.submit_job(
            model, train_dataset, test_dataset=test_dataset, params=params, activate=activate, base=base,
            label_texts=label_texts,
        )
        return await self._call(req, _api.PARSE_JOB)

    async def get_job(self, job_id: str | int) -> Job:
        return await self._call(_api.get_job(job_id), _api.PARSE_JOB)

    async def list_jobs(
        self,
        state: str | None = None,
        *,
        model: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> list[Job]:
        """One page, newest first; `iter_jobs` walks every page."""
        return await self._call(_api.list_jobs(state, model, limit, cursor), _api.PARSE_JOBS)

    async def iter_jobs(
        self, state: str | None = None, *, model: str | None = None, page_size: int = 100
    ) -> AsyncIterator[Job]:
        async for item in self._pages(lambda c: _api.list_jobs(state, model, page_size, c), _api.PAGE_JOBS):
            yield item

    async def delete_job(self, job_id: str | int) -> None:
        await self._call(_api.delete_job(job_id), _api.no_content)

    async def cancel_job(self, job_id: str | int) -> Job:
        return await self._call(_api.cancel_job(job_id), _api.PARSE_JOB)

    async def job_logs(self, job_id: str | int) -> str:
        return await self._call(_api.job_logs(job_id), _api.as_logs)

    async def watch(self, job_id: str | int, *, idle_timeout: float = 300.0) -> AsyncIterator[JobEvent]:
        """Follow the job's event stream until a terminal state (same resume rules as `Client.watch`)."""
        decoder = SSEDecoder()
        failures = 0
        ended = False  # the terminal state came; the stream may still bring the version's activation
        timeout = httpx.Timeout(self._http.timeout.connect, read=idle_timeout)
        while True:
            headers = {"Accept": "text/event-stream"}
            if decoder.last_event_id:
                headers["Last-Event-ID"] = decoder.last_event_id
            try:
                async with self._http.stream(
                    "GET", _api.events_path(job_id), headers=headers, timeout=timeout
                ) as response:
                    if response.is_error:
                        await response.aread()
                        _api.check(response)
                    async for line in response.aiter_lines():
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
                await self._sleep(self.retry.delay(failures - 1))
            job = await self.get_job(job_id)
            if job.done:
                yield JobEvent(event="state", data=job.model_dump(mode="json"), id=decoder.last_event_id)
                return
            await self._sleep(self.retry.delay(0))

    async def wait_for_job(
        self, job_id: str | int, *, on_event: Callable[[JobEvent], None] | None = None
    ) -> Job:
        async for event in self.watch(job_id):
            if on_event is not None:
                on_event(event)
        return await self.get_job(job_id)
