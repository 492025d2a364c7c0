"""Which tasks a listing or a bulk action covers, and what cancel and retry do to one: pure.

``TaskFilter`` is one set of rules for ``GET /v1/tasks`` (query parameters), the body of
``POST /v1/tasks/bulk-cancel`` and ``/bulk-retry`` (``{"filter": {...}}``), ``orbit-admin
task list`` and the console. Every refusal is an ``InvalidArgument`` naming the field
(``state``, ``filter.priority[2]``, ...). ``TaskCursor`` is the keyset of those pages:
newest first by ``(created_at, task_id)``.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs

from orbit_protocol.limits import MAX_BULK, MAX_PRIORITY, MAX_TASK_IDS

from .errors import FailedPrecondition, InvalidArgument
from .ids import is_hex32
from .rules import HANDLER, LATEST, QUEUE_ID, integer, kind, reject_unknown, string, timestamp
from .strict_json import show

# ``waiting``: a task whose parents have not all succeeded (orbit_node.domain.dependencies).
STATES = ("waiting", "queued", "reserved", "running", "succeeded", "failed", "cancelled", "expired")
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "expired"})
# What a cancel can still change, and what a retry starts from.
CANCELLABLE_STATES = ("waiting", "queued", "reserved", "running")
RETRYABLE_STATES = ("failed", "cancelled", "expired")
PRIORITIES = tuple(range(MAX_PRIORITY + 1))
# A filter names at most this many task ids; a bulk call changes at most this many tasks.
FILTER_FIELDS = (
    "queue_id",
    "state",
    "handler",
    "priority",
    "priority_min",
    "priority_max",
    "created_after",
    "created_before",
    "finished_after",
    "finished_before",
    "task_ids",
)
# Query parameters that may be repeated or hold a comma-separated list.
LIST_FIELDS = ("state", "priority", "task_ids")
BULK_FIELDS = ("filter", "limit", "cursor")
# Cursor kind of task listings and bulk actions (an older listing's "t1" is refused).
CURSOR_KIND = "t2"
EPOCH = datetime(1970, 1, 1)


@attrs.frozen(kw_only=True)
class TaskFilter:
    """Conditions a task must all meet; the defaults match every task."""

    queue_id: str | None = None
    # Any of these states; empty: any state.
    states: tuple[str, ...] = ()
    handler: str | None = None
    # Any of these priority levels; None: any level (an empty tuple matches nothing).
    priorities: tuple[int, ...] | None = None
    # created_after <= created_at < created_before (naive UTC); likewise finished_at.
    created_after: datetime | None = None
    created_before: datetime | None = None
    finished_after: datetime | None = None
    finished_before: datetime | None = None
    # Any of these task ids; empty: any task.
    task_ids: tuple[str, ...] = ()

    @property
    def is_empty(self) -> bool:
        return self == TaskFilter()

    @property
    def matches_nothing(self) -> bool:
        return self.priorities == ()

    def with_states(self, states: Sequence[str]) -> TaskFilter:
        """The same filter, limited to ``states`` when it names none itself."""
        return self if self.states else attrs.evolve(self, states=tuple(states))


@attrs.frozen(order=True)
class TaskCursor:
    """Where the next page starts: after this task, newest first by (created_at, task_id)."""

    created_at: datetime
    task_id: str

    def encode(self) -> str:
        micros = (self.created_at - EPOCH) // timedelta(microseconds=1)
        return base64.urlsafe_b64encode(f"{CURSOR_KIND}.{micros}.{self.task_id}".encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, text: Any, field: str = "cursor") -> TaskCursor:
        refused = InvalidArgument(f"{field}: not a cursor returned by a task listing", field=field)
        if not isinstance(text, str) or not text:
            raise refused
        try:
            decoded = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("ascii")
        except (binascii.Error, ValueError):
            raise refused from None
        prefix, micros, task_id = (decoded.split(".") + ["", ""])[:3]
        if prefix != CURSOR_KIND or not re.fullmatch(r"[0-9]{1,18}", micros) or not is_hex32(task_id):
            raise refused
        try:
            return cls(EPOCH + timedelta(microseconds=int(micros)), task_id)
        except OverflowError:
            raise refused from None


# -- parsing -----------------------------------------------------------------------


def _one_of(value: Any, field: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise InvalidArgument(f"{field}: must be one of {', '.join(allowed)}, got {show(value)}", field=field)
    return str(value)


def _hex_id(value: Any, field: str) -> str:
    return string(value, field, QUEUE_ID, "32 lowercase hex characters")


def _priority_set(
    listed: Sequence[int] | None, low: int | None, high: int | None, prefix: str
) -> tuple[int, ...] | None:
    if low is not None and high is not None and high < low:
        raise InvalidArgument(
            f"{prefix}priority_max: must not be less than {prefix}priority_min", field=f"{prefix}priority_max"
        )
    if listed is None and low is None and high is None:
        return None
    levels = set(PRIORITIES if listed is None else listed)
    levels = {p for p in levels if (low is None or p >= low) and (high is None or p <= high)}
    return None if levels == set(PRIORITIES) else tuple(sorted(levels))


def _time_range(after: datetime | None, before: datetime | None, prefix: str, name: str) -> None:
    if after is not None and before is not None and before <= after:
        raise InvalidArgument(
            f"{prefix}{name}_before: must be later than {prefix}{name}_after", field=f"{prefix}{name}_before"
        )


def _build(values: Mapping[str, Any], prefix: str) -> TaskFilter:
    """The filter of already parsed values (states, priorities, ids as lists)."""
    states = values.get("state")
    task_ids = values.get("task_ids")
    if task_ids is not None and not 1 <= len(task_ids) <= MAX_TASK_IDS:
        raise InvalidArgument(
            f"{prefix}task_ids: must name 1 to {MAX_TASK_IDS} task ids, got {len(task_ids)}", field=f"{prefix}task_ids"
        )
    _time_range(values.get("created_after"), values.get("created_before"), prefix, "created")
    _time_range(values.get("finished_after"), values.get("finished_before"), prefix, "finished")
    return TaskFilter(
        queue_id=values.get("queue_id"),
        states=tuple(dict.fromkeys(states or ())),
        handler=values.get("handler"),
        priorities=_priority_set(
            values.get("priority"), values.get("priority_min"), values.get("priority_max"), prefix
        ),
        created_after=values.get("created_after"),
        created_before=values.get("created_before"),
        finished_after=values.get("finished_after"),
        finished_before=values.get("finished_before"),
        task_ids=tuple(dict.fromkeys(task_ids or ())),
    )


def _scalar(name: str, value: Any, field: str) -> Any:
    """One value of a filter field (a JSON value, or one query parameter's text)."""
    if name == "queue_id":
        return _hex_id(value, field)
    if name == "state":
        return _one_of(value, field, STATES)
    if name == "handler":
        return string(value, field, HANDLER, "1-200 characters of A-Z a-z 0-9 . _ : / -")
    if name in ("priority", "priority_min", "priority_max"):
        return integer(value, field, 0, MAX_PRIORITY)
    if name == "task_ids":
        return _hex_id(value, field)
    return timestamp(value, field)


def filter_from_json(value: Any, prefix: str = "filter") -> TaskFilter:
    """A JSON object of filter fields. ``state`` and ``priority`` take one value or an array,
    ``task_ids`` an array; refusals name ``prefix.field`` (``filter.state[1]``)."""
    if not isinstance(value, dict):
        raise InvalidArgument(f"{prefix}: must be an object, got {kind(value)}", field=prefix)
    dotted = prefix + "."
    reject_unknown(value, FILTER_FIELDS, dotted)
    parsed: dict[str, Any] = {}
    for name, item in value.items():
        field = dotted + name
        if name in LIST_FIELDS:
            if name == "task_ids" and not isinstance(item, list):
                raise InvalidArgument(f"{field}: must be an array of task ids, got {kind(item)}", field=field)
            if not isinstance(item, list):
                parsed[name] = [_scalar(name, item, field)]
            elif not item:
                raise InvalidArgument(f"{field}: must not be empty", field=field)
            else:
                parsed[name] = [_scalar(name, v, f"{field}[{i}]") for i, v in enumerate(item)]
        else:
            parsed[name] = _scalar(name, item, field)
    return _build(parsed, dotted)


def filter_from_query(params: Mapping[str, Sequence[str]]) -> TaskFilter:
    """Query parameters (each name -> its values). ``state``, ``priority`` and ``task_ids``
    may be repeated or hold a comma-separated list; the others are given once. The caller
    has refused unknown parameters."""
    parsed: dict[str, Any] = {}
    for name in FILTER_FIELDS:
        texts = params.get(name)
        if not texts:
            continue
        if name in LIST_FIELDS:
            items = [part.strip() for text in texts for part in text.split(",")]
            if len(items) > MAX_TASK_IDS:
                raise InvalidArgument(f"{name}: at most {MAX_TASK_IDS} values, got {len(items)}", field=name)
            parsed[name] = [_scalar(name, _query_value(name, v), name) for v in items]
        else:
            if len(texts) > 1:
                raise InvalidArgument(f"{name}: given more than once", field=name)
            parsed[name] = _scalar(name, _query_value(name, texts[0]), name)
    return _build(parsed, "")


def _query_value(name: str, text: str) -> Any:
    """A query parameter's text as the JSON value its field rule takes (priorities are integers)."""
    if name in ("priority", "priority_min", "priority_max"):
        if not re.fullmatch(r"[0-9]{1,2}", text):
            raise InvalidArgument(f"{name}: must be an integer from 0 to {MAX_PRIORITY}, got {show(text)}", field=name)
        return int(text)
    return text


@attrs.frozen
class BulkRequest:
    """The body of a bulk action: which tasks, how many at most this call, where to go on."""

    filter: TaskFilter
    limit: int
    after: TaskCursor | None


def bulk_request(body: Mapping[str, Any]) -> BulkRequest:
    """``{"filter": {...}, "limit": N, "cursor": "..."}``; the filter names at least one field."""
    reject_unknown(body, BULK_FIELDS)
    if "filter" not in body:
        raise InvalidArgument("filter: field is required", field="filter")
    found = filter_from_json(body["filter"])
    if found.is_empty:
        raise InvalidArgument(
            f"filter: name at least one of {', '.join(FILTER_FIELDS)} (an empty filter would take every task)",
            field="filter",
        )
    limit = integer(body["limit"], "limit", 1, MAX_BULK) if "limit" in body else MAX_BULK
    cursor = body.get("cursor")
    return BulkRequest(found, limit, None if cursor is None else TaskCursor.decode(cursor))


# -- what cancel and retry do to one task --------------------------------------------

CANCEL_NOW = "cancel"  # queued: cancelled at once
CANCEL_REQUEST = "request"  # reserved or running: cancel requested; the dispatch side settles it
UNCHANGED = "unchanged"


def cancel_action(task_id: str, state: str, cancel_requested: bool) -> str | FailedPrecondition:
    """What cancelling a task in ``state`` does (``docs/api.md``, "Cancel")."""
    if state in ("queued", "waiting"):
        return CANCEL_NOW
    if state in ("reserved", "running"):
        return UNCHANGED if cancel_requested else CANCEL_REQUEST
    if state == "cancelled":
        return UNCHANGED
    return FailedPrecondition(
        f"task_id: task {task_id} already finished as {state}; it cannot be cancelled", field="task_id"
    )


def retry_refusal(task_id: str, state: str) -> FailedPrecondition | None:
    """Why a task in ``state`` cannot be retried, or None: only failed, cancelled and expired
    tasks can (a succeeded task is done; a live one may still finish)."""
    if state in RETRYABLE_STATES:
        return None
    if state == "succeeded":
        why = "it succeeded"
    else:
        why = f"it is {state}; only a failed, cancelled or expired task can be retried"
    return FailedPrecondition(f"task_id: task {task_id} cannot be retried: {why}", field="task_id")


def retry_deadline(deadline: datetime | None, created_at: datetime, now: datetime) -> datetime | None:
    """A retry's deadline: the original's time from acceptance to its deadline, counted from
    ``now`` (the retry's acceptance), at most the last instant the database keeps."""
    if deadline is None:
        return None
    return now + min(deadline - created_at, LATEST - now)
