"""The frames one Worker connection has queued and not sent yet, sans-IO.

``SendBuffer`` counts what waits for the connection's writer and says whether one more
frame fits: at most ``max_messages`` frames and ``max_bytes`` UTF-8 bytes
(``NodeConfig.worker_send_buffer_messages`` and ``worker_send_buffer_bytes``). A frame
alone may exceed the byte bound: it fits an empty buffer. ``ConnectionCore`` owns it and
decides what a frame that does not fit means (the Worker reads too slowly).
"""

from __future__ import annotations

from typing import Any

import attrs

from . import protocol as p


@attrs.frozen
class Frame:
    """One text frame for the Worker and its size in UTF-8 bytes."""

    text: str
    size: int

    @classmethod
    def of(cls, message: p.NodeMessage | dict[str, Any]) -> Frame:
        text = p.dumps(message)
        return cls(text, len(text.encode()))


@attrs.define(eq=False)
class SendBuffer:
    """Frames queued for the writer: how many, how many bytes, within which bounds."""

    max_messages: int
    max_bytes: int
    messages: int = attrs.field(default=0, init=False)
    # UTF-8 bytes of the queued frames.
    size: int = attrs.field(default=0, init=False)

    def fits(self, frame: Frame) -> bool:
        """One more frame stays within both bounds (the first one always fits the bytes)."""
        if self.messages >= self.max_messages:
            return False
        return not self.messages or self.size + frame.size <= self.max_bytes

    def add(self, frame: Frame) -> None:
        self.messages += 1
        self.size += frame.size

    def remove(self, frame: Frame) -> None:
        """``frame`` left the buffer: the writer took it, or it was dropped."""
        self.messages -= 1
        self.size -= frame.size
