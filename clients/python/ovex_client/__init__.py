"""Python SDK for the ovex service: `Client` (sync) and `AsyncClient` (asyncio), typed errors and answers."""

from .async_client import AsyncClient
from .client import Client
from .errors import (
    APIError,
    AuthenticationError,
    BadRequest,
    Conflict,
    NotFound,
    OvexClientError,
    PayloadTooLarge,
    PermissionDenied,
    RateLimited,
    RequestTimeout,
    ServerError,
    TransportError,
    ValidationError,
)
from .models import (
    DatasetInfo,
    Features,
    Job,
    JobEvent,
    JobProgress,
    LabelsAdded,
    LabelScore,
    ModelInfo,
    ModelVersion,
    Prediction,
    PredictResponse,
)

__version__ = "0.1.0"

__all__ = [
    "APIError",
    "AsyncClient",
    "AuthenticationError",
    "BadRequest",
    "Client",
    "Conflict",
    "DatasetInfo",
    "Features",
    "Job",
    "JobEvent",
    "JobProgress",
    "LabelScore",
    "LabelsAdded",
    "ModelInfo",
    "ModelVersion",
    "NotFound",
    "OvexClientError",
    "PayloadTooLarge",
    "PermissionDenied",
    "PredictResponse",
    "Prediction",
    "RateLimited",
    "RequestTimeout",
    "ServerError",
    "TransportError",
    "ValidationError",
    "__version__",
]
