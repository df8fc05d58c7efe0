"""Every SQL table: datasets, jobs and the per-job event log; models' active versions and flags.

Timestamps are float seconds since the epoch: SQLite and PostgreSQL then compare and return them the
same way, which matters for the heartbeat lease that decides whether a job's worker has died.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
_EventId = BigInteger().with_variant(Integer(), "sqlite")

QUEUED = "queued"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
TERMINAL_STATES = frozenset({SUCCEEDED, FAILED, CANCELLED})
ACTIVE_STATES = frozenset({QUEUED, RUNNING})
STATES = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED)
# the format of an uploaded label-texts file ({"name", "text"} lines), beside the data formats jsonl and xc
LABEL_TEXTS = "label_texts"


class Base(DeclarativeBase):
    """Declarative base; the migrations mirror these tables by hand."""


class DatasetRow(Base):
    __tablename__ = "datasets"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    checksum: Mapped[str] = mapped_column(String(64), unique=True)
    format: Mapped[str] = mapped_column(String(16))
    filename: Mapped[str] = mapped_column(String(255))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    rows: Mapped[int] = mapped_column(Integer)
    features: Mapped[int | None] = mapped_column(Integer, nullable=True)
    labels: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)
    # deleted while ended jobs named it: the record stays for their history, the file is gone
    deleted_at: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    model: Mapped[str] = mapped_column(String(64))
    train_dataset: Mapped[str] = mapped_column(String(40), ForeignKey("datasets.id"))
    test_dataset: Mapped[str | None] = mapped_column(String(40), ForeignKey("datasets.id"), nullable=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    # {"model", "version", "replay_dataset"} of the version a continual job grows (training.continuing)
    base: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True, default=None)
    # the dataset (of format "label_texts") whose label texts the job trains with
    label_texts: Mapped[str | None] = mapped_column(String(40), nullable=True, default=None)
    activate: Mapped[bool] = mapped_column(Boolean, default=False)
    state: Mapped[str] = mapped_column(String(16), index=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(128), nullable=True)
    heartbeat_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)
    epoch: Mapped[int | None] = mapped_column(Integer, nullable=True)
    epochs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    steps_total: Mapped[int | None] = mapped_column(Integer, nullable=True)
    examples_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    resumed_from_step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    model_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    activated: Mapped[bool] = mapped_column(Boolean, default=False)


class JobEventRow(Base):
    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(_EventId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(40), ForeignKey("jobs.id", ondelete="CASCADE"))
    ts: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(16))
    data: Mapped[dict[str, Any]] = mapped_column(JSON)


class ActiveVersionRow(Base):
    __tablename__ = "active_versions"

    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    version: Mapped[str] = mapped_column(String(128))
    explicit: Mapped[bool] = mapped_column(Boolean, default=False)
    updated_at: Mapped[float] = mapped_column(Float)


class ModelFlagsRow(Base):
    """What an operator decided about a model beyond its active version: it is the default (at most one
    row), or it is deactivated (not served; its versions stay)."""

    __tablename__ = "model_flags"

    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    deactivated: Mapped[bool] = mapped_column(Boolean, default=False)
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)
    updated_at: Mapped[float] = mapped_column(Float)
