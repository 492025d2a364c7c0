"""Set-up and invariant checks the fault scenarios share (all read the real database)."""

from __future__ import annotations

import itertools
from typing import Any

from orbit_node.db import Database
from orbit_node.store.tenancy import TenancyStore

from . import seed
from .helpers import wait_until
from .nodeutil import ALL_SCOPES

TERMINAL = ("succeeded", "failed", "cancelled", "expired")


async def tenant_with_token(db: Database, application: str = "app", **kwargs: Any) -> tuple[seed.Tenant, str]:
    owner = await seed.tenant(db, application=application, **kwargs)
    _, token = await TenancyStore(db).create_credential(owner.namespace_id, "fault", ALL_SCOPES)
    return owner, token


async def rows(db: Database, sql: str, *params: Any) -> list[dict[str, Any]]:
    return await db.run(lambda tx: tx.fetchall_raw(sql, params or None))


async def assert_attempt_history(db: Database, task_id: str) -> list[dict[str, Any]]:
    """The attempt history of a task shows one owner at a time.

    Attempts are numbered in order; every attempt but the current one is closed; each
    closed before the next was reserved; at most one attempt finished the task; and a
    terminal task's current attempt (if any) is closed too.
    """
    task = await seed.task_row(db, task_id)
    attempts = await seed.attempt_rows(db, task_id)
    open_attempts = [a for a in attempts if a["outcome"] is None]
    assert len(open_attempts) <= 1, attempts
    if open_attempts:
        assert task["state"] in ("reserved", "running"), (task["state"], attempts)
        assert open_attempts[0]["fencing_token"] == task["fencing_token"], attempts
    for earlier, later in itertools.pairwise(attempts):
        assert earlier["outcome"] is not None, attempts
        assert earlier["finished_at"] <= later["reserved_at"], (earlier, later)
    finishing = [a for a in attempts if a["outcome"] in TERMINAL]
    assert len(finishing) <= 1, attempts
    if task["state"] == "succeeded":
        assert [a["outcome"] for a in finishing] == ["succeeded"], attempts
    return attempts


async def wait_for_state(db: Database, task_id: str, *states: str, timeout_s: float = 10) -> dict[str, Any]:
    """Poll the task row until it is in one of ``states`` (a real process must act first)."""

    async def reached() -> dict[str, Any] | None:
        row = await seed.task_row(db, task_id)
        return row if row["state"] in states else None

    return await wait_until(reached, timeout_s=timeout_s)
