"""Pydantic models of the server's requests and answers.

Answers allow extra fields, so a newer server that adds a field never breaks an older client.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator


def _to_str(value: Any) -> Any:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


# Ids and versions may be numbers or strings on the wire; the client always hands back strings.
Id = Annotated[str, BeforeValidator(_to_str)]

Normalization = Literal["sparsemax", "evsoftmax", "softmax", "none"]
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
# what a job's stream may send after its terminal state: whether the new version now serves
ACTIVATION_EVENTS = frozenset({"activated", "activation_failed"})


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())


class Features(BaseModel):
    """A sparse input row: feature ids and their values (same length, finite values)."""

    model_config = ConfigDict(extra="forbid")

    indices: list[int]
    values: list[float]

    @field_validator("values")
    @classmethod
    def _finite(cls, values: list[float]) -> list[float]:
        for i, v in enumerate(values):
            if not math.isfinite(v):
                raise ValueError(f"values[{i}] is not finite")
        return values

    @model_validator(mode="after")
    def _same_length(self) -> Features:
        if len(self.indices) != len(self.values):
            raise ValueError(
                f"indices and values differ in length ({len(self.indices)} != {len(self.values)})"
            )
        return self


PredictInput = str | Features | Mapping[str, Any]


def input_to_wire(item: PredictInput) -> dict[str, Any]:
    """One input as the API wants it: `{"text": ...}` or `{"features": {"indices", "values"}}`."""
    if isinstance(item, str):
        return {"text": item}
    if isinstance(item, Features):
        return {"features": item.model_dump()}
    if isinstance(item, Mapping):
        if "text" in item or "features" in item:
            out = dict(item)
            feats = out.get("features")
            if isinstance(feats, Features):
                out["features"] = feats.model_dump()
            return out
        if "indices" in item and "values" in item:
            return {"features": {"indices": list(item["indices"]), "values": list(item["values"])}}
    raise TypeError(
        "an input is a string, a Features, or a mapping with 'text' or 'features' "
        f"(got {type(item).__name__})"
    )


def inputs_to_wire(inputs: PredictInput | Sequence[PredictInput]) -> list[dict[str, Any]]:
    """A single input or a sequence of them, as the `inputs` list of a predict request."""
    if isinstance(inputs, str | Features | Mapping):
        return [input_to_wire(inputs)]
    return [input_to_wire(item) for item in inputs]


class Contribution(_Answer):
    """What one input feature added to a label's score."""

    feature: int
    word: str | None = None  # the input's word (or word pair) behind it, for text models
    value: float
    contribution: float


class Explanation(_Answer):
    """Why a label scored as it did (`explain=True`). With `method == "exact"` (linear encoder) the score is
    `bias` plus the sum of every feature's contribution; `gradient_x_input` is a first-order approximation."""

    method: str
    approximate: bool
    bias: float
    contributions: list[Contribution] = Field(default_factory=list)
    n_features: int | None = None


class LabelScore(_Answer):
    id: int
    name: str | None = None
    score: float
    prob: float | None = None
    from_text: bool = False  # known by its text alone: no training rows yet
    explanation: Explanation | None = None


class Prediction(_Answer):
    labels: list[LabelScore]
    exact: bool | None = None
    # features of the input the model knows; 0: nothing recognised, the answer is the label biases alone
    known_features: int | None = None


class PredictResponse(_Answer):
    model: str
    version: Id | None = None
    predictions: list[Prediction]


class ModelVersion(_Answer):
    version: Id
    active: bool | None = None
    loaded: bool | None = None
    n_labels: int | None = None
    n_features: int | None = None
    dim: int | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    created_at: datetime | None = None
    job: Id | None = None  # the job that made it
    dataset: Id | None = None  # the dataset it was trained on
    base_version: Id | None = None  # the version it grew; None: trained from scratch
    lineage: str | None = None  # in words, e.g. "v2 grows v1"
    test_dataset: Id | None = None  # the dataset its metrics were measured on


class ModelInfo(_Answer):
    name: str
    active_version: Id | None = None
    n_labels: int | None = None
    n_features: int | None = None
    dim: int | None = None
    retrieval: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    versions: list[ModelVersion] = Field(default_factory=list)
    # the model's newest versions are shown; how many it has, and where the older ones continue
    n_versions: int | None = None
    versions_cursor: str | None = None
    default: bool = False  # answers predict calls made without a model name
    deactivated: bool = False  # not served until one of its versions is activated
    created_at: datetime | None = None  # when its first version was written
    input_kind: str | None = None  # "text" or "sparse": what its predict calls take

    @field_validator("versions", mode="before")
    @classmethod
    def _versions(cls, value: Any) -> Any:
        # Accept bare version ids as well as version objects.
        if isinstance(value, list):
            return [v if isinstance(v, dict) else {"version": v} for v in value]
        return value


class ActivateResult(_Answer):
    name: str
    active_version: Id
    previous_version: Id | None = None


class DefaultModel(_Answer):
    """The model behind `predict` without a model name, and why: `setting` (OVEX_DEFAULT_MODEL), `api`
    (set with `set_default_model`) or `automatic` (the demo model, else the oldest)."""

    default: str | None = None
    source: str | None = None


class ModelDeleted(_Answer):
    """A model deleted with every version; `cancelled_jobs` were cancelled first (`force=True`)."""

    name: str
    versions: list[Id] = Field(default_factory=list)
    cancelled_jobs: list[Id] = Field(default_factory=list)


class ModelDeactivated(_Answer):
    name: str
    deactivated: bool = True


class LabelsAdded(_Answer):
    """The version written by adding labels by their texts."""

    name: str
    version: Id
    base_version: Id
    n_labels: int
    added: int
    first_label_id: int
    index: str | None = None
    activated: bool = False
    seconds: float | None = None


class DatasetInfo(_Answer):
    id: Id
    name: str | None = None
    rows: int | None = None
    features: int | None = None
    labels: int | None = None
    format: str | None = None
    size_bytes: int | None = None
    checksum: str | None = None
    filename: str | None = None
    created_at: datetime | None = None
    # only on an upload of bytes stored before: nothing was stored again; `name` is what holds them
    already_stored: bool = False
    requested_name: str | None = None
    note: str | None = None


class JobProgress(_Answer):
    epoch: float | None = None
    epochs: int | None = None
    step: int | None = None
    steps_total: int | None = None
    examples_per_s: float | None = None
    loss: float | None = None
    metrics: dict[str, float] | None = None

    @property
    def fraction(self) -> float | None:
        """Share of the work done, from steps if known, else from epochs."""
        if self.step is not None and self.steps_total:
            return min(1.0, self.step / self.steps_total)
        if self.epoch is not None and self.epochs:
            return min(1.0, self.epoch / self.epochs)
        return None


class Job(_Answer):
    id: Id
    state: str
    model: str | None = None
    train_dataset: Id | None = None
    test_dataset: Id | None = None
    params: dict[str, Any] | None = None
    activate: bool | None = None
    progress: JobProgress | None = None
    error: str | None = None
    model_version: Id | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    attempts: int | None = None
    worker: str | None = None
    resumed_from_step: int | None = None
    cancel_requested: bool | None = None
    base: dict[str, Any] | None = None
    label_texts: Id | None = None
    deleted_datasets: list[Id] = Field(default_factory=list)  # datasets it names that were deleted since

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES


class JobEvent(_Answer):
    """One Server-Sent Event of a job's stream; `data` is the decoded JSON payload (or raw text)."""

    event: str = "message"
    data: Any = None
    id: str | None = None

    @property
    def state(self) -> str | None:
        if isinstance(self.data, dict):
            st = self.data.get("state")
            if isinstance(st, str):
                return st
        return self.event if self.event in TERMINAL_STATES else None

    @property
    def progress(self) -> JobProgress | None:
        if not isinstance(self.data, dict):
            return None
        raw = self.data.get("progress", self.data if self.event == "progress" else None)
        return JobProgress.model_validate(raw) if isinstance(raw, dict) else None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES
