"""The lease store: who holds a task, from its claim to Finish, release or recovery.

A claim hands out reservation leases with fencing tokens; Start turns one into a run
lease, renew extends it, Finish (with retries and backoff) and release end it, and the
recovery sweep takes back the expired ones. MySQL transactions decide who may run what; ``LeaseStore`` is the one repository
that runs their SQL (``db/sql/leases.sql``). See ``docs/dispatch.md`` for the design.
Each transaction lives in its own module: the claim in ``claim``, Start/renew/Finish/
release and the recovery sweep in ``transitions``, the explanation in ``explain``; the
values they share are in ``ownership``, the pure quota and backoff rules in ``quota``
and ``backoff``.

* Every time that decides ownership comes from the database clock (``NOW(6)``); a
  node's clock is never consulted, so nodes with skewed clocks stay correct.
* Every transition after the claim is a compare-and-set on (task, fencing token, state,
  lease still valid on the database clock). Losing it is a typed outcome
  (``Outcome.OWNERSHIP_LOST``) in the batch forms and ``OwnershipLost`` in the
  single-item forms, never a crash.
* Transaction bodies are replayed by ``Database.transaction`` on deadlock and lock-wait
  errors, so they only touch the database through ``tx`` and rebuild all state per run.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from ..db import Database
from ..domain.claims import ClaimRequest
from ..domain.ownership import (
    AttachItem,
    FinishItem,
    Hook,
    Outcome,
    OwnershipLost,
    RecoveryStats,
    Reservation,
    TransitionResult,
)
from .claim import run_claim
from .explain import read_explanation
from .recovery import Requeued, run_recovery
from .transitions import (
    RECOVERY_BATCH,
    TransitionPart,
    TransitionRules,
    all_recorded_finishes,
    attach_key,
    finish_key,
    pair_key,
    recorded_finishes,
    run_transitions,
)


@attrs.define(eq=False)
class LeaseStore:
    db: Database
    reservation_lease_s: float = attrs.field(kw_only=True)
    run_lease_s: float = attrs.field(kw_only=True)
    batch_size: int = attrs.field(kw_only=True)
    hook: Hook | None = attrs.field(default=None, kw_only=True)
    rng: random.Random = attrs.field(factory=random.Random, kw_only=True)
    _rules: TransitionRules = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self):
        if self.reservation_lease_s <= 0 or self.run_lease_s <= 0:
            raise ValueError("leases must be positive")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self._rules = TransitionRules(
            reservation_lease_s=self.reservation_lease_s, run_lease_s=self.run_lease_s, rng=self.rng
        )

    @classmethod
    def from_config(cls, db: Database, config: Any) -> LeaseStore:
        """Build from a ``NodeConfig`` (leases and claim batch size)."""
        return cls(
            db,
            reservation_lease_s=config.reservation_lease_s,
            run_lease_s=config.run_lease_s,
            batch_size=config.claim_batch_size,
        )

    async def _at(self, point: str, task_ids: Iterable[str]) -> None:
        if self.hook is not None:
            await self.hook(point, tuple(task_ids))

    async def claim(self, req: ClaimRequest) -> list[Reservation]:
        """Reserve up to ``min(req.limit, batch_size)`` due tasks in one short transaction."""
        return await run_claim(
            self.db,
            req,
            limit=min(req.limit, self.batch_size),
            reservation_lease_s=self.reservation_lease_s,
            at=self._at,
        )

    # -- transitions, each a batch in one transaction ----------------------------------

    def start_part(self, items: Iterable[tuple[str, str]]) -> TransitionPart:
        """reserved -> running for each (task_id, token) with a run lease."""
        return TransitionPart("start.locked", list(items), pair_key, self._rules.start)

    def renew_part(self, items: Iterable[tuple[str, str]]) -> TransitionPart:
        """Extend leases that are still valid: running by the run lease, reserved by the reservation lease."""
        return TransitionPart("renew.locked", list(items), pair_key, self._rules.renew)

    def release_part(self, items: Iterable[tuple[str, str]]) -> TransitionPart:
        """Give back reservations that will not be started: queued again, no attempt used.
        A reservation whose lease has expired is refused like a late Start (the sweeper's now)."""
        return TransitionPart("release.locked", list(items), pair_key, self._rules.release)

    def finish_part(self, items: Iterable[FinishItem], *, recorded_only: str | None = None) -> TransitionPart:
        """Record results and failures; retry with backoff or settle; release the resource key.
        A repeated Finish of an attempt (its token) is answered with what was recorded.

        ``recorded_only`` (a namespace id): Finishes from a connection that does not hold
        the tasks, answered only where they repeat one recorded, for tasks of that
        namespace; nothing is written."""
        if recorded_only is not None:
            return TransitionPart(
                "finish.locked",
                list(items),
                finish_key,
                self._rules.finish_recorded,
                all_recorded_finishes,
                recorded_only,
            )
        return TransitionPart(
            "finish.locked", list(items), finish_key, self._rules.finish, recorded_finishes, releases=True
        )

    def attach_part(self, items: Iterable[AttachItem]) -> TransitionPart:
        """Running tasks of a Worker's earlier connection, adopted by its new one: token
        current, lease valid, state running; the lease is renewed."""
        attach = list(items)
        # One connection's items: one namespace, whose tasks alone it may adopt (another's
        # are answered as not found, their state not said).
        namespace_id = attach[0].namespace_id if attach else None
        return TransitionPart("attach.locked", attach, attach_key, self._rules.attach, namespace_id=namespace_id)

    async def transition(self, parts: Sequence[TransitionPart]) -> list[list[TransitionResult]]:
        """Run several batches (of any kinds, naming distinct tasks) in one transaction."""
        return await run_transitions(self.db, self._at, parts)

    async def start_many(self, items: Iterable[tuple[str, str]]) -> list[TransitionResult]:
        return (await self.transition([self.start_part(items)]))[0]

    async def renew_many(self, items: Iterable[tuple[str, str]]) -> list[TransitionResult]:
        return (await self.transition([self.renew_part(items)]))[0]

    async def release_many(self, items: Iterable[tuple[str, str]]) -> list[TransitionResult]:
        return (await self.transition([self.release_part(items)]))[0]

    async def finish_many(
        self, items: Iterable[FinishItem], *, recorded_only: str | None = None
    ) -> list[TransitionResult]:
        return (await self.transition([self.finish_part(items, recorded_only=recorded_only)]))[0]

    async def attach_many(self, items: Iterable[AttachItem]) -> list[TransitionResult]:
        return (await self.transition([self.attach_part(items)]))[0]

    # Single-item conveniences: OwnershipLost instead of an outcome.

    async def start(self, task_id: str, token: str) -> TransitionResult:
        return _raise_lost((await self.start_many([(task_id, token)]))[0])

    async def renew(self, task_id: str, token: str) -> TransitionResult:
        return _raise_lost((await self.renew_many([(task_id, token)]))[0])

    async def finish(
        self,
        task_id: str,
        token: str,
        *,
        result_json: str | None = None,
        error: dict[str, Any] | None = None,
        retryable: bool = False,
    ) -> TransitionResult:
        item = FinishItem(task_id, token, result_json, error, retryable)
        return _raise_lost((await self.finish_many([item]))[0])

    async def release(self, task_id: str, token: str) -> TransitionResult:
        return _raise_lost((await self.release_many([(task_id, token)]))[0])

    # -- recovery and explanation ------------------------------------------------------

    async def recover(self, *, limit: int = RECOVERY_BATCH, requeued: Requeued | None = None) -> RecoveryStats:
        """One sweep pass over expired leases and queued tasks past their deadline (see
        ``transitions.run_recovery``); safe to run on every node at once. ``requeued``
        hears of the queues it put tasks back in, after their commit."""
        return await run_recovery(self.db, self._rules, self._at, limit=limit, requeued=requeued)

    async def explain(self, namespace_id: str, task_id: str) -> dict[str, Any]:
        """Why a task is (not) being dispatched right now, as a JSON-ready dict.

        Read-only, one consistent snapshot. Raises NotFound for unknown tasks and for
        tasks of another namespace (their existence is not revealed).
        """
        return await read_explanation(self.db, namespace_id, task_id)


def _raise_lost(result: TransitionResult) -> TransitionResult:
    if result.outcome is Outcome.OWNERSHIP_LOST:
        assert result.lost_reason is not None
        raise OwnershipLost(result.task_id, result.lost_reason)
    return result
