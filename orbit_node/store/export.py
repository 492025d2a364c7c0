"""Finished tasks of one application, oldest ``finished_at`` first, a page at a time: what
``orbit-admin task export`` writes before retention deletes them.

A page is one short read transaction: the next keys of ``ix_tasks_lease`` (state,
lease_expires_at, application_id, finished_at; 000023) for each terminal state, merged in
(finished_at, task_id) order (``db/sql/export.sql``), then those tasks with their attempts
(``operations.task_documents``, as ``task show`` reads one task). The caller walks on
with the page's cursor, so a whole export holds one page at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import attrs

from ..db import Database, Tx
from ..domain.retention import CLASS_OF_STATE
from ..domain.wire import verbatim_json
from .operations import task_documents

# The terminal states: one index range each, merged into one order.
FINISHED_STATES = tuple({"state": state} for state in CLASS_OF_STATE)
# Tasks a page reads unless told otherwise: a few hundred keeps each transaction short and
# the memory of a page to a few hundred tasks.
EXPORT_PAGE_SIZE = 500
# The most tasks a page may read (a page is held in memory whole, payloads included).
EXPORT_PAGE_MAX = 5000


@attrs.frozen
class ExportCursor:
    """Where the next page starts: after this task, in (finished_at, task_id) order."""

    finished_at: datetime
    task_id: str


@attrs.frozen
class ExportPage:
    # Documents as ``task show --json`` has them; the JSON text columns are ``Verbatim``
    # (``wire.verbatim_json``) for a JSON line to hold as stored.
    tasks: list[dict[str, Any]]
    # Where the next page starts; None when this page was the last.
    next: ExportCursor | None


@attrs.define(eq=False)
class ExportStore:
    db: Database

    async def page(
        self,
        application_id: str,
        *,
        finished_before: datetime,
        finished_after: datetime | None = None,
        after: ExportCursor | None = None,
        limit: int = EXPORT_PAGE_SIZE,
    ) -> ExportPage:
        """The application's next ``limit`` finished tasks after ``after`` (from the first
        when None) whose finished_at is before ``finished_before`` and, when given, not
        before ``finished_after``."""
        if not 1 <= limit <= EXPORT_PAGE_MAX:
            raise ValueError(f"limit: must be from 1 to {EXPORT_PAGE_MAX}, got {limit}")
        params = {
            "application_id": application_id,
            "finished_before": finished_before,
            "finished_after": finished_after,
            "after_at": None if after is None else after.finished_at,
            "after_id": None if after is None else after.task_id,
            "limit": limit,
        }

        async def body(tx: Tx) -> tuple[Sequence[dict[str, Any]], list[dict[str, Any]]]:
            keys = await tx.fetchall_union("export_page_branch", "export_page_order", FINISHED_STATES, params)
            if not keys:
                return keys, []
            return keys, await task_documents(tx, [k["task_id"] for k in keys], stored=verbatim_json)

        # One snapshot: the page's keys, its tasks and their attempts agree.
        keys, tasks = await self.db.transaction(body, isolation="REPEATABLE READ")
        last = keys[-1] if len(keys) == limit else None
        return ExportPage(tasks, None if last is None else ExportCursor(last["finished_at"], last["task_id"]))
