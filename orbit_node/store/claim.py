"""The claim transaction: reserve due tasks for one Worker connection.

It first reads candidates without locking, in dispatch order, then locks exactly the
rows it will take by primary key with ``SKIP LOCKED``: it never locks a task it does not
reserve or settle (a ``SKIP LOCKED`` scan would keep locks on every row it read and
filtered out, hiding them from Workers that could run them). Application and queue
quotas are read from their locked rows and enforced by ``orbit_node.domain.quota``.

A resource key admits up to its queue's ``max_running_per_key`` reserved or running
tasks: the claim locks the key's row with ``SKIP LOCKED`` (its mutex), counts the live
holders under that lock and takes what is left (docs/dispatch.md, "Resource keys").
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

import attrs

from orbit_protocol.limits import MAX_PRIORITY

from ..db import Database, Tx
from ..domain.claims import ClaimRequest
from ..domain.ids import is_hex32
from ..domain.ownership import LIVE_STATES, At, Reservation
from ..domain.quota import Budget, epoch_second, quota_budget, window_after
from .task_rows import PRIORITY_STEP_S
from .transitions import ATTEMPTS_ERROR, CANCELLED_ERROR, DEADLINE_ERROR, Writes

# A claim re-reads candidates of a queue at most this often when rows it picked were
# locked by another transaction (a concurrent claim, an operator's query, a cancel) or
# settled meanwhile: enough to fill a batch under contention, while the transaction
# stays short. Each round takes the next free candidates in dispatch order, after the
# ones already tried, so a claim takes exactly the first free eligible rows in order
# (docs/dispatch.md, "Order under contention").
MAX_CLAIM_ROUNDS = 4
# Every priority level a task can have (rules.MAX_PRIORITY).
PRIORITY_LEVELS = tuple(range(MAX_PRIORITY + 1))
# The flags of a locked row's ``marks`` (claim_lock_tasks): its deadline has passed; it has
# a trace context; it has parents (000027). What the last two mark is read with the claim's
# COMMIT (claim_extras).
PAST_DEADLINE = 1
TRACED = 2
HAS_PARENTS = 4
# What claim_extras names in place of an empty list (no task id is this).
NO_TASK = ("-",)


async def run_claim(
    db: Database, req: ClaimRequest, *, limit: int, reservation_lease_s: float, at: At
) -> list[Reservation]:
    """Reserve up to ``limit`` due tasks in one short transaction."""
    queue_ids = tuple(dict.fromkeys(q for q in req.queue_ids if is_hex32(q)))
    capabilities = tuple(sorted(c.as_tuple() for c in req.capabilities))
    if limit <= 0 or not queue_ids or not capabilities:
        return []

    async def body(tx: Tx) -> list[Reservation]:
        return await _Claim(tx, req, queue_ids, capabilities, limit, reservation_lease_s, at).run()

    return await db.transaction(body)


@attrs.define(eq=False)
class _Claim:
    """One run of a claim transaction body (rebuilt from scratch on every replay)."""

    tx: Tx
    req: ClaimRequest
    queue_ids: tuple[str, ...]
    capabilities: tuple[tuple[str, str, str], ...]
    limit: int
    reservation_lease_s: float
    at: At
    # Candidates already considered in this transaction (locked, skipped or blocked by a key).
    tried: set[str] = attrs.field(factory=set)
    # Resource keys whose row this claim holds locked: their live holders (those this
    # claim took included) and whether the first holder's place is free.
    key_holders: dict[str, int] = attrs.field(factory=dict)
    first_free: dict[str, bool] = attrs.field(factory=dict)
    # Resource keys seen without an occupancy row.
    keys_missing: set[str] = attrs.field(factory=set)
    writes: Writes = attrs.field(factory=Writes)

    @property
    def branches(self) -> tuple[Mapping[str, Any], ...]:
        """One candidate range per (capability, keyed, priority level)."""
        return claim_branches(self.capabilities, self.req.resource_key_support)

    async def run(self) -> list[Reservation]:
        tx, req = self.tx, self.req
        # The gates and the first queue's candidates in one round trip. The candidates are
        # used when nothing the gates say would have changed their read: the first queue is
        # open and no quota lock comes before it (a quota's lock orders claims of its
        # application or queue, and their candidates are read under it).
        first = self.queue_ids[0]
        early: list[dict[str, Any]] | None
        gates, early = await tx.fetchall_each(
            tx.statement(
                "claim_gates",
                {"namespace_id": req.namespace_id, "application_id": req.application_id, "queue_ids": self.queue_ids},
            ),
            self._candidates(first, self.limit),
        )
        if not gates or gates[0]["app_suspended"]:
            return []
        order = {queue_id: index for index, queue_id in enumerate(self.queue_ids)}
        queues = sorted((g for g in gates if not g["paused"]), key=lambda g: order[g["queue_id"]])
        if not queues:
            return []
        app_budget = await self._application_budget(gates[0])
        if app_budget is not None and app_budget.remaining == 0:
            return []
        queue_budgets = await self._queue_budgets(queues)
        if app_budget is not None or queues[0]["queue_id"] != first or first in queue_budgets:
            early = None

        limit = self.limit if app_budget is None else min(self.limit, app_budget.remaining)
        taken: list[Mapping[str, Any]] = []
        per_queue: dict[str, int] = {}
        for gate in queues:
            queue_id = gate["queue_id"]
            want = limit - len(taken)
            if want <= 0:
                break
            budget = queue_budgets.get(queue_id)
            if budget is not None:
                want = min(want, budget.remaining)
            if want <= 0:
                continue
            rows = await self._claim_queue(
                queue_id, want, running_per_key(gate["max_running_per_key"]), early if queue_id == first else None
            )
            taken.extend(rows)
            per_queue[queue_id] = len(rows)
        await self.writes.apply(tx)
        if not taken:
            return []
        reservations, reserved_at = await self._reserve(taken)
        # Start-rate windows count in the second the reservations carry (reserved_at).
        reserved_s = epoch_second(reserved_at)
        if app_budget is not None and app_budget.window_s is not None:
            window_s, count = window_after(app_budget, len(taken), reserved_s)
            tx.defer(
                "claim_application_window",
                {"application_id": req.application_id, "window_s": window_s, "window_count": count},
            )
        for queue_id, count in per_queue.items():
            budget = queue_budgets.get(queue_id)
            if count and budget is not None and budget.window_s is not None:
                window_s, total = window_after(budget, count, reserved_s)
                tx.defer("claim_queue_window", {"queue_id": queue_id, "window_s": window_s, "window_count": total})
        await self.at("claim.reserved", [r.task_id for r in reservations])
        traced = tuple(r["task_id"] for r in taken if r["marks"] & TRACED)
        children = tuple(r["task_id"] for r in taken if r["marks"] & HAS_PARENTS)
        if traced or children:
            return await self._with_extras(reservations, traced, children)
        return reservations

    async def _with_extras(
        self, reservations: list[Reservation], traced: tuple[str, ...], children: tuple[str, ...]
    ) -> list[Reservation]:
        """The reservations with the trace contexts and the parents of the tasks that have
        them, read in the packet that commits the claim (a claim of tasks with neither never
        reads them)."""
        params = {"traced": traced or NO_TASK, "children": children or NO_TASK}
        rows = await self.tx.commit_reading(self.tx.statement("claim_extras", params))
        contexts: dict[str, str] = {}
        parents: dict[str, list[str]] = {}
        for row in rows:
            if row["kind"] == "trace":
                contexts[row["task_id"]] = row["value"]
            else:
                parents.setdefault(row["task_id"], []).append(row["value"])
        return [
            attrs.evolve(r, trace_context=contexts.get(r.task_id), parents=tuple(sorted(parents.get(r.task_id, ()))))
            if r.task_id in contexts or r.task_id in parents
            else r
            for r in reservations
        ]

    async def _application_budget(self, gate: Mapping[str, Any]) -> Budget | None:
        if gate["app_max_concurrent"] is None and gate["app_max_starts"] is None:
            return None
        app = await self.tx.fetchone("claim_lock_application", {"application_id": self.req.application_id})
        if app is None or app["suspended"]:
            return Budget(0)
        live = 0
        if app["max_concurrent_executions"] is not None:
            row = await self.tx.fetchrow("claim_count_application_live", {"application_id": self.req.application_id})
            live = row["live"]
        return quota_budget(
            max_concurrent=app["max_concurrent_executions"],
            live=live,
            max_per_second=app["max_starts_per_second"],
            window_s=app["start_window_s"],
            window_count=app["start_window_count"],
            now_s=app["now_s"],
        )

    async def _queue_budgets(self, queues: Sequence[Mapping[str, Any]]) -> dict[str, Budget]:
        controlled = sorted(
            g["queue_id"] for g in queues if g["max_concurrency"] is not None or g["max_starts_per_second"] is not None
        )
        budgets: dict[str, Budget] = {}
        if not controlled:
            return budgets
        for row in await self.tx.fetchall("claim_lock_queues", {"queue_ids": tuple(controlled)}):
            queue_id = row["queue_id"]
            if row["paused"]:
                budgets[queue_id] = Budget(0)
                continue
            live = 0
            if row["max_concurrency"] is not None:
                live = (await self.tx.fetchrow("claim_count_queue_live", {"queue_id": queue_id}))["live"]
            budgets[queue_id] = quota_budget(
                max_concurrent=row["max_concurrency"],
                live=live,
                max_per_second=row["max_starts_per_second"],
                window_s=row["start_window_s"],
                window_count=row["start_window_count"],
                now_s=row["now_s"],
            )
        return budgets

    def _candidates(self, queue_id: str, limit: int) -> str:
        """The read of a queue's first ``limit`` candidates in dispatch order (no locks)."""
        return self.tx.union_statement(
            "claim_candidates_branch", "claim_candidates_order", self.branches, {"queue_id": queue_id, "limit": limit}
        )

    async def _claim_queue(
        self, queue_id: str, want: int, limit_per_key: int, early: list[dict[str, Any]] | None = None
    ) -> list[Mapping[str, Any]]:
        """Lock and keep up to ``want`` due tasks of one queue, in dispatch order, at most
        ``limit_per_key`` holding one resource key (``early``: its first ``want``
        candidates, read already)."""
        taken: list[Mapping[str, Any]] = []
        for _ in range(MAX_CLAIM_ROUNDS):
            need = want - len(taken)
            if need <= 0:
                break
            # The candidates already tried come first in order: read past them.
            read_limit = need + len(self.tried)
            if early is not None and read_limit == want:
                candidates, early = early, None
            else:
                [candidates] = await self.tx.fetchall_each(self._candidates(queue_id, read_limit))
            fresh = [c for c in candidates if c["task_id"] not in self.tried]
            picked = await self._pick(fresh, need, limit_per_key)
            if picked:
                rows = await self.tx.fetchall("claim_lock_tasks", {"task_ids": tuple(c["task_id"] for c in picked)})
                # The lock statement returns rows in primary-key order; keep dispatch order.
                by_id = {r["task_id"]: r for r in rows}
                locked = [by_id[c["task_id"]] for c in candidates if c["task_id"] in by_id]
                await self.at("claim.locked", [r["task_id"] for r in locked])
                taken.extend(await self._take_keys(self._settle_unrunnable(locked), limit_per_key))
            if len(candidates) < read_limit:
                break  # the queue has no further candidates
        return taken

    async def _pick(
        self, candidates: Sequence[Mapping[str, Any]], need: int, limit_per_key: int
    ) -> list[Mapping[str, Any]]:
        """The next ``need`` candidates worth locking: not blocked by a resource key that
        already has ``limit_per_key`` live holders (as committed, or as this claim holds it)."""
        keys = {c["resource_key"] for c in candidates if c["resource_key"] is not None} - set(self.key_holders)
        live: dict[str, int] = {}
        if keys:
            # An estimate to pick by (the count under the key's lock decides). With one
            # holder a key, the first holder is read alone: further holders exist only
            # where another queue of the key admits more or the limit was lowered.
            statement = "claim_key_state" if limit_per_key == 1 else "claim_key_occupancy"
            rows = await self.tx.fetchall(
                statement, {"namespace_id": self.req.namespace_id, "keys": tuple(sorted(keys))}
            )
            live = {r["resource_key"]: key_holders(r) for r in rows}
            self.keys_missing |= keys - set(live)
        picked: list[Mapping[str, Any]] = []
        picked_of_key: dict[str, int] = {}
        for candidate in candidates:
            if len(picked) >= need:
                break
            self.tried.add(candidate["task_id"])
            key = candidate["resource_key"]
            if key is not None:
                before = picked_of_key.get(key, 0)
                if self.key_holders.get(key, live.get(key, 0)) + before >= limit_per_key:
                    continue
                picked_of_key[key] = before + 1
            picked.append(candidate)
        return picked

    def _settle_unrunnable(self, locked: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """Settle locked candidates that can never run; they do not count toward the batch."""
        runnable = []
        for row in locked:
            # A queued task holds no resource key and no open attempt: settling it is its
            # terminal state alone.
            if row["marks"] & PAST_DEADLINE:
                self.writes.terminate(row["task_id"], "expired", error=DEADLINE_ERROR)
            elif row["cancel_requested"]:
                self.writes.terminate(row["task_id"], "cancelled", error=CANCELLED_ERROR)
            elif row["attempts"] >= row["max_attempts"]:
                self.writes.terminate(row["task_id"], "failed", error=ATTEMPTS_ERROR)
            else:
                runnable.append(row)
        return runnable

    async def _take_keys(self, rows: list[Mapping[str, Any]], limit_per_key: int) -> list[Mapping[str, Any]]:
        """Occupy the resource key of each keyed row while the key has fewer than
        ``limit_per_key`` live holders; the other keyed rows are dropped.

        A key's row is locked with ``SKIP LOCKED`` (a key another transaction holds is not
        ours this time) and its live holders are counted under that lock: only a claim
        holding the row adds a holder, so no other claim can add one before this one
        commits. The first holder goes in the row itself, further ones in
        ``resource_key_holders``."""
        ns = self.req.namespace_id
        keys = sorted({r["resource_key"] for r in rows if r["resource_key"] is not None} - set(self.key_holders))
        if keys:
            # The count is a statement of its own, run once every row is locked: its
            # snapshot then sees every holder added before (a claim that held a row
            # committed before this one locked it).
            params = {"namespace_id": ns, "keys": tuple(keys)}
            locked, counted = await self.tx.fetchall_each(
                self.tx.statement("claim_lock_keys", params), self.tx.statement("claim_key_occupancy", params)
            )
            mine = {r["resource_key"] for r in locked}
            for r in counted:
                if r["resource_key"] in mine:
                    self.key_holders[r["resource_key"]] = key_holders(r)
                    self.first_free[r["resource_key"]] = key_free(r)
        kept = []
        for row in rows:
            key = row["resource_key"]
            if key is None:
                kept.append(row)
                continue
            params = {"namespace_id": ns, "resource_key": key, "task_id": row["task_id"]}
            if key in self.key_holders:
                if self.key_holders[key] >= limit_per_key:
                    continue
                if self.first_free[key]:
                    await self.tx.execute("claim_hold_key", params)
                    self.first_free[key] = False
                else:
                    self.tx.defer("claim_add_holder", params)
                self.key_holders[key] += 1
            elif key in self.keys_missing and await self.tx.execute("claim_insert_key", params) == 1:
                # The row this statement created holds the task and is locked by this claim.
                self.key_holders[key], self.first_free[key] = 1, False
            else:
                # Locked by another transaction, or created concurrently: not ours this time.
                continue
            kept.append(row)
        return kept

    async def _reserve(self, rows: Sequence[Mapping[str, Any]]) -> tuple[list[Reservation], datetime]:
        # The latest lock statement's NOW(6): every reservation of the claim carries it.
        now = max(r["now"] for r in rows)
        lease = now + timedelta(seconds=self.reservation_lease_s)
        tokens = {r["task_id"]: f"{r['attempts'] + 1}-{secrets.token_hex(8)}" for r in rows}
        task_ids = tuple(tokens)
        # Neither answer is read: both go with the commit. The rows are locked by this
        # transaction, so the reservation changes every one of them (``rows`` checks it; a
        # claim that breaks it hands out nothing, and what it reserved expires).
        self.tx.defer_per_row(
            "claim_reserve",
            {task_id: {"fencing_token": token} for task_id, token in tokens.items()},
            {
                "node_id": self.req.node_id,
                "connection_id": self.req.connection_id,
                "now": now,
                "lease_expires_at": lease,
            },
            changed=len(rows),
        )
        self.tx.defer("claim_insert_attempts", {"task_ids": task_ids}, rows=len(rows))
        reservations = [
            Reservation(
                task_id=r["task_id"],
                queue_id=r["queue_id"],
                namespace_id=self.req.namespace_id,
                application_id=self.req.application_id,
                handler=r["handler"],
                handler_version=r["handler_version"],
                payload_version=r["payload_version"],
                payload_json=r["payload"],
                priority=r["priority"],
                attempt=r["attempts"] + 1,
                max_attempts=r["max_attempts"],
                fencing_token=tokens[r["task_id"]],
                lease_expires_at=lease,
                deadline=r["deadline"],
                resource_key=r["resource_key"],
                available_at=r["available_at"],
                deadline_in_s=None if r["deadline"] is None else (r["deadline"] - now).total_seconds(),
            )
            for r in rows
        ]
        return reservations, now


@functools.lru_cache(maxsize=256)
def claim_branches(
    capabilities: tuple[tuple[str, str, str], ...], resource_key_support: bool
) -> tuple[Mapping[str, Any], ...]:
    """The candidate ranges of a connection's claims: one per (capability, keyed, priority
    level). The same every claim of the connection, so made once (read-only mappings)."""
    keyed = (0, 1) if resource_key_support else (0,)
    return tuple(
        MappingProxyType(
            {
                "handler": handler,
                "handler_version": handler_version,
                "payload_version": payload_version,
                "keyed": k,
                "priority": priority,
                "window_s": priority * PRIORITY_STEP_S,
            }
        )
        for handler, handler_version, payload_version in capabilities
        for k in keyed
        for priority in PRIORITY_LEVELS
    )


def key_free(row: Mapping[str, Any]) -> bool:
    """A resource key's first holder's place is free without a holder, or when its holder
    no longer holds it (a repair: every transition releases the key in the same
    transaction)."""
    return row["holder_task_id"] is None or row["holder_state"] not in LIVE_STATES


def key_holders(row: Mapping[str, Any]) -> int:
    """The live holders of a key, of a ``claim_key_occupancy`` row (or of a
    ``claim_key_state`` row, which does not count further holders)."""
    return (0 if key_free(row) else 1) + int(row.get("further_live") or 0)


def running_per_key(value: Any) -> int:
    """How many reserved or running tasks of one resource key a queue admits, of its
    ``max_running_per_key`` column (the writers keep it from 1 to 1,000)."""
    return max(1, int(value))
