"""Typed dependencies: routers get the registry, batcher and settings injected, never as globals."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.metrics import Metrics
from service.serving.batching import MicroBatcher
from service.serving.registry import ModelRegistry
from service.settings import Settings


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


SettingsDep = Annotated[Settings, Depends(get_settings)]
RegistryDep = Annotated[ModelRegistry, Depends(get_registry)]
BatcherDep = Annotated[MicroBatcher, Depends(get_batcher)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
