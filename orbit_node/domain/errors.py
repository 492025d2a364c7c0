"""The one error hierarchy of the node.

Every error that crosses a public boundary (HTTP, WebSocket, CLI, SDK) is an
``OrbitError`` with a stable machine ``code`` and, where one field is at fault,
the ``field`` it names.

Errors of one layer live beside it and derive from these: the lease store's
``OwnershipLost``; the Worker protocol's ``MessageRefused`` (a bad inbound message,
with the ``error`` frame's ``code`` and a WebSocket ``close_code``); a Worker
connection's ``WorkerConnectionClosed``, as ``ClosedByNode`` when the node closed it and
``ConnectionBroken`` when the peer went away.
"""

from __future__ import annotations

from typing import Any


class OrbitError(Exception):
    """Root of every error the node raises on purpose."""

    code = "INTERNAL"
    http_status = 500

    def __init__(self, message: str, *, field: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details or {}


class InvalidArgument(OrbitError):
    code = "INVALID_ARGUMENT"
    http_status = 400


class Unauthenticated(OrbitError):
    code = "UNAUTHENTICATED"
    http_status = 401


class PermissionDenied(OrbitError):
    code = "PERMISSION_DENIED"
    http_status = 403


class NotFound(OrbitError):
    code = "NOT_FOUND"
    http_status = 404


class AlreadyExists(OrbitError):
    code = "ALREADY_EXISTS"
    http_status = 409


class IdempotencyConflict(OrbitError):
    code = "IDEMPOTENCY_CONFLICT"
    http_status = 409


class FailedPrecondition(OrbitError):
    code = "FAILED_PRECONDITION"
    http_status = 409


class ResourceExhausted(OrbitError):
    """A limit was reached; ``retry_after_s`` (whole seconds) says when another try may
    pass, and goes out as the ``Retry-After`` header."""

    code = "RESOURCE_EXHAUSTED"
    http_status = 429

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        details: dict[str, Any] | None = None,
        retry_after_s: int | None = None,
    ):
        super().__init__(message, field=field, details=details)
        self.retry_after_s = retry_after_s


class PayloadTooLarge(OrbitError):
    code = "PAYLOAD_TOO_LARGE"
    http_status = 413


class UnsupportedMediaType(OrbitError):
    code = "UNSUPPORTED_MEDIA_TYPE"
    http_status = 415


class Unavailable(OrbitError):
    """The database cannot be reached (or answered with a connection-level failure), or the
    node cannot take the request now.

    ``cause`` classifies a database failure for operators (``/readyz`` and the log; see
    ``CAUSES``); callers are told only that the service is unavailable. None: the node's
    own refusal (shutting down, full), whose message is meant for the caller.
    """

    code = "UNAVAILABLE"
    http_status = 503

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        details: dict[str, Any] | None = None,
        cause: str | None = None,
    ):
        super().__init__(message, field=field, details=details)
        if cause is not None and cause not in CAUSES:
            raise ValueError(f"unknown cause {cause!r}")
        self.cause = cause


# Why the database cannot serve the node, as /readyz names it.
CAUSES = (
    "unreachable",  # no connection, or no answer in time
    "access_denied",  # the server refused the configured user (or a privilege)
    "unknown_database",  # the server has no database of the configured name
    "schema_behind",  # the database is at an older schema version than the node needs
    "schema_ahead",  # the database was migrated by a newer version than this node
    "database_error",  # the server answered with another error
)


class SchemaNotReady(Unavailable):
    """The database schema is not the version this node needs (run ``orbit-migrate up``)."""

    code = "SCHEMA_NOT_READY"

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        details: dict[str, Any] | None = None,
        cause: str = "schema_behind",
    ):
        super().__init__(message, field=field, details=details, cause=cause)


class DatabaseError(OrbitError):
    """The database refused a statement for a reason that is not the caller's input."""

    code = "INTERNAL"
    http_status = 500

    def __init__(self, message: str, *, errno: int | None = None):
        super().__init__(message)
        self.errno = errno


class SchemaMismatch(OrbitError):
    """The database schema is not the version this code expects."""

    code = "FAILED_PRECONDITION"
    http_status = 503


class ConfigError(OrbitError):
    """Bad configuration: reported as one line, never a traceback."""

    code = "INVALID_ARGUMENT"
    http_status = 400
