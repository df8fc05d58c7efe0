"""GET /healthz (the process is up) and GET /readyz (a model is loaded and warmed)."""

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
async def readyz(registry: RegistryDep) -> JSONResponse:
    """200 when at least one model version is loaded and warmed, else 503."""
    models = {n: s.version for n, s in registry.active().items()}
    ready = bool(models)
    return JSONResponse(Readiness(ready=ready, models=models).model_dump(), status_code=200 if ready else 503)
