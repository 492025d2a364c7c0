"""The trigger's pacing on trio's clock (autojump): one round per interval, rounds that find
more work repeat at once (bounded), failures wait for the next interval.

What is due and what a fire creates is decided by the database (tests/integration/test_plans_trigger.py);
here a scripted stand-in for the store only answers "these plans are due" so that the loop's
timing can be observed exactly, without real I/O that would let the mock clock jump.
"""

from __future__ import annotations

import logging

import attrs
import trio

from orbit_node.dispatch.periodic import MAX_BACK_TO_BACK_PASSES
from orbit_node.dispatch.plan_trigger import PlanTrigger
from orbit_node.domain.errors import Unavailable
from orbit_node.store.plans import FireResult

# Generous on the mock clock: it only moves when everything waits.
TIMEOUT_S = 600


@attrs.define
class ScriptedStore:
    """``due()`` answers from a script (plan ids, or an error to raise); then nothing is due."""

    script: list
    calls: list[float] = attrs.field(factory=list)
    fired: list[str] = attrs.field(factory=list)

    async def due(self, limit: int) -> list[str]:
        self.calls.append(trio.current_time())
        await trio.lowlevel.checkpoint()
        item = self.script.pop(0) if self.script else []
        if isinstance(item, Exception):
            raise item
        return item[:limit]

    async def fire(self, plan_id: str, *, limit: int) -> FireResult:
        self.fired.append(plan_id)
        await trio.lowlevel.checkpoint()
        # A plan named "behind..." had more due fire times than one transaction creates.
        return FireResult(plan_id=plan_id, locked=True, created=1, still_due=plan_id.startswith("behind"))


async def run_rounds(trigger: PlanTrigger, rounds: int) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(trigger.run)
            # Counted, not merely awaited: a round may finish before the first wait starts.
            while trigger.passes < rounds:
                await trigger.wait_for_pass()
            nursery.cancel_scope.cancel()


async def test_one_round_per_interval_when_nothing_is_due(autojump_clock):
    store = ScriptedStore([])
    start = trio.current_time()
    await run_rounds(PlanTrigger(store, interval_s=2.5), 4)
    assert [t - start for t in store.calls] == [0.0, 2.5, 5.0, 7.5]


async def test_a_full_batch_of_due_plans_is_followed_at_once_by_another_pass_but_not_forever(autojump_clock):
    store = ScriptedStore([["a", "b"]] * 20)
    trigger = PlanTrigger(store, interval_s=1.0, plans_per_pass=2)
    start = trio.current_time()
    await run_rounds(trigger, 2)
    offsets = [t - start for t in store.calls]
    # The first round stops after the bound, the second works off the rest and an empty pass.
    assert offsets == [0.0] * MAX_BACK_TO_BACK_PASSES + [1.0] * (20 - MAX_BACK_TO_BACK_PASSES + 1)
    assert trigger.totals.tasks_created == 40 and trigger.passes == 2


async def test_a_plan_still_due_after_its_transaction_is_fired_again_at_once(autojump_clock):
    store = ScriptedStore([["behind"], ["behind"], ["done"]])
    trigger = PlanTrigger(store, interval_s=1.0)
    start = trio.current_time()
    await run_rounds(trigger, 1)
    assert [t - start for t in store.calls] == [0.0, 0.0, 0.0]
    assert store.fired == ["behind", "behind", "done"]


async def test_a_failed_round_is_logged_and_retried_after_the_interval(autojump_clock, caplog):
    store = ScriptedStore([Unavailable("database unavailable: gone"), ["p"]])
    trigger = PlanTrigger(store, interval_s=3.0)
    start = trio.current_time()
    with caplog.at_level(logging.WARNING, logger="orbit.plans"):
        await run_rounds(trigger, 2)
    assert [t - start for t in store.calls] == [0.0, 3.0]
    assert store.fired == ["p"] and trigger.totals.tasks_created == 1
    assert "plan trigger failed: database unavailable: gone" in caplog.text
