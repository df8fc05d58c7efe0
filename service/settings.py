"""The one settings object of the service: every knob, read from `OVEX_*` environment variables.

Command-line flags override the environment by constructing `Settings(**overrides)`; nothing else in the
service reads the environment, so tests build a `Settings` and pass it to `create_app`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

# the top-k backends, and the knob that picks one of them (`auto`: by the head's size)
IndexKind = Literal["exact", "int8", "flat", "ivf", "hnsw"]
RetrievalKind = Literal["auto", IndexKind]
RETRIEVAL_KINDS: tuple[str, ...] = get_args(RetrievalKind)


def _default_threads() -> int:
    """Half the cores (at least one): the event loop and the compute thread share the machine."""
    return max(1, (os.cpu_count() or 2) // 2)


def _default_lone_threads() -> int:
    """Every core: a lone request leaves the others idle (under load, batches form and scan one per core)."""
    return max(1, os.cpu_count() or 1)


class Settings(BaseSettings):
    """Service configuration. Grouped by concern; each field's description is its documentation."""

    model_config = SettingsConfigDict(env_prefix="OVEX_", env_file=None, extra="ignore")

    # --- where things live -------------------------------------------------------------------------
    models_dir: Path = Field(
        default=Path("models"), description="artifacts at <models_dir>/<name>/<version>/"
    )
    data_dir: Path = Field(default=Path("data"), description="uploaded datasets and job state")
    default_model: str | None = Field(
        default=None, description="model behind /v1/predict; None: the one set through the API, else demo, "
        "else the oldest"
    )

    # --- HTTP ----------------------------------------------------------------------------------------
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    api_key: SecretStr | None = Field(
        default=None,
        description="admin key: every mutation (X-API-Key or Authorization: Bearer); None: mutations off",
    )
    read_key: SecretStr | None = Field(
        default=None,
        description="read key: job logs, dataset details and predictions need it (or the admin key); "
        "None: those reads are open",
    )
    max_body_bytes: int = Field(default=1 << 20, ge=1024, description="request body limit (413 above it)")
    max_upload_bytes: int = Field(default=256 << 20, ge=1024, description="body limit for dataset uploads")
    body_timeout_s: float = Field(
        default=30.0, gt=0, description="a request body that sends nothing for this long is dropped (408)"
    )
    body_deadline_s: float = Field(
        default=60.0,
        gt=0,
        description="a request body must have all arrived this long after its headers, plus its size at "
        "`body_min_rate` (its Content-Length, or the path's body limit when it declares none), or it is "
        "dropped (408)",
    )
    body_min_rate: int = Field(
        default=64 << 10,
        ge=1024,
        description="bytes per second a body is given on top of `body_deadline_s` (a full 256 MiB upload: "
        "about 68 minutes)",
    )
    max_header_bytes: int = Field(
        default=64 << 10,
        ge=1024,
        description="request line and headers larger than this are answered 431 and the connection closed",
    )
    header_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="a request whose headers have not all arrived this long after its first byte gets 408 "
        "and its connection is closed; a new connection that sends nothing that long is closed",
    )
    predict_needs_read_key: bool = Field(
        default=False, description="predictions also need the read key when one is set (default: open)"
    )
    access_log: bool = Field(default=False, description="one JSON log line per request")
    log_level: str = Field(default="info", description="debug, info, warning or error")
    log_json: bool | None = Field(
        default=None, description="JSON log lines; None: JSON unless stderr is a terminal (then readable)"
    )

    # --- prediction limits ---------------------------------------------------------------------------
    max_batch: int = Field(default=256, ge=1, description="most inputs in one predict request")
    max_top_k: int = Field(default=1000, ge=1, description="largest top_k a request may ask for")
    max_explain_top_k: int = Field(
        default=20, ge=1, description="largest top_k of a predict request with `explain: true`"
    )
    max_explain_terms: int = Field(
        default=10, ge=1, le=1000, description="most contributions listed per label of an explanation"
    )
    request_timeout_s: float = Field(default=30.0, gt=0, description="a predict request never waits longer")
    max_labels_per_request: int = Field(
        default=10_000, ge=1, description="most labels one POST /v1/models/{name}/labels may add"
    )

    # --- micro-batching ------------------------------------------------------------------------------
    batch_window_ms: float = Field(default=1.0, ge=0, description="how long a batch waits for more requests")
    batch_max_rows: int = Field(default=64, ge=1, description="most input rows the predictor sees at once")

    # --- compute -------------------------------------------------------------------------------------
    threads: int = Field(default_factory=_default_threads, ge=1, description="torch and faiss threads")
    lone_scan_threads: int = Field(
        default_factory=_default_lone_threads,
        ge=1,
        le=64,
        description="threads sharing the int8 scan of a request that arrives alone (a batch of several "
        "scans each on one thread); split between workers",
    )
    retrieval: RetrievalKind = Field(
        default="auto", description="top-k backend; auto picks by the head's size (labels × d)"
    )
    exact_max_weights: int = Field(
        default=4_000_000, ge=0, description="auto: exact float32 scan up to this many weights (K·d)"
    )
    ivf_nlist: int | None = Field(default=None, ge=1, description="IVF and int8 cells; None: about 2*sqrt(K)")
    ivf_nprobe: int | None = Field(default=None, ge=1, description="IVF cells probed; None: tuned at build")
    index_recall_target: float = Field(
        default=0.99, gt=0, le=1, description="recall@10 the nprobe tuning aims at"
    )
    hnsw_m: int = Field(default=32, ge=4)
    hnsw_ef_search: int = Field(default=128, ge=1)
    exact_block_rows: int = Field(
        default=65536, ge=1024, description="label rows per block on the exact path"
    )
    warmup: bool = Field(default=True, description="run a few predictions before a model is marked ready")

    # --- serving processes ---------------------------------------------------------------------------
    workers: int = Field(
        default=1, ge=1, le=64, description="serving processes on one port; `threads` is split between them"
    )
    active_poll_s: float = Field(
        default=1.0, gt=0, le=60, description="how often a process checks the database for activations"
    )
    refused_retry_s: float = Field(
        default=30.0, ge=0, description="a version that failed to load is retried after this long"
    )

    # --- training jobs (service/training) ----------------------------------------------------------------
    db_url: str | None = Field(
        default=None, description="job database URL; None: SQLite file <data_dir>/ovex.db"
    )
    embedded_worker: bool = Field(default=True, description="`ovex serve` starts its own worker process")
    worker_concurrency: int = Field(
        default=1, ge=1, le=64, description="jobs one worker process runs at once"
    )
    memory_budget_bytes: int = Field(
        default=4 << 30,
        ge=1 << 20,
        description="most memory one training process (one rank of a sharded job) may need",
    )
    checkpoint_every: int = Field(default=500, ge=1, description="training steps between checkpoints")
    job_heartbeat_s: float = Field(default=1.0, gt=0, description="how often a worker renews its job's lease")
    job_lease_s: float = Field(
        default=15.0, gt=0, description="a running job whose lease is older is re-queued"
    )
    job_max_attempts: int = Field(default=3, ge=1, description="worker losses before a job is marked failed")
    job_poll_s: float = Field(
        default=0.25, gt=0, le=10, description="how often idle workers and event streams look for news"
    )

    # --- handing the one object to child processes -----------------------------------------------------
    def to_child_json(self) -> str:
        """This object as JSON, keys included, for a serving process this one spawns (`--workers N`)."""
        data = self.model_dump(mode="json")
        for name in ("api_key", "read_key"):
            secret = getattr(self, name)
            data[name] = None if secret is None else secret.get_secret_value()
        return json.dumps(data)

    @classmethod
    def for_child(cls) -> Settings:
        """The parent's object when it handed one over (`SETTINGS_ENV`), else the `OVEX_*` environment."""
        given = os.environ.get(SETTINGS_ENV)
        return cls.model_validate_json(given) if given else cls()


def default_of(name: str) -> Any:
    """A field's default as a `Settings()` without environment would have it, for objects that take a
    part of these settings and must not repeat their defaults."""
    return Settings.model_fields[name].get_default(call_default_factory=True)


# where `ovex serve --workers N` puts its `Settings` (as JSON) for the processes it spawns
SETTINGS_ENV = "OVEX_SETTINGS_JSON"
