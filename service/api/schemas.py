"""Request and response bodies of the prediction and model endpoints (pydantic at the edge)."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from service.api.bodies import ClientBody

# words of the `ovex demo` model's vocabulary: the OpenAPI examples work against it as they stand
DEMO_TEXT = "noci dotavo jihede kupici"
# float32 is what the model computes in; larger magnitudes would become inf there.
F32_MAX = 3.4028234663852886e38

FeatureIndex = Annotated[StrictInt, Field(ge=0)]
# as long as a stored name may be: a longer one names nothing, and is refused before it is echoed back
NAME_MAX = 128
ModelName = Annotated[str, Path(description="model name (GET /v1/models lists them)", examples=["demo"],
                                max_length=NAME_MAX)]
VersionName = Annotated[str, Path(description="version of the model (its directory name)", examples=["1"],
                                  max_length=NAME_MAX)]
# strict: `true` is not a feature value (V2 refuses it too); integers are still taken as floats
FeatureValue = Annotated[StrictFloat, Field(allow_inf_nan=False, ge=-F32_MAX, le=F32_MAX)]

# The most inputs the server answering this request takes (its `max_batch`), set per request by a
# dependency that FastAPI resolves before the body: the list is counted before any input is validated,
# so a huge list costs one `len`, not one validation and one error per input. None: not checked here.
BATCH_LIMIT: ContextVar[int | None] = ContextVar("ovex_batch_limit", default=None)


class SparseFeatures(ClientBody):
    """A sparse vector in the model's input space: `values[i]` at column `indices[i]`."""

    # fail_fast: the first bad element is reported, not one error per element of a long list
    indices: list[FeatureIndex] = Field(
        fail_fast=True, description="column indices, 0 ≤ i < the model's n_features"
    )
    values: list[FeatureValue] = Field(fail_fast=True, description="finite values, same length as indices")

    @model_validator(mode="after")
    def _same_length(self) -> SparseFeatures:
        if len(self.indices) != len(self.values):
            raise ValueError(
                f"indices and values differ in length ({len(self.indices)} vs {len(self.values)})"
            )
        return self


class PredictInput(ClientBody):
    """Exactly one of `text` (featurized by the model) or `features` (already in its input space)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"text": DEMO_TEXT},
                {"features": {"indices": [3, 17, 42], "values": [1.0, 1.0, 0.5]}},
            ]
        },
    )

    text: str | None = Field(
        None, min_length=1, description="raw text for a model trained on text; must not be blank"
    )
    features: SparseFeatures | None = Field(
        None, description="a sparse vector for a model trained on XC-format features"
    )

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


class PredictRequest(ClientBody):
    """Inputs to label, and how: how many labels at most, which map turns scores into probabilities."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"inputs": [{"text": DEMO_TEXT}], "top_k": 5}]},
    )

    inputs: list[PredictInput] = Field(
        min_length=1, description="one answer per input, in order; at most the server's max_batch inputs"
    )
    top_k: StrictInt = Field(10, ge=1, description="most labels per answer (at most the server's max_top_k)")
    normalization: Literal["sparsemax", "evsoftmax", "softmax", "none"] = Field(
        "sparsemax",
        description="scores → probabilities: sparsemax and evsoftmax give exact zeros (only labels with "
        "non-zero probability are listed), softmax a dense distribution, none scores only",
    )
    exact: StrictBool = Field(False, description="score every label instead of using the index")
    explain: StrictBool = Field(
        False,
        description="also say, per returned label, which input words (text models) or feature ids "
        "contributed most to its score (`explanation`); only with top_k at most the server's "
        "max_explain_top_k",
    )

    @field_validator("inputs", mode="before")
    @classmethod
    def _count_first(cls, v: Any) -> Any:
        limit = BATCH_LIMIT.get()
        if limit is not None and isinstance(v, list) and len(v) > limit:
            raise PydanticCustomError(
                "too_long",
                "at most {limit} inputs per request, got {count}: split them into several requests",
                {"limit": limit, "count": len(v)},
            )
        return v


class Contribution(BaseModel):
    """What one input feature added to a label's score."""

    feature: int = Field(description="the feature's column in the model's input space")
    word: str | None = Field(None, description="the input's word (or word pair, or a sentence's or clause's "
                             "leading word marked `^`) behind it, for text models")
    value: float = Field(description="the feature's value after the model's featurization (tf-idf, L2)")
    contribution: float = Field(description="its share of the score (see `method`)")


class Explanation(BaseModel):
    """Why a label scored as it did."""

    method: Literal["exact", "gradient_x_input"] = Field(
        description="exact (linear encoder): score = bias + Σ contributions over all the input's features; "
        "gradient_x_input (mlp/maxout): each feature's value times the score's derivative by it, a "
        "first-order approximation that need not sum to the score"
    )
    approximate: bool = Field(description="true unless method is exact")
    bias: float = Field(description="what the score is without any input feature: b_k + ⟨w_k, input bias⟩ "
                        "(exact method)")
    contributions: list[Contribution] = Field(
        description="the features with the largest |contribution|, largest first (at most the server's "
        "max_explain_terms)"
    )
    n_features: int = Field(description="how many of the input's features contributed (all, not only those "
                            "listed)")


class LabelOut(BaseModel):
    """One label of an answer."""

    id: int = Field(description="label id, 0 ≤ id < n_labels")
    name: str = Field(description="label name (the id as text where the training data had no names)")
    score: float = Field(description="the model's score ⟨w_k, h(x)⟩ + b_k")
    prob: float | None = Field(description="probability under the normalization; null for `none`")
    from_text: bool = Field(
        False, description="the label is known by its text alone: it has no training rows yet (added by "
        "POST /v1/models/{name}/labels, or named only in the model's label texts); a training job with rows "
        "for it (a continual job on this version) refines it"
    )
    explanation: Explanation | None = Field(None, description="only with `explain: true`")


class PredictionOut(BaseModel):
    """The answer for one input."""

    labels: list[LabelOut] = Field(description="best first; for sparse maps only non-zero probabilities")
    exact: bool = Field(description="equals the answer from scoring every label")
    known_features: int = Field(
        description="how many of the input's features the model knows: for text, the distinct words found "
        "in its vocabulary (or hash buckets hit); for sparse features, the non-zero values. 0 means nothing "
        "was recognised and the answer reflects only the label biases"
    )


class PredictResponse(BaseModel):
    """Answers, in input order, all from one model version."""

    model: str = Field(description="the model that answered")
    version: str = Field(description="the version that answered (each request sees exactly one)")
    predictions: list[PredictionOut] = Field(description="one per input, in order")


class VersionInfo(BaseModel):
    """One version of a model on disk."""

    version: str = Field(description="version directory name (models/<name>/<version>)")
    active: bool = Field(description="this version answers predictions")
    loaded: bool = Field(description="loaded in memory (the active version is)")
    n_labels: int | None = Field(None, description="number of labels K")
    n_features: int | None = Field(None, description="width of the input space")
    dim: int | None = Field(None, description="width of the representation h(x)")
    metrics: dict[str, Any] = Field(
        default_factory=dict, description="test metrics from training (p@k, ndcg@k, psp@k), if tested"
    )
    error: str | None = Field(None, description="why this version was refused, if it was")
    created_at: float | None = Field(None, description="when the version was written (seconds since the "
                                     "epoch)")
    job: str | None = Field(None, description="the job that made it (null: trained outside the service, or "
                            "its job record was deleted)")
    dataset: str | None = Field(None, description="the dataset id it was trained on (from its job)")
    base_version: str | None = Field(None, description="the version it grew (a continual job, or labels "
                                     "added by their texts); null: trained from scratch")
    lineage: str | None = Field(None, description='in words, e.g. "v2 grows v1"')
    test_dataset: str | None = Field(None, description="the dataset id its `metrics` were measured on "
                                     "(from its job; null: unknown or not tested)")


class ModelInfo(BaseModel):
    """A model: its versions and the one that serves."""

    name: str = Field(description="model name (models/<name>/)")
    active_version: str | None = Field(description="the version that answers predictions; null: none loaded")
    n_labels: int | None = Field(None, description="labels of the active version")
    n_features: int | None = Field(None, description="input width of the active version")
    dim: int | None = Field(None, description="representation width of the active version")
    retrieval: str | None = Field(None, description="top-k backend of the active version")
    label_texts: bool = Field(False, description="the active version was trained with label texts: POST "
                              "/v1/models/{name}/labels can add labels to it by their texts")
    metrics: dict[str, Any] = Field(default_factory=dict, description="test metrics of the active version")
    versions: list[VersionInfo] = Field(
        description="its newest versions on disk, oldest first: all of them when there are at most "
        "`versions` (the query parameter); `n_versions` says how many there are"
    )
    n_versions: int = Field(description="how many versions the model has on disk")
    versions_cursor: str | None = Field(
        None,
        description="pass as `cursor` to GET /v1/models/{name}/versions for the versions older than those "
        "shown; null when none is left out (with `versions=0`, start there without a cursor)",
    )
    default: bool = Field(False, description="this model answers POST /v1/predict")
    deactivated: bool = Field(False, description="not served (POST .../deactivate); activating a version "
                              "serves it again")
    created_at: float | None = Field(None, description="when its first version was written")
    input_kind: Literal["text", "sparse"] | None = Field(
        None, description="what its predict requests take: `text` inputs or sparse `features`"
    )


class ModelList(BaseModel):
    """One page of the models on disk."""

    default: str | None = Field(description="the model behind POST /v1/predict")
    default_source: Literal["setting", "api", "automatic"] = Field(
        "automatic",
        description="why: OVEX_DEFAULT_MODEL, set through PUT /v1/default-model, or automatic (the demo "
        "model, else the model whose first version is the oldest)",
    )
    models: list[ModelInfo] = Field(description="by name")
    next_cursor: str | None = Field(None, description="pass as `cursor` for the next page; null on the last")


class VersionList(BaseModel):
    """One page of a model's versions."""

    versions: list[VersionInfo] = Field(description="newest first")
    next_cursor: str | None = Field(
        description="pass as `cursor` for the next (older) page; null on the last"
    )


class DefaultModelRequest(ClientBody):
    """Which model answers POST /v1/predict."""

    model: StrictStr | None = Field(description="a model name; null: the automatic choice again",
                                    examples=["demo"], max_length=NAME_MAX)


class DefaultModelResponse(BaseModel):
    """The model behind POST /v1/predict, and why."""

    default: str | None = Field(description="the model (null: no model on disk)")
    source: Literal["setting", "api", "automatic"] = Field(
        description="OVEX_DEFAULT_MODEL (overrides the API), PUT /v1/default-model, or automatic")


class DeleteModelResponse(BaseModel):
    """A deleted model."""

    name: str = Field(description="the model, now gone with all its versions")
    versions: list[str] = Field(description="the versions deleted")
    cancelled_jobs: list[str] = Field(description="jobs cancelled first (`force=true`)")


class DeactivateResponse(BaseModel):
    """A deactivated model."""

    name: str = Field(description="the model, no longer served; its versions stay")
    deactivated: bool = Field(description="always true")


class ActivateResponse(BaseModel):
    """The outcome of a hot swap."""

    name: str = Field(description="the model")
    active_version: str = Field(description="the version that now answers")
    previous_version: str | None = Field(description="the version that answered before (null: none)")


class NewLabel(ClientBody):
    """A label to add, by its name and the text that says what it is."""

    name: StrictStr = Field(description="the label's name, new to the model", examples=["giravu"])
    text: StrictStr = Field(description="what the label is: its row is computed from this text",
                            examples=[DEMO_TEXT])


class AddLabelsRequest(ClientBody):
    """Labels to append to a model trained with label texts, as a new version."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"labels": [{"name": "new-topic", "text": DEMO_TEXT}], "activate": True}]
        }
    )

    labels: list[NewLabel] = Field(description="the labels to add (names new to the model, texts not blank)")
    activate: StrictBool = Field(False, description="activate the new version once it is written")
    base_version: str | None = Field(
        None, max_length=NAME_MAX, description="the version to extend; omitted: the active one"
    )


class AddLabelsResponse(BaseModel):
    """The version written with the labels appended."""

    name: str = Field(description="the model")
    version: str = Field(description="the new version: the base's labels, then the added ones")
    base_version: str = Field(description="the version it extends (left as it was)")
    n_labels: int = Field(description="labels of the new version")
    added: int = Field(description="labels added")
    first_label_id: int = Field(description="id of the first added label (the others follow in order)")
    index: str = Field(description="how its serving index came to be: `appended` (the base's int8 cells "
                       "extended), `built` (from scratch), or `exact` (none needed)")
    activated: bool = Field(description="whether the new version now answers")
    seconds: float = Field(description="time taken, activation included")


class Health(BaseModel):
    """The process is up."""

    status: str = Field(description='always "ok"')


class Readiness(BaseModel):
    """Whether predictions can be answered."""

    ready: bool = Field(
        description="a model version is loaded and warmed, and no model that is to serve is still loading"
    )
    models: dict[str, str] = Field(default_factory=dict, description="model → active version")


class ErrorField(BaseModel):
    """What is wrong with one field of the request."""

    loc: list[str | int] = Field(description='where: e.g. ["body", "inputs", 2, "features", "indices", 5]')
    msg: str = Field(description="what is wrong and how to fix it")
    type: str = Field(description="error kind (value_error, missing, not_found, ...)")


class ErrorBody(BaseModel):
    """Every error answer: a message, or one entry per field at fault."""

    detail: str | list[ErrorField] = Field(description="a message, or the fields at fault")
