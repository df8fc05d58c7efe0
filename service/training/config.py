"""The job system's view of the one `Settings` object: derived paths and the database URL.

Nothing here is a second copy of a setting: limits and timings are read from `Settings` where they are
used; this class only adds what follows from them (directories under `data_dir`, the default SQLite URL).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from service.db.engine import db_url
from service.serving.catalog import ModelCatalog
from service.settings import Settings


@dataclass(frozen=True)
class JobsConfig:
    """`settings` plus the paths and database URL derived from it."""

    settings: Settings

    @property
    def data_dir(self) -> Path:
        return Path(self.settings.data_dir).expanduser().resolve()

    @property
    def models_dir(self) -> Path:
        return Path(self.settings.models_dir).expanduser().resolve()

    @property
    def catalog(self) -> ModelCatalog:
        """The models directory's layout: where versions are published and found."""
        return ModelCatalog(self.models_dir)

    @property
    def db_url(self) -> str:
        return db_url(self.settings)

    @property
    def datasets_dir(self) -> Path:
        return self.data_dir / "datasets"

    @property
    def uploads_dir(self) -> Path:
        return self.data_dir / "uploads"

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"

    def job_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id

    def ensure_dirs(self) -> None:
        for path in (self.data_dir, self.models_dir, self.datasets_dir, self.uploads_dir, self.jobs_dir):
            path.mkdir(parents=True, exist_ok=True)
