"""The node's messages to a Worker as the SDK reads them: ``parse_message`` reads one frame
into the frozen value of its type (``orbit_protocol.messages``, the codec the node builds
them with), which the Worker matches on.

Node -> Worker (``docs/worker-protocol.md``): ``welcome``, ``heartbeat``, ``dispatch``,
``ack``, ``cancel``, ``drain``, ``error``. A frame that is not a JSON object with a string
``type``, or a message of one of these types that breaks a rule of the protocol, is a
``ProtocolError`` naming the message type and the field (``tasks[0].token``). Fields the
SDK does not know are passed over, and a type it does not know is ``Unknown`` (the
Worker ignores it), so a Worker keeps working with a node that adds one. Sans-IO:
nothing here awaits.
"""

from __future__ import annotations

import json

import attrs

from orbit_protocol.messages import (
    Ack,
    AckResult,
    Cancel,
    CancelTask,
    Dispatch,
    DispatchedTask,
    Drain,
    Error,
    Heartbeat,
    Invalid,
    Welcome,
    kind,
    read_node_message,
)

from .errors import ProtocolError

__all__ = [
    "Ack",
    "AckResult",
    "Cancel",
    "CancelTask",
    "Dispatch",
    "DispatchedTask",
    "Drain",
    "Error",
    "Heartbeat",
    "NodeMessage",
    "Unknown",
    "Welcome",
    "parse_message",
]


@attrs.frozen
class Unknown:
    """A message of a type this SDK does not know."""

    type: str


NodeMessage = Welcome | Heartbeat | Dispatch | Ack | Cancel | Drain | Error | Unknown


def parse_message(frame: str | bytes) -> NodeMessage:
    """The message one frame from the node holds, or a ``ProtocolError`` naming what is
    malformed (``field`` is its path, ``type`` when the frame has no string type)."""
    try:
        obj = json.loads(frame)
    except ValueError as exc:
        raise ProtocolError(f"a message from the node is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"a message from the node is {kind(obj)}, not a JSON object")
    try:
        return read_node_message(obj)
    except Invalid as exc:
        if exc.code == "UNKNOWN_TYPE":
            return Unknown(obj["type"])
        if exc.message_type is None:
            raise ProtocolError(
                f"a message from the node has no type: {exc.field}: {exc.problem}", field=exc.field
            ) from None
        said = f"malformed {exc.message_type!r} message from the node: {exc.field}: {exc.problem}"
        raise ProtocolError(said, field=exc.field) from None
