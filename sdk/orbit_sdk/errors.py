"""The errors the SDK raises, each an ``OrbitClientError``: the node's refusals
(``ApiError`` and its subclasses, by the envelope's ``code``) and the client's own
(configuration, a request it would not send, transport, a wait that ran out)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from .models import Task


class OrbitClientError(Exception):
    """Root of the errors the SDK raises (the client's and the Worker's): ``code`` says
    which (machine-readable), ``message`` what happened, ``field`` what it is about when
    one thing is (a setting, a request field's path), ``details`` anything more. The
    SDK's errors are its own: none is one of the node's (``orbit_node.domain.errors``)."""

    code = "CLIENT_ERROR"

    def __init__(self, message: str, *, field: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details or {}


class ConfigError(OrbitClientError):
    """Bad configuration of the SDK: a credentials file or ``ORBIT_CREDENTIALS_FILE``
    missing or incomplete, a queue name the namespace does not have, a bad URL.
    ``field`` names the setting."""

    code = "INVALID_ARGUMENT"


class InvalidRequestError(OrbitClientError, ValueError):
    """A request the client would not send: a value that is not JSON (a ``set``, an
    object, NaN) or an argument out of range. ``field`` names it by its path
    (``payload.tags``, ``requests[3].payload.when``, ``task_ids[0]``); nothing was sent.
    (``InvalidArgumentError`` is the node's refusal of a request it received.)"""

    code = "INVALID_ARGUMENT"


class WaitTimeoutError(OrbitClientError):
    """``wait`` / ``as_finished`` ran out of time: ``unfinished`` maps each task id that
    had not reached a terminal state to the state last read (None if it could not be
    read); ``finished`` holds the tasks that did, in the order they were seen finished.
    The last read failure the wait rode out (the node unreachable, 503), if any, is the
    ``__cause__``."""

    code = "WAIT_TIMEOUT"

    def __init__(self, message: str, *, unfinished: Mapping[str, str | None], finished: list[Task]):
        super().__init__(message)
        self.unfinished = dict(unfinished)
        self.finished = list(finished)


class TransportError(OrbitClientError):
    """The node could not be reached, or the connection broke before an answer."""

    code = "TRANSPORT_ERROR"


class ProtocolError(OrbitClientError):
    """The node answered with something that is not the API's envelope, or sent the
    Worker a message it cannot read (``sdk/messages.py``: the message names its type,
    ``field`` the part at fault, e.g. ``tasks[0].token``)."""

    code = "PROTOCOL_ERROR"

    def __init__(self, message: str, *, status: int | None = None, field: str | None = None):
        super().__init__(message, field=field)
        self.status = status


class ApiError(OrbitClientError):
    """The node refused a request: its status, stable code, the field at fault and the request id."""

    def __init__(self, message: str, *, status: int, code: str, field: str | None, request_id: str | None):
        super().__init__(message, field=field)
        self.status = status
        self.code = code
        self.request_id = request_id

    def __str__(self) -> str:
        return f"{self.code} ({self.status}): {self.message} [request_id={self.request_id}]"


class InvalidArgumentError(ApiError):
    """400 INVALID_ARGUMENT: the request is malformed or a field is invalid (``field`` names it)."""


class UnauthenticatedError(ApiError):
    """401 UNAUTHENTICATED: no, an unknown or a revoked credential."""


class PermissionDeniedError(ApiError):
    """403 PERMISSION_DENIED: the credential lacks the scope (for that queue)."""


class NotFoundError(ApiError):
    """404 NOT_FOUND: no such task, queue or plan in the credential's namespace."""


class AlreadyExistsError(ApiError):
    """409 ALREADY_EXISTS: a queue or plan of that name exists."""


class IdempotencyConflictError(ApiError):
    """409 IDEMPOTENCY_CONFLICT: the acceptance key was used for a different request."""


class FailedPreconditionError(ApiError):
    """409 FAILED_PRECONDITION: the object's state forbids it (cancel of a finished task, ...)."""


class ResourceExhaustedError(ApiError):
    """429 RESOURCE_EXHAUSTED: a quota or limit was reached; retry later."""


class PayloadTooLargeError(ApiError):
    """413 PAYLOAD_TOO_LARGE: the body is larger than the node's ``ORBIT_MAX_BODY_BYTES``."""


class UnsupportedMediaTypeError(ApiError):
    """415 UNSUPPORTED_MEDIA_TYPE: the body is not ``application/json``."""


class UnavailableError(ApiError):
    """503 UNAVAILABLE: the node or its database cannot answer now; safe to retry."""


class InternalError(ApiError):
    """500 INTERNAL: a bug on the node; the ``request_id`` finds its log line."""


ERRORS_BY_CODE: dict[str, type[ApiError]] = {
    "INVALID_ARGUMENT": InvalidArgumentError,
    "UNAUTHENTICATED": UnauthenticatedError,
    "PERMISSION_DENIED": PermissionDeniedError,
    "NOT_FOUND": NotFoundError,
    "ALREADY_EXISTS": AlreadyExistsError,
    "IDEMPOTENCY_CONFLICT": IdempotencyConflictError,
    "FAILED_PRECONDITION": FailedPreconditionError,
    "RESOURCE_EXHAUSTED": ResourceExhaustedError,
    "PAYLOAD_TOO_LARGE": PayloadTooLargeError,
    "UNSUPPORTED_MEDIA_TYPE": UnsupportedMediaTypeError,
    "UNAVAILABLE": UnavailableError,
    "INTERNAL": InternalError,
}


def api_error(error: Mapping[str, Any], status: int, request_id: str | None) -> ApiError:
    """The ``ApiError`` subclass of an error object of the envelope (or of a batch item)."""
    code = str(error.get("code", "UNKNOWN"))
    return ERRORS_BY_CODE.get(code, ApiError)(
        str(error.get("message", "")), status=status, code=code, field=error.get("field"), request_id=request_id
    )


def first_error(group: BaseExceptionGroup) -> BaseException:
    """The first exception of a group that is not a cancellation (or the first at all)."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    for leaf in leaves:
        if not isinstance(leaf, trio.Cancelled):
            return leaf
    return leaves[0]
