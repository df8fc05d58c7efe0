"""KServe Open Inference Protocol (V2) bodies, and the conversion between V2 tensors and ovex's own
prediction request and answers (pydantic at the edge; the prediction itself is the /v1 path's).

Inputs: a text model takes one BYTES tensor `text` of shape [N] (or [N, 1]); a sparse model takes the
rows in CSR form: `indices` INT64 [nnz], `values` FP32 [nnz] and, for more than one row, `offsets` INT64
[N + 1] (row i is entries offsets[i] .. offsets[i+1]). Outputs are rectangular [N, L] tensors padded
past each row's `label_counts` (ids -1, names "", scores and probabilities 0), because a sparse
distribution keeps a different number of labels per row.
"""

from __future__ import annotations

import itertools
import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    FailFast,
    Field,
    StrictFloat,
    StrictInt,
    TypeAdapter,
    ValidationError,
)

from service.api.bodies import ClientBody
from service.api.schemas import PredictInput, PredictRequest, SparseFeatures
from service.errors import Malformed
from service.serving.predictor import RowPrediction

MAX_TENSOR_ELEMENTS = 1 << 22
Datatype = Literal[
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BYTES",
]  # fmt: skip
INT_TYPES = ("INT64", "INT32", "INT16", "INT8", "UINT64", "UINT32", "UINT16", "UINT8")
FLOAT_TYPES = ("FP32", "FP64", "FP16")
OUTPUTS = ("label_ids", "label_names", "probabilities", "scores", "label_counts", "exact", "from_text")
PARAMETERS = ("top_k", "normalization", "exact")
# element checks of INT and FP tensors: strict (no bools, no strings), stopping at the first bad element
_INTS: TypeAdapter[list[Any]] = TypeAdapter(Annotated[list[StrictInt], FailFast()])
_FLOATS: TypeAdapter[list[Any]] = TypeAdapter(
    Annotated[list[Annotated[StrictFloat, Field(allow_inf_nan=False)]], FailFast()]
)


class TensorMeta(BaseModel):
    """An input or output tensor a model takes or returns."""

    name: str = Field(description="tensor name")
    datatype: Datatype = Field(description="element type (BYTES, FP32, INT64, BOOL, ...)")
    shape: list[int] = Field(description="dimensions; -1 for one of any size")


class ModelMetadata(BaseModel):
    """What a model is and which tensors it takes and returns."""

    name: str = Field(description="model name")
    versions: list[str] = Field(description="its stored versions")
    platform: str = Field(default="ovex", description="the serving platform")
    inputs: list[TensorMeta] = Field(description="the input tensors it takes")
    outputs: list[TensorMeta] = Field(description="the output tensors it can return")
    parameters: dict[str, Any] = Field(default_factory=dict, description="the request parameters it takes")


class InferInput(ClientBody):
    """One input tensor: `text` (BYTES), or sparse rows as `indices`, `values` and `offsets`."""

    name: str = Field(max_length=64, description="text, indices, values or offsets")
    shape: list[Annotated[StrictInt, Field(ge=0)]] = Field(
        min_length=1, max_length=4, description="dimensions of `data`"
    )
    datatype: Datatype = Field(description="BYTES for text, INT64 for indices/offsets, FP32 for values")
    parameters: dict[str, Any] | None = Field(None, description="per-input parameters (none are used)")
    data: list[Any] = Field(description="row-major, flat or nested")


class RequestedOutput(ClientBody):
    """An output the client wants back (all of them when the request names none)."""

    name: str = Field(max_length=64, description="label_ids, label_names, probabilities, scores, ...")
    parameters: dict[str, Any] | None = Field(
        None, description="`classification: k` (as in Triton) asks for the top k labels"
    )


class InferRequest(ClientBody):
    """An inference request of the Open Inference Protocol (V2)."""

    id: str | None = Field(None, max_length=256, description="echoed in the response")
    parameters: dict[str, Any] | None = Field(
        None, description="top_k (int), normalization (sparsemax|evsoftmax|softmax|none), exact (bool)"
    )
    inputs: list[InferInput] = Field(min_length=1, max_length=3, description="the input tensors")
    outputs: list[RequestedOutput] | None = Field(
        None, max_length=len(OUTPUTS), description="the outputs wanted; left out: all of them"
    )


class InferOutput(BaseModel):
    """One output tensor; rows are padded to the longest answer (`label_counts` gives each row's length)."""

    name: str = Field(description="output name")
    datatype: Datatype = Field(description="element type")
    shape: list[int] = Field(description="dimensions of `data`")
    data: list[Any] = Field(description="row-major, flat")


class InferResponse(BaseModel):
    """The answer to an inference request, naming the version that produced it."""

    model_name: str = Field(description="model name")
    model_version: str = Field(description="the version that answered")
    id: str | None = Field(None, description="the request's id")
    outputs: list[InferOutput] = Field(description="the output tensors")


class V2Error(BaseModel):
    """Every error under /v2, in the protocol's shape."""

    error: str = Field(description="what is wrong and how to fix it")


def input_metadata(input_kind: str) -> list[TensorMeta]:
    if input_kind == "text":
        return [TensorMeta(name="text", datatype="BYTES", shape=[-1])]
    return [
        TensorMeta(name="indices", datatype="INT64", shape=[-1]),
        TensorMeta(name="values", datatype="FP32", shape=[-1]),
        TensorMeta(name="offsets", datatype="INT64", shape=[-1]),
    ]


OUTPUT_METADATA = [
    TensorMeta(name="label_ids", datatype="INT64", shape=[-1, -1]),
    TensorMeta(name="label_names", datatype="BYTES", shape=[-1, -1]),
    TensorMeta(name="probabilities", datatype="FP32", shape=[-1, -1]),
    TensorMeta(name="scores", datatype="FP32", shape=[-1, -1]),
    TensorMeta(name="label_counts", datatype="INT64", shape=[-1]),
    TensorMeta(name="exact", datatype="BOOL", shape=[-1]),
    TensorMeta(name="from_text", datatype="BOOL", shape=[-1, -1]),
]


def _size(t: InferInput) -> int:
    """The elements the tensor's shape declares, bounded before any element is looked at."""
    need = math.prod(t.shape)
    if need > MAX_TENSOR_ELEMENTS:
        raise Malformed(f"input {t.name!r}: shape {t.shape} holds over {MAX_TENSOR_ELEMENTS} elements")
    return need


def _flat(t: InferInput) -> list[Any]:
    """The tensor's elements in row-major order, checked against its shape (stops at the first extra)."""
    need = _size(t)
    if len(t.data) == need and not any(type(x) is list for x in t.data):
        return t.data  # already flat, as clients send it: no walk
    out: list[Any] = []
    stack = [iter(t.data)]
    while stack:
        for x in stack[-1]:
            if isinstance(x, list):
                stack.append(iter(x))
                break
            out.append(x)
            if len(out) > need:
                raise Malformed(f"input {t.name!r}: shape {t.shape} needs {need} elements, data has more")
        else:
            stack.pop()
    if len(out) != need:
        raise Malformed(f"input {t.name!r}: shape {t.shape} needs {need} elements, data has {len(out)}")
    return out


def _checked(t: InferInput, adapter: TypeAdapter[list[Any]], what: str) -> list[Any]:
    """The elements as `adapter` reads them (in pydantic's compiled code: no Python loop per element),
    or a `Malformed` naming the first bad one."""
    try:
        return adapter.validate_python(_flat(t))
    except ValidationError as exc:
        e = exc.errors()[0]
        where = e["loc"][0] if e["loc"] else "?"
        raise Malformed(f"input {t.name!r}: element {where} is {e.get('input')!r}, not {what}") from None


def _rows_declared(by_name: dict[str, InferInput], input_kind: str) -> int:
    """How many rows the request's shapes declare: the batch limit is checked on this, before any data."""
    if input_kind == "text":
        return by_name["text"].shape[0]
    if "offsets" in by_name:
        return max(0, _size(by_name["offsets"]) - 1)
    return 1


def _ints(t: InferInput) -> list[int]:
    if t.datatype not in INT_TYPES:
        raise Malformed(f"input {t.name!r} must be an integer tensor (INT64), not {t.datatype}")
    return _checked(t, _INTS, "an integer")


def _floats(t: InferInput) -> list[float]:
    if t.datatype not in FLOAT_TYPES:
        raise Malformed(f"input {t.name!r} must be a float tensor (FP32), not {t.datatype}")
    return _checked(t, _FLOATS, "a finite number")


def _rows(req: InferRequest, input_kind: str, max_batch: int) -> list[PredictInput]:
    by_name = {t.name: t for t in req.inputs}
    if len(by_name) != len(req.inputs):
        raise Malformed("each input name may appear once")
    expected = {"text"} if input_kind == "text" else {"indices", "values", "offsets"}
    unknown = sorted(set(by_name) - expected)
    if unknown:
        raise Malformed(
            f"unknown input {unknown[0]!r}: this model takes "
            + (
                "one BYTES input 'text'"
                if input_kind == "text"
                else "INT64 'indices', FP32 'values' and optionally INT64 'offsets'"
            )
        )
    if input_kind == "text":
        t = by_name.get("text")
        if t is None:
            raise Malformed("a text model takes one BYTES input 'text' of shape [N]")
        if t.datatype != "BYTES" or len(t.shape) > 2 or (len(t.shape) == 2 and t.shape[1] != 1):
            raise Malformed("input 'text' must be BYTES of shape [N] or [N, 1]")
    elif "indices" not in by_name or "values" not in by_name:
        raise Malformed("a sparse model takes INT64 'indices' and FP32 'values' (and 'offsets' for N rows)")
    n_rows = _rows_declared(by_name, input_kind)
    if n_rows > max_batch:
        raise Malformed(
            f"at most {max_batch} rows per request, the inputs' shapes declare {n_rows}: "
            "split them into several requests"
        )
    if input_kind == "text":
        texts = _flat(by_name["text"])
        bad = next((i for i, x in enumerate(texts) if not isinstance(x, str)), None)
        if bad is not None:
            raise Malformed(f"input 'text': element {bad} is not a string")
        return [PredictInput.model_construct(text=x, features=None) for x in texts]
    n_indices, n_values = _size(by_name["indices"]), _size(by_name["values"])
    if n_indices != n_values:
        raise Malformed(f"'indices' and 'values' differ in length ({n_indices} vs {n_values})")
    indices, values = _ints(by_name["indices"]), _floats(by_name["values"])
    offsets = _ints(by_name["offsets"]) if "offsets" in by_name else [0, len(indices)]
    if len(offsets) < 2 or offsets[0] != 0 or offsets[-1] != len(indices):
        raise Malformed(f"'offsets' must run from 0 to len(indices) = {len(indices)} (N + 1 entries)")
    if any(b < a for a, b in itertools.pairwise(offsets)):
        raise Malformed("'offsets' must not decrease")
    return [
        PredictInput.model_construct(
            text=None,
            features=SparseFeatures.model_construct(indices=indices[a:b], values=values[a:b]),
        )
        for a, b in itertools.pairwise(offsets)
    ]


def _top_k(req: InferRequest) -> int | None:
    """`parameters.top_k`, or Triton's `classification: k` on a requested output; they must agree."""
    given = [
        (f"output {o.name!r} classification", (o.parameters or {})["classification"])
        for o in req.outputs or ()
        if "classification" in (o.parameters or {})
    ]
    if req.parameters and "top_k" in req.parameters:
        given.append(("parameter top_k", req.parameters["top_k"]))
    for where, k in given:
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise Malformed(f"{where} must be a positive integer, got {k!r}")
    ks = {k for _, k in given}
    if len(ks) > 1:
        raise Malformed(f"top_k and the outputs' classification parameters disagree: {sorted(ks)}")
    return ks.pop() if ks else None


def to_predict_request(req: InferRequest, input_kind: str, max_batch: int) -> PredictRequest:
    """The /v1 request this V2 request means; every problem is a `Malformed` (400) saying what to fix.
    Shapes are checked against the batch limit before any element is read; the per-element checks
    are Python loops over up to a body's worth of numbers, so the caller runs this off the event loop."""
    params = dict(req.parameters or {})
    unknown = sorted(set(params) - set(PARAMETERS))
    if unknown:
        raise Malformed(f"unknown parameter {unknown[0]!r}; known: {', '.join(PARAMETERS)}")
    for o in req.outputs or ():
        if o.name not in OUTPUTS:
            raise Malformed(f"unknown output {o.name!r}; this model returns {', '.join(OUTPUTS)}")
        if set(o.parameters or {}) - {"classification"}:
            raise Malformed(f"output {o.name!r}: the only output parameter is 'classification'")
    rows = _rows(req, input_kind, max_batch)
    top_k = _top_k(req)
    fields: dict[str, Any] = {"inputs": [r.model_dump(exclude_none=True) for r in rows]}
    if top_k is not None:
        fields["top_k"] = top_k
    for key in ("normalization", "exact"):
        if key in params:
            fields[key] = params[key]
    try:
        pr = PredictRequest.model_validate(fields)
    except ValidationError as exc:
        raise Malformed("; ".join(_describe(e) for e in exc.errors()[:10])) from None
    if pr.normalization == "none" and any(o.name == "probabilities" for o in req.outputs or ()):
        raise Malformed("output 'probabilities' needs a normalization other than 'none'")
    return pr


def _describe(e: Any) -> str:
    loc = list(e.get("loc", ()))
    if loc[:1] == ["inputs"] and len(loc) > 1:
        where = f"row {loc[1]}" + "".join(f".{p}" for p in loc[2:])
    elif loc[:1] == ["top_k"]:
        where = "top_k / classification"
    else:
        where = ".".join(map(str, loc)) or "request"
    return f"{where}: {e.get('msg', 'invalid')}"


def to_outputs(preds: list[RowPrediction], req: InferRequest, normalization: str) -> list[InferOutput]:
    n, width = len(preds), max((len(p.labels) for p in preds), default=0)

    def grid(get: Any, pad: Any) -> list[Any]:
        return [[get(b) for b in p.labels] + [pad] * (width - len(p.labels)) for p in preds]

    tensors: dict[str, tuple[Datatype, list[int], Any]] = {
        "label_ids": ("INT64", [n, width], lambda: grid(lambda b: b.id, -1)),
        "label_names": ("BYTES", [n, width], lambda: grid(lambda b: b.name, "")),
        "probabilities": ("FP32", [n, width], lambda: grid(lambda b: b.prob or 0.0, 0.0)),
        "scores": ("FP32", [n, width], lambda: grid(lambda b: b.score, 0.0)),
        "label_counts": ("INT64", [n], lambda: [len(p.labels) for p in preds]),
        "exact": ("BOOL", [n], lambda: [p.certified for p in preds]),
        # a label known by its text alone (no training rows yet), as REST answers' `from_text`
        "from_text": ("BOOL", [n, width], lambda: grid(lambda b: b.from_text, False)),
    }
    wanted = (
        [o.name for o in req.outputs]
        if req.outputs
        else [name for name in OUTPUTS if not (name == "probabilities" and normalization == "none")]
    )
    out = []
    for name in wanted:
        dtype, shape, make = tensors[name]
        out.append(InferOutput(name=name, datatype=dtype, shape=shape, data=make()))
    return out
