"""GET /v1/models, GET /v1/models/{name}, activate and delete a version."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from starlette.concurrency import run_in_threadpool

from service.api.auth import ApiKey
from service.api.deps import RegistryDep
from service.api.schemas import (
    ActivateResponse,
    ErrorBody,
    ModelInfo,
    ModelList,
    ModelName,
    VersionInfo,
    VersionName,
)
from service.errors import NotFound
from service.registry import ModelRegistry

router = APIRouter(tags=["models"])

VERSION_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (401, 403, 404)}


def model_info(registry: ModelRegistry, name: str, versions: list[str]) -> ModelInfo:
    served = registry.serving(name)
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
    responses={**VERSION_ERRORS, 409: {"model": ErrorBody, "description": "failed to load; old one serves"}},
)
async def activate(
    name: ModelName, version: VersionName, registry: RegistryDep, _: ApiKey
) -> ActivateResponse:
    """Hot swap: load and warm `version`, then route new requests to it; in-flight ones finish on theirs."""
    served, prev = await run_in_threadpool(registry.activate, name, version)
    return ActivateResponse(name=name, active_version=served.version, previous_version=prev)


@router.delete(
    "/v1/models/{name}/versions/{version}",
    status_code=204,
    response_class=Response,
    responses={
        **VERSION_ERRORS,
        409: {"model": ErrorBody, "description": "the version is the active one, or a job continues it"},
    },
)
async def delete_version(name: ModelName, version: VersionName, registry: RegistryDep, _: ApiKey) -> Response:
    """Remove a version's files; the active version cannot be deleted (activate another one first), nor the
    base of a queued or running job (cancel it, or wait until it ends)."""
    await run_in_threadpool(registry.delete_version, name, version)
    return Response(status_code=204)
