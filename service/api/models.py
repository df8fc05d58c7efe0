"""GET /v1/models (paged), GET /v1/models/{name}, its versions (paged), activate and delete a version, add
labels by their texts."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from starlette.concurrency import run_in_threadpool

from service.add_labels import add_labels
from service.api.auth import ApiKey
from service.api.datasets import Limit
from service.api.deps import RegistryDep, SettingsDep
from service.api.schemas import (
    ActivateResponse,
    AddLabelsRequest,
    AddLabelsResponse,
    ErrorBody,
    ModelInfo,
    ModelList,
    ModelName,
    VersionInfo,
    VersionList,
    VersionName,
)
from service.errors import NotFound
from service.listing import MAX_PAGE, models_page, versions_page
from service.registry import ModelRegistry, ServedModel

router = APIRouter(tags=["models"])

VERSION_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (401, 403, 404)}


Cursor = Annotated[
    str | None, Query(max_length=400, description="`next_cursor` of the previous page; omitted: the first")
]
Shown = Annotated[int, Query(ge=0, le=MAX_PAGE, description="how many of each model's newest versions to "
                             "show (0: only their count); GET /v1/models/{name}/versions pages the rest")]


def version_info(registry: ModelRegistry, name: str, version: str, served: ServedModel | None) -> VersionInfo:
    summary = registry.version_summary(name, version)
    here = served is not None and served.version == version
    return VersionInfo(
        version=version,
        active=here,
        loaded=here,
        n_labels=summary.get("n_labels"),
        n_features=summary.get("n_features"),
        dim=summary.get("dim"),
        metrics=summary.get("metrics", {}),
        error=registry.refused(name, version),
    )


def model_info(registry: ModelRegistry, name: str, versions: list[str], show: int) -> ModelInfo:
    """A model with its newest `show` versions (oldest first) and the cursor to page the older ones."""
    served = registry.serving(name)
    newest, older = versions_page(name, versions, show, None)
    return ModelInfo(
        name=name,
        active_version=served.version if served else None,
        n_labels=served.n_labels if served else None,
        n_features=served.n_features if served else None,
        dim=served.dim if served else None,
        retrieval=served.retrieval if served else None,
        metrics=served.metrics if served else {},
        versions=[version_info(registry, name, v, served) for v in reversed(newest)],
        n_versions=len(versions),
        versions_cursor=older,
    )


def _versions_of(registry: ModelRegistry, name: str) -> list[str]:
    versions = registry.scan().get(name)
    if versions is None:
        raise NotFound(f"unknown model {name!r}")
    return versions


@router.get("/v1/models", response_model=ModelList, responses={422: {"model": ErrorBody}})
def list_models(
    registry: RegistryDep,
    limit: Limit = 100,
    cursor: Cursor = None,
    versions: Shown = 20,
) -> ModelList:
    """One page of the models on disk, by name, each with its newest versions; the active one serves
    requests."""
    scanned = registry.scan()
    names, nxt = models_page(list(scanned), limit, cursor)
    return ModelList(
        default=registry.default_name(),
        models=[model_info(registry, n, scanned[n], versions) for n in names],
        next_cursor=nxt,
    )


@router.get("/v1/models/{name}", response_model=ModelInfo, responses={404: {"model": ErrorBody}})
def get_model(name: ModelName, registry: RegistryDep, versions: Shown = 100) -> ModelInfo:
    """Label count, dims, metrics, which version is active, and its newest versions."""
    return model_info(registry, name, _versions_of(registry, name), versions)


@router.get(
    "/v1/models/{name}/versions",
    response_model=VersionList,
    responses={404: {"model": ErrorBody}, 422: {"model": ErrorBody}},
)
def list_versions(
    name: ModelName, registry: RegistryDep, limit: Limit = 100, cursor: Cursor = None
) -> VersionList:
    """One page of a model's versions, newest first."""
    page, nxt = versions_page(name, _versions_of(registry, name), limit, cursor)
    served = registry.serving(name)
    return VersionList(versions=[version_info(registry, name, v, served) for v in page], next_cursor=nxt)


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
        503: {"model": ErrorBody, "description": "the job database is unavailable, or the models disk is "
                                                 "read-only: the version was not deleted"},
        507: {"model": ErrorBody, "description": "the models disk is full: the version was not deleted"},
    },
)
async def delete_version(name: ModelName, version: VersionName, registry: RegistryDep, _: ApiKey) -> Response:
    """Remove a version's files; the active version cannot be deleted (activate another one first), nor the
    base of a queued or running job (cancel it, or wait until it ends)."""
    await run_in_threadpool(registry.delete_version, name, version)
    return Response(status_code=204)


@router.post(
    "/v1/models/{name}/labels",
    status_code=201,
    response_model=AddLabelsResponse,
    responses={
        **VERSION_ERRORS,
        409: {"model": ErrorBody, "description": "a name the model already has, a model trained without "
                                                 "label texts, or a new version that failed to load"},
        422: {"model": ErrorBody, "description": "a blank text, a bad or repeated name, too many labels"},
        503: {"model": ErrorBody, "description": "the models disk is read-only (nothing written), or a "
                                                 "worker did not confirm the activation in time"},
        507: {"model": ErrorBody, "description": "the models disk is full: nothing was written"},
    },
)
async def post_labels(
    name: ModelName, body: AddLabelsRequest, registry: RegistryDep, settings: SettingsDep, _: ApiKey
) -> AddLabelsResponse:
    """Add labels by their texts: writes the next version with their rows (computed from the texts by the
    model's label tower) appended to the active version's (or `base_version`'s), which stays as it was,
    and activates it when asked. Only for models trained with label texts."""
    added = await run_in_threadpool(
        add_labels,
        registry,
        name,
        [(x.name, x.text) for x in body.labels],
        base_version=body.base_version,
        activate=body.activate,
        max_labels=settings.max_labels_per_request,
    )
    return AddLabelsResponse(
        name=added.model,
        version=added.version,
        base_version=added.base_version,
        n_labels=added.n_labels,
        added=added.added,
        first_label_id=added.first_label_id,
        index=added.index,
        activated=added.activated,
        seconds=round(added.seconds, 3),
    )
