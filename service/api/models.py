"""GET /v1/models, GET /v1/models/{name}, POST /v1/models/{name}/versions/{version}/activate."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from service.api.auth import ApiKey
from service.api.deps import RegistryDep
from service.api.errors import NotFound
from service.api.schemas import (
    ActivateResponse,
    ErrorBody,
    ModelInfo,
    ModelList,
    ModelName,
    VersionInfo,
    VersionName,
)
from service.registry import ModelRegistry

router = APIRouter(tags=["models"])


def model_info(registry: ModelRegistry, name: str, versions: list[str]) -> ModelInfo:
    served = registry.active().get(name)
    infos = []
    for v in versions:
        summary = registry.version_summary(name, v)
        infos.append(
            VersionInfo(
                version=v,
                active=served is not None and served.version == v,
                loaded=served is not None and served.version == v,
                n_labels=summary.get("n_labels"),
                n_features=summary.get("n_features"),
                dim=summary.get("dim"),
                metrics=summary.get("metrics", {}),
                error=registry.refused(name, v),
            )
        )
    return ModelInfo(
        name=name,
        active_version=served.version if served else None,
        n_labels=served.n_labels if served else None,
        n_features=served.n_features if served else None,
        dim=served.dim if served else None,
        retrieval=served.retrieval if served else None,
        metrics=served.metrics if served else {},
        versions=infos,
    )


@router.get("/v1/models", response_model=ModelList)
def list_models(registry: RegistryDep) -> ModelList:
    """Every model on disk with its versions; the active one serves requests."""
    return ModelList(
        default=registry.default_name(),
        models=[model_info(registry, n, vs) for n, vs in registry.scan().items()],
    )


@router.get("/v1/models/{name}", response_model=ModelInfo, responses={404: {"model": ErrorBody}})
def get_model(name: ModelName, registry: RegistryDep) -> ModelInfo:
    """Versions, label count, dims, metrics, and which version is active."""
    versions = registry.scan().get(name)
    if versions is None:
        raise NotFound(f"unknown model {name!r}")
    return model_info(registry, name, versions)


@router.post(
    "/v1/models/{name}/versions/{version}/activate",
    response_model=ActivateResponse,
    responses={
        401: {"model": ErrorBody},
        403: {"model": ErrorBody},
        404: {"model": ErrorBody},
        409: {"model": ErrorBody, "description": "the version failed to load; the old one serves"},
    },
)
async def activate(
    name: ModelName, version: VersionName, registry: RegistryDep, _: ApiKey
) -> ActivateResponse:
    """Hot swap: load and warm `version`, then route new requests to it; in-flight ones finish on theirs."""
    served, prev = await run_in_threadpool(registry.activate, name, version)
    return ActivateResponse(name=name, active_version=served.version, previous_version=prev)
