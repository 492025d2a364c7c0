"""The rules of what a client may send, pure: no web framework, no database, no network.

One place for the field rules of a task (``POST /v1/tasks`` and a plan's task template
share them), queues and the Worker protocol's names; the strict JSON reader; and
``NewTask``, the validated submission the store accepts. Every refusal is an
``InvalidArgument`` with a stable code and the field it names. JSON is parsed
strictly: duplicate keys, ``NaN``/``Infinity``, numbers out of range, integer literals
longer than Python parses (4300 digits), lone surrogates and nesting deeper than
``strict_json.MAX_JSON_DEPTH`` are refused.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import attrs

from orbit_protocol.limits import MAX_BATCH_TASKS, MAX_PARENT_KEYS, MAX_PARENTS, MAX_PRIORITY, MAX_RESOURCE_KEY_CHARS
from orbit_protocol.messages import HANDLER_NAME, HEX32, VERSION

from . import strict_json
from .errors import InvalidArgument
from .ids import is_hex32
from .strict_json import NotStrictJson, show
from .wire import rfc3339

# The same names Workers may declare (the Worker protocol's rules), so every accepted
# task can be served.
QUEUE_ID = HEX32
HANDLER = HANDLER_NAME
QUEUE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# Idempotency-Key: 1-255 visible ASCII characters.
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")
# resource_key: 1-255 characters, no control characters.
RESOURCE_KEY_MAX = MAX_RESOURCE_KEY_CHARS
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# RFC 3339 date-time; fractions beyond microseconds are truncated (the database keeps microseconds).
RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
# Accepted instants: the DATETIME(6) range from the Unix epoch on.
EARLIEST = datetime(1970, 1, 1)
LATEST = datetime(9999, 12, 31, 23, 59, 59, 999999)
MAX_ATTEMPTS = 100
# A delay longer than this is better written as available_at.
MAX_DELAY_S = 366 * 24 * 3600
BACKOFF_INITIAL_MS_MAX = 3_600_000
BACKOFF_MAX_MS_MAX = 86_400_000
BACKOFF_MULTIPLIER_MIN = 1.0
BACKOFF_MULTIPLIER_MAX = 10.0
# Queue controls are INT columns.
CONTROL_MAX = 2_147_483_647
# A queue's max_running_per_key (queues.max_running_per_key, 000028): reserved + running
# tasks of one resource key at once. 1, the default, is one at a time.
MIN_RUNNING_PER_KEY = 1
MAX_RUNNING_PER_KEY = 1000
DEFAULT_RUNNING_PER_KEY = 1
# An application's fairness weight (applications.fairness_weight): with every application
# asking, claim turns are shared in proportion to the weights; 1 everywhere is P3's rotation.
MIN_WEIGHT = 1
MAX_WEIGHT = 100
SUBMIT_FIELDS = (
    "queue_id",
    "handler",
    "handler_version",
    "payload_version",
    "payload",
    "priority",
    "available_at",
    "delay_s",
    "deadline",
    "max_attempts",
    "backoff",
    "resource_key",
    "depends_on",
    "depends_on_keys",
)
SUBMIT_REQUIRED = ("queue_id", "handler", "handler_version", "payload_version", "payload")
# A plan's task template (definition.task) has the submission's fields except these,
# which belong to each task the plan creates rather than to the template.
TEMPLATE_EXCLUDED = {
    "queue_id": "the plan's queue receives its tasks",
    "available_at": "each task is available at its fire time",
    "delay_s": "each task is available at its fire time",
    "deadline": "a fixed deadline cannot serve repeated fire times",
    "depends_on": "a parent succeeds once, so every fire after it would run at once; submit a fire's children from its handler",
    "depends_on_keys": "a parent succeeds once, so every fire after it would run at once; submit a fire's children from its handler",
}
TEMPLATE_FIELDS = tuple(f for f in SUBMIT_FIELDS if f not in TEMPLATE_EXCLUDED)
TEMPLATE_REQUIRED = tuple(f for f in SUBMIT_REQUIRED if f not in TEMPLATE_EXCLUDED)
# POST /v1/tasks/batch: {"tasks": [...]}, each item a submission plus its own key.
BATCH_FIELDS = ("tasks",)
BATCH_ITEM_FIELDS = ("idempotency_key", *SUBMIT_FIELDS)
BACKOFF_FIELDS = ("initial_ms", "max_ms", "multiplier")
QUEUE_CONTROL_FIELDS = ("max_concurrency", "max_starts_per_second", "max_running_per_key")
# Items of one page of a listing at most (limit=), and when none is asked for.
LIST_LIMIT_MAX = 500
LIST_LIMIT_DEFAULT = 100
QUEUE_CREATE_FIELDS = ("name", *QUEUE_CONTROL_FIELDS)


# Defaults of the optional submission fields (the column defaults of 000005/000012).
DEFAULT_PRIORITY = 0
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_BACKOFF_INITIAL_MS = 1000
DEFAULT_BACKOFF_MAX_MS = 300_000
DEFAULT_BACKOFF_MULTIPLIER = 2.0


# -- JSON --------------------------------------------------------------------------


def parse_json(raw: bytes) -> Any:
    """Parse a request body strictly (``strict_json``: UTF-8 JSON text, RFC 8259, no
    extensions); a refusal is a 400 naming ``body``."""
    try:
        return strict_json.loads(raw)
    except NotStrictJson as exc:
        raise InvalidArgument(f"body: {exc}", field="body") from None


def kind(value: Any) -> str:
    """How an error message names the JSON type of ``value``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def path_id(value: str, field: str) -> str:
    if not is_hex32(value):
        raise InvalidArgument(f"{field}: expected 32 lowercase hex characters, got {show(value)}", field=field)
    return value


# -- fields ------------------------------------------------------------------------


def reject_unknown(obj: Mapping[str, Any], allowed: Iterable[str], prefix: str = "") -> None:
    allowed = set(allowed)
    for key in obj:
        if key not in allowed:
            raise InvalidArgument(f"{prefix}{key}: unknown field", field=f"{prefix}{key}")


def require(obj: Mapping[str, Any], name: str, prefix: str = "") -> Any:
    if name not in obj:
        raise InvalidArgument(f"{prefix}{name}: field is required", field=f"{prefix}{name}")
    return obj[name]


def string(value: Any, field: str, pattern: re.Pattern[str], rule: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidArgument(f"{field}: must be {rule}, got {show(value)}", field=field)
    return value


def integer(value: Any, field: str, low: int, high: int) -> int:
    """A JSON integer literal in [low, high]: not a bool, not 9.0, not 1e0, not "9"."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgument(f"{field}: must be a JSON integer from {low} to {high}, got {show(value)}", field=field)
    return value


def fairness_weight(value: Any, field: str = "weight") -> int:
    """An application's fairness weight: an integer from 1 to 100, or its decimal text (a
    command-line argument)."""
    weight = int(value) if isinstance(value, str) and re.fullmatch(r"[0-9]{1,3}", value) else value
    if isinstance(weight, bool) or not isinstance(weight, int) or not MIN_WEIGHT <= weight <= MAX_WEIGHT:
        raise InvalidArgument(
            f"{field}: must be an integer from {MIN_WEIGHT} to {MAX_WEIGHT}, got {show(value)}", field=field
        )
    return weight


def number(value: Any, field: str, low: float, high: float) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise InvalidArgument(f"{field}: must be a number from {low:g} to {high:g}, got {show(value)}", field=field)
    return value


def timestamp(value: Any, field: str) -> datetime:
    """An RFC 3339 date-time with an offset -> naive UTC datetime (microseconds)."""
    rule = "an RFC 3339 timestamp such as 2030-01-02T03:04:05Z"
    match = RFC3339.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise InvalidArgument(f"{field}: must be {rule}, got {show(value)}", field=field)
    year, month, day, hour, minute, second, fraction, offset = match.groups()
    micro = int((fraction or "").ljust(6, "0")[:6])
    try:
        if offset in ("Z", "z"):
            tz = UTC
        else:
            sign = -1 if offset[0] == "-" else 1
            off_h, off_m = int(offset[1:3]), int(offset[4:6])
            if off_h > 23 or off_m > 59:
                raise ValueError("offset out of range")
            tz = timezone(sign * timedelta(hours=off_h, minutes=off_m))
        local = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), micro, tzinfo=tz)
        utc = local.astimezone(UTC).replace(tzinfo=None)
    except (ValueError, OverflowError):
        raise InvalidArgument(f"{field}: must be {rule}, got {show(value)}", field=field) from None
    if not EARLIEST <= utc <= LATEST:
        raise InvalidArgument(f"{field}: must be from 1970-01-01 to 9999-12-31 (UTC), got {show(value)}", field=field)
    return utc


def resource_key(value: Any, field: str = "resource_key") -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= RESOURCE_KEY_MAX or CONTROL_CHARS.search(value):
        raise InvalidArgument(
            f"{field}: must be a string of 1-{RESOURCE_KEY_MAX} characters without control characters, got {show(value)}",
            field=field,
        )
    return value


# -- request bodies ----------------------------------------------------------------


def submit_task(body: Mapping[str, Any], *, trace_context: str | None = None) -> NewTask:
    """The body of POST /v1/tasks -> a validated NewTask (with the request's validated
    trace context, if any)."""
    return NewTask(**task_fields(body, allowed=SUBMIT_FIELDS, required=SUBMIT_REQUIRED), trace_context=trace_context)


def batch_tasks(body: Mapping[str, Any]) -> list[Any]:
    """The body of POST /v1/tasks/batch -> its items, not yet validated (see ``batch_item``).

    Refusals here are the whole request's: no ``tasks`` array, or one of no or too many items.
    """
    reject_unknown(body, BATCH_FIELDS)
    items = require(body, "tasks")
    if not isinstance(items, list):
        raise InvalidArgument(f"tasks: must be an array, got {kind(items)}", field="tasks")
    if not 1 <= len(items) <= MAX_BATCH_TASKS:
        raise InvalidArgument(f"tasks: must hold 1 to {MAX_BATCH_TASKS} tasks, got {len(items)}", field="tasks")
    return items


def batch_item(value: Any, index: int, *, trace_context: str | None = None) -> tuple[str, NewTask]:
    """Item ``index`` of a batch -> (its idempotency key, the validated NewTask).

    The POST /v1/tasks rules exactly, plus ``idempotency_key`` (the header's rule); every
    refusal names ``tasks[index].`` + the field.
    """
    field = f"tasks[{index}]"
    if not isinstance(value, dict):
        raise InvalidArgument(f"{field}: must be an object, got {kind(value)}", field=field)
    prefix = field + "."
    fields = task_fields(
        value, allowed=BATCH_ITEM_FIELDS, required=("idempotency_key", *SUBMIT_REQUIRED), prefix=prefix
    )
    key = string(
        value["idempotency_key"],
        prefix + "idempotency_key",
        IDEMPOTENCY_KEY,
        "1-255 visible ASCII characters (0x21-0x7E)",
    )
    return key, NewTask(**fields, trace_context=trace_context)


def task_template(value: Any, field: str) -> dict[str, Any]:
    """A plan version's ``definition.task``: the POST /v1/tasks rules, without the queue and times.

    Returns the NewTask fields except ``queue_id``; refusals name ``field`` + "." + the field.
    """
    if not isinstance(value, dict):
        raise InvalidArgument(f"{field}: must be an object, got {show(value)}", field=field)
    prefix = field + "."
    for name, reason in TEMPLATE_EXCLUDED.items():
        if name in value:
            raise InvalidArgument(f"{prefix}{name}: not part of a plan's task; {reason}", field=prefix + name)
    return task_fields(value, allowed=TEMPLATE_FIELDS, required=TEMPLATE_REQUIRED, prefix=prefix)


def task_fields(
    body: Mapping[str, Any], *, allowed: Sequence[str], required: Sequence[str], prefix: str = ""
) -> dict[str, Any]:
    """The NewTask fields of a task body (a submission or a plan's task template).

    One set of rules for both; every refusal names ``prefix`` + the field.
    """
    reject_unknown(body, allowed, prefix)
    for name in required:
        require(body, name, prefix)
    fields: dict[str, Any] = {}
    if "queue_id" in body:
        fields["queue_id"] = string(body["queue_id"], prefix + "queue_id", QUEUE_ID, "32 lowercase hex characters")
    fields |= {
        "handler": string(body["handler"], prefix + "handler", HANDLER, "1-200 characters of A-Z a-z 0-9 . _ : / -"),
        "handler_version": string(
            body["handler_version"], prefix + "handler_version", VERSION, "1-64 characters of A-Z a-z 0-9 . _ + -"
        ),
        "payload_version": string(
            body["payload_version"], prefix + "payload_version", VERSION, "1-64 characters of A-Z a-z 0-9 . _ + -"
        ),
        "payload": body["payload"],
    }
    if "priority" in body:
        fields["priority"] = integer(body["priority"], prefix + "priority", 0, MAX_PRIORITY)
    if "available_at" in body and "delay_s" in body:
        raise InvalidArgument(f"{prefix}delay_s: give available_at or delay_s, not both", field=prefix + "delay_s")
    if "available_at" in body:
        fields["available_at"] = timestamp(body["available_at"], prefix + "available_at")
    if "delay_s" in body:
        delay = number(body["delay_s"], prefix + "delay_s", 0, MAX_DELAY_S)
        fields["delay_us"] = delay * 1_000_000 if isinstance(delay, int) else round(delay * 1_000_000)
    if "deadline" in body:
        fields["deadline"] = timestamp(body["deadline"], prefix + "deadline")
        if "available_at" in fields and fields["deadline"] <= fields["available_at"]:
            raise InvalidArgument(f"{prefix}deadline: must be later than available_at", field=prefix + "deadline")
    if "max_attempts" in body:
        fields["max_attempts"] = integer(body["max_attempts"], prefix + "max_attempts", 1, MAX_ATTEMPTS)
    if "backoff" in body:
        fields.update(_backoff(body["backoff"], prefix + "backoff"))
    if "resource_key" in body:
        fields["resource_key"] = resource_key(body["resource_key"], prefix + "resource_key")
    if "depends_on" in body:
        fields["depends_on"] = depends_on(body["depends_on"], prefix + "depends_on")
    if "depends_on_keys" in body:
        fields["depends_on_keys"] = depends_on_keys(body["depends_on_keys"], prefix + "depends_on_keys")
    return fields


def depends_on(value: Any, field: str) -> tuple[str, ...]:
    """A task's parents by id: an array of up to ``MAX_PARENTS`` distinct task ids."""
    return _distinct_list(
        value, field, lambda item, at: path_id(item, at) if isinstance(item, str) else _not_id(item, at)
    )


def _not_id(value: Any, field: str) -> str:
    raise InvalidArgument(f"{field}: expected 32 lowercase hex characters, got {show(value)}", field=field)


def depends_on_keys(value: Any, field: str) -> tuple[str, ...]:
    """Parents by the idempotency keys they were accepted under (before, or by an earlier
    item of the same batch), as many as a batch holds: a fan-in of a whole batch."""
    return _distinct_list(
        value,
        field,
        lambda item, at: string(item, at, IDEMPOTENCY_KEY, "1-255 visible ASCII characters (0x21-0x7E)"),
        most=MAX_PARENT_KEYS,
    )


def _distinct_list(value: Any, field: str, item: Any, *, most: int = MAX_PARENTS) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise InvalidArgument(f"{field}: must be an array, got {kind(value)}", field=field)
    if len(value) > most:
        raise InvalidArgument(f"{field}: must hold at most {most} parents, got {len(value)}", field=field)
    seen: dict[str, None] = {}
    for index, element in enumerate(value):
        at = f"{field}[{index}]"
        checked = item(element, at)
        if checked in seen:
            raise InvalidArgument(f"{at}: {show(checked)} is named twice", field=at)
        seen[checked] = None
    return tuple(seen)


def _backoff(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidArgument(f"{field}: must be an object, got {show(value)}", field=field)
    reject_unknown(value, BACKOFF_FIELDS, prefix=field + ".")
    initial = value.get("initial_ms", DEFAULT_BACKOFF_INITIAL_MS)
    maximum = value.get("max_ms", DEFAULT_BACKOFF_MAX_MS)
    multiplier = value.get("multiplier", DEFAULT_BACKOFF_MULTIPLIER)
    initial = integer(initial, f"{field}.initial_ms", 1, BACKOFF_INITIAL_MS_MAX)
    maximum = integer(maximum, f"{field}.max_ms", 1, BACKOFF_MAX_MS_MAX)
    multiplier = number(multiplier, f"{field}.multiplier", BACKOFF_MULTIPLIER_MIN, BACKOFF_MULTIPLIER_MAX)
    if maximum < initial:
        raise InvalidArgument(f"{field}.max_ms: must not be less than {field}.initial_ms", field=f"{field}.max_ms")
    return {"backoff_initial_ms": initial, "backoff_max_ms": maximum, "backoff_multiplier": float(multiplier)}


def _control(value: Any, field: str) -> int | None:
    if field == "max_running_per_key":
        # A number of holders, never unlimited: null is refused like any non-integer.
        return running_per_key(value)
    return None if value is None else integer(value, field, 0, CONTROL_MAX)


def running_per_key(value: Any, field: str = "max_running_per_key") -> int:
    """A queue's ``max_running_per_key``: a JSON integer from 1 to 1,000."""
    return integer(value, field, MIN_RUNNING_PER_KEY, MAX_RUNNING_PER_KEY)


def create_queue(body: Mapping[str, Any]) -> dict[str, Any]:
    reject_unknown(body, QUEUE_CREATE_FIELDS)
    name = string(
        require(body, "name"),
        "name",
        QUEUE_NAME,
        "1-128 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit",
    )
    controls = {f: _control(body.get(f), f) for f in QUEUE_CONTROL_FIELDS if f != "max_running_per_key"}
    per_key = body.get("max_running_per_key", DEFAULT_RUNNING_PER_KEY)
    return {"name": name, **controls, "max_running_per_key": _control(per_key, "max_running_per_key")}


def queue_controls(body: Mapping[str, Any]) -> dict[str, int | None]:
    reject_unknown(body, QUEUE_CONTROL_FIELDS)
    if not body:
        raise InvalidArgument(f"body: name at least one of {', '.join(QUEUE_CONTROL_FIELDS)}", field="body")
    return {f: _control(body[f], f) for f in QUEUE_CONTROL_FIELDS if f in body}


def no_fields(body: Mapping[str, Any]) -> None:
    """Bodies of action routes (cancel, pause, resume): empty or ``{}``."""
    reject_unknown(body, ())


# One encoder for every digest (json.dumps with options builds one per call).
_CANONICAL_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(value: Any) -> str:
    """One text per JSON value: sorted keys, no whitespace, UTF-8 kept as is."""
    return _CANONICAL_JSON.encode(value)


@attrs.frozen(kw_only=True)
class NewTask:
    """A validated submission. Times are naive UTC datetimes (the database session is UTC)."""

    queue_id: str
    handler: str
    handler_version: str
    payload_version: str
    # The payload as parsed JSON (integers of any size are Python ints, kept exactly).
    payload: Any
    priority: int = DEFAULT_PRIORITY
    available_at: datetime | None = None
    # Added to the database clock when available_at is absent.
    delay_us: int = 0
    deadline: datetime | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff_initial_ms: int = DEFAULT_BACKOFF_INITIAL_MS
    backoff_max_ms: int = DEFAULT_BACKOFF_MAX_MS
    backoff_multiplier: float = DEFAULT_BACKOFF_MULTIPLIER
    resource_key: str | None = None
    # Parents by task id, and (a batch item) by the idempotency keys of earlier items of
    # its batch: it waits until all of them succeed (``orbit_node.domain.dependencies``).
    depends_on: tuple[str, ...] = ()
    depends_on_keys: tuple[str, ...] = ()
    # The producer's W3C trace context, validated, in its stored form
    # (``trace_context.TraceContext.stored``), or None. Not part of the request: a repeat
    # under another trace is the same request, so ``canonical`` leaves it out.
    trace_context: str | None = None

    @property
    def held_back(self) -> bool:
        """Whether the submission names when the task becomes available (else: at once)."""
        return self.available_at is not None or self.delay_us > 0

    def canonical(self) -> dict[str, Any]:
        """The request as the digest sees it: every field at its default value is left out.

        This is what keeps digests stable across versions: a request that says
        ``"priority": 0`` and one written before priority existed are the same request.
        """
        form: dict[str, Any] = {
            "queue_id": self.queue_id,
            "handler": self.handler,
            "handler_version": self.handler_version,
            "payload_version": self.payload_version,
            "payload": self.payload,
        }
        optional: tuple[tuple[str, Any, Any], ...] = (
            ("priority", self.priority, DEFAULT_PRIORITY),
            ("available_at", rfc3339(self.available_at), None),
            ("delay_us", self.delay_us, 0),
            ("deadline", rfc3339(self.deadline), None),
            ("max_attempts", self.max_attempts, DEFAULT_MAX_ATTEMPTS),
            ("backoff_initial_ms", self.backoff_initial_ms, DEFAULT_BACKOFF_INITIAL_MS),
            ("backoff_max_ms", self.backoff_max_ms, DEFAULT_BACKOFF_MAX_MS),
            ("backoff_multiplier", float(self.backoff_multiplier), DEFAULT_BACKOFF_MULTIPLIER),
            ("resource_key", self.resource_key, None),
            ("depends_on", list(self.depends_on), []),
            ("depends_on_keys", list(self.depends_on_keys), []),
        )
        for name, value, default in optional:
            if value != default:
                form[name] = value
        return form

    def digest(self) -> str:
        return hashlib.sha256(canonical_json(self.canonical()).encode("utf-8")).hexdigest()
