"""POST /v1/models/{name}/predict and POST /v1/predict (the default model)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends, Response
from starlette.concurrency import run_in_threadpool

from service.api.auth import PredictKey
from service.api.deps import BatcherDep, MetricsDep, RegistryDep, SettingsDep
from service.api.errors import MAX_FIELD_ERRORS
from service.api.schemas import BATCH_LIMIT, ErrorBody, ModelName, PredictRequest, PredictResponse
from service.errors import Field, InputError, Unavailable
from service.metrics import Metrics
from service.serving.batching import MicroBatcher
from service.serving.explain import explain
from service.serving.predictor import InputRow, Options, Query, RowPrediction
from service.serving.registry import ServedModel
from service.settings import Settings

router = APIRouter(tags=["predict"])

ERRORS: dict[int | str, dict[str, object]] = {
    404: {"model": ErrorBody, "description": "unknown model"},
    409: {"model": ErrorBody, "description": "the model is deactivated (the answer says how to serve it)"},
    413: {"model": ErrorBody, "description": "body over the size limit"},
    422: {"model": ErrorBody, "description": "invalid input; `loc` names the field and index"},
    503: {"model": ErrorBody, "description": "no model loaded yet, or the request timed out"},
}


async def count_first(settings: SettingsDep) -> None:
    """Hand this server's batch limit to the body's validation, which FastAPI runs after dependencies:
    a list over it is refused on its length alone (`PredictRequest`)."""
    BATCH_LIMIT.set(settings.max_batch)


def _to_job(req: PredictRequest, served: ServedModel, settings: Settings) -> Query:
    """Check what only the limits and the model can tell, then build plain predictor inputs. The index
    checks are numpy's, so a body full of numbers costs the event loop a few milliseconds at most."""
    errors: list[tuple[Field, str]] = []
    if len(req.inputs) > settings.max_batch:
        errors.append(
            (("inputs",), f"at most {settings.max_batch} inputs per request, got {len(req.inputs)}")
        )
    if req.top_k > settings.max_top_k:
        errors.append((("top_k",), f"top_k must be at most {settings.max_top_k}, got {req.top_k}"))
    elif req.explain and req.top_k > settings.max_explain_top_k:
        errors.append((("top_k",), f"with explain, top_k must be at most "
                       f"{settings.max_explain_top_k}, got {req.top_k}: ask for fewer labels, or leave "
                       "explain out"))
    rows: list[InputRow] = []
    nf = served.n_features
    kind = served.predictor.input_kind
    for i, inp in enumerate(req.inputs[: settings.max_batch]):
        if inp.features is None:
            if kind != "text":
                errors.append(
                    (
                        ("inputs", i, "text"),
                        f"model {served.name!r} takes sparse `features`, not text",
                    )
                )
            rows.append(InputRow(text=inp.text))
            continue
        if kind == "text":
            errors.append(
                (("inputs", i, "features"), f"model {served.name!r} takes `text`, not features")
            )
            continue
        try:
            indices = np.asarray(inp.features.indices, dtype=np.int64)
        except OverflowError:  # an index past int64 is out of range like any other
            indices = np.asarray([min(v, nf) for v in inp.features.indices], dtype=np.int64)
        over = np.flatnonzero(indices >= nf)
        for j in over[:5].tolist():
            errors.append(
                (
                    ("inputs", i, "features", "indices", j),
                    f"index {inp.features.indices[j]} is out of range: model "
                    f"{served.name!r} has {nf} features (0..{nf - 1})",
                )
            )
        if over.size:
            continue
        values = np.asarray(inp.features.values, dtype=np.float64).astype(np.float32)
        rows.append(InputRow(indices=indices, values=values))
    if errors:
        raise InputError(_bounded(errors))
    return Query(rows, Options(top_k=req.top_k, normalization=req.normalization, exact=req.exact))


def _bounded(errors: list[tuple[Field, str]]) -> list[tuple[Field, str]]:
    """The first `MAX_FIELD_ERRORS`, then one counting the rest: what to fix first, in a small answer."""
    if len(errors) <= MAX_FIELD_ERRORS:
        return errors
    return [*errors[:MAX_FIELD_ERRORS], ((), f"and {len(errors) - MAX_FIELD_ERRORS} more errors")]


def known_features(served: ServedModel, rows: Sequence[InputRow]) -> list[int]:
    """Per input, the features the model recognises (0: an answer from the label biases alone)."""
    counts = [0 if r.values is None else int(np.count_nonzero(r.values)) for r in rows]
    text_pos = [i for i, r in enumerate(rows) if r.text is not None]
    if text_pos:
        x = served.predictor.model.featurizer.transform_texts([rows[i].text for i in text_pos])
        for i, n in zip(text_pos, np.diff(x.indptr), strict=True):
            counts[i] = int(n)
    return counts


async def predict_rows(
    served: ServedModel, req: PredictRequest, batcher: MicroBatcher, settings: Settings, metrics: Metrics
) -> tuple[list[RowPrediction], list[int]]:
    """The one prediction path of every protocol (/v1, /v2): check against the limits and the model,
    then through the micro-batcher to the pinned version's predictor. Returns the answers and, per
    input, how many of its features the model knows."""
    start = time.perf_counter()
    try:
        job = _to_job(req, served, settings)
        try:
            preds = await batcher.submit(served.predictor, job, settings.request_timeout_s)
        except TimeoutError:
            raise Unavailable(f"prediction took over {settings.request_timeout_s}s; retry later",
                              retry_after=1) from None
    except Exception:
        metrics.predict_errors.labels(served.name).inc()
        raise
    metrics.predict_latency.labels(served.name).observe(time.perf_counter() - start)
    metrics.predicted_rows.labels(served.name, served.version).inc(len(preds))
    return preds, known_features(served, job.rows)


async def _predict(
    served: ServedModel, req: PredictRequest, batcher: MicroBatcher, settings: Settings, metrics: Metrics
) -> Response:
    preds, known = await predict_rows(served, req, batcher, settings, metrics)
    why: list[list[dict[str, Any]]] | None = None
    if req.explain:
        rows = _to_job(req, served, settings).rows
        why = await run_in_threadpool(explain, served.predictor, rows, preds, settings.max_explain_terms)
    body = {
        "model": served.name,
        "version": served.version,
        "predictions": [
            {
                "labels": [
                    {"id": b.id, "name": b.name, "score": b.score, "prob": b.prob}
                    | ({"explanation": why[i][j]} if why is not None else {})
                    for j, b in enumerate(p.labels)
                ],
                "exact": p.exact,
                "known_features": n,
            }
            for i, (p, n) in enumerate(zip(preds, known, strict=True))
        ],
    }
    # Built by hand: skips re-validating our own output, which costs more than the prediction itself.
    return Response(json.dumps(body, allow_nan=False, ensure_ascii=False), media_type="application/json")


@router.post(
    "/v1/models/{name}/predict",
    response_model=PredictResponse,
    responses=ERRORS,
    dependencies=[Depends(count_first)],
)
async def predict_model(
    name: ModelName,
    req: PredictRequest,
    registry: RegistryDep,
    batcher: BatcherDep,
    settings: SettingsDep,
    metrics: MetricsDep,
    _: PredictKey,
) -> Response:
    """Top labels with sparse probabilities from the active version of `name`. Text inputs are featurized
    as in training; `known_features` says how many of an input's features the model recognised."""
    return await _predict(registry.get(name), req, batcher, settings, metrics)


@router.post(
    "/v1/predict", response_model=PredictResponse, responses=ERRORS, dependencies=[Depends(count_first)]
)
async def predict_default(
    req: PredictRequest,
    registry: RegistryDep,
    batcher: BatcherDep,
    settings: SettingsDep,
    metrics: MetricsDep,
    _: PredictKey,
) -> Response:
    """Same as `/v1/models/{name}/predict` for the default model."""
    return await _predict(registry.default(), req, batcher, settings, metrics)
