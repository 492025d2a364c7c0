"""The audit record: who did what through the console (credential, time, action, target
or filter, how many it changed), one row per write in ``audit_records`` (000020).

The console records each action after it took effect, on the database of the
application's shard; the console's audit page and ``orbit-admin audit list`` read it.
Nothing decides anything from it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import attrs

from ..db import Database
from ..domain.errors import InvalidArgument
from ..domain.wire import rfc3339
from .tenancy import Principal

# Where a write came from (audit_records.via).
VIA_CONSOLE = "console"
# The actions recorded (audit_records.action).
TASK_CANCEL = "task.cancel"
TASK_RETRY = "task.retry"
QUEUE_PAUSE = "queue.pause"
QUEUE_RESUME = "queue.resume"
# Actions on the tasks a filter matches (Entry.filter holds it).
TASKS_BULK_CANCEL = "tasks.bulk_cancel"
TASKS_BULK_RETRY = "tasks.bulk_retry"
# Above every audit id (BIGINT UNSIGNED AUTO_INCREMENT): the "before" of a first page.
LIST_START = 2**64 - 1
# The most records one listing returns.
MAX_LIMIT = 500


@attrs.frozen(kw_only=True)
class Entry:
    """One write to record, by the principal that made it."""

    who: Principal
    action: str
    # How many tasks or queues it changed (0: there was nothing to do).
    changed: int
    # What came of it, in words ("cancelled", "cancel requested", "already paused", ...).
    outcome: str
    queue_id: str | None = None
    task_id: str | None = None
    # The filter of an action on many tasks.
    filter: Mapping[str, Any] | None = None
    via: str = VIA_CONSOLE


@attrs.frozen(kw_only=True)
class AuditRecord:
    audit_id: int
    recorded_at: datetime
    credential_id: str
    # The credential's name (None when the row is gone).
    credential_name: str | None
    via: str
    action: str
    queue_id: str | None
    queue: str | None
    task_id: str | None
    filter: dict[str, Any] | None
    changed: int
    outcome: str
    application: str | None
    namespace: str | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> AuditRecord:
        return cls(
            **{f.name: row[f.name] for f in attrs.fields(cls) if f.name not in ("filter", "changed")},
            filter=None if row["filter"] is None else json.loads(row["filter"]),
            changed=int(row["changed"]),
        )

    def as_json(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "recorded_at": rfc3339(self.recorded_at)}


@attrs.frozen
class AuditPage:
    records: list[AuditRecord]
    # The last audit id of this page when another page may follow, else None.
    last: int | None


@attrs.define(eq=False)
class AuditStore:
    db: Database

    async def record(self, entry: Entry) -> None:
        who = entry.who
        await self.db.execute(
            "audit_insert",
            {
                "application_id": who.application_id,
                "namespace_id": who.namespace_id,
                "credential_id": who.credential_id,
                "via": entry.via,
                "action": entry.action,
                "queue_id": entry.queue_id,
                "task_id": entry.task_id,
                "filter": None if entry.filter is None else json.dumps(dict(entry.filter), sort_keys=True),
                "changed": entry.changed,
                "outcome": entry.outcome,
            },
        )

    async def list(
        self,
        *,
        namespace_id: str | None = None,
        application_id: str | None = None,
        credential_id: str | None = None,
        queue_ids: Sequence[str] | None = None,
        before: int | None = None,
        limit: int = 50,
    ) -> AuditPage:
        """Records newest first, before the audit id ``before``. ``queue_ids`` None: records
        of every queue and of none; else only records of those queues."""
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidArgument(f"limit: expected 1 to {MAX_LIMIT}", field="limit")
        if queue_ids is not None and not queue_ids:
            return AuditPage([], None)
        rows = await self.db.fetchall(
            "audit_list",
            {
                "namespace_id": namespace_id,
                "application_id": application_id,
                "credential_id": credential_id,
                "before": LIST_START if before is None else before,
                "all_queues": queue_ids is None,
                # IN () is not valid SQL; the flag above makes this list irrelevant.
                "queue_ids": tuple(queue_ids) if queue_ids is not None else ("",),
                "limit": limit + 1,
            },
        )
        records = [AuditRecord.from_row(r) for r in rows[:limit]]
        return AuditPage(records, records[-1].audit_id if len(rows) > limit else None)
