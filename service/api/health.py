"""GET /healthz (the process is up) and GET /readyz (the models are loaded and warmed)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service.api.deps import RegistryDep
from service.api.schemas import Health, Readiness

router = APIRouter(tags=["ops"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """Answers as soon as the process serves HTTP, models or not."""
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
def readyz(registry: RegistryDep) -> JSONResponse:
    """200 when the models are ready for inference (`ModelRegistry.ready`, as /v2/health/ready: a model
    serves and none that is to serve is still loading), else 503; lists the versions serving."""
    ready = registry.ready()
    models = {n: s.version for n, s in registry.active().items()}
    return JSONResponse(Readiness(ready=ready, models=models).model_dump(), status_code=200 if ready else 503)
