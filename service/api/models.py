"""GET /v1/models (paged), GET /v1/models/{name}, its versions (paged), activate and delete a version, add
labels by their texts."""

from __future__ import annotations

import contextlib
import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from service.api.deps import ApiKey, Cursor, Limit, RegistryDep, SettingsDep
from service.api.schemas import (
    ActivateResponse,
    AddLabelsRequest,
    AddLabelsResponse,
    DeactivateResponse,
    DefaultModelRequest,
    DefaultModelResponse,
    DeleteModelResponse,
    ErrorBody,
    ModelInfo,
    ModelList,
    ModelName,
    VersionInfo,
    VersionList,
    VersionName,
)
from service.db.tables import JobRow
from service.errors import DomainError, NotFound
from service.serving.add_labels import ADDED, add_labels
from service.serving.input_kind import InputKind, model_kind
from service.serving.listing import MAX_PAGE, models_page, versions_page
from service.serving.registry import ModelRegistry, ServedModel

router = APIRouter(tags=["models"])

VERSION_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (401, 403, 404)}


Shown = Annotated[int, Query(ge=0, le=MAX_PAGE, description="how many of each model's newest versions to "
                             "show (0: only their count); GET /v1/models/{name}/versions pages the rest")]


class Provenance:
    """Where a model's versions came from: the jobs that made them (one query per model), and the base
    a version grew. Without the job system (or with its database down) only what the files say."""

    def __init__(self, request: Request, registry: ModelRegistry, name: str, versions: list[str]) -> None:
        self.registry, self.name = registry, name
        self.jobs: dict[str, JobRow] = {}
        rt = getattr(request.app.state, "jobs", None)
        if rt is not None and versions:
            with contextlib.suppress(DomainError):  # listing models never fails on the job database
                self.jobs = rt.store.made_many(name, versions)

    def base_of(self, version: str) -> str | None:
        job = self.jobs.get(version)
        if job is not None and job.base and job.base.get("model") == self.name:
            return str(job.base.get("version"))
        try:  # labels added by their texts record their base in the version
            added = json.loads((self.registry.catalog.version_dir(self.name, version) / ADDED).read_text())
            return str(added["base_version"]) if isinstance(added, dict) and "base_version" in added else None
        except (OSError, ValueError):
            return None


def version_info(registry: ModelRegistry, name: str, version: str, served: ServedModel | None,
                 prov: Provenance | None = None) -> VersionInfo:
    summary = registry.version_summary(name, version)
    here = served is not None and served.version == version
    job = prov.jobs.get(version) if prov is not None else None
    base = prov.base_of(version) if prov is not None else None
    metrics = summary.get("metrics", {})
    return VersionInfo(
        version=version,
        active=here,
        loaded=here,
        n_labels=summary.get("n_labels"),
        n_features=summary.get("n_features"),
        dim=summary.get("dim"),
        metrics=metrics,
        error=registry.refused(name, version),
        created_at=registry.created_at(name, version),
        job=job.id if job is not None else None,
        dataset=job.train_dataset if job is not None else None,
        base_version=base,
        lineage=f"v{version} grows v{base}" if base is not None else None,
        test_dataset=job.test_dataset if job is not None and metrics else None,
    )


def model_info(request: Request, registry: ModelRegistry, name: str, versions: list[str],
               show: int) -> ModelInfo:
    """A model with its newest `show` versions (oldest first) and the cursor to page the older ones."""
    served = registry.serving(name)
    newest, older = versions_page(name, versions, show, None)
    prov = Provenance(request, registry, name, newest)
    return ModelInfo(
        name=name,
        active_version=served.version if served else None,
        n_labels=served.n_labels if served else None,
        n_features=served.n_features if served else None,
        dim=served.dim if served else None,
        retrieval=served.retrieval if served else None,
        label_texts=served is not None and served.predictor.text_only is not None,
        metrics=served.metrics if served else {},
        versions=[version_info(registry, name, v, served, prov) for v in reversed(newest)],
        n_versions=len(versions),
        versions_cursor=older,
        default=registry.default_name() == name,
        deactivated=registry.is_deactivated(name),
        created_at=registry.created_at(name, versions[0]) if versions else None,
        input_kind=served.predictor.input_kind if served else _stored_kind(registry, name),
    )


def _stored_kind(registry: ModelRegistry, name: str) -> InputKind | None:
    found = model_kind(registry.catalog, name)
    return found[0] if found else None


def _versions_of(registry: ModelRegistry, name: str) -> list[str]:
    versions = registry.scan().get(name)
    if versions is None:
        raise NotFound(f"unknown model {name!r}")
    return versions


@router.get("/v1/models", response_model=ModelList, responses={422: {"model": ErrorBody}})
def list_models(
    request: Request,
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
        default_source=registry.default_source(),  # type: ignore[arg-type]
        models=[model_info(request, registry, n, scanned[n], versions) for n in names],
        next_cursor=nxt,
    )


@router.get("/v1/models/{name}", response_model=ModelInfo, responses={404: {"model": ErrorBody}})
def get_model(request: Request, name: ModelName, registry: RegistryDep, versions: Shown = 100) -> ModelInfo:
    """Label count, dims, metrics, which version is active, and its newest versions."""
    return model_info(request, registry, name, _versions_of(registry, name), versions)


@router.get(
    "/v1/models/{name}/versions",
    response_model=VersionList,
    responses={404: {"model": ErrorBody}, 422: {"model": ErrorBody}},
)
def list_versions(
    request: Request, name: ModelName, registry: RegistryDep, limit: Limit = 100, cursor: Cursor = None
) -> VersionList:
    """One page of a model's versions, newest first, each with when it was written, the job and dataset
    that made it, the version it grew, and the test set its metrics were measured on."""
    page, nxt = versions_page(name, _versions_of(registry, name), limit, cursor)
    served = registry.serving(name)
    prov = Provenance(request, registry, name, page)
    return VersionList(versions=[version_info(registry, name, v, served, prov) for v in page],
                       next_cursor=nxt)


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


WRITE_ERRORS: dict[int | str, dict[str, Any]] = {
    503: {"model": ErrorBody, "description": "the job database is unavailable, the models disk is read-only, "
                                             "or a worker did not confirm in time (it follows shortly)"},
    507: {"model": ErrorBody, "description": "the models disk is full: nothing was deleted"},
}


@router.delete(
    "/v1/models/{name}",
    response_model=DeleteModelResponse,
    responses={
        **VERSION_ERRORS,
        **WRITE_ERRORS,
        409: {"model": ErrorBody, "description": "a queued or running job continues one of its versions or "
                                                 "trains into it (the answer names them); `force=true` "
                                                 "cancels them first"},
    },
)
async def delete_model(
    name: ModelName,
    registry: RegistryDep,
    _: ApiKey,
    force: Annotated[bool, Query(description="cancel the queued and running jobs that use the model "
                                             "first, instead of refusing")] = False,
) -> DeleteModelResponse:
    """Remove a model with every version (admin key). Every worker and replica stops serving it; if it was
    the default, POST /v1/predict falls back to the automatic choice."""
    versions = registry.scan().get(name, [])
    cancelled = await run_in_threadpool(registry.delete_model, name, force)
    return DeleteModelResponse(name=name, versions=versions, cancelled_jobs=cancelled)


@router.post(
    "/v1/models/{name}/deactivate",
    response_model=DeactivateResponse,
    responses={**VERSION_ERRORS, 503: WRITE_ERRORS[503]},
)
async def deactivate_model(name: ModelName, registry: RegistryDep, _: ApiKey) -> DeactivateResponse:
    """Stop serving a model in every worker and replica; its versions stay. Predictions on it are a 409
    saying how to serve it again: activate one of its versions."""
    await run_in_threadpool(registry.deactivate, name)
    return DeactivateResponse(name=name, deactivated=True)


@router.get("/v1/default-model", response_model=DefaultModelResponse)
def get_default_model(registry: RegistryDep) -> DefaultModelResponse:
    """The model behind POST /v1/predict: OVEX_DEFAULT_MODEL, else the one set with PUT, else the demo
    model, else the model whose first version is the oldest (a model trained later never takes over)."""
    return DefaultModelResponse(default=registry.default_name(),
                                source=registry.default_source())  # type: ignore[arg-type]


@router.put(
    "/v1/default-model",
    response_model=DefaultModelResponse,
    responses={**VERSION_ERRORS, 422: {"model": ErrorBody}, 503: WRITE_ERRORS[503]},
)
async def put_default_model(
    body: DefaultModelRequest, registry: RegistryDep, _: ApiKey
) -> DefaultModelResponse:
    """Set the model behind POST /v1/predict for every worker and replica (admin key); `null` returns to
    the automatic choice. OVEX_DEFAULT_MODEL, when set, still wins (`source` says so)."""
    await run_in_threadpool(registry.set_default, body.model)
    return DefaultModelResponse(default=registry.default_name(),
                                source=registry.default_source())  # type: ignore[arg-type]


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
