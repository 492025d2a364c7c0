"""The Worker protocol, sans-IO: parse and validate inbound messages, build outbound ones.

The public description is ``schema/worker-protocol.schema.json``; tests validate every
message the node sends against it. Messages are JSON objects with a ``type``.

Worker -> node: ``hello``, ``heartbeat``, ``start``, ``renew``, ``finish``, ``release``, ``drain``.
Node -> Worker: ``welcome``, ``heartbeat``, ``dispatch``, ``ack``, ``cancel``, ``drain``, ``error``.

Batching: one ``dispatch`` carries every reservation of a claim, and ``start``,
``renew``, ``finish`` and ``release`` each carry a list of tasks, acknowledged by one
``ack`` with a result per task, so a busy Worker pays one round trip per batch,
not per task per transition.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from orbit_protocol.limits import MAX_ERROR_MESSAGE_CHARS, MAX_TASKS_PER_MESSAGE, MAX_TRACEBACK_CHARS

from ..domain import strict_json
from ..domain.claims import Capability
from ..domain.errors import OrbitError
from ..domain.rules import HANDLER, QUEUE_ID, VERSION
from ..domain.strict_json import NotStrictJson
from ..domain.wire import rfc3339

if TYPE_CHECKING:
    from ..domain.ownership import Reservation

# WebSocket close codes the node uses (documented in docs/worker-protocol.md).
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001  # node shutting down, after drain
CLOSE_POLICY = 1008  # permission problems found after the handshake
CLOSE_TOO_BIG = 1009  # message over the configured limit
CLOSE_INTERNAL = 1011
CLOSE_HEARTBEAT_TIMEOUT = 4000  # nothing received for heartbeat_timeout_s
CLOSE_PROTOCOL = 4002  # out-of-order or repeated protocol violations, binary frames
CLOSE_SLOW_CONSUMER = 4003  # the Worker reads too slowly: its outbound buffer is full
CLOSE_MOVED = 4004  # the node is full: the slot went to an application under its fair share

MAX_CAPACITY = 1000
MAX_QUEUES = 64
MAX_CAPABILITIES = 256
# Handler and version names follow the task rules (``orbit_node.domain.rules``), so every
# capability a Worker declares can match an accepted task.
_NAME = HANDLER
_VERSION = VERSION
_HEX32 = QUEUE_ID
_TOKEN = re.compile(r"[0-9]{1,10}-[0-9a-f]{16}")
_MESSAGE_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
# The keys of a task reference, and of a succeeded task's report (``result`` optional).
_REF_KEYS = frozenset({"task_id", "token"})
_SUCCEEDED_KEYS = frozenset({"task_id", "token", "outcome", "result"})
# The text fields of a failed task's error, each with its most characters.
_ERROR_TEXTS = (("message", MAX_ERROR_MESSAGE_CHARS), ("code", 128), ("traceback", MAX_TRACEBACK_CHARS))
# A result as stored (compact, UTF-8 as it is), and every outbound message: one encoder
# each, instead of one built by every json.dumps call with these options.
_RESULT_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_MESSAGE_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class MessageRefused(OrbitError):
    """A bad inbound message. ``close_code`` set means the connection must close.

    ``code`` is the ``error`` frame's machine code (``INVALID_MESSAGE``, ``OUT_OF_ORDER``,
    ...); it replaces the class default for each instance.
    """

    code = "INVALID_MESSAGE"
    http_status = 400

    def __init__(self, code: str, message: str, *, field: str | None = None, close_code: int | None = None):
        super().__init__(message, field=field)
        self.code = code
        self.close_code = close_code


@attrs.frozen
class TaskRef:
    task_id: str
    token: str


@attrs.frozen
class FinishReport:
    task_id: str
    token: str
    outcome: str  # succeeded | failed
    result_json: str | None
    error: Mapping[str, Any] | None
    retryable: bool


@attrs.frozen
class Hello:
    queues: tuple[str, ...]
    capabilities: frozenset[Capability]
    resource_keys: bool
    capacity: int
    client_name: str | None
    client_version: str | None
    # Running tasks of the Worker's earlier connection it asks this one to adopt.
    tasks: tuple[TaskRef, ...] = ()


@attrs.frozen
class Heartbeat:
    pass


@attrs.frozen
class Start:
    tasks: tuple[TaskRef, ...]
    id: str | None = None


@attrs.frozen
class Renew:
    tasks: tuple[TaskRef, ...]
    id: str | None = None


@attrs.frozen
class Release:
    tasks: tuple[TaskRef, ...]
    id: str | None = None


@attrs.frozen
class Finish:
    tasks: tuple[FinishReport, ...]
    id: str | None = None


@attrs.frozen
class Attach:
    """The tasks of a hello's ``tasks``, adopted once the hello is accepted (answered by
    an ``ack`` of ``attach``); not a message a Worker sends on its own."""

    tasks: tuple[TaskRef, ...]
    id: str | None = None


@attrs.frozen
class Drain:
    # The Worker's own word for why (logged), if it gave one.
    reason: str | None = None


Message = Hello | Heartbeat | Start | Renew | Release | Finish | Drain


def _invalid(message: str, field: str) -> MessageRefused:
    return MessageRefused("INVALID_MESSAGE", message, field=field)


def _fields(obj: Mapping[str, Any], required: set[str], optional: set[str], where: str) -> None:
    unknown = sorted(set(obj) - required - optional - {"type"})
    if unknown:
        raise _invalid(f"unknown field {unknown[0]!r}", f"{where}{unknown[0]}")
    missing = sorted(required - set(obj))
    if missing:
        raise _invalid(f"missing field {missing[0]!r}", f"{where}{missing[0]}")


def _string(value: Any, pattern: re.Pattern[str], field: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise _invalid(f"{field}: invalid value", field)
    return value


def _int(value: Any, low: int, high: int, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _invalid(f"{field}: expected an integer {low}..{high}", field)
    return value


def _bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise _invalid(f"{field}: expected true or false", field)
    return value


def _list(value: Any, field: str, *, low: int, high: int) -> list[Any]:
    if not isinstance(value, list) or not low <= len(value) <= high:
        raise _invalid(f"{field}: expected a list of {low}..{high} items", field)
    return value


def _object(value: Any, field: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _invalid(f"{field}: expected an object", field)
    return value


def _message_id(obj: Mapping[str, Any]) -> str | None:
    return _string(obj["id"], _MESSAGE_ID, "id") if "id" in obj else None


def _well_formed(task_id: Any, token: Any) -> bool:
    return (
        type(task_id) is str
        and type(token) is str
        and _HEX32.fullmatch(task_id) is not None
        and _TOKEN.fullmatch(token) is not None
    )


def _ref(item: Any) -> TaskRef | None:
    """A well-formed task reference at once; None sends it through the checks that name
    what is wrong."""
    if type(item) is dict and item.keys() == _REF_KEYS and _well_formed(item["task_id"], item["token"]):
        return TaskRef(item["task_id"], item["token"])
    return None


def _task_refs(obj: Mapping[str, Any]) -> tuple[TaskRef, ...]:
    _fields(obj, {"tasks"}, {"id"}, "")
    return _ref_list(obj["tasks"], low=1)


def _ref_list(value: Any, *, low: int) -> tuple[TaskRef, ...]:
    refs = []
    for i, item in enumerate(_list(value, "tasks", low=low, high=MAX_TASKS_PER_MESSAGE)):
        ref = _ref(item)
        if ref is not None:
            refs.append(ref)
            continue
        item = _object(item, f"tasks[{i}]")
        _fields(item, {"task_id", "token"}, set(), f"tasks[{i}].")
        refs.append(
            TaskRef(
                _string(item["task_id"], _HEX32, f"tasks[{i}].task_id"),
                _string(item["token"], _TOKEN, f"tasks[{i}].token"),
            )
        )
    return tuple(refs)


def _hello(obj: Mapping[str, Any]) -> Hello:
    _fields(obj, {"queues", "capabilities", "capacity"}, {"resource_keys", "client", "tasks"}, "")
    queues = tuple(
        _string(q, _HEX32, f"queues[{i}]") for i, q in enumerate(_list(obj["queues"], "queues", low=1, high=MAX_QUEUES))
    )
    caps = set()
    for i, item in enumerate(_list(obj["capabilities"], "capabilities", low=1, high=MAX_CAPABILITIES)):
        item = _object(item, f"capabilities[{i}]")
        _fields(item, {"handler", "handler_version", "payload_version"}, set(), f"capabilities[{i}].")
        caps.add(
            Capability(
                _string(item["handler"], _NAME, f"capabilities[{i}].handler"),
                _string(item["handler_version"], _VERSION, f"capabilities[{i}].handler_version"),
                _string(item["payload_version"], _VERSION, f"capabilities[{i}].payload_version"),
            )
        )
    client_name = client_version = None
    if "client" in obj:
        client = _object(obj["client"], "client")
        _fields(client, set(), {"name", "version"}, "client.")
        if "name" in client:
            client_name = _string(client["name"], _NAME, "client.name")
        if "version" in client:
            client_version = _string(client["version"], _VERSION, "client.version")
    capacity = _int(obj["capacity"], 1, MAX_CAPACITY, "capacity")
    tasks = _ref_list(obj.get("tasks", []), low=0)
    seen: set[str] = set()
    for i, ref in enumerate(tasks):
        if ref.task_id in seen:
            raise _invalid(f"tasks: task {ref.task_id} is presented twice", f"tasks[{i}].task_id")
        seen.add(ref.task_id)
    if len(tasks) > capacity:
        raise _invalid(f"tasks: {len(tasks)} running tasks presented, more than the capacity {capacity}", "tasks")
    return Hello(
        queues=tuple(dict.fromkeys(queues)),
        capabilities=frozenset(caps),
        resource_keys=_bool(obj.get("resource_keys", False), "resource_keys"),
        capacity=capacity,
        client_name=client_name,
        client_version=client_version,
        tasks=tasks,
    )


def _finish(obj: Mapping[str, Any]) -> Finish:
    _fields(obj, {"tasks"}, {"id"}, "")
    reports = []
    for i, item in enumerate(_list(obj["tasks"], "tasks", low=1, high=MAX_TASKS_PER_MESSAGE)):
        if (
            type(item) is dict
            and item.get("outcome") == "succeeded"
            and item.keys() <= _SUCCEEDED_KEYS
            and _well_formed(item.get("task_id"), item.get("token"))
        ):
            # A well-formed success at once; anything else is checked field by field below.
            stored = _RESULT_JSON.encode(item.get("result"))
            reports.append(FinishReport(item["task_id"], item["token"], "succeeded", stored, None, False))
            continue
        where = f"tasks[{i}]"
        item = _object(item, where)
        _fields(item, {"task_id", "token", "outcome"}, {"result", "error", "retryable"}, f"{where}.")
        outcome = item["outcome"]
        if outcome == "succeeded":
            if "error" in item or "retryable" in item:
                raise _invalid("a succeeded task carries result, not error/retryable", f"{where}.error")
            result_json = _RESULT_JSON.encode(item.get("result"))
            error = None
            retryable = False
        elif outcome == "failed":
            if "result" in item:
                raise _invalid("a failed task carries error, not result", f"{where}.result")
            error = _object(item.get("error", {}), f"{where}.error")
            unknown = sorted(set(error) - {"message", "code", "details", "traceback"})
            if unknown:
                raise _invalid(f"unknown field {unknown[0]!r}", f"{where}.error.{unknown[0]}")
            for name, limit in _ERROR_TEXTS:
                if name in error and (not isinstance(error[name], str) or len(error[name]) > limit):
                    raise _invalid(
                        f"error.{name}: expected a string of at most {limit} characters", f"{where}.error.{name}"
                    )
            result_json = None
            retryable = _bool(item.get("retryable", True), f"{where}.retryable")
        else:
            raise _invalid('outcome must be "succeeded" or "failed"', f"{where}.outcome")
        reports.append(
            FinishReport(
                task_id=_string(item["task_id"], _HEX32, f"{where}.task_id"),
                token=_string(item["token"], _TOKEN, f"{where}.token"),
                outcome=outcome,
                result_json=result_json,
                error=error,
                retryable=retryable,
            )
        )
    return Finish(tuple(reports), _message_id(obj))


def _drain(obj: Mapping[str, Any]) -> Drain:
    _fields(obj, set(), {"reason"}, "")
    if "reason" not in obj:
        return Drain()
    reason = obj["reason"]
    if not isinstance(reason, str) or not 1 <= len(reason) <= 64:
        raise _invalid("reason: expected a string of 1..64 characters", "reason")
    return Drain(reason)


def _empty(cls: Callable[[], Message]) -> Callable[[Mapping[str, Any]], Message]:
    def parse(obj: Mapping[str, Any]) -> Message:
        _fields(obj, set(), set(), "")
        return cls()

    return parse


_PARSERS: dict[str, Callable[[Mapping[str, Any]], Message]] = {
    "hello": _hello,
    "heartbeat": _empty(Heartbeat),
    "start": lambda obj: Start(_task_refs(obj), _message_id(obj)),
    "renew": lambda obj: Renew(_task_refs(obj), _message_id(obj)),
    "release": lambda obj: Release(_task_refs(obj), _message_id(obj)),
    "finish": _finish,
    "drain": lambda obj: _drain(obj),
}


def parse_message(data: str | bytes) -> Message:
    """Parse one inbound frame into a message, or raise ``MessageRefused``.

    Messages are JSON text frames; a binary frame is refused whatever it holds, and the
    connection closes (``CLOSE_PROTOCOL``).
    """
    if not isinstance(data, str):
        raise MessageRefused(
            "MALFORMED_MESSAGE",
            "binary frames are refused: send every message as a JSON text frame",
            close_code=CLOSE_PROTOCOL,
        )
    try:
        obj = strict_json.loads(data)
    except NotStrictJson as exc:
        raise MessageRefused("MALFORMED_MESSAGE", f"not a JSON message: {exc}") from None
    if not isinstance(obj, dict):
        raise MessageRefused("MALFORMED_MESSAGE", "a message must be a JSON object")
    if "type" not in obj:
        raise _invalid("missing field 'type'", "type")
    kind = obj["type"]
    if not isinstance(kind, str):
        raise _invalid("type: expected a string", "type")
    parser = _PARSERS.get(kind)
    if parser is None:
        shown = kind if len(kind) <= 64 else kind[:64] + "..."
        raise MessageRefused("UNKNOWN_TYPE", f"unknown message type {shown!r}", field="type")
    return parser(obj)


# -- outbound ------------------------------------------------------------------------


def dumps(message: Mapping[str, Any]) -> str:
    return _MESSAGE_JSON.encode(message)


def welcome(
    *,
    connection_id: str,
    node_id: str,
    heartbeat_interval_s: float,
    heartbeat_timeout_s: float,
    max_message_bytes: int,
    reservation_lease_s: float,
    run_lease_s: float,
) -> dict[str, Any]:
    return {
        "type": "welcome",
        "connection_id": connection_id,
        "node_id": node_id,
        "heartbeat_interval_s": heartbeat_interval_s,
        "heartbeat_timeout_s": heartbeat_timeout_s,
        "max_message_bytes": max_message_bytes,
        "reservation_lease_s": reservation_lease_s,
        "run_lease_s": run_lease_s,
    }


def heartbeat() -> dict[str, Any]:
    return {"type": "heartbeat"}


def dispatch_task(r: Reservation) -> dict[str, Any]:
    """One reservation as the Worker sees it; ``priority`` only when non-zero,
    ``traceparent`` and ``tracestate`` only when the submission carried them, ``parents``
    only for a task that has some."""
    task = {
        "task_id": r.task_id,
        "token": r.fencing_token,
        "queue_id": r.queue_id,
        "handler": r.handler,
        "handler_version": r.handler_version,
        "payload_version": r.payload_version,
        "payload": json.loads(r.payload_json),
        "attempt": r.attempt,
        "max_attempts": r.max_attempts,
        "lease_expires_at": rfc3339(r.lease_expires_at),
    }
    if r.deadline is not None:
        task["deadline"] = rfc3339(r.deadline)
    if r.resource_key is not None:
        task["resource_key"] = r.resource_key
    if r.priority:
        task["priority"] = r.priority
    if r.trace_context is not None:
        # The producer's W3C trace context, validated when it was accepted; absent when the
        # submission carried none.
        traceparent, _, tracestate = r.trace_context.partition(" ")
        task["traceparent"] = traceparent
        if tracestate:
            task["tracestate"] = tracestate
    if r.parents:
        # The task's parents (depends_on), each succeeded: their results are the handler's to read.
        task["parents"] = list(r.parents)
    return task


def dispatch(reservations: Sequence[Reservation]) -> dict[str, Any]:
    return {"type": "dispatch", "tasks": [dispatch_task(r) for r in reservations]}


def ack(of: str, results: list[dict[str, Any]], message_id: str | None = None) -> dict[str, Any]:
    body = {"type": "ack", "of": of, "results": results}
    if message_id is not None:
        body["id"] = message_id
    return body


def refused(task_id: str, code: str) -> dict[str, Any]:
    """One ``ack`` result for a task whose transition was refused before the store (``NOT_HELD``, ...)."""
    return {"task_id": task_id, "ok": False, "code": code}


def cancel(items: list[tuple[str, str]]) -> dict[str, Any]:
    return {"type": "cancel", "tasks": [{"task_id": task_id, "reason": reason} for task_id, reason in items]}


# Why the node asks a Worker to drain: it shuts down, or it gave the connection's slot to
# an application under its fair share. Either way the Worker moves: it reconnects (to
# another node, given several) and re-attaches what runs there.
DRAIN_REASONS = ("shutdown", "moved")


def drain(reason: str) -> dict[str, Any]:
    assert reason in DRAIN_REASONS, reason
    return {"type": "drain", "reason": reason}


def error(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    body = {"type": "error", "code": code, "message": message}
    if field is not None:
        body["field"] = field
    return body
