"""Prometheus metrics (prefix `ovex_`): requests by route and status, latency, batch sizes, models.

Each app owns its own `CollectorRegistry`, so several apps in one process (tests) never collide. Under
`--workers N` every serving process also writes its values to the supervisor's directory (prometheus_client's
multiprocess mode, which the supervisor switches on before the library is imported), and `/metrics` answers
with the sum over the serving processes, whichever of them serves the scrape. The instruments live here, below
every layer that writes them; `service.api.metrics` serves them.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values
from prometheus_client.multiprocess import MultiProcessCollector

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class Metrics:
    """The service's instruments; the registry, batcher and middleware write, `/metrics` reads."""

    def __init__(self) -> None:
        # the library's own switch: its values go to the shared files, not to this process's memory
        self.shared = values.ValueClass is not values.MutexValue
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "ovex_requests_total", "HTTP requests", ["route", "method", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "ovex_request_duration_seconds",
            "HTTP request latency",
            ["route", "method", "status"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_rows = Histogram(
            "ovex_batch_rows",
            "input rows per predictor call",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=self.registry,
        )
        self.batch_requests = Histogram(
            "ovex_batch_requests",
            "requests merged into one predictor call",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=self.registry,
        )
        self.models_loaded = Gauge(
            "ovex_models_loaded",
            "1 for each model version that serves requests",
            ["model", "version"],
            registry=self.registry,
            multiprocess_mode="livemax",  # across serving processes: served by any serving process alive
        )
        self.load_failures = Counter(
            "ovex_model_load_failures_total",
            "model versions refused at load",
            ["model"],
            registry=self.registry,
        )
        self.predicted_rows = Counter(
            "ovex_predicted_rows_total", "inputs answered", ["model", "version"], registry=self.registry
        )
        # per model, whichever route (/v1, /v2) asked: what the console's home page shows per model
        self.predict_latency = Histogram(
            "ovex_predict_duration_seconds",
            "predict requests: checks, queueing and the predictor",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.predict_errors = Counter(
            "ovex_predict_errors_total",
            "predict requests refused or failed",
            ["model"],
            registry=self.registry,
        )

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        s = str(status)
        self.requests.labels(route, method, s).inc()
        self.latency.labels(route, method, s).observe(seconds)

    def set_active(self, model: str, version: str, previous: str | None) -> None:
        if previous is not None and previous != version:
            if not self.shared:
                self.models_loaded.remove(model, previous)
            else:  # a value in the shared files cannot be removed, only set
                self.models_loaded.labels(model, previous).set(0)
        self.models_loaded.labels(model, version).set(1)

    def set_inactive(self, model: str, version: str) -> None:
        """`model` is no longer served here (deleted or deactivated)."""
        if not self.shared:
            with contextlib.suppress(KeyError):
                self.models_loaded.remove(model, version)
        else:
            self.models_loaded.labels(model, version).set(0)

    def exposition(self) -> bytes:
        """This process's metrics, or every serving process's summed (latency buckets and counters added
        up)."""
        if not self.shared:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged)
        return generate_latest(merged)
