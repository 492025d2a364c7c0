"""Which tasks a listing or a bulk action of ``OrbitClient`` covers, and what a bulk call did.

    failed_today = TaskFilter(states=("failed",), finished_after=midnight)
    page = await client.list_tasks(filter=failed_today)
    async for result in client.iter_bulk_retry(failed_today):
        print(result.changed, "retried")

``TaskFilter`` is sent as query parameters (``GET /v1/tasks``) or as the ``filter`` object
of ``POST /v1/tasks/bulk-cancel`` / ``bulk-retry``; every field given must hold
(``docs/api.md``). The node checks every field; this module only shapes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import attrs


def _utc(value: datetime) -> str:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("TaskFilter times must be timezone-aware datetimes")
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@attrs.frozen(kw_only=True)
class TaskFilter:
    """Conditions on tasks; the defaults match every task. Times are aware datetimes:
    ``created_after`` <= created_at < ``created_before``, likewise ``finished_*``."""

    queue_id: str | None = None
    # Any of these states (queued, reserved, running, succeeded, failed, cancelled, expired).
    states: Sequence[str] = attrs.field(default=(), converter=tuple)
    handler: str | None = None
    # Any of these priority levels (0-9), and/or a range.
    priorities: Sequence[int] = attrs.field(default=(), converter=tuple)
    priority_min: int | None = None
    priority_max: int | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    finished_after: datetime | None = None
    finished_before: datetime | None = None
    # Any of these task ids (at most 1,000).
    task_ids: Sequence[str] = attrs.field(default=(), converter=tuple)

    def to_json(self) -> dict[str, Any]:
        """The ``filter`` object of a bulk request (fields not given left out)."""
        body: dict[str, Any] = {}
        for name, value in (
            ("queue_id", self.queue_id),
            ("state", list(self.states)),
            ("handler", self.handler),
            ("priority", list(self.priorities)),
            ("priority_min", self.priority_min),
            ("priority_max", self.priority_max),
            ("created_after", self.created_after),
            ("created_before", self.created_before),
            ("finished_after", self.finished_after),
            ("finished_before", self.finished_before),
            ("task_ids", list(self.task_ids)),
        ):
            if value is None or value == []:
                continue
            body[name] = _utc(value) if isinstance(value, datetime) else value
        return body

    def to_params(self) -> dict[str, Any]:
        """Query parameters of ``GET /v1/tasks`` (lists as comma-separated text)."""
        return {
            name: ",".join(str(v) for v in value) if isinstance(value, list) else value
            for name, value in self.to_json().items()
        }


@attrs.frozen(kw_only=True)
class BulkItem:
    """What one call of a bulk action did to one task."""

    task_id: str
    # cancelled, cancel_requested, retried, unchanged or refused.
    outcome: str
    # The task's state after the call (a retried task keeps its own terminal state).
    state: str
    # Retry: the task that retries it (new, or the one of an earlier retry).
    retry_task_id: str | None = None
    # Refused: the error the single route would raise (``FailedPreconditionError``).
    error: Any = None


@attrs.frozen(kw_only=True)
class BulkResult:
    """One call of ``bulk_cancel`` / ``bulk_retry``: counts, one item per task it took, and
    the cursor of the next call (None once no more tasks match)."""

    changed: int
    unchanged: int
    refused: int
    items: list[BulkItem]
    next_cursor: str | None
