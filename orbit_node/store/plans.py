"""Plans: immutable versions, activation, pause/resume, and the trigger's fire transaction.

Every writer of a plan (new version, activate, pause, resume) locks the plan row first,
and computes ``next_fire_at`` from the ``NOW(6)`` the locking statement returned. The
trigger (any number of nodes at once) locks one due plan at a time with ``FOR UPDATE SKIP
LOCKED``, creates the tasks of its due fire times, advances ``next_fire_at`` and commits:
a plan is advanced by one transaction at a time, and a node never waits for another.
Each task gets a fire record (``idempotency_records`` kind ``plan``, key
``{plan_id}:{version}:{fire time}``) in the same transaction, so a fire time never
creates a second task, whatever rewinds ``next_fire_at``. Once retention has deleted a
fire time's task, and its fire record with it, ``last_fire_at`` still holds: the trigger
never creates a fire time at or before the plan's last one.
"""

from __future__ import annotations

import builtins
import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import attrs

from ..db import Database, Tx
from ..domain.errors import AlreadyExists, DatabaseError, InvalidArgument, NotFound
from ..domain.ids import is_hex32, random_id, time_ordered_id
from ..domain.plans.definition import Definition, parse_stored
from ..domain.plans.schedule import due_fire_times
from ..domain.wire import rfc3339
from .task_rows import ER_DUP_ENTRY, LIST_START, TaskPage, TaskSummary, insert_tasks, task_row

log = logging.getLogger("orbit.plans")

# idempotency_records.kind of plan fire records (client keys use "request").
KIND_PLAN = "plan"


def fire_key(plan_id: str, version: int, fire_at: datetime) -> str:
    """The fire record key of one fire time of one version (ASCII, at most 72 characters)."""
    return f"{plan_id}:{version}:{rfc3339(fire_at)}"


@attrs.frozen(kw_only=True)
class Plan:
    plan_id: str
    namespace_id: str
    application_id: str
    queue_id: str
    name: str
    paused: bool = attrs.field(converter=bool)
    active_version: int | None
    next_fire_at: datetime | None
    last_fire_at: datetime | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Plan:
        return cls(**{f.name: row[f.name] for f in attrs.fields(cls)})


@attrs.frozen(kw_only=True)
class PlanVersion:
    plan_id: str
    version: int
    # The definition as stored: canonical JSON text of what the client sent.
    definition_json: str
    created_at: datetime

    @property
    def definition(self) -> Any:
        return json.loads(self.definition_json)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> PlanVersion:
        return cls(
            plan_id=row["plan_id"],
            version=row["version"],
            definition_json=row["definition"],
            created_at=row["created_at"],
        )


@attrs.frozen(kw_only=True)
class PlanTask(TaskSummary):
    """A task a plan created, with the version that created it."""

    plan_version: int


@attrs.frozen(kw_only=True)
class FireResult:
    """What one fire transaction did for one plan."""

    plan_id: str
    # False: another node (or a writer) held the plan, or it was no longer due.
    locked: bool
    created: int = 0
    # Fire times that already had a task (a fire record existed).
    duplicates: int = 0
    # Missed fire times were passed over (catch-up).
    skipped_missed: bool = False
    # The batch limit cut this transaction short: the plan is still due.
    still_due: bool = False
    # The active version could not be read; the plan stopped firing (next_fire_at NULL).
    stopped: str | None = None
    # The plan's queue (set once the plan was locked): where the created tasks wait.
    queue_id: str | None = None


@attrs.define(eq=False)
class PlanStore:
    db: Database

    # -- reads -----------------------------------------------------------------------

    async def get(self, namespace_id: str, plan_id: str) -> Plan:
        row = None
        if is_hex32(plan_id):
            row = await self.db.fetchone("plan_get", {"namespace_id": namespace_id, "plan_id": plan_id})
        if row is None:
            raise NotFound(f"plan_id: plan {plan_id} not found", field="plan_id")
        return Plan.from_row(row)

    async def list(
        self,
        namespace_id: str,
        *,
        queue_ids: Sequence[str] | None = None,
        queue_id: str | None = None,
        after: str = "",
        limit: int = 100,
    ) -> list[Plan]:
        """Plans in id order after ``after``; ``queue_ids`` None means every queue of the namespace."""
        if queue_ids is not None and not queue_ids:
            return []
        rows = await self.db.fetchall(
            "plan_list",
            {
                "namespace_id": namespace_id,
                "after": after,
                "queue_id": queue_id,
                "all_queues": queue_ids is None,
                # IN () is not valid SQL; the flag above makes this list irrelevant.
                "queue_ids": tuple(queue_ids) if queue_ids is not None else ("",),
                "limit": limit,
            },
        )
        return [Plan.from_row(r) for r in rows]

    async def get_version(self, namespace_id: str, plan_id: str, version: int) -> PlanVersion:
        await self.get(namespace_id, plan_id)
        row = await self.db.fetchone("plan_version_get", {"plan_id": plan_id, "version": version})
        if row is None:
            raise NotFound(f"version: plan {plan_id} has no version {version}", field="version")
        return PlanVersion.from_row(row)

    async def list_versions(
        self, namespace_id: str, plan_id: str, *, after: int = 0, limit: int = 100
    ) -> builtins.list[PlanVersion]:
        await self.get(namespace_id, plan_id)
        rows = await self.db.fetchall("plan_version_list", {"plan_id": plan_id, "after": after, "limit": limit})
        return [PlanVersion.from_row(r) for r in rows]

    async def list_tasks(
        self, namespace_id: str, plan_id: str, *, state: str | None = None, before: str | None = None, limit: int = 100
    ) -> TaskPage[PlanTask]:
        """The tasks the plan created, newest first."""
        await self.get(namespace_id, plan_id)
        rows = await self.db.fetchall(
            "plan_task_list",
            {
                "namespace_id": namespace_id,
                "plan_id": plan_id,
                "before": before or LIST_START,
                "state": state,
                "limit": limit + 1,
            },
        )
        tasks: list[PlanTask] = [PlanTask.from_row(r) for r in rows[:limit]]
        return TaskPage(tasks, tasks[-1].task_id if len(rows) > limit else None)

    # -- writes ----------------------------------------------------------------------

    async def create(self, namespace_id: str, queue_id: str, name: str, definition: Definition | None = None) -> Plan:
        """A plan in a queue of the namespace; with ``definition``, version 1 is created and activated."""
        plan_id = random_id()

        async def body(tx: Tx) -> dict[str, Any]:
            queue = await tx.fetchone("task_submit_queue", {"namespace_id": namespace_id, "queue_id": queue_id})
            if queue is None:
                raise NotFound(f"queue_id: queue {queue_id} not found", field="queue_id")
            if await tx.fetchone("plan_by_name", {"namespace_id": namespace_id, "name": name}) is not None:
                raise _name_taken(name)
            await tx.execute(
                "plan_insert",
                {
                    "plan_id": plan_id,
                    "namespace_id": namespace_id,
                    "application_id": queue["application_id"],
                    "queue_id": queue_id,
                    "name": name,
                },
            )
            if definition is not None:
                locked = await self._lock(tx, namespace_id, plan_id)
                await self._insert_version(tx, plan_id, 1, definition)
                await self._set_state(tx, locked, paused=False, active_version=1, definition=definition)
            return await tx.fetchrow("plan_get", {"namespace_id": namespace_id, "plan_id": plan_id})

        try:
            row = await self.db.transaction(body)
        except DatabaseError as exc:
            if exc.errno == ER_DUP_ENTRY:  # a concurrent create of the same name committed first
                raise _name_taken(name) from None
            raise
        return Plan.from_row(row)

    async def add_version(self, namespace_id: str, plan_id: str, definition: Definition) -> PlanVersion:
        """The next version (1, 2, ...); it changes nothing until it is activated."""

        async def body(tx: Tx) -> dict[str, Any]:
            await self._lock(tx, namespace_id, plan_id)
            latest = await tx.fetchrow("plan_version_max", {"plan_id": plan_id})
            version = int(latest["version"]) + 1
            await self._insert_version(tx, plan_id, version, definition)
            return await tx.fetchrow("plan_version_get", {"plan_id": plan_id, "version": version})

        return PlanVersion.from_row(await self.db.transaction(body))

    async def activate(self, namespace_id: str, plan_id: str, version: int) -> Plan:
        """Make ``version`` the active one and recompute ``next_fire_at`` from the database clock.

        The first fire time of the new version at or after NOW(6) becomes next; due fire
        times of the previous version that were not triggered yet are dropped. Activating
        the version that is already active changes nothing. A paused plan keeps no
        next fire time; resuming computes it.
        """

        async def body(tx: Tx) -> dict[str, Any]:
            locked = await self._lock(tx, namespace_id, plan_id)
            row = await tx.fetchone("plan_version_get", {"plan_id": plan_id, "version": version})
            if row is None:
                raise NotFound(f"version: plan {plan_id} has no version {version}", field="version")
            if locked["active_version"] != version:
                await self._set_state(
                    tx, locked, paused=bool(locked["paused"]), active_version=version, definition=_stored(row)
                )
            return await tx.fetchrow("plan_get", {"namespace_id": namespace_id, "plan_id": plan_id})

        return Plan.from_row(await self.db.transaction(body))

    async def set_paused(self, namespace_id: str, plan_id: str, paused: bool) -> Plan:
        """Pause (no fire times, next_fire_at cleared) or resume (next fire time at or after NOW(6)).

        Fire times that passed while the plan was paused are not created: a pause is not an
        outage. Pausing a paused plan, or resuming a running one, changes nothing.
        """

        async def body(tx: Tx) -> dict[str, Any]:
            locked = await self._lock(tx, namespace_id, plan_id)
            if bool(locked["paused"]) != paused:
                definition = None
                if not paused and locked["active_version"] is not None:
                    row = await tx.fetchrow(
                        "plan_version_get", {"plan_id": plan_id, "version": locked["active_version"]}
                    )
                    definition = _stored(row)
                await self._set_state(
                    tx, locked, paused=paused, active_version=locked["active_version"], definition=definition
                )
            return await tx.fetchrow("plan_get", {"namespace_id": namespace_id, "plan_id": plan_id})

        return Plan.from_row(await self.db.transaction(body))

    async def _lock(self, tx: Tx, namespace_id: str, plan_id: str) -> dict[str, Any]:
        row = None
        if is_hex32(plan_id):
            row = await tx.fetchone("plan_lock", {"namespace_id": namespace_id, "plan_id": plan_id})
        if row is None:
            raise NotFound(f"plan_id: plan {plan_id} not found", field="plan_id")
        return row

    async def _insert_version(self, tx: Tx, plan_id: str, version: int, definition: Definition) -> None:
        await tx.execute(
            "plan_version_insert", {"plan_id": plan_id, "version": version, "definition": definition.text()}
        )

    async def _set_state(
        self,
        tx: Tx,
        locked: Mapping[str, Any],
        *,
        paused: bool,
        active_version: int | None,
        definition: Definition | None,
    ) -> None:
        """Write paused/active_version and the next fire time at or after the locked NOW(6)."""
        next_fire_at = None
        if not paused and definition is not None:
            next_fire_at = definition.schedule.first_at_or_after(locked["db_now"])
        await tx.execute(
            "plan_set_schedule_state",
            {
                "plan_id": locked["plan_id"],
                "paused": int(paused),
                "active_version": active_version,
                "next_fire_at": next_fire_at,
            },
        )

    # -- the trigger -----------------------------------------------------------------

    async def due(self, limit: int) -> builtins.list[str]:
        """Ids of plans due on the database clock, oldest fire time first (no locks)."""
        return [r["plan_id"] for r in await self.db.fetchall("plan_due", {"limit": limit})]

    async def fire(self, plan_id: str, *, limit: int) -> FireResult:
        """One transaction: lock the plan if it is due and free, create the tasks of at most
        ``limit`` due fire times (catch-up policy applied), advance ``next_fire_at``, commit.
        """

        async def body(tx: Tx) -> FireResult:
            row = await tx.fetchone("plan_lock_due", {"plan_id": plan_id})
            if row is None:
                return FireResult(plan_id=plan_id, locked=False)
            version = row["active_version"]
            try:
                stored = None
                if version is not None:
                    stored = await tx.fetchone("plan_version_get", {"plan_id": plan_id, "version": version})
                if stored is None:
                    raise InvalidArgument(f"active_version: version {version} does not exist", field="active_version")
                definition = parse_stored(stored["definition"])
            except (InvalidArgument, ValueError) as exc:
                # Stop the plan rather than retry it every pass; activating a version restarts it.
                await tx.execute(
                    "plan_advance", {"plan_id": plan_id, "next_fire_at": None, "last_fire_at": row["last_fire_at"]}
                )
                return FireResult(plan_id=plan_id, locked=True, stopped=str(exc), queue_id=row["queue_id"])
            firing = due_fire_times(definition.schedule, row["next_fire_at"], row["db_now"], limit=limit)
            created = 0
            for fire_at in firing.fire_times:
                if row["last_fire_at"] is not None and fire_at <= row["last_fire_at"]:
                    # Fired before: its fire record may be gone with its task (retention),
                    # so the plan's own last fire time is what keeps it from firing twice.
                    continue
                new = definition.task_for(row["queue_id"], fire_at)
                task_id = time_ordered_id()
                recorded = await tx.execute(
                    "plan_fire_record_insert",
                    {
                        "namespace_id": row["namespace_id"],
                        "idempotency_key": fire_key(plan_id, version, fire_at),
                        "request_digest": new.digest(),
                        "task_id": task_id,
                    },
                )
                if recorded:
                    await insert_tasks(
                        tx,
                        row["namespace_id"],
                        [
                            task_row(
                                task_id,
                                row["application_id"],
                                row["namespace_id"],
                                new,
                                row["db_now"],
                                plan_id=plan_id,
                                plan_version=version,
                            )
                        ],
                    )
                    created += 1
            await tx.execute(
                "plan_advance",
                {
                    "plan_id": plan_id,
                    "next_fire_at": firing.next_fire_at,
                    "last_fire_at": firing.fire_times[-1] if firing.fire_times else row["last_fire_at"],
                },
            )
            return FireResult(
                plan_id=plan_id,
                locked=True,
                created=created,
                duplicates=len(firing.fire_times) - created,
                skipped_missed=firing.skipped_missed,
                still_due=firing.next_fire_at is not None and firing.next_fire_at <= row["db_now"],
                queue_id=row["queue_id"],
            )

        return await self.db.transaction(body)


def _stored(row: Mapping[str, Any]) -> Definition:
    return parse_stored(row["definition"])


def _name_taken(name: str) -> AlreadyExists:
    return AlreadyExists(f"name: a plan named {name!r} already exists in this namespace", field="name")
