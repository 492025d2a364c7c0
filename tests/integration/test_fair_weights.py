"""Fairness weights from the database to running nodes (real MariaDB, real WebSockets): an
operator's change reaches every node's claim scheduler within a refresh, and with two
applications backlogged the node's claim turns follow the weights (weight 1 each: the
plain rotation)."""

from __future__ import annotations

from collections import Counter

import attrs
import trio

from orbit_node.config import SchedulerLimits
from orbit_node.services import default_services
from orbit_node.store.operations import OperationsStore
from orbit_node.store.tenancy import TenancyStore

from .. import seed
from ..helpers import wait_until
from ..nodeutil import make_tenant, run_node
from ..wsclient import raw_worker

# A whole test on the real clock (nodes, Workers, a database).
TEST_TIMEOUT_S = 90
# A changed weight applies within one refresh (1 s); the bound leaves room for a busy machine.
APPLIED_WITHIN_S = 5


async def test_every_node_applies_a_changed_weight_and_forgets_it_back_at_1(node_config, db):
    shop = await make_tenant(db, "shop")
    other = await make_tenant(db, "other")
    ops = OperationsStore(db)
    await ops.set_weight("other", 2)  # before the nodes start: read at once
    with trio.fail_after(TEST_TIMEOUT_S):
        async with (
            run_node(node_config, services=default_services()) as one,
            run_node(node_config, services=default_services()) as two,
        ):
            schedulers = [running.node.state.services.pool.scheduler for running in (one, two)]

            def weights() -> list[dict[str, int]]:
                return [s.statistics().weight_by_application for s in schedulers]

            await wait_until(lambda: weights() == [{other.application_id: 2}] * 2, timeout_s=APPLIED_WITHIN_S)
            await ops.set_weight("shop", 7)
            expected = {shop.application_id: 7, other.application_id: 2}
            await wait_until(lambda: weights() == [expected] * 2, timeout_s=APPLIED_WITHIN_S)
            await ops.set_weight("shop", 1)
            await wait_until(lambda: weights() == [{other.application_id: 2}] * 2, timeout_s=APPLIED_WITHIN_S)
            assert [s.weight(shop.application_id) for s in schedulers] == [1, 1]
            assert all(running.node.state.services.shards.main.weights.passes >= 2 for running in (one, two))


async def test_a_weight_the_database_did_not_check_counts_as_the_largest(db):
    """A server that ignores CHECK constraints (MySQL before 8.0.16) may hold a weight above
    100; nodes read it as 100 instead of failing on it."""
    shop = await make_tenant(db, "shop")
    other = await make_tenant(db, "other")
    await db.run(lambda tx: tx.execute_raw("ALTER TABLE applications DROP CONSTRAINT ck_applications_weight"))
    await db.run(lambda tx: tx.execute_raw("UPDATE applications SET fairness_weight = 500 WHERE name = 'shop'"))
    await OperationsStore(db).set_weight("other", 7)
    assert await TenancyStore(db).application_weights() == {shop.application_id: 100, other.application_id: 7}


async def test_two_backlogged_applications_share_a_node_s_claim_turns_by_their_weights(node_config, db):
    # One SQL slot: every grant is a choice between the two applications (the in-flight limit
    # of one claim per application leaves the other application's request waiting). One task
    # per claim and no pacing, so each connection asks again as soon as its claim ended.
    config = attrs.evolve(
        node_config,
        claim_batch_size=1,
        scheduler=SchedulerLimits(sql_slots=1, claims_per_connection_per_cycle=10**6),
    )
    heavy = await make_tenant(db, "heavy")
    light = await make_tenant(db, "light")
    for tenant, prefix in ((heavy, "aaaaaaaa"), (light, "bbbbbbbb")):
        owner = seed.Tenant(tenant.application_id, tenant.namespace_id, tenant.queue_id)
        await seed.bulk_insert_tasks(db, owner, 1000, id_prefix=prefix)
    names = {heavy.application_id: "heavy", light.application_id: "light"}
    granted: list[str] = []
    more = trio.Event()

    def on_grant(grant) -> None:
        nonlocal more
        granted.append(names[grant.request.application_id])
        more.set()

    async def grants_after(start: int, count: int) -> Counter[str]:
        nonlocal more
        while len(granted) < start + count:
            more = trio.Event()
            await more.wait()
        return Counter(granted[start : start + count])

    async def worker(token: str, queue_id: str, task_status=trio.TASK_STATUS_IGNORED) -> None:
        # Never starts what it gets: reservations pile up and the connection keeps asking.
        async with raw_worker(running.base_url, token) as w:
            await w.hello([queue_id], capacity=1000)
            task_status.started()
            while True:
                await w.recv()

    with trio.fail_after(TEST_TIMEOUT_S):
        async with run_node(config, services=default_services()) as running:
            services = running.node.state.services
            services.pool.on_grant = on_grant
            async with trio.open_nursery() as workers:
                for tenant in (heavy, light):
                    for _ in range(3):
                        await workers.start(worker, tenant.token, tenant.queue_id)
                await wait_until(lambda: set(granted) == {"heavy", "light"})
                # Weight 1 each: the plain rotation.
                turns = await grants_after(len(granted), 40)
                assert abs(turns["heavy"] - 20) <= 1 and turns["heavy"] + turns["light"] == 40, turns

                await OperationsStore(db).set_weight("heavy", 3)
                await wait_until(lambda: services.pool.scheduler.weight(heavy.application_id) == 3)
                turns = await grants_after(len(granted) + 1, 80)
                # 3 to 1, give or take the turn at either edge of the window.
                assert abs(turns["heavy"] - 60) <= 1 and turns["heavy"] + turns["light"] == 80, turns
                workers.cancel_scope.cancel()
