"""The node's messages to a Worker as values: ``parse_message`` reads one frame into the
frozen value of its type, which the Worker matches on.

Node -> Worker (``docs/worker-protocol.md``): ``welcome``, ``heartbeat``, ``dispatch``,
``ack``, ``cancel``, ``drain``, ``error``. A frame that is not a JSON object with a string
``type``, or a message of one of these types that lacks a field the SDK reads or holds
one of the wrong kind, is a ``ProtocolError`` naming the message type and the field
(``tasks[0].token``). Fields the SDK does not read are not checked, and a type it does
not know is ``Unknown`` (the Worker ignores it). Sans-IO: nothing here awaits.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import attrs

from .errors import ProtocolError
from .handlers import WorkerTask

T = TypeVar("T")

# Ack codes of a transition the node could not decide (its database out of reach, its
# queue of transitions full): nothing changed, the connection still holds the task, and
# the same transition is sent again.
UNDECIDED = frozenset({"UNAVAILABLE", "RESOURCE_EXHAUSTED"})


@attrs.frozen
class Welcome:
    """The answer to the hello: the session's bounds."""

    type: ClassVar[str] = "welcome"
    connection_id: str
    node_id: str
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    max_message_bytes: int
    reservation_lease_s: float
    run_lease_s: float


@attrs.frozen
class Heartbeat:
    type: ClassVar[str] = "heartbeat"


@attrs.frozen
class Dispatched:
    """One reservation of a ``dispatch``: the attempt a handler sees, and its fencing token."""

    token: str
    task: WorkerTask


@attrs.frozen
class Dispatch:
    type: ClassVar[str] = "dispatch"
    tasks: tuple[Dispatched, ...]


@attrs.frozen
class AckResult:
    """The node's answer for one task of a start, renew, finish or release."""

    task_id: str
    ok: bool
    # Why not ok: OWNERSHIP_LOST, NOT_HELD, TASK_CANCELLED, TASK_EXPIRED, or one of UNDECIDED.
    code: str | None = None
    # The task's state after the transition, when the node says it.
    state: str | None = None

    @property
    def undecided(self) -> bool:
        """Refused without a decision: the same transition is to be sent again."""
        return not self.ok and self.code in UNDECIDED


@attrs.frozen
class Ack:
    type: ClassVar[str] = "ack"
    # The kind of message acknowledged (start, renew, finish, release).
    of: str
    results: tuple[AckResult, ...]
    # The acknowledged message's id, when it had one.
    id: str | None = None


@attrs.frozen
class CancelTask:
    task_id: str
    # cancel_requested or deadline.
    reason: str


@attrs.frozen
class Cancel:
    type: ClassVar[str] = "cancel"
    tasks: tuple[CancelTask, ...]


@attrs.frozen
class Drain:
    type: ClassVar[str] = "drain"
    # shutdown (the node stops) or moved (its slot went to another application); None
    # from a node that does not say. Either way the Worker moves to its next connection.
    reason: str | None = None


@attrs.frozen
class Error:
    """The node's ``error`` message (it refused a message of the Worker's): not an exception."""

    type: ClassVar[str] = "error"
    code: str
    message: str
    field: str | None = None


@attrs.frozen
class Unknown:
    """A message of a type this SDK does not know."""

    type: str


NodeMessage = Welcome | Heartbeat | Dispatch | Ack | Cancel | Drain | Error | Unknown


def _kind(value: Any) -> str:
    """What a JSON value is, as an error message says it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


def _malformed(kind: str, field: str, problem: str) -> ProtocolError:
    return ProtocolError(f"malformed {kind!r} message from the node: {field}: {problem}", field=field)


@attrs.frozen
class _Fields:
    """One JSON object of a message of type ``kind`` (the message, or an item of one of its
    lists, whose path starts ``where``), read field by field."""

    kind: str
    obj: Mapping[str, Any]
    where: str = ""

    def malformed(self, name: str, problem: str) -> ProtocolError:
        return _malformed(self.kind, self.where + name, problem)

    def _absent(self, name: str, expected: str) -> ProtocolError:
        return self.malformed(name, f"expected {expected}, got null" if name in self.obj else "missing")

    def _optional(self, name: str, kind: type[T], expected: str) -> T | None:
        value = self.obj.get(name)
        if value is None:
            return None
        if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
            return value
        raise self.malformed(name, f"expected {expected}, got {_kind(value)}")

    def _required(self, name: str, kind: type[T], expected: str) -> T:
        value = self._optional(name, kind, expected)
        if value is None:
            raise self._absent(name, expected)
        return value

    def text(self, name: str) -> str:
        return self._required(name, str, "a string")

    def optional_text(self, name: str) -> str | None:
        return self._optional(name, str, "a string")

    def integer(self, name: str) -> int:
        return self._required(name, int, "an integer")

    def optional_integer(self, name: str) -> int | None:
        return self._optional(name, int, "an integer")

    def flag(self, name: str) -> bool:
        return self._required(name, bool, "true or false")

    def seconds(self, name: str) -> float:
        expected = "a positive number of seconds"
        value = self.obj.get(name)
        if value is None:
            raise self._absent(name, expected)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.malformed(name, f"expected {expected}, got {_kind(value)}")
        if not value > 0:
            raise self.malformed(name, f"expected {expected}, got {value!r}")
        return float(value)

    def value(self, name: str) -> Any:
        """Any JSON value (null included), present."""
        if name not in self.obj:
            raise self.malformed(name, "missing")
        return self.obj[name]

    def strings(self, name: str) -> tuple[str, ...]:
        """An optional list of strings (absent: empty)."""
        items = self._optional(name, list, "a list")
        if items is None:
            return ()
        for index, item in enumerate(items):
            if not isinstance(item, str):
                raise self.malformed(f"{name}[{index}]", f"expected a string, got {_kind(item)}")
        return tuple(items)

    def objects(self, name: str, *, at_least: int = 0) -> list[_Fields]:
        items = self._required(name, list, "a list")
        if len(items) < at_least:
            raise _malformed(
                self.kind, f"{self.where}{name}", f"expected at least {at_least} item(s), got {len(items)}"
            )
        fields = []
        for index, item in enumerate(items):
            path = f"{self.where}{name}[{index}]"
            if not isinstance(item, dict):
                raise _malformed(self.kind, path, f"expected an object, got {_kind(item)}")
            fields.append(_Fields(self.kind, item, f"{path}."))
        return fields


def _welcome(m: _Fields) -> Welcome:
    return Welcome(
        connection_id=m.text("connection_id"),
        node_id=m.text("node_id"),
        heartbeat_interval_s=m.seconds("heartbeat_interval_s"),
        heartbeat_timeout_s=m.seconds("heartbeat_timeout_s"),
        max_message_bytes=m.integer("max_message_bytes"),
        reservation_lease_s=m.seconds("reservation_lease_s"),
        run_lease_s=m.seconds("run_lease_s"),
    )


def _dispatched(t: _Fields) -> Dispatched:
    return Dispatched(
        token=t.text("token"),
        task=WorkerTask(
            task_id=t.text("task_id"),
            queue_id=t.text("queue_id"),
            handler=t.text("handler"),
            handler_version=t.text("handler_version"),
            payload_version=t.text("payload_version"),
            payload=t.value("payload"),
            attempt=t.integer("attempt"),
            max_attempts=t.integer("max_attempts"),
            priority=t.optional_integer("priority") or 0,
            deadline=t.optional_text("deadline"),
            resource_key=t.optional_text("resource_key"),
            traceparent=t.optional_text("traceparent"),
            tracestate=t.optional_text("tracestate"),
            parent_ids=t.strings("parents"),
        ),
    )


def _ack(m: _Fields) -> Ack:
    results = tuple(
        AckResult(
            task_id=r.text("task_id"), ok=r.flag("ok"), code=r.optional_text("code"), state=r.optional_text("state")
        )
        for r in m.objects("results")
    )
    return Ack(of=m.text("of"), results=results, id=m.optional_text("id"))


def _cancel(m: _Fields) -> Cancel:
    return Cancel(
        tuple(
            CancelTask(t.text("task_id"), t.optional_text("reason") or "cancel_requested") for t in m.objects("tasks")
        )
    )


_PARSERS: dict[str, Callable[[_Fields], NodeMessage]] = {
    "welcome": _welcome,
    "heartbeat": lambda m: Heartbeat(),
    "dispatch": lambda m: Dispatch(tuple(_dispatched(t) for t in m.objects("tasks", at_least=1))),
    "ack": _ack,
    "cancel": _cancel,
    "drain": lambda m: Drain(m.optional_text("reason")),
    "error": lambda m: Error(code=m.text("code"), message=m.text("message"), field=m.optional_text("field")),
}


def parse_message(frame: str | bytes) -> NodeMessage:
    """The message one frame from the node holds, or a ``ProtocolError`` naming what is
    malformed (``field`` is its path, ``type`` when the frame has no string type)."""
    try:
        obj = json.loads(frame)
    except ValueError as exc:
        raise ProtocolError(f"a message from the node is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"a message from the node is {_kind(obj)}, not a JSON object")
    kind = obj.get("type")
    if not isinstance(kind, str):
        problem = f"expected a string, got {_kind(kind)}" if "type" in obj else "missing"
        raise ProtocolError(f"a message from the node has no type: type: {problem}", field="type")
    parse = _PARSERS.get(kind)
    return Unknown(kind) if parse is None else parse(_Fields(kind, obj))
