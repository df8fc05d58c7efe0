"""Request and response bodies of the prediction and model endpoints (pydantic at the edge)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator, model_validator

from trainer.losses import LOSSES, load_plugins
from trainer.params import TrainParams

# float32 is what the model computes in; larger magnitudes would become inf there.
F32_MAX = 3.4028234663852886e38

FeatureIndex = Annotated[StrictInt, Field(ge=0)]
FeatureValue = Annotated[float, Field(allow_inf_nan=False, ge=-F32_MAX, le=F32_MAX)]


class SparseFeatures(BaseModel):
    """A sparse vector in the model's input space: `values[i]` at column `indices[i]`."""

    model_config = ConfigDict(extra="forbid")

    indices: list[FeatureIndex] = Field(description="column indices, 0 ≤ i < the model's n_features")
    values: list[FeatureValue] = Field(description="finite values, same length as indices")

    @model_validator(mode="after")
    def _same_length(self) -> SparseFeatures:
        if len(self.indices) != len(self.values):
            raise ValueError(
                f"indices and values differ in length ({len(self.indices)} vs {len(self.values)})"
            )
        return self


class PredictInput(BaseModel):
    """Exactly one of `text` (featurized by the model) or `features` (already in its input space)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"text": "sparse labels"}]})

    text: str | None = Field(None, min_length=1, description="raw text; must not be blank")
    features: SparseFeatures | None = None

    @field_validator("text")
    @classmethod
    def _not_blank(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("text is blank")
        return v

    @model_validator(mode="after")
    def _exactly_one(self) -> PredictInput:
        if (self.text is None) == (self.features is None):
            raise ValueError("give exactly one of `text` or `features`")
        return self


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inputs: list[PredictInput] = Field(min_length=1, description="at most the server's max_batch inputs")
    top_k: StrictInt = Field(10, ge=1, description="most labels per answer (at most the server's max_top_k)")
    normalization: Literal["sparsemax", "evsoftmax", "softmax", "none"] = "sparsemax"
    exact: StrictBool = Field(False, description="score every label instead of using the index")


class LabelOut(BaseModel):
    id: int
    name: str
    score: float
    prob: float | None = Field(description="probability under the normalization; null for `none`")


class PredictionOut(BaseModel):
    labels: list[LabelOut] = Field(description="best first; for sparse maps only non-zero probabilities")
    exact: bool = Field(description="equals the answer from scoring every label")
    known_features: int = Field(
        description="how many of the input's features the model knows: for text, the distinct words found "
        "in its vocabulary (or hash buckets hit); for sparse features, the non-zero values. 0 means nothing "
        "was recognised and the answer reflects only the label biases"
    )


class PredictResponse(BaseModel):
    model: str
    version: str
    predictions: list[PredictionOut]


class VersionInfo(BaseModel):
    version: str
    active: bool
    loaded: bool
    n_labels: int | None = None
    n_features: int | None = None
    dim: int | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    error: str | None = Field(None, description="why this version was refused, if it was")


class ModelInfo(BaseModel):
    name: str
    active_version: str | None
    n_labels: int | None = None
    n_features: int | None = None
    dim: int | None = None
    retrieval: str | None = Field(None, description="top-k backend of the active version")
    metrics: dict[str, Any] = Field(default_factory=dict)
    versions: list[VersionInfo]


class ModelList(BaseModel):
    default: str | None
    models: list[ModelInfo]


class ActivateResponse(BaseModel):
    name: str
    active_version: str
    previous_version: str | None


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    ready: bool
    models: dict[str, str] = Field(default_factory=dict, description="model → active version")


class ErrorField(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorBody(BaseModel):
    detail: str | list[ErrorField]


def train_params_schema() -> dict[str, Any]:
    """The JSON schema of `TrainParams` for the job `params` field, with the loss names as an enum, so
    the OpenAPI document (and the console's form built from it) lists every training option."""
    load_plugins()
    schema = TrainParams.model_json_schema()
    schema["properties"]["loss"]["enum"] = sorted(LOSSES)
    schema["title"] = "TrainParams"
    return schema
