"""The claim transaction: reserve due tasks for one Worker connection.

It first reads candidates without locking, in dispatch order, then locks exactly the
rows it will take by primary key with ``SKIP LOCKED``: it never locks a task it does not
reserve or settle (a ``SKIP LOCKED`` scan would keep locks on every row it read and
filtered out, hiding them from Workers that could run them). Application and queue
quotas are read from their locked rows and enforced by ``orbit_node.store.quota``.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

import attrs

from ..claims import ClaimRequest
from ..db import Database, Tx
from ..ids import is_hex32
from ..rules import MAX_PRIORITY
from .ownership import LIVE_STATES, At, Reservation
from .quota import Budget, epoch_second, quota_budget, window_after
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
# a trace context, read with the claim's COMMIT (claim_trace_contexts).
PAST_DEADLINE = 1
TRACED = 2


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
    # Resource keys this claim holds or saw missing (no occupancy row yet).
    keys_taken: set[str] = attrs.field(factory=set)
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
            rows = await self._claim_queue(queue_id, want, early if queue_id == first else None)
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
        if traced:
            return await self._with_trace_contexts(reservations, traced)
        return reservations

    async def _with_trace_contexts(self, reservations: list[Reservation], traced: tuple[str, ...]) -> list[Reservation]:
        """The reservations with the trace contexts of the tasks that have one, read in the
        packet that commits the claim (a claim of tasks without one never reads them)."""
        rows = await self.tx.commit_reading(self.tx.statement("claim_trace_contexts", {"task_ids": traced}))
        contexts = {r["task_id"]: r["trace_context"] for r in rows}
        return [
            attrs.evolve(r, trace_context=contexts[r.task_id]) if r.task_id in contexts else r for r in reservations
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
        self, queue_id: str, want: int, early: list[dict[str, Any]] | None = None
    ) -> list[Mapping[str, Any]]:
        """Lock and keep up to ``want`` due tasks of one queue, in dispatch order
        (``early``: its first ``want`` candidates, read already)."""
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
            picked = await self._pick(fresh, need)
            if picked:
                rows = await self.tx.fetchall("claim_lock_tasks", {"task_ids": tuple(c["task_id"] for c in picked)})
                # The lock statement returns rows in primary-key order; keep dispatch order.
                by_id = {r["task_id"]: r for r in rows}
                locked = [by_id[c["task_id"]] for c in candidates if c["task_id"] in by_id]
                await self.at("claim.locked", [r["task_id"] for r in locked])
                taken.extend(await self._take_keys(self._settle_unrunnable(locked)))
            if len(candidates) < read_limit:
                break  # the queue has no further candidates
        return taken

    async def _pick(self, candidates: Sequence[Mapping[str, Any]], need: int) -> list[Mapping[str, Any]]:
        """The next ``need`` candidates worth locking: not blocked by an occupied resource key."""
        keys = {c["resource_key"] for c in candidates if c["resource_key"] is not None} - self.keys_taken
        free: dict[str, bool] = {}
        if keys:
            rows = await self.tx.fetchall(
                "claim_key_state", {"namespace_id": self.req.namespace_id, "keys": tuple(sorted(keys))}
            )
            free = {r["resource_key"]: key_free(r) for r in rows}
            self.keys_missing |= keys - set(free)
        picked: list[Mapping[str, Any]] = []
        picked_keys: set[str] = set()
        for candidate in candidates:
            if len(picked) >= need:
                break
            self.tried.add(candidate["task_id"])
            key = candidate["resource_key"]
            if key is not None:
                if key in self.keys_taken or key in picked_keys or not free.get(key, True):
                    continue
                picked_keys.add(key)
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

    async def _take_keys(self, rows: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """Occupy the resource key of each keyed row; rows whose key is taken are dropped."""
        keys = sorted({r["resource_key"] for r in rows if r["resource_key"] is not None})
        if not keys:
            return rows
        ns = self.req.namespace_id
        locked = {
            r["resource_key"]: r
            for r in await self.tx.fetchall("claim_lock_keys", {"namespace_id": ns, "keys": tuple(keys)})
        }
        held = tuple(sorted(k for k, r in locked.items() if r["holder_task_id"] is not None))
        holders_free: dict[str, bool] = {}
        if held:
            for r in await self.tx.fetchall("claim_key_state", {"namespace_id": ns, "keys": held}):
                holders_free[r["resource_key"]] = key_free(r)
        kept = []
        for row in rows:
            key = row["resource_key"]
            if key is None:
                kept.append(row)
                continue
            params = {"namespace_id": ns, "resource_key": key, "task_id": row["task_id"]}
            if key in locked:
                if locked[key]["holder_task_id"] is not None and not holders_free.get(key, False):
                    continue
                await self.tx.execute("claim_hold_key", params)
            elif key not in self.keys_missing or await self.tx.execute("claim_insert_key", params) != 1:
                # Locked by another transaction, or created concurrently: not ours this time.
                continue
            self.keys_taken.add(key)
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
    """A resource key is free without a holder, or when its holder no longer holds it
    (a repair: every transition releases the key in the same transaction)."""
    return row["holder_task_id"] is None or row["holder_state"] not in LIVE_STATES
