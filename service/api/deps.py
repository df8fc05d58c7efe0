"""Every dependency a router takes, in one place: the services, settings and instruments the app holds,
the API keys, and the paging parameters; routers import these, never each other.

The OpenAPI answers that follow from a dependency (401/403 from a key, 503 from the job database) are
described beside it, so every router that takes it documents them alike.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Query, Request

from service.api.auth import require_api_key, require_predict_key, require_read_key
from service.errors import Unavailable
from service.metrics import Metrics
from service.serving.batching import MicroBatcher
from service.serving.listing import MAX_PAGE
from service.serving.predict import PredictService
from service.serving.registry import ModelRegistry
from service.settings import Settings
from service.training.service import JobsService


async def get_settings(request: Request) -> Settings:
    s: Settings = request.app.state.settings
    return s


async def get_registry(request: Request) -> ModelRegistry:
    r: ModelRegistry = request.app.state.registry
    return r


async def get_metrics(request: Request) -> Metrics:
    m: Metrics = request.app.state.metrics
    return m


async def get_batcher(request: Request) -> MicroBatcher:
    b: MicroBatcher = request.app.state.batcher
    return b


async def get_predict(request: Request) -> PredictService:
    p: PredictService = request.app.state.predict
    return p


async def get_jobs(request: Request) -> JobsService:
    """The job system's service; `Unavailable` where this process does not run it (yet)."""
    rt = getattr(request.app.state, "jobs", None)
    if rt is None:
        raise Unavailable("the job system is not running in this process")
    service: JobsService = rt.service
    return service


SettingsDep = Annotated[Settings, Depends(get_settings)]
RegistryDep = Annotated[ModelRegistry, Depends(get_registry)]
BatcherDep = Annotated[MicroBatcher, Depends(get_batcher)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
PredictDep = Annotated[PredictService, Depends(get_predict)]
Jobs = Annotated[JobsService, Depends(get_jobs)]

ApiKey = Annotated[None, Depends(require_api_key)]
ReadKey = Annotated[None, Depends(require_read_key)]
PredictKey = Annotated[None, Depends(require_predict_key)]

Limit = Annotated[int, Query(ge=1, le=MAX_PAGE, description="most items on one page")]
Cursor = Annotated[
    str | None, Query(max_length=400, description="`next_cursor` of the previous page; omitted: the first")
]

# every route of the jobs and datasets API reads the job database
DB_DOWN: dict[int | str, dict[str, Any]] = {
    503: {"description": "the job database is unavailable (or the job system is not running here); retry "
                         "after Retry-After seconds"}
}
KEYED: dict[int | str, dict[str, Any]] = {
    401: {"description": "missing key"},
    403: {"description": "the key does not allow this call (or none is configured on the server)"},
}
