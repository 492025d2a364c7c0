"""The Worker protocol as the node speaks it, sans-IO.

The messages, their rules and both directions' parsing and building are
``orbit_protocol.messages``, the one codec the node and the SDK share (re-exported here).
What only the node adds: an inbound frame read strictly (``strict_json``) into a Worker's
message, or refused with a ``MessageRefused`` that the connection answers with an
``error`` frame; a reservation as the dispatched task a Worker sees; and ``Attach``, the
tasks a hello presented as the connection adopts them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from orbit_protocol.messages import (
    CLOSE_GOING_AWAY,
    CLOSE_HEARTBEAT_TIMEOUT,
    CLOSE_INTERNAL,
    CLOSE_MOVED,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_PROTOCOL,
    CLOSE_SLOW_CONSUMER,
    CLOSE_TOO_BIG,
    DRAIN_REASONS,
    Ack,
    AckResult,
    Cancel,
    CancelTask,
    Dispatch,
    DispatchedTask,
    Drain,
    Error,
    Finish,
    FinishReport,
    Heartbeat,
    Hello,
    Invalid,
    NodeMessage,
    Release,
    Renew,
    Start,
    TaskRef,
    Welcome,
    WorkerMessage,
    read_worker_message,
)
from orbit_protocol.messages import dumps as dumps_message

from ..domain import strict_json
from ..domain.errors import OrbitError
from ..domain.strict_json import NotStrictJson
from ..domain.wire import rfc3339

if TYPE_CHECKING:
    from ..domain.ownership import Reservation

__all__ = [
    "CLOSE_GOING_AWAY",
    "CLOSE_HEARTBEAT_TIMEOUT",
    "CLOSE_INTERNAL",
    "CLOSE_MOVED",
    "CLOSE_NORMAL",
    "CLOSE_POLICY",
    "CLOSE_PROTOCOL",
    "CLOSE_SLOW_CONSUMER",
    "CLOSE_TOO_BIG",
    "DRAIN_REASONS",
    "Ack",
    "AckResult",
    "Attach",
    "Cancel",
    "CancelTask",
    "Dispatch",
    "DispatchedTask",
    "Drain",
    "Error",
    "Finish",
    "FinishReport",
    "Heartbeat",
    "Hello",
    "Message",
    "MessageRefused",
    "NodeMessage",
    "Release",
    "Renew",
    "Start",
    "TaskRef",
    "Welcome",
    "cancel",
    "dispatch",
    "dispatch_task",
    "drain",
    "dumps",
    "parse_message",
    "refused",
]

# What a Worker sends.
Message = WorkerMessage


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
class Attach:
    """The tasks of a hello's ``tasks``, adopted once the hello is accepted (answered by
    an ``ack`` of ``attach``); not a message a Worker sends on its own."""

    tasks: tuple[TaskRef, ...]
    id: str | None = None


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
    try:
        return read_worker_message(obj)
    except Invalid as exc:
        raise MessageRefused(exc.code, exc.text, field=exc.field) from None


def dumps(message: NodeMessage | dict[str, Any]) -> str:
    """The text of the frame that carries ``message`` (or any JSON object)."""
    if isinstance(message, dict):
        return json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return dumps_message(message)


def dispatch_task(r: Reservation) -> DispatchedTask:
    """One reservation as the Worker sees it."""
    traceparent = tracestate = None
    if r.trace_context is not None:
        # The producer's W3C trace context, validated when it was accepted; absent when the
        # submission carried none.
        traceparent, _, state = r.trace_context.partition(" ")
        tracestate = state or None
    return DispatchedTask(
        r.task_id,
        r.fencing_token,
        r.queue_id,
        r.handler,
        r.handler_version,
        r.payload_version,
        json.loads(r.payload_json),
        r.attempt,
        r.max_attempts,
        rfc3339(r.lease_expires_at),
        rfc3339(r.deadline),
        r.resource_key,
        r.priority,
        traceparent,
        tracestate,
        r.parents,
    )


def dispatch(reservations: Sequence[Reservation]) -> Dispatch:
    return Dispatch(tuple(dispatch_task(r) for r in reservations))


def refused(task_id: str, code: str) -> AckResult:
    """One ``ack`` result for a task whose transition was refused before the store (``NOT_HELD``, ...)."""
    return AckResult(task_id, False, code)


def cancel(items: Iterable[tuple[str, str]]) -> Cancel:
    """A ``cancel`` of (task_id, reason) pairs."""
    return Cancel(tuple(CancelTask(task_id, reason) for task_id, reason in items))


def drain(reason: str) -> Drain:
    assert reason in DRAIN_REASONS, reason
    return Drain(reason)
