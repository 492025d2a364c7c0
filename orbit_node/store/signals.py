"""Signals between nodes: the append-only table ``node_signals`` (docs/scheduling.md).

A signal tells the other nodes that something they may be waiting for happened: tasks
due now or at a due time in a queue (``tasks``), a cancel asked for a task a Worker
of another node may hold (``cancel``), a request on the writer waiting for a task to
finish (``watch``), and a task that finished and is waited for (``finished``). Signals
decide nothing; a lost one costs latency.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    # Only the repository needs the database: the values stay importable without a driver.
    from ..db import Database

TASKS = "tasks"
CANCEL = "cancel"
WATCH = "watch"
FINISHED = "finished"


@attrs.frozen
class Signal:
    """One signal to publish."""

    kind: str
    queue_id: str | None = None
    task_id: str | None = None
    # ``tasks``: when they come due (database clock); None: due now.
    due_at: datetime | None = None

    @classmethod
    def tasks(cls, queue_id: str, due_at: datetime | None = None) -> Signal:
        return cls(TASKS, queue_id=queue_id, due_at=due_at)

    @classmethod
    def cancel(cls, task_id: str) -> Signal:
        return cls(CANCEL, task_id=task_id)

    @classmethod
    def watch(cls, task_id: str) -> Signal:
        return cls(WATCH, task_id=task_id)

    @classmethod
    def finished(cls, task_id: str) -> Signal:
        return cls(FINISHED, task_id=task_id)


@attrs.frozen
class ReadSignal:
    """One signal as a reader sees it."""

    signal_id: int
    origin_node_id: str
    kind: str
    queue_id: str | None = None
    task_id: str | None = None
    # ``tasks`` with a due time: seconds until it on the database clock when read (0 when
    # it has passed); None: due now.
    due_in_s: float | None = None


class SignalStore:
    def __init__(self, db: Database):
        self.db = db

    async def publish(self, origin_node_id: str, signals: Sequence[Signal]) -> int:
        """Append ``signals`` (one multi-row INSERT, autocommit); returns the rows written."""
        rows = [
            {
                "origin_node_id": origin_node_id,
                "kind": s.kind,
                "queue_id": s.queue_id,
                "task_id": s.task_id,
                "due_at": s.due_at,
            }
            for s in signals
        ]
        return await self.db.run(lambda tx: tx.execute_rows("signal_publish", rows))

    async def start(self, back_s: float) -> int:
        """Where a reader that begins now starts: below the signals of the last ``back_s``
        seconds (database clock), else at the newest one (0 when there is none)."""
        row = await self.db.fetchone("signal_start", {"back_us": round(back_s * 1_000_000)})
        return 0 if row is None else int(row["start"])

    async def read(self, after: int, limit: int, missing: Sequence[int] = ()) -> list[ReadSignal]:
        """Up to ``limit`` signals with an id above ``after`` or in ``missing``, oldest first."""
        params = {"after": after, "missing": (0, *missing), "limit": limit}
        rows = await self.db.fetchall("signal_read", params)
        return [
            ReadSignal(
                signal_id=int(row["signal_id"]),
                origin_node_id=row["origin_node_id"],
                kind=row["kind"],
                queue_id=row["queue_id"],
                task_id=row["task_id"],
                due_in_s=None if row["due_in_us"] is None else int(row["due_in_us"]) / 1_000_000,
            )
            for row in rows
        ]

    async def prune(self, keep_s: int, limit: int) -> int:
        """Delete up to ``limit`` signals older than ``keep_s`` seconds; returns how many."""
        return await self.db.execute("signal_prune", {"keep_s": keep_s, "limit": limit})
