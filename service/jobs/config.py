"""The slice of the service settings the job system reads, as one frozen dataclass.

Reading settings through this adapter keeps the job code testable on its own and lets the worker process
rebuild exactly the same configuration from the `OVEX_*` environment the API hands it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

QueueKind = Literal["sqlite", "redis"]


def normalize_db_url(url: str) -> str:
    """Route plain `postgresql://` URLs to psycopg 3 (the driver we ship) instead of psycopg2."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


@dataclass(frozen=True)
class JobsConfig:
    """Paths, backends and limits of the job system."""

    data_dir: Path
    models_dir: Path
    db_url: str
    queue: QueueKind = "sqlite"
    redis_url: str = "redis://127.0.0.1:6379/0"
    max_upload_bytes: int = 1 << 30
    memory_budget_bytes: int = 4 << 30
    checkpoint_every: int = 500
    embedded_worker: bool = True
    worker_concurrency: int = 1
    heartbeat_s: float = 1.0
    lease_s: float = 15.0
    max_attempts: int = 3
    poll_s: float = 0.25

    @property
    def datasets_dir(self) -> Path:
        return self.data_dir / "datasets"

    @property
    def uploads_dir(self) -> Path:
        return self.data_dir / "uploads"

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"

    @property
    def queue_file(self) -> Path:
        return self.data_dir / "queue.sqlite3"

    def job_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id

    @classmethod
    def from_settings(cls, settings: Any) -> JobsConfig:
        """Build from the service `Settings` (fields missing there fall back to the defaults above)."""
        data_dir = Path(getattr(settings, "data_dir", "data")).expanduser().resolve()
        models_dir = Path(getattr(settings, "models_dir", "models")).expanduser().resolve()
        db_url = getattr(settings, "db_url", None) or f"sqlite:///{data_dir / 'ovex.db'}"
        defaults = cls(data_dir=data_dir, models_dir=models_dir, db_url=db_url)

        def pick(name: str, setting: str | None = None) -> Any:
            value = getattr(settings, setting or name, None)
            return getattr(defaults, name) if value is None else value

        return cls(
            data_dir=data_dir,
            models_dir=models_dir,
            db_url=normalize_db_url(str(db_url)),
            queue=pick("queue"),
            redis_url=str(pick("redis_url")),
            max_upload_bytes=int(pick("max_upload_bytes")),
            memory_budget_bytes=int(pick("memory_budget_bytes")),
            checkpoint_every=int(pick("checkpoint_every")),
            embedded_worker=bool(pick("embedded_worker")),
            worker_concurrency=int(pick("worker_concurrency")),
            heartbeat_s=float(pick("heartbeat_s", "job_heartbeat_s")),
            lease_s=float(pick("lease_s", "job_lease_s")),
            max_attempts=int(pick("max_attempts", "job_max_attempts")),
        )

    def ensure_dirs(self) -> None:
        for path in (self.data_dir, self.models_dir, self.datasets_dir, self.uploads_dir, self.jobs_dir):
            path.mkdir(parents=True, exist_ok=True)
