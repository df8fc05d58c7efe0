"""POST /v1/models/{name}/predict and POST /v1/predict (the default model): thin over `PredictService`."""

from __future__ import annotations

import json

from fastapi import APIRouter, Depends, Response

from service.api.deps import PredictDep, PredictKey, SettingsDep
from service.api.schemas import BATCH_LIMIT, ErrorBody, ModelName, PredictRequest, PredictResponse
from service.serving.predict import Answer

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


def _response(answer: Answer) -> Response:
    why = answer.why
    body = {
        "model": answer.served.name,
        "version": answer.served.version,
        "predictions": [
            {
                "labels": [
                    {"id": b.id, "name": b.name, "score": b.score, "prob": b.prob, "from_text": b.from_text}
                    | ({"explanation": why[i][j]} if why is not None else {})
                    for j, b in enumerate(p.labels)
                ],
                "exact": p.certified,
                "known_features": n,
            }
            for i, (p, n) in enumerate(zip(answer.rows, answer.known, strict=True))
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
async def predict_model(name: ModelName, req: PredictRequest, predict: PredictDep, _: PredictKey) -> Response:
    """Top labels with sparse probabilities from the active version of `name`. Text inputs are featurized
    as in training; `known_features` says how many of an input's features the model recognised."""
    return _response(await predict.predict(predict.model(name), req))


@router.post(
    "/v1/predict", response_model=PredictResponse, responses=ERRORS, dependencies=[Depends(count_first)]
)
async def predict_default(req: PredictRequest, predict: PredictDep, _: PredictKey) -> Response:
    """Same as `/v1/models/{name}/predict` for the default model."""
    return _response(await predict.predict(predict.model(None), req))
