"""`/metrics` and the middleware that times every request into `service.metrics.Metrics`."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.metrics import Metrics


class MetricsMiddleware:
    """Pure ASGI (no per-request task): times every HTTP request, labelled by its route template."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def _send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, _send)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.observe_request(route, scope.get("method", ""), status, time.perf_counter() - start)


router = APIRouter(tags=["ops"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
def metrics(request: Request) -> Response:
    """Prometheus text exposition of the service's metrics (all workers' under `--workers N`)."""
    m: Metrics = request.app.state.metrics
    return Response(m.exposition(), media_type=CONTENT_TYPE_LATEST)
