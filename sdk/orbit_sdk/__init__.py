"""Python SDK: a trio-native client of the task interface (``OrbitClient``: tasks, queues,
plans, waiting for tasks) and the automatic Worker (``Worker``: run handlers for the
tasks of queues; ``Worker.serve`` / ``orbit-worker`` as a process of its own). Every
failure it raises is an ``OrbitClientError``.

    from orbit_sdk import OrbitClient, PermanentError, SubmitTaskRequest, Worker, WorkerTask

The guide is ``docs/sdk.md``. A distribution of its own (``orbit-sdk``): it depends on
trio, trio-websocket, httpx, attrs and ``orbit-protocol`` only, never on the node.
Where the node is installed, ``orbit_node.sdk`` and its modules are these same modules.
"""

from .client import OrbitClient
from .credentials import Credentials, credentials_from_env
from .errors import (
    AlreadyExistsError,
    ApiError,
    ConfigError,
    FailedPreconditionError,
    IdempotencyConflictError,
    InternalError,
    InvalidArgumentError,
    InvalidRequestError,
    NotFoundError,
    OrbitClientError,
    PayloadTooLargeError,
    PermissionDeniedError,
    ProtocolError,
    ResourceExhaustedError,
    TransportError,
    UnauthenticatedError,
    UnavailableError,
    UnsupportedMediaTypeError,
    WaitTimeoutError,
)
from .filters import BulkItem, BulkResult, TaskFilter
from .models import (
    Backoff,
    BatchItemResult,
    FanIn,
    Page,
    Plan,
    PlanDefinition,
    PlanSchedule,
    PlanTaskSummary,
    PlanVersion,
    Queue,
    SubmitResult,
    SubmitTaskRequest,
    Task,
    TaskChild,
    TaskSummary,
    TaskTemplate,
)
from .worker import Handler, PermanentError, Worker, WorkerRejected, WorkerTask

__all__ = [
    "AlreadyExistsError",
    "ApiError",
    "Backoff",
    "BatchItemResult",
    "BulkItem",
    "BulkResult",
    "ConfigError",
    "Credentials",
    "FailedPreconditionError",
    "FanIn",
    "Handler",
    "IdempotencyConflictError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidRequestError",
    "NotFoundError",
    "OrbitClient",
    "OrbitClientError",
    "Page",
    "PayloadTooLargeError",
    "PermanentError",
    "Plan",
    "PlanDefinition",
    "PlanSchedule",
    "PlanTaskSummary",
    "PlanVersion",
    "PermissionDeniedError",
    "ProtocolError",
    "Queue",
    "ResourceExhaustedError",
    "SubmitResult",
    "SubmitTaskRequest",
    "Task",
    "TaskChild",
    "TaskFilter",
    "TaskSummary",
    "TaskTemplate",
    "TransportError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnsupportedMediaTypeError",
    "WaitTimeoutError",
    "Worker",
    "WorkerRejected",
    "WorkerTask",
    "credentials_from_env",
]
