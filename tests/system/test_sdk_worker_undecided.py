"""An SDK Worker whose transition the node could not decide (its database out of reach:
``UNAVAILABLE``) asks again instead of giving the task up (real node, MariaDB through a
fault proxy, WebSockets).

Found by the chaos run (tests/system/test_chaos.py, ``python -m bench chaos``): a Worker that
dropped a task after an undecided Start left the node's connection holding it, so that
connection never claimed again; an undecided renew stopped a healthy handler and failed
the task for good."""

from __future__ import annotations

from contextlib import AsyncExitStack, asynccontextmanager

import attrs
import trio

from harness.proxy import Direction, FaultProxy, open_fault_proxy
from orbit_node.services import default_services
from orbit_sdk.worker import Worker, WorkerTask

from .. import seed
from ..checks import assert_attempt_history, tenant_with_token, wait_for_state
from ..helpers import wait_until
from ..nodeutil import run_node

# Long enough for the Start / Finish sent meanwhile to be answered UNAVAILABLE.
OUTAGE_S = 2.0
# A run lease of 6 s: the SDK renews every 2 s.
RUN_LEASE_S = 6.0


def cut(proxy: FaultProxy) -> None:
    """The node loses its database: open connections are reset, new ones refused."""
    proxy.refuse_new = True
    proxy.reset()


async def lease_moved(db, task_id: str, since) -> object:
    """Wait until the task's lease was renewed past ``since``; returns the new expiry."""

    async def renewed():
        lease = (await seed.task_row(db, task_id))["lease_expires_at"]
        return lease if lease is not None and lease > since else None

    return await wait_until(renewed, timeout_s=RUN_LEASE_S * 2)


@attrs.define
class Setup:
    db_proxy: FaultProxy
    # Between the Worker and the node, when asked for.
    ws_proxy: FaultProxy | None
    runs: list[str]
    release: trio.Event


@asynccontextmanager
async def worker_on_node(node_config, dsn, token: str, queue_id: str, *, ws_proxy=False, **config):
    """A node reaching its database through a fault proxy, and an SDK Worker serving it
    (capacity 1) whose handler logs each run and returns once ``release`` is set."""
    async with AsyncExitStack() as stack:
        setup = Setup(await stack.enter_async_context(open_fault_proxy(dsn.host, dsn.port)), None, [], trio.Event())
        node_config = attrs.evolve(node_config, dsn=setup.db_proxy.dsn_for(dsn), **config)
        node = await stack.enter_async_context(run_node(node_config, services=default_services()))
        url = node.base_url
        if ws_proxy:
            setup.ws_proxy = await stack.enter_async_context(
                open_fault_proxy("127.0.0.1", int(node.base_url.rsplit(":", 1)[1]))
            )
            url = f"http://127.0.0.1:{setup.ws_proxy.port}"
        worker = Worker(url, token, [queue_id])

        @worker.handler("h", "v1", "v1")
        async def handle(task: WorkerTask):
            setup.runs.append(f"began attempt {task.attempt}")
            try:
                await setup.release.wait()
            except trio.Cancelled:
                setup.runs.append("cancelled")
                raise
            return "done"

        with trio.fail_after(40):
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                yield setup
                nursery.cancel_scope.cancel()


async def assert_succeeded_once(db, task_id: str) -> None:
    row = await wait_for_state(db, task_id, "succeeded", "failed", "cancelled", timeout_s=10)
    assert (row["state"], row["attempts"]) == ("succeeded", 1), row
    assert [a["outcome"] for a in await assert_attempt_history(db, task_id)] == ["succeeded"]


async def test_a_renew_the_node_could_not_decide_leaves_the_handler_running(node_config, db, dsn):
    owner, token = await tenant_with_token(db)
    task_id = await seed.insert_task(db, owner)
    async with worker_on_node(node_config, dsn, token, owner.queue_id, run_lease_s=RUN_LEASE_S) as setup:
        row = await wait_for_state(db, task_id, "running")
        # Right after a renew, for longer than the renew interval and well inside the lease.
        renewed = await lease_moved(db, task_id, row["lease_expires_at"])
        cut(setup.db_proxy)
        await trio.sleep(RUN_LEASE_S / 3 * 1.5)
        setup.db_proxy.heal()
        await lease_moved(db, task_id, renewed)
        setup.release.set()
        await assert_succeeded_once(db, task_id)
    assert setup.runs == ["began attempt 1"]


async def test_a_start_the_node_could_not_decide_is_sent_again(node_config, db, dsn):
    owner, token = await tenant_with_token(db)
    async with worker_on_node(node_config, dsn, token, owner.queue_id, ws_proxy=True) as setup:
        assert setup.ws_proxy is not None
        setup.release.set()
        # The dispatch is held on its way to the Worker; the database goes away before
        # the Worker's Start arrives.
        setup.ws_proxy.stall(Direction.DOWN)
        task_id = await seed.insert_task(db, owner)
        await wait_for_state(db, task_id, "reserved")
        # The row reads reserved as soon as the claim commits, which can be before the
        # node has read that COMMIT's answer: cut then, the claim's outcome is unknown to
        # the node, and the reservation waits out its lease (docs/guarantees.md), which is
        # not what this test is about. A dispatch held by the proxy was sent after that answer.
        await wait_until(lambda: setup.ws_proxy.holding)
        cut(setup.db_proxy)
        setup.ws_proxy.heal()
        await trio.sleep(OUTAGE_S)
        setup.db_proxy.heal()
        await assert_succeeded_once(db, task_id)
    assert setup.runs == ["began attempt 1"]


async def test_a_finish_the_node_could_not_decide_is_sent_again(node_config, db, dsn):
    owner, token = await tenant_with_token(db)
    task_id = await seed.insert_task(db, owner)
    async with worker_on_node(node_config, dsn, token, owner.queue_id) as setup:
        await wait_for_state(db, task_id, "running")
        cut(setup.db_proxy)
        setup.release.set()
        await trio.sleep(OUTAGE_S)
        setup.db_proxy.heal()
        await assert_succeeded_once(db, task_id)
    assert setup.runs == ["began attempt 1"]
