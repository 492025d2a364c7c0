"""Requests waiting for a task to finish (``dispatch/waits.py``) on trio's clock, without a
database: what wakes them, their deadline, the node's shutdown, and the node's own check
costing one read of states per interval for all of them."""

from __future__ import annotations

import math

import attrs
import trio
import trio.testing

from orbit_node.dispatch.waits import CHECK_BATCH, TaskWaits


@attrs.define
class States:
    """A TaskStore's ``states``: the tasks' states, and the ids of each call."""

    known: dict[str, str] = attrs.field(factory=dict)
    calls: list[list[str]] = attrs.field(factory=list)

    async def states(self, task_ids):
        self.calls.append(list(task_ids))
        return {t: self.known[t] for t in task_ids if t in self.known}


def waits_over(store: States, **changes) -> TaskWaits:
    return TaskWaits(store, **changes)  # type: ignore[arg-type]


async def test_a_wait_ends_at_its_deadline_or_when_its_task_finishes(autojump_clock):
    store = States({"a": "running", "b": "queued"})
    waits = waits_over(store, check_interval_s=60.0)
    ended: dict[str, tuple[bool, float]] = {}

    async def wait(task_id: str, for_s: float) -> None:
        began = trio.current_time()
        woken = await waits.wait(task_id, began + for_s)
        ended[task_id] = (woken, trio.current_time() - began)

    async with trio.open_nursery() as nursery:
        await nursery.start(waits.run)
        nursery.start_soon(wait, "a", 30.0)
        nursery.start_soon(wait, "b", 5.0)
        await trio.testing.wait_all_tasks_blocked()
        assert waits.waiting_requests == 2 and waits.any_waiting()
        await trio.sleep(2.0)
        waits.finished(["a"])  # a finish through this node: woken at once
        await trio.sleep(10.0)
        nursery.cancel_scope.cancel()
    assert ended["a"][0] and math.isclose(ended["a"][1], 2.0)
    assert not ended["b"][0] and math.isclose(ended["b"][1], 5.0)
    assert (waits.woken, waits.timed_out, waits.waiting_requests) == (1, 1, 0)
    assert store.calls == []  # its check interval never came


async def test_the_nodes_check_reads_every_waiting_task_in_one_statement_per_interval(autojump_clock):
    """A finish no signal told of (another node's, an older node's, orbit-admin's) is found
    by the node's own read of the states: one statement per interval for all the waiting
    requests, whatever their number, and none while nothing waits."""
    task_ids = [f"t{i}" for i in range(CHECK_BATCH + 5)]
    store = States(dict.fromkeys(task_ids, "running"))
    waits = waits_over(store, check_interval_s=1.0)
    woken: list[str] = []

    async def wait(task_id: str) -> None:
        if await waits.wait(task_id, trio.current_time() + 30.0):
            woken.append(task_id)

    async with trio.open_nursery() as nursery:
        await nursery.start(waits.run)
        await trio.sleep(10.0)
        assert store.calls == []
        for task_id in task_ids:
            nursery.start_soon(wait, task_id)
        nursery.start_soon(wait, "t0")  # two requests for one task: one id read
        await trio.sleep(3.5)
        # Three intervals, each one statement per CHECK_BATCH ids.
        assert [len(c) for c in store.calls] == [CHECK_BATCH, 5] * 3
        store.known["t3"] = "succeeded"
        del store.known["t7"]  # gone: its request reads it again and answers 404
        await trio.sleep(1.0)
        assert sorted(woken) == ["t3", "t7"]
        nursery.cancel_scope.cancel()


async def test_shutdown_wakes_every_waiting_request_and_no_new_one_waits(autojump_clock):
    store = States({"a": "running"})
    stopping = trio.Event()
    waits = waits_over(store, stopping=stopping, check_interval_s=60.0)
    ended: list[tuple[bool, float]] = []

    async def wait() -> None:
        began = trio.current_time()
        ended.append((await waits.wait("a", began + 30.0), trio.current_time() - began))

    async with trio.open_nursery() as nursery:
        await nursery.start(waits.run)
        nursery.start_soon(wait)
        nursery.start_soon(wait)
        await trio.sleep(1.0)
        stopping.set()
        await trio.testing.wait_all_tasks_blocked()
        assert ended == [(False, 1.0), (False, 1.0)]
        await wait()
        assert ended[-1] == (False, 0.0)
        nursery.cancel_scope.cancel()
    assert waits.waiting_requests == 0
