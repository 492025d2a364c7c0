"""A trio-native client of the task interface (HTTP, JSON) over httpx.

    async with OrbitClient.from_env() as client:          # ORBIT_URL, ORBIT_CREDENTIALS_FILE
        accepted = await client.submit_task("prepare-001", SubmitTaskRequest(
            queue_id=queue_id, handler="object.prepare", handler_version="v1",
            payload_version="v1", payload={"object_ref": "objects/example"}, priority=9))
        accepted.task.priority, accepted.created
        results = await client.submit_many([("prepare-002", request_2), ("prepare-003", request_3)])
        [r.status for r in results]                        # 201, 200, 409, 400, ... per item

Everything the client raises is an ``OrbitClientError``: every error the server
reports is an ``ApiError`` subclass carrying the server's ``code``, ``field`` and
``request_id``; a request that cannot be sent (a payload holding a ``set``) is an
``InvalidRequestError`` naming the field. Timeouts are the caller's: wrap a call in
``trio.fail_after(...)`` / ``trio.move_on_after(...)``, or give ``wait`` its ``timeout_s``.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Generic, Self, TypeVar

import attrs
import httpx

from .. import errors
from ..errors import OrbitError
from .encoding import NotJson, encode
from .filters import BulkItem, BulkResult, TaskFilter

T = TypeVar("T")

# Keys every credentials file has (the format orbit-admin bootstrap writes).
CREDENTIALS_KEYS = ("url", "token", "application", "namespace", "environment", "scopes", "queues")
# Items of one POST /v1/tasks/batch at most.
MAX_BATCH_TASKS = 1000


# -- errors ------------------------------------------------------------------------


class OrbitClientError(OrbitError):
    """Root of the errors the SDK raises (the client's and the Worker's)."""

    code = "CLIENT_ERROR"
    # ``http_status`` is how the node answers one of its own errors; an error the SDK
    # raises is not answered by anyone (``ApiError.status`` is what the node answered).
    http_status: int | None = None  # type: ignore[assignment]


# OrbitClientError's http_status (None) comes first in the MRO, as meant.
class ConfigError(OrbitClientError, errors.ConfigError):  # type: ignore[misc]
    """Bad configuration of the SDK: a credentials file or ``ORBIT_CREDENTIALS_FILE``
    missing or incomplete, a queue name the namespace does not have. ``field`` names
    the setting. Also an ``orbit_node.errors.ConfigError``."""

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
    """The node answered with something that is not the API's envelope."""

    code = "PROTOCOL_ERROR"

    def __init__(self, message: str, *, status: int | None = None):
        super().__init__(message)
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


def _encode(value: Any, path: str) -> str:
    """``value`` as JSON text, or an ``InvalidRequestError`` naming the first part that is
    not JSON (``path`` names ``value`` itself; empty for a request body)."""
    try:
        return encode(value, path)
    except NotJson as exc:
        raise InvalidRequestError(f"{exc}; nothing was sent", field=exc.field) from None


def api_error(error: Mapping[str, Any], status: int, request_id: str | None) -> ApiError:
    """The ``ApiError`` subclass of an error object of the envelope (or of a batch item)."""
    code = str(error.get("code", "UNKNOWN"))
    return ERRORS_BY_CODE.get(code, ApiError)(
        str(error.get("message", "")), status=status, code=code, field=error.get("field"), request_id=request_id
    )


# -- values ------------------------------------------------------------------------


def _rfc3339(value: datetime) -> str:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("timestamps must be timezone-aware datetimes")
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _aware(instance: Any, attribute: attrs.Attribute[datetime | None], value: datetime | None) -> None:
    if value is not None and (value.tzinfo is None or value.utcoffset() is None):
        raise InvalidRequestError(f"{attribute.name}: must be a timezone-aware datetime", field=attribute.name)


def _segment(value: str) -> str:
    """An id as one path segment, whatever the caller passed."""
    return urllib.parse.quote(value, safe="")


def _time(value: str | datetime | None) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(value)


@attrs.frozen(kw_only=True)
class Backoff:
    """Retry backoff of a task; None leaves the server's default (1000 ms, 300000 ms, 2.0)."""

    initial_ms: int | None = None
    max_ms: int | None = None
    multiplier: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The wire form (unset fields left out)."""
        return {k: v for k, v in attrs.asdict(self).items() if v is not None}


@attrs.frozen(kw_only=True)
class TaskTemplate:
    """The fields of a task that a plan repeats at every fire time (``definition.task``).

    ``SubmitTaskRequest`` adds the queue and the times of one submission.
    """

    handler: str
    handler_version: str
    payload_version: str
    # Any JSON value; integers of any size are kept exactly.
    payload: Any
    # 0-9; 0 is never sent, so the request digest stays the one of a request without priority.
    priority: int = 0
    max_attempts: int | None = None
    backoff: Backoff | None = None
    resource_key: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The wire form (defaults left out)."""
        body: dict[str, Any] = {
            "handler": self.handler,
            "handler_version": self.handler_version,
            "payload_version": self.payload_version,
            "payload": self.payload,
        }
        if self.priority != 0:
            body["priority"] = self.priority
        if self.max_attempts is not None:
            body["max_attempts"] = self.max_attempts
        if self.backoff is not None:
            body["backoff"] = self.backoff.to_json()
        if self.resource_key is not None:
            body["resource_key"] = self.resource_key
        return body


@attrs.frozen(kw_only=True)
class SubmitTaskRequest(TaskTemplate):
    """One task to submit: a ``TaskTemplate`` plus its queue and times.

    ``available_at`` (aware datetime) or ``delay_s`` holds it back; ``deadline`` (aware
    datetime) is when it stops being worth running (it then ends ``expired``).
    """

    queue_id: str
    available_at: datetime | None = attrs.field(default=None, validator=_aware)
    delay_s: float | None = None
    deadline: datetime | None = attrs.field(default=None, validator=_aware)

    def to_json(self) -> dict[str, Any]:
        """The body of ``POST /v1/tasks``."""
        body: dict[str, Any] = {"queue_id": self.queue_id, **super().to_json()}
        if self.available_at is not None:
            body["available_at"] = _rfc3339(self.available_at)
        if self.delay_s is not None:
            body["delay_s"] = self.delay_s
        if self.deadline is not None:
            body["deadline"] = _rfc3339(self.deadline)
        return body


@attrs.frozen(kw_only=True)
class PlanSchedule:
    """When a plan fires; None leaves the server's default (see docs/plans.md)."""

    # Every this many seconds (from start_at, else aligned to the Unix epoch).
    interval_s: int | None = None
    # A 5-field cron expression, in time_zone (an IANA name; the server's default is UTC).
    cron: str | None = None
    time_zone: str | None = None
    start_at: datetime | None = attrs.field(default=None, validator=_aware)
    end_at: datetime | None = attrs.field(default=None, validator=_aware)
    # "skip" (the default) or "fire_once": what fire times missed during an outage become.
    catch_up: str | None = None
    # How late a fire time may be reached and still count as on time (server default 60).
    grace_s: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The wire form (unset fields left out)."""
        body: dict[str, Any] = {}
        for field in attrs.fields(type(self)):
            value = getattr(self, field.name)
            if value is not None:
                body[field.name] = _rfc3339(value) if isinstance(value, datetime) else value
        return body


@attrs.frozen(kw_only=True)
class PlanDefinition:
    """The content of one immutable plan version."""

    task: TaskTemplate
    schedule: PlanSchedule

    def to_json(self) -> dict[str, Any]:
        """The wire form of ``definition``."""
        return {"task": self.task.to_json(), "schedule": self.schedule.to_json()}


def _definition_json(definition: PlanDefinition | Mapping[str, Any]) -> Any:
    return definition.to_json() if isinstance(definition, PlanDefinition) else definition


def _time_field(*, optional: bool = False) -> Any:
    return attrs.field(converter=_time if optional else _required_time)


def _required_time(value: str | datetime) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def _backoff(value: Backoff | Mapping[str, Any]) -> Backoff:
    return value if isinstance(value, Backoff) else Backoff(**value)


class _FromJson:
    """``from_json``: every attrs field from the key of its name; absent keys take the default."""

    # Set by attrs on every subclass (all are attrs classes).
    __attrs_attrs__: ClassVar[tuple[attrs.Attribute[Any], ...]]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        try:
            return cls(
                **{f.name: data[f.name] for f in attrs.fields(cls) if f.name in data or f.default is attrs.NOTHING}
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"{cls.__name__}: unexpected shape from the server ({exc!r})") from None


@attrs.frozen(kw_only=True)
class TaskSummary(_FromJson):
    """A task as lists show it. ``state`` is one of queued, reserved, running,
    succeeded, failed, cancelled, expired; ``attempts`` counts started attempts."""

    task_id: str
    queue_id: str
    handler: str
    handler_version: str
    payload_version: str
    state: str
    # Absent on the wire means 0 (normal priority).
    priority: int = 0
    attempts: int
    max_attempts: int
    available_at: datetime = _time_field()
    deadline: datetime | None = _time_field(optional=True)
    resource_key: str | None
    cancel_requested: bool
    created_at: datetime = _time_field()
    finished_at: datetime | None = _time_field(optional=True)
    # The task this one retries (``retry_task``), else None.
    retried_from: str | None = None
    # Listings only: why a queued task waits (QUEUE_PAUSED, APPLICATION_SUSPENDED,
    # NO_CAPABLE_WORKER, NOT_DUE, QUOTA, RESOURCE_KEY_HELD), else None.
    waiting_reason: str | None = None


@attrs.frozen(kw_only=True)
class Task(TaskSummary):
    """A task with its payload, backoff, times, and ``result`` / ``error`` once finished."""

    payload: Any
    backoff: Backoff = attrs.field(converter=_backoff)
    reserved_at: datetime | None = _time_field(optional=True)
    started_at: datetime | None = _time_field(optional=True)
    updated_at: datetime = _time_field()
    plan_id: str | None
    plan_version: int | None
    # Present once the task finished with a result / an error (None otherwise).
    result: Any = None
    error: Any = None


@attrs.frozen(kw_only=True)
class Queue(_FromJson):
    """A queue: its id and name, whether it is paused, its controls (None = unlimited)."""

    queue_id: str
    name: str
    paused: bool
    max_concurrency: int | None
    max_starts_per_second: int | None
    created_at: datetime = _time_field()


@attrs.frozen(kw_only=True)
class Plan(_FromJson):
    """A plan: it creates tasks in ``queue_id`` from its active version's definition."""

    plan_id: str
    name: str
    queue_id: str
    paused: bool
    # None until a version is activated.
    active_version: int | None
    # The next fire time on the database clock; None while paused, without an active
    # version, or after the schedule's end.
    next_fire_at: datetime | None = _time_field(optional=True)
    last_fire_at: datetime | None = _time_field(optional=True)
    created_at: datetime = _time_field()
    updated_at: datetime = _time_field()


@attrs.frozen(kw_only=True)
class PlanVersion(_FromJson):
    """One immutable version of a plan's definition."""

    plan_id: str
    version: int
    # The definition as it was given (a JSON object).
    definition: Any
    created_at: datetime = _time_field()


@attrs.frozen(kw_only=True)
class PlanTaskSummary(TaskSummary):
    """A task a plan created, with the version that created it."""

    plan_version: int


@attrs.frozen
class Page(Generic[T]):
    """One page of a list: ``items``, and ``next_cursor`` to pass for the next page."""

    items: list[T]
    # Pass to the next call to continue; None on the last page.
    next_cursor: str | None

    @classmethod
    def from_document(cls, item_type: Any, document: Mapping[str, Any]) -> Page[Any]:
        """A list envelope: ``data`` items of ``item_type`` and the ``next_cursor``."""
        return cls([item_type.from_json(item) for item in document["data"]], document.get("next_cursor"))


@attrs.frozen
class SubmitResult:
    """What ``submit_task`` returns: the task and whether this call created it."""

    task: Task
    # True for the first acceptance (201), False for an identical repeat (200).
    created: bool


@attrs.frozen
class BatchItemResult:
    """One item of ``submit_many``: its task (created or repeated) or the server's refusal."""

    # 201 created, 200 repeat of an identical earlier request, else the refusal's status.
    status: int
    # The whole task; None for a refusal, and with ``return_tasks=False``.
    task: Task | None = None
    # The refusal as the single submit would raise it (field named ``tasks[i]....``).
    error: ApiError | None = None
    # The accepted task's id and state (also with ``return_tasks=False``); None for a refusal.
    task_id: str | None = None
    state: str | None = None

    @property
    def created(self) -> bool:
        """This call created the task (201)."""
        return self.status == 201

    @property
    def accepted(self) -> bool:
        """The task exists (created now or before); False when the item was refused."""
        return self.error is None


@attrs.frozen(kw_only=True)
class Credentials:
    """The credentials file ``orbit-admin bootstrap`` writes: the node's ``url``, the
    ``token``, the names of its application / namespace / environment, its ``scopes``
    and ``queues`` (queue name -> 32-hex queue id)."""

    url: str
    token: str = attrs.field(repr=False)
    application: str
    namespace: str
    environment: str
    scopes: tuple[str, ...]
    queues: Mapping[str, str]

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Credentials:
        """Read a credentials file; a missing, unreadable or incomplete file is a ``ConfigError``."""
        where = f"credentials file {os.fspath(path)}"
        try:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{where}: cannot be read ({exc.strerror})", field="ORBIT_CREDENTIALS_FILE") from None
        except ValueError:
            raise ConfigError(f"{where}: not valid JSON", field="ORBIT_CREDENTIALS_FILE") from None
        if not isinstance(document, dict):
            raise ConfigError(f"{where}: expected a JSON object", field="ORBIT_CREDENTIALS_FILE")
        missing = [key for key in CREDENTIALS_KEYS if key not in document]
        if missing:
            raise ConfigError(f"{where}: missing {missing[0]!r}", field="ORBIT_CREDENTIALS_FILE")
        return cls(
            url=str(document["url"]),
            token=str(document["token"]),
            application=str(document["application"]),
            namespace=str(document["namespace"]),
            environment=str(document["environment"]),
            scopes=tuple(document["scopes"]),
            queues=dict(document["queues"]),
        )


def credentials_from_env(env: Mapping[str, str] | None = None) -> tuple[Credentials, str | None]:
    """The credentials file named by ORBIT_CREDENTIALS_FILE (required) and ORBIT_URL (or None)."""
    env = os.environ if env is None else env
    path = env.get("ORBIT_CREDENTIALS_FILE")
    if not path:
        raise ConfigError("ORBIT_CREDENTIALS_FILE is not set", field="ORBIT_CREDENTIALS_FILE")
    return Credentials.load(path), env.get("ORBIT_URL") or None


_UNSET: Any = object()


# -- the client --------------------------------------------------------------------


class OrbitClient:
    """One node's task interface. Use as ``async with``, or call ``aclose()``."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        event_hooks: Mapping[str, list[Callable[..., Any]]] | None = None,
    ):
        self.url = url.rstrip("/")
        try:
            self._http = httpx.AsyncClient(
                base_url=self.url,
                headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
                transport=transport,
                event_hooks=dict(event_hooks or {}),
                # Timeouts are cancel scopes set by the caller (trio.fail_after around a call).
                timeout=None,
            )
        except httpx.InvalidURL as exc:
            raise ConfigError(f"url: not a node URL ({exc}): {url!r}", field="url") from None

    @classmethod
    def from_credentials(cls, credentials: Credentials, *, url: str | None = None, **kwargs: Any) -> OrbitClient:
        """A client with the file's token and url (``url`` overrides it)."""
        return cls(url or credentials.url, credentials.token, **kwargs)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> OrbitClient:
        """ORBIT_CREDENTIALS_FILE (required) and ORBIT_URL (overrides the file's url)."""
        credentials, url = credentials_from_env(env)
        return cls.from_credentials(credentials, url=url, **kwargs)

    async def __aenter__(self) -> OrbitClient:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP connections (``async with`` does it)."""
        await self._http.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        content: bytes | None = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """Send one request; returns (status, envelope) or raises the server's error.

        ``body`` is encoded here (a value that is not JSON is an ``InvalidRequestError``
        naming its path, and nothing is sent); ``content`` is a body encoded already."""
        request_headers = dict(headers or {})
        if body is not None:
            content = _encode(body, "").encode("utf-8")
        if content is not None:
            request_headers["Content-Type"] = "application/json"
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = await self._http.request(method, path, content=content, params=query, headers=request_headers)
        except httpx.TransportError as exc:
            raise TransportError(f"{method} {path}: {exc!r}") from exc
        except httpx.HTTPError as exc:
            # Not a transport failure: the answer could not be decoded (or redirected on and on).
            raise ProtocolError(f"{method} {path}: {exc!r}") from exc
        except httpx.InvalidURL as exc:
            raise InvalidRequestError(
                f"{method} {path}: not a valid URL ({exc}); nothing was sent", field="url"
            ) from None
        try:
            document = json.loads(response.content)
        except ValueError:
            document = None
        if not isinstance(document, dict):
            raise ProtocolError(
                f"{method} {path}: HTTP {response.status_code} without a JSON envelope", status=response.status_code
            )
        error = document.get("error")
        if isinstance(error, dict):
            raise api_error(error, response.status_code, document.get("request_id"))
        if not 200 <= response.status_code < 300 or "data" not in document:
            raise ProtocolError(
                f"{method} {path}: HTTP {response.status_code} without data", status=response.status_code
            )
        return response.status_code, document

    # -- tasks

    async def submit_task(self, acceptance_key: str, request: SubmitTaskRequest) -> SubmitResult:
        """Submit once per ``acceptance_key``: repeating the same request returns the same task.

        Safe to retry after a TransportError with the same key and request.
        """
        status, document = await self._call(
            "POST", "/v1/tasks", body=request.to_json(), headers={"Idempotency-Key": acceptance_key}
        )
        return SubmitResult(Task.from_json(document["data"]), created=status == 201)

    async def submit_many(
        self,
        requests: Iterable[tuple[str, SubmitTaskRequest]],
        *,
        batch_size: int = MAX_BATCH_TASKS,
        return_tasks: bool = True,
    ) -> list[BatchItemResult]:
        """Submit (acceptance key, request) pairs, ``batch_size`` (1-1,000) per ``POST /v1/tasks/batch``.

        One result per pair, in order. An item the server refuses (invalid, conflict,
        unknown queue, ...) is a result with ``error``; the other items are accepted. A
        failure of a whole batch raises: the batches sent before it are committed, the
        failing one committed nothing. Like ``submit_task``, safe to retry with the same
        keys and requests.

        ``return_tasks=False`` asks the node for ids and states only (``Prefer:
        return=minimal``): ``task`` is then None and ``task_id``/``state`` say what was
        accepted. It is the cheaper way to submit many tasks that are not read back.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH_TASKS:
            raise InvalidRequestError(
                f"batch_size: expected 1 to {MAX_BATCH_TASKS}, got {batch_size!r}", field="batch_size"
            )
        # Every item is encoded before the first batch is sent: one that is not JSON
        # (named by its place in ``requests``) stops the call before anything is accepted.
        items = [
            _encode({"idempotency_key": key, **request.to_json()}, f"requests[{index}]")
            for index, (key, request) in enumerate(requests)
        ]
        results: list[BatchItemResult] = []
        headers = None if return_tasks else {"Prefer": "return=minimal"}
        for start in range(0, len(items), batch_size):
            content = '{"tasks":[' + ",".join(items[start : start + batch_size]) + "]}"
            _, document = await self._call("POST", "/v1/tasks/batch", content=content.encode("utf-8"), headers=headers)
            request_id = document.get("request_id")
            for item in document["data"]["results"]:
                status = int(item["status"])
                if "error" in item:
                    results.append(BatchItemResult(status, error=api_error(item["error"], status, request_id)))
                elif "task" in item:
                    task = Task.from_json(item["task"])
                    results.append(BatchItemResult(status, task=task, task_id=task.task_id, state=task.state))
                else:
                    results.append(BatchItemResult(status, task_id=item["task_id"], state=item["state"]))
        return results

    async def get_task(self, task_id: str) -> Task:
        """One task, with its payload and, once finished, its result or error."""
        _, document = await self._call("GET", f"/v1/tasks/{_segment(task_id)}")
        return Task.from_json(document["data"])

    async def list_tasks(
        self,
        *,
        queue_id: str | None = None,
        state: str | Sequence[str] | None = None,
        filter: TaskFilter | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[TaskSummary]:
        """One page of summaries, newest first by (created_at, task_id); ``filter`` (and the
        ``queue_id`` / ``state`` shortcuts) narrow it. A queued task says why it waits
        (``waiting_reason``). Pass ``page.next_cursor`` as ``cursor``, with the same filter."""
        params = {} if filter is None else filter.to_params()
        if queue_id is not None:
            params["queue_id"] = queue_id
        if state is not None:
            params["state"] = state if isinstance(state, str) else ",".join(state)
        _, document = await self._call("GET", "/v1/tasks", params={**params, "limit": limit, "cursor": cursor})
        return Page.from_document(TaskSummary, document)

    async def iter_tasks(
        self, filter: TaskFilter | None = None, *, page_size: int | None = None
    ) -> AsyncIterator[TaskSummary]:
        """Every task ``filter`` matches, newest first, a page (``page_size``, 1-500) at a time."""
        cursor = None
        while True:
            page = await self.list_tasks(filter=filter, limit=page_size, cursor=cursor)
            for task in page.items:
                yield task
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def cancel_task(self, task_id: str) -> Task:
        """Queued: cancelled at once. Reserved/running: cancel requested; the Worker's handler is
        cancelled and the task ends ``cancelled``. A task that finished otherwise: ``FailedPreconditionError``."""
        _, document = await self._call("POST", f"/v1/tasks/{_segment(task_id)}/cancel")
        return Task.from_json(document["data"])

    async def retry_task(self, task_id: str) -> SubmitResult:
        """Run a failed, cancelled or expired task again, as a new task linked to it
        (``retried_from``); ``created`` is False when it was retried before (the same new
        task). Any other state: ``FailedPreconditionError``."""
        status, document = await self._call("POST", f"/v1/tasks/{_segment(task_id)}/retry")
        return SubmitResult(Task.from_json(document["data"]), created=status == 201)

    async def bulk_cancel(
        self, filter: TaskFilter, *, limit: int | None = None, cursor: str | None = None
    ) -> BulkResult:
        """Cancel the next ``limit`` (at most 1,000) tasks ``filter`` matches, newest first; go on
        with ``cursor=result.next_cursor`` until it is None (``iter_bulk_cancel`` does)."""
        return await self._bulk("cancel", filter, limit, cursor)

    async def bulk_retry(
        self, filter: TaskFilter, *, limit: int | None = None, cursor: str | None = None
    ) -> BulkResult:
        """Retry the next ``limit`` (at most 1,000) tasks ``filter`` matches, newest first; go on
        with ``cursor=result.next_cursor`` until it is None (``iter_bulk_retry`` does)."""
        return await self._bulk("retry", filter, limit, cursor)

    async def iter_bulk_cancel(self, filter: TaskFilter, *, limit: int | None = None) -> AsyncIterator[BulkResult]:
        """``bulk_cancel`` call after call, following the cursor until no more tasks match."""
        async for result in self._bulk_pages("cancel", filter, limit):
            yield result

    async def iter_bulk_retry(self, filter: TaskFilter, *, limit: int | None = None) -> AsyncIterator[BulkResult]:
        """``bulk_retry`` call after call, following the cursor until no more tasks match."""
        async for result in self._bulk_pages("retry", filter, limit):
            yield result

    async def _bulk_pages(self, action: str, filter: TaskFilter, limit: int | None) -> AsyncIterator[BulkResult]:
        cursor = None
        while True:
            result = await self._bulk(action, filter, limit, cursor)
            yield result
            if result.next_cursor is None:
                return
            cursor = result.next_cursor

    async def _bulk(self, action: str, filter: TaskFilter, limit: int | None, cursor: str | None) -> BulkResult:
        body: dict[str, Any] = {"filter": filter.to_json()}
        if limit is not None:
            body["limit"] = limit
        if cursor is not None:
            body["cursor"] = cursor
        _, document = await self._call("POST", f"/v1/tasks/bulk-{action}", body=body)
        data, request_id = document["data"], document.get("request_id")
        items = [
            BulkItem(
                task_id=item["task_id"],
                outcome=item["outcome"],
                state=item["state"],
                retry_task_id=item.get("retry_task_id"),
                # A refusal is the error the single route would raise (409 FAILED_PRECONDITION).
                error=api_error(item["error"], 409, request_id) if "error" in item else None,
            )
            for item in data["results"]
        ]
        return BulkResult(
            changed=data["changed"],
            unchanged=data["unchanged"],
            refused=data["refused"],
            items=items,
            next_cursor=document.get("next_cursor"),
        )

    # -- plans

    async def create_plan(
        self, name: str, queue_id: str, definition: PlanDefinition | Mapping[str, Any] | None = None
    ) -> Plan:
        """A plan in a queue; with ``definition``, version 1 is created and activated at once."""
        body: dict[str, Any] = {"name": name, "queue_id": queue_id}
        if definition is not None:
            body["definition"] = _definition_json(definition)
        _, document = await self._call("POST", "/v1/plans", body=body)
        return Plan.from_json(document["data"])

    async def add_plan_version(self, plan_id: str, definition: PlanDefinition | Mapping[str, Any]) -> PlanVersion:
        """The next immutable version; it takes effect once activated."""
        _, document = await self._call(
            "POST", f"/v1/plans/{_segment(plan_id)}/versions", body={"definition": _definition_json(definition)}
        )
        return PlanVersion.from_json(document["data"])

    async def activate_plan_version(self, plan_id: str, version: int) -> Plan:
        """Make ``version`` the one the plan fires from."""
        _, document = await self._call("POST", f"/v1/plans/{_segment(plan_id)}/activate", body={"version": version})
        return Plan.from_json(document["data"])

    async def pause_plan(self, plan_id: str) -> Plan:
        """Stop firing (fire times passed while paused are not caught up)."""
        _, document = await self._call("POST", f"/v1/plans/{_segment(plan_id)}/pause")
        return Plan.from_json(document["data"])

    async def resume_plan(self, plan_id: str) -> Plan:
        """Fire again from the active version."""
        _, document = await self._call("POST", f"/v1/plans/{_segment(plan_id)}/resume")
        return Plan.from_json(document["data"])

    async def get_plan(self, plan_id: str) -> Plan:
        """One plan."""
        _, document = await self._call("GET", f"/v1/plans/{_segment(plan_id)}")
        return Plan.from_json(document["data"])

    async def list_plans(
        self, *, queue_id: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> Page[Plan]:
        """One page of plans (of one queue with ``queue_id``)."""
        _, document = await self._call(
            "GET", "/v1/plans", params={"queue_id": queue_id, "limit": limit, "cursor": cursor}
        )
        return Page.from_document(Plan, document)

    async def get_plan_version(self, plan_id: str, version: int) -> PlanVersion:
        """One version of a plan."""
        _, document = await self._call("GET", f"/v1/plans/{_segment(plan_id)}/versions/{int(version)}")
        return PlanVersion.from_json(document["data"])

    async def list_plan_versions(
        self, plan_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[PlanVersion]:
        """Versions, oldest first."""
        _, document = await self._call(
            "GET", f"/v1/plans/{_segment(plan_id)}/versions", params={"limit": limit, "cursor": cursor}
        )
        return Page.from_document(PlanVersion, document)

    async def list_plan_tasks(
        self, plan_id: str, *, state: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> Page[PlanTaskSummary]:
        """The tasks the plan created, newest first."""
        _, document = await self._call(
            "GET", f"/v1/plans/{_segment(plan_id)}/tasks", params={"state": state, "limit": limit, "cursor": cursor}
        )
        return Page.from_document(PlanTaskSummary, document)

    # -- queues

    async def create_queue(
        self, name: str, *, max_concurrency: int | None = None, max_starts_per_second: int | None = None
    ) -> Queue:
        """A queue in the credential's namespace; controls default to unlimited."""
        body: dict[str, Any] = {"name": name}
        if max_concurrency is not None:
            body["max_concurrency"] = max_concurrency
        if max_starts_per_second is not None:
            body["max_starts_per_second"] = max_starts_per_second
        _, document = await self._call("POST", "/v1/queues", body=body)
        return Queue.from_json(document["data"])

    async def get_queue(self, queue_id: str) -> Queue:
        """One queue."""
        _, document = await self._call("GET", f"/v1/queues/{_segment(queue_id)}")
        return Queue.from_json(document["data"])

    async def list_queues(self, *, limit: int | None = None, cursor: str | None = None) -> Page[Queue]:
        """One page of the namespace's queues the credential may read."""
        _, document = await self._call("GET", "/v1/queues", params={"limit": limit, "cursor": cursor})
        return Page.from_document(Queue, document)

    async def pause_queue(self, queue_id: str) -> Queue:
        """Stop dispatching the queue's tasks (submissions are still accepted)."""
        _, document = await self._call("POST", f"/v1/queues/{_segment(queue_id)}/pause")
        return Queue.from_json(document["data"])

    async def resume_queue(self, queue_id: str) -> Queue:
        """Dispatch the queue's tasks again."""
        _, document = await self._call("POST", f"/v1/queues/{_segment(queue_id)}/resume")
        return Queue.from_json(document["data"])

    async def set_queue_controls(
        self, queue_id: str, *, max_concurrency: int | None = _UNSET, max_starts_per_second: int | None = _UNSET
    ) -> Queue:
        """Change the named controls; None means unlimited, an omitted control is kept."""
        body = {
            name: value
            for name, value in (("max_concurrency", max_concurrency), ("max_starts_per_second", max_starts_per_second))
            if value is not _UNSET
        }
        if not body:
            raise InvalidRequestError(
                "set_queue_controls: name max_concurrency and/or max_starts_per_second", field="max_concurrency"
            )
        _, document = await self._call("PATCH", f"/v1/queues/{_segment(queue_id)}/controls", body=body)
        return Queue.from_json(document["data"])

    # -- waiting for tasks

    def as_finished(self, task_ids: Iterable[str], timeout_s: float | None = None) -> AsyncIterator[Task]:
        """Each task of ``task_ids`` once it reached a terminal state (succeeded, failed,
        cancelled, expired), in the order they are seen finished:
        ``async for task in client.as_finished(ids, timeout_s=60): ...``.

        Polls ``GET /v1/tasks/{id}`` for every unfinished task, 0.1 s after the first
        round then doubling to one round every 2 s (docs/sdk.md, "Waiting for tasks", has
        the cost). ``timeout_s`` (None: no bound) ends it with ``WaitTimeoutError``
        naming the tasks not finished. A read the node could not answer (unreachable,
        503, 429) is tried again next round; any other refusal (``NotFoundError`` for an
        unknown id, ...) is raised at once. Ids that are not 32-hex are an
        ``InvalidRequestError`` naming ``task_ids[i]``; a repeated id is waited for once."""
        from .waiting import as_finished  # waiting builds on this module

        return as_finished(self, task_ids, timeout_s)

    async def wait(self, task_ids: Iterable[str], timeout_s: float | None = None) -> list[Task]:
        """Wait until every task of ``task_ids`` reached a terminal state; the tasks, in
        the order of ``task_ids`` (each id once). ``WaitTimeoutError`` after ``timeout_s``
        names the unfinished ones (``.unfinished``) and holds the finished (``.finished``).
        Polls as ``as_finished`` does."""
        from .waiting import task_id_list

        order = task_id_list(task_ids)
        tasks = {task.task_id: task async for task in self.as_finished(order, timeout_s)}
        return [tasks[task_id] for task_id in order]
