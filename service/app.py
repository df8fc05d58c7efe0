"""`create_app(settings)`: the FastAPI application, assembled from routers, middleware and the registry.

Models load in a background thread started by the lifespan, inside the serving process (never in a
parent that forks: faiss hangs in forked children), so `/healthz` answers at once and `/readyz` turns
ready when a model is warmed.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api import datasets, health, jobs, models, predict, v2
from service.api import metrics as metrics_api
from service.api.console import install_console
from service.api.errors import document_errors, install_error_handlers
from service.api.limits import BodyLimitMiddleware
from service.api.metrics import MetricsMiddleware
from service.db.engine import db_url
from service.logs import configure_logging
from service.metrics import Metrics
from service.serving.active import ActiveVersions
from service.serving.batching import MicroBatcher
from service.serving.predict import PredictService
from service.serving.registry import ModelRegistry
from service.serving.retrieval import configure_threads
from service.settings import Settings
from service.training.runtime import JobsRuntime

log = logging.getLogger("ovex.app")

API_VERSION = "1"
MODELS_LOADED = "ovex_models_loaded"  # lifespan state: set once the registry's start-up load is done


class ServingProcessHeader:
    """`X-Ovex-Worker: <pid>` on every response: which of the `--workers N` serving processes answered."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.header = (b"x-ovex-worker", str(os.getpid()).encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), self.header]
            await send(message)

        await self.app(scope, receive, send_with_header)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; nothing heavy happens until the lifespan starts (in the serving process)."""
    settings = settings or Settings()
    metrics = Metrics()
    store = ActiveVersions.for_url(db_url(settings))  # connects lazily
    registry = ModelRegistry(settings, store, metrics)

    def on_batch(rows: int, requests: int) -> None:
        metrics.batch_rows.observe(rows)
        metrics.batch_requests.observe(requests)

    batcher = MicroBatcher(
        settings.batch_window_ms / 1000.0,
        settings.batch_max_rows,
        on_batch,
        thread_init=lambda: configure_threads(settings.threads),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, threading.Event]]:
        configure_threads(settings.threads)
        await batcher.start()
        loader = threading.Thread(target=registry.start, name="ovex-model-loader", daemon=True)
        loader.start()
        jobs_runtime = JobsRuntime(settings, registry)  # job DB migrations; embedded worker
        app.state.jobs = jobs_runtime
        jobs_runtime.start()
        log.info(
            "serving",
            extra={"models_dir": str(settings.models_dir), "threads": settings.threads, "pid": os.getpid()},
        )
        try:
            yield {MODELS_LOADED: registry.started}
        finally:
            jobs_runtime.stop()
            registry.stop()
            await batcher.stop()

    app = FastAPI(
        title="ovex",
        version=API_VERSION,
        description="Extreme classification: the few labels that matter, with sparse probabilities.",
        lifespan=lifespan,
        docs_url=None,  # served from local files by install_console
        redoc_url=None,  # its bundle fetches a logo from a CDN
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.registry = registry
    app.state.batcher = batcher
    app.state.predict = PredictService(registry, batcher, settings, metrics)
    install_error_handlers(app)
    document_errors(app)
    app.add_middleware(
        BodyLimitMiddleware,
        default_limit=settings.max_body_bytes,
        prefix_limits={"/v1/datasets": settings.max_upload_bytes},
        body_timeout_s=settings.body_timeout_s,
        body_deadline_s=settings.body_deadline_s,
        body_min_rate=settings.body_min_rate,
    )
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.add_middleware(ServingProcessHeader)
    routers = (
        predict.router,
        v2.router,
        models.router,
        health.router,
        metrics_api.router,
        datasets.router,
        jobs.router,
    )
    for r in routers:
        app.include_router(r)
    install_console(app)
    return app


def app_from_env() -> FastAPI:
    """The factory each serving process of `ovex serve --workers N` calls, with the settings its parent
    handed over (flags included)."""
    settings = Settings.for_child()
    configure_logging(settings.log_level, settings.log_json)
    if not settings.access_log:  # configure_logging re-attached what uvicorn's config had switched off
        logging.getLogger("uvicorn.access").propagate = False
    return create_app(settings)
