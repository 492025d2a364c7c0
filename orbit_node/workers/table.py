"""The node's live Worker connections, by id: which one holds a task (a cancel is pushed
to it) and whether any serves a given set of applications (a shard's signals are read
only then). The hub adds and removes connections; the signals of every shard ask it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from . import protocol as p

if TYPE_CHECKING:
    from .connection import WorkerConnection


@attrs.define(eq=False)
class ConnectionTable:
    connections: dict[str, WorkerConnection] = attrs.field(factory=dict)
    # Cancel requests sent to a Worker of this node as they arrived (``push_cancel``).
    cancels_pushed: int = 0

    def push_cancel(self, task_id: str) -> bool:
        """A cancel of ``task_id`` was requested through this node: if one of its
        connections holds the task, send that Worker ``cancel`` now (True).

        Otherwise the node whose connection holds it hears of it through the signals
        between nodes (``SignalRelay.cancel``), or at the latest when the Worker's next
        renew is answered (the Worker renews every third of the run lease)."""
        for conn in self.connections.values():
            if task_id in conn.core.held:
                conn.send(p.cancel([(task_id, "cancel_requested")]))
                self.cancels_pushed += 1
                return True
        return False

    def serves(self, holds: Callable[[str], bool]) -> bool:
        """Whether a connection of an application ``holds`` says yes to is here."""
        return any(holds(conn.principal.application_id) for conn in self.connections.values())
