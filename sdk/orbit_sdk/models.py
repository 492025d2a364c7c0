"""The SDK's values: what a request carries (``SubmitTaskRequest``, ``TaskTemplate``,
``Backoff``, plan schedules and definitions) and what the node answers (``Task``,
``TaskSummary``, ``Queue``, ``Plan``, ``Page``, batch results), as frozen attrs classes."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar, Generic, Self, TypeVar

import attrs

from .encoding import NotJson, encode
from .errors import ApiError, InvalidRequestError, ProtocolError

T = TypeVar("T")


def encode_json(value: Any, path: str) -> str:
    """``value`` as JSON text, or an ``InvalidRequestError`` naming the first part that is
    not JSON (``path`` names ``value`` itself; empty for a request body)."""
    try:
        return encode(value, path)
    except NotJson as exc:
        raise InvalidRequestError(f"{exc}; nothing was sent", field=exc.field) from None


def rfc3339(value: datetime) -> str:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("timestamps must be timezone-aware datetimes")
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _strings(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def _aware(instance: Any, attribute: attrs.Attribute[datetime | None], value: datetime | None) -> None:
    if value is not None and (value.tzinfo is None or value.utcoffset() is None):
        raise InvalidRequestError(f"{attribute.name}: must be a timezone-aware datetime", field=attribute.name)


def path_segment(value: str) -> str:
    """An id as one path segment, whatever the caller passed."""
    return urllib.parse.quote(value, safe="")


def parse_time(value: str | datetime | None) -> datetime | None:
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
    ``depends_on`` (task ids, up to 100) makes it wait until those tasks have succeeded;
    ``depends_on_keys`` (up to 1,000) does the same by the acceptance keys they were
    submitted under: before, or by earlier items of the same ``submit_many`` batch
    (docs/api.md, "Dependencies").
    """

    queue_id: str
    available_at: datetime | None = attrs.field(default=None, validator=_aware)
    delay_s: float | None = None
    deadline: datetime | None = attrs.field(default=None, validator=_aware)
    depends_on: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    depends_on_keys: tuple[str, ...] = attrs.field(default=(), converter=_strings)

    def to_json(self) -> dict[str, Any]:
        """The body of ``POST /v1/tasks``."""
        body: dict[str, Any] = {"queue_id": self.queue_id, **super().to_json()}
        if self.available_at is not None:
            body["available_at"] = rfc3339(self.available_at)
        if self.delay_s is not None:
            body["delay_s"] = self.delay_s
        if self.deadline is not None:
            body["deadline"] = rfc3339(self.deadline)
        if self.depends_on:
            body["depends_on"] = list(self.depends_on)
        if self.depends_on_keys:
            body["depends_on_keys"] = list(self.depends_on_keys)
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
                body[field.name] = rfc3339(value) if isinstance(value, datetime) else value
        return body


@attrs.frozen(kw_only=True)
class PlanDefinition:
    """The content of one immutable plan version."""

    task: TaskTemplate
    schedule: PlanSchedule

    def to_json(self) -> dict[str, Any]:
        """The wire form of ``definition``."""
        return {"task": self.task.to_json(), "schedule": self.schedule.to_json()}


def definition_json(definition: PlanDefinition | Mapping[str, Any]) -> Any:
    return definition.to_json() if isinstance(definition, PlanDefinition) else definition


def _time_field(*, optional: bool = False) -> Any:
    return attrs.field(converter=parse_time if optional else _required_time)


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
    """A task as lists show it. ``state`` is one of waiting (for its parents), queued,
    reserved, running, succeeded, failed, cancelled, expired; ``attempts`` counts started
    attempts."""

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
    # Its parents (``depends_on``), by id; empty for a task without any.
    depends_on: tuple[str, ...] = attrs.field(default=(), converter=_strings)


@attrs.frozen(kw_only=True)
class Queue(_FromJson):
    """A queue: its id and name, whether it is paused, its controls (None = unlimited;
    ``max_running_per_key``, tasks of one resource key reserved or running at once, is
    1 to 1,000)."""

    queue_id: str
    name: str
    paused: bool
    max_concurrency: int | None
    max_starts_per_second: int | None
    # A server older than this control sends none: one at a time, as it does.
    max_running_per_key: int = 1
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
class FanIn:
    """What ``submit_fan_in`` returns: one result per part, in order, and the join's."""

    parts: list[BatchItemResult]
    join: BatchItemResult


@attrs.frozen(kw_only=True)
class TaskChild(_FromJson):
    """A task that names another in ``depends_on``, as ``list_children`` shows it."""

    task_id: str
    state: str


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
