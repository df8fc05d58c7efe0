"""KServe Open Inference Protocol (V2) beside /v1, so gateways and clients written for it work unchanged.

Thin: the bodies and their conversion live in `v2_protocol`; a prediction goes through the same
`PredictService` as /v1 (limits, micro-batcher, the version pinned when the request arrived). Errors under
/v2 have the protocol's shape `{"error": "..."}` (mapped in `errors.py` with every other error).
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from service.api.deps import PredictDep, RegistryDep
from service.api.schemas import ModelName, VersionName
from service.api.v2_protocol import (
    OUTPUT_METADATA,
    InferRequest,
    InferResponse,
    ModelMetadata,
    V2Error,
    input_metadata,
    to_outputs,
    to_predict_request,
)
from service.errors import InputError, Malformed, NotFound
from service.serving.predict import PredictService
from service.serving.registry import ModelRegistry

router = APIRouter(prefix="/v2", tags=["v2 (open inference protocol)"])

ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": V2Error, "description": "invalid request; the message says what to fix"},
    404: {"model": V2Error, "description": "unknown model or version"},
    503: {"model": V2Error, "description": "not loaded yet, or the request timed out"},
}


def _v2_field(field: Sequence[str | int], msg: str) -> str:
    """A field error in V2's words: an input row by its number, any other field by its name."""
    if len(field) > 1 and field[0] == "inputs":
        return f"row {field[1]}: {msg}"
    return f"{field[-1]}: {msg}" if field else msg


@router.get("/health/live")
async def live() -> dict[str, bool]:
    """The process serves HTTP."""
    return {"live": True}


@router.get("/health/ready", responses={503: {"description": "no model serves yet, or one is still loading"}})
def ready(registry: RegistryDep) -> JSONResponse:
    """200 when the models are ready for inference (`ModelRegistry.ready`, as /readyz), else 503."""
    ok = registry.ready()
    return JSONResponse({"ready": ok}, status_code=200 if ok else 503)


def _metadata(predict: PredictService, name: str, version: str | None) -> ModelMetadata:
    served = predict.serving(name, version)
    return ModelMetadata(
        name=name,
        versions=[version] if version else predict.registry.scan().get(name, []),
        inputs=input_metadata(served.predictor.input_kind),
        outputs=OUTPUT_METADATA,
        parameters={
            "active_version": served.version,
            "n_labels": served.n_labels,
            "retrieval": served.retrieval,
        },
    )


@router.get("/models/{name}", response_model=ModelMetadata, responses=ERRORS)
def model_metadata(name: ModelName, predict: PredictDep) -> ModelMetadata:
    """Inputs and outputs of the model's active version, and every version on disk."""
    return _metadata(predict, name, None)


@router.get("/models/{name}/versions/{version}", response_model=ModelMetadata, responses=ERRORS)
def version_metadata(name: ModelName, version: VersionName, predict: PredictDep) -> ModelMetadata:
    """As the model's metadata, for one stored version."""
    return _metadata(predict, name, version)


def _model_ready(registry: ModelRegistry, name: str, version: str | None) -> JSONResponse:
    versions = registry.scan().get(name)
    if versions is None or (version is not None and version not in versions):
        raise NotFound(
            f"unknown model {name!r}" if versions is None else f"model {name!r} has no version {version!r}"
        )
    served = registry.serving(name)
    ok = served is not None and (version is None or served.version == version)
    return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 503)


@router.get("/models/{name}/ready", responses=ERRORS)
def model_ready(name: ModelName, registry: RegistryDep) -> JSONResponse:
    """200 when a version of the model serves, else 503."""
    return _model_ready(registry, name, None)


@router.get("/models/{name}/versions/{version}/ready", responses=ERRORS)
def version_ready(name: ModelName, version: VersionName, registry: RegistryDep) -> JSONResponse:
    """200 when this version is the one serving, else 503."""
    return _model_ready(registry, name, version)


async def _infer(name: str, version: str | None, req: InferRequest, predict: PredictService) -> InferResponse:
    served = predict.serving(name, version)
    # per-element checks in Python: in a thread, so a body full of numbers never stalls the event loop
    limit = predict.settings.max_batch
    pr = await run_in_threadpool(to_predict_request, req, served.predictor.input_kind, limit)
    try:
        answer = await predict.predict(served, pr)
    except InputError as exc:  # /v1 names fields as body.inputs.<row>...; V2 inputs are tensors
        raise Malformed("; ".join(_v2_field(f, msg) for f, msg in exc.errors)) from None
    return InferResponse(
        model_name=served.name,
        model_version=served.version,
        id=req.id,
        outputs=to_outputs(answer.rows, req, pr.normalization),
    )


@router.post("/models/{name}/infer", response_model=InferResponse, responses=ERRORS)
async def infer(name: ModelName, req: InferRequest, predict: PredictDep) -> InferResponse:
    """Top labels of the active version: ids, names, probabilities, scores, counts and the exact flag."""
    return await _infer(name, None, req, predict)


@router.post("/models/{name}/versions/{version}/infer", response_model=InferResponse, responses=ERRORS)
async def infer_version(
    name: ModelName, version: VersionName, req: InferRequest, predict: PredictDep
) -> InferResponse:
    """As `/infer`, refusing (400) when `version` is not the one serving."""
    return await _infer(name, version, req, predict)
