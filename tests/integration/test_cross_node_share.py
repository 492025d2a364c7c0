"""The share across nodes: turns an application took on other nodes count in each node's rotation.

Pure first (``TurnsElsewhere``: two reads of the other nodes' counters -> gains), then the
statement that reads them (real MariaDB, rows written with chosen times), the recorder's
loop with its database cut and healed, and two in-process nodes on one database.
"""

from __future__ import annotations

import subprocess
import sys

import attrs
import trio

from harness.proxy import open_fault_proxy
from orbit_node.config import SchedulerLimits
from orbit_node.db import Database
from orbit_node.dispatch.scheduler import FairScheduler
from orbit_node.dispatch.share import TurnsElsewhere
from orbit_node.dispatch.turns import TurnRecorder
from orbit_node.services import default_services
from orbit_node.store.operations import OperationsStore
from orbit_node.store.tenancy import TenancyStore

from .. import seed
from ..helpers import wait_until
from ..nodeutil import ALL_SCOPES, run_node
from ..unit.test_scheduler import drain_one_at_a_time, ticket
from ..wsclient import raw_worker

UNPACED = 10**6


def test_gains_count_only_between_two_reads_of_the_same_counter():
    elsewhere = TurnsElsewhere()
    assert elsewhere.update([("n1", "A", 10), ("n2", "A", 5)]) == {}  # the first read is a baseline
    assert elsewhere.update([("n1", "A", 14), ("n2", "A", 6), ("n2", "B", 3)]) == {"A": 5}  # B: new, a baseline
    assert elsewhere.update([("n1", "A", 14), ("n2", "A", 6), ("n2", "B", 7)]) == {"B": 4}
    # n1's count started over (a new node with that id is not possible, a reset row is): a baseline.
    assert elsewhere.update([("n1", "A", 2), ("n2", "B", 9)]) == {"B": 2}
    # A counter not read (its node stopped, or the rotation forgot the application) is
    # forgotten: what it gained meanwhile is never counted as recent.
    assert elsewhere.update([("n2", "B", 9)]) == {}
    assert elsewhere.update([("n1", "A", 50), ("n2", "B", 10)]) == {"B": 1}
    elsewhere.forget()
    assert len(elsewhere) == 0
    assert elsewhere.update([("n1", "A", 60), ("n2", "B", 20)]) == {}


def test_the_three_node_example_of_the_docs():
    """docs/scheduling.md, "A share across nodes": N1 grants 6 turns a scan cycle (one SQL
    slot here) and A, B and C always ask there; N2 and N3 serve only A, 3 turns a cycle
    each, for cycles 1-5. N1 reads their counters at the start of each cycle."""
    s = FairScheduler(SchedulerLimits(sql_slots=1, claims_per_connection_per_cycle=UNPACED))
    for name in "ABC":
        s.submit(ticket(name, name, f"q{name}"))
    elsewhere = TurnsElsewhere()
    counters = {"N2": 0, "N3": 0}
    rows = []
    for cycle in range(1, 9):
        gained = elsewhere.update([(node, "A", turns) for node, turns in counters.items()])
        s.charge_elsewhere(gained)
        charged = s.statistics().virtual_time_by_application["A"]
        order = "".join(app for app, _, _ in drain_one_at_a_time(s, resubmit=lambda t: t, rounds=6))
        stats = s.statistics()
        rows.append((gained.get("A", 0), charged, order, stats.virtual_time_by_application, stats.virtual_time))
        if cycle <= 5:
            counters = {node: turns + 3 for node, turns in counters.items()}
    assert [(g, c, o) for g, c, o, _, _ in rows] == [
        (0, 0.0, "ABCABC"),
        (6, 8.0, "BCBCBC"),
        (6, 11.0, "BCBCBC"),
        (6, 14.0, "BCBCBC"),
        (6, 17.0, "BCBCBC"),
        (6, 20.0, "BCBCBC"),
        (0, 20.0, "BCBCBC"),
        (0, 20.0, "ABCABC"),
    ]
    assert [(t["B"], v) for _, _, _, t, v in rows] == [
        (2.0, 1.0),
        (5.0, 4.0),
        (8.0, 7.0),
        (11.0, 10.0),
        (14.0, 13.0),
        (17.0, 16.0),
        (20.0, 19.0),
        (22.0, 21.0),
    ]


def test_the_bookkeeping_imports_no_trio():
    code = "import sys, orbit_node.dispatch.share; sys.exit('trio' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


async def add_node(db: Database, node_id: str, *, heartbeat_age_s: float = 0.0, stopped: bool = False) -> None:
    await db.run(
        lambda tx: tx.execute_raw(
            "INSERT INTO nodes (node_id, hostname, http_addr, version, heartbeat_at, stopped_at) "
            "VALUES (%s, 'h', 'a', 'v', NOW(6) - INTERVAL %s SECOND, IF(%s, NOW(6), NULL))",
            (node_id, heartbeat_age_s, stopped),
        )
    )


async def set_turns(db: Database, node_id: str, application_id: str, turns: int) -> None:
    await OperationsStore(db).record_turns(node_id, {application_id: turns})


async def test_the_read_covers_the_named_applications_on_other_live_nodes_only(db):
    a = await seed.tenant(db, application="a")
    b = await seed.tenant(db, application="b")
    c = await seed.tenant(db, application="c")
    me, other, stale, stopped = "1" * 32, "2" * 32, "3" * 32, "4" * 32
    await add_node(db, me)
    await add_node(db, other, heartbeat_age_s=5)
    await add_node(db, stale, heartbeat_age_s=120)
    await add_node(db, stopped, stopped=True)
    for node_id in (me, other, stale, stopped):
        for app in (a, b, c):
            await set_turns(db, node_id, app.application_id, 7)
    ops = OperationsStore(db)
    got = await ops.turns_elsewhere(me, [a.application_id, b.application_id])
    assert sorted(got) == sorted([(other, a.application_id, 7), (other, b.application_id, 7)])
    assert await ops.turns_elsewhere(me, []) == []


async def test_the_recorder_charges_turns_taken_elsewhere_and_a_failed_read_charges_nothing(db, dsn):
    """Node "me" knows A and B; another node grants A 5 turns between two of me's reads:
    A is charged 5 (its virtual time 5 ahead of B's). While me's database is cut, its loop
    goes on and its rotation keeps granting; the first read after the cut is a baseline
    (what A gained meanwhile is not charged), the next one charges again."""
    a = await seed.tenant(db, application="a")
    b = await seed.tenant(db, application="b")
    me, other = "1" * 32, "2" * 32
    await add_node(db, me)
    await add_node(db, other)
    await set_turns(db, other, a.application_id, 100)
    scheduler = FairScheduler(SchedulerLimits(sql_slots=1, claims_per_connection_per_cycle=UNPACED))
    for name, app in (("a", a), ("b", b)):
        scheduler.submit(ticket(name, app.application_id, f"q{name}"))

    def lead() -> float:
        times = scheduler.statistics().virtual_time_by_application
        return times[a.application_id] - times[b.application_id]

    async with open_fault_proxy(dsn.host, dsn.port) as proxy:
        cut_db = Database(proxy.dsn_for(dsn), size=2)
        recorder = TurnRecorder(
            OperationsStore(cut_db),
            me,
            lambda: {},
            applications=scheduler.applications,
            charge_elsewhere=scheduler.charge_elsewhere,
            interval_s=0.05,
        )
        try:
            with trio.fail_after(20):
                async with trio.open_nursery() as nursery:
                    await nursery.start(recorder.run)
                    await recorder.wait_for_flush()
                    await recorder.wait_for_flush()
                    assert lead() == 0
                    await set_turns(db, other, a.application_id, 105)
                    await wait_until(lambda: lead() == 5)
                    proxy.refuse_new = True
                    proxy.reset()
                    flushes = recorder.flushes
                    await wait_until(lambda: recorder.flushes >= flushes + 3)  # the loop goes on
                    await set_turns(db, other, a.application_id, 200)
                    # The rotation grants as before: the cut stops nothing here.
                    assert [g.request.application_id for g in scheduler.grant(0.0)] == [b.application_id]
                    proxy.heal()
                    await recorder.wait_for_flush()
                    await recorder.wait_for_flush()
                    await recorder.wait_for_flush()
                    assert lead() == 4  # B took one turn; the 95 turns A took during the cut were not charged
                    await set_turns(db, other, a.application_id, 210)
                    # Charged again: 10 turns, and what is left of the lead from before is
                    # dropped beyond them (A ends 10 + 1 ahead of the node's virtual time, 0).
                    await wait_until(lambda: scheduler.statistics().virtual_time_by_application[a.application_id] == 11)
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await cut_db.aclose()


async def claim_forever(base_url: str, token: str, queue_id: str, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A raw Worker that never starts a task: with its large capacity it always has a claim
    request waiting or running. Its dispatches are read and dropped."""
    async with raw_worker(base_url, token) as w:
        await w.hello([queue_id], capacity=1000)
        task_status.started()
        while True:
            await w.ws.get_message()


async def test_two_nodes_on_one_database_share_the_cluster_wide_turns(node_config, db):
    """A's Workers are on both nodes, B's only on the first. The first node has one SQL
    slot; the second serves A with four at once. Without the share across nodes the first
    node alternates A and B (A's share there 1/2); with it, A has taken more than its
    share on the second node, so the first one serves B whenever B asks: A's share there
    falls near 0. And the share never idles a node: once B's Workers are gone, A gets the
    first node's turns again."""
    a = await seed.tenant(db, application="a", queue="a0")
    b = await seed.tenant(db, application="b")
    # A's queues: one for its Workers on the first node, four for those on the second, so
    # that claims running at once never race for the same rows (a claim that loses the race
    # may come back empty, and an empty result holds its queue back for a scan cycle).
    a_second = [await seed.add_queue(db, a, f"a{i}") for i in range(1, 5)]
    for i, owner in enumerate([a, b, *a_second]):
        await seed.bulk_insert_tasks(db, owner, 10_000, id_prefix=f"{i:08x}")
    tokens = {}
    for owner in (a, b):
        _, tokens[owner.application_id] = await TenancyStore(db).create_credential(owner.namespace_id, "t", ALL_SCOPES)
    first_config = attrs.evolve(
        node_config, claim_batch_size=1, scheduler=SchedulerLimits(sql_slots=1, claims_per_connection_per_cycle=UNPACED)
    )
    second_config = attrs.evolve(
        node_config,
        claim_batch_size=1,
        scheduler=SchedulerLimits(sql_slots=4, in_flight_per_application=4, claims_per_connection_per_cycle=UNPACED),
    )
    with trio.fail_after(60):
        async with (
            run_node(first_config, services=default_services()) as first,
            run_node(second_config, services=default_services()) as second,
            trio.open_nursery() as workers,
        ):
            pool = first.node.state.services.pool
            assert pool is not None
            async with trio.open_nursery() as b_workers:
                for _ in range(3):
                    await workers.start(claim_forever, first.base_url, tokens[a.application_id], a.queue_id)
                    await b_workers.start(claim_forever, first.base_url, tokens[b.application_id], b.queue_id)
                for queue in a_second:
                    for _ in range(2):
                        await workers.start(claim_forever, second.base_url, tokens[a.application_id], queue.queue_id)
                # Warm-up: both nodes have recorded their turns and read the other's twice.
                await trio.sleep(3.0)
                before = dict(pool.statistics().turns_by_application)
                await trio.sleep(4.0)
                after = dict(pool.statistics().turns_by_application)
                turns = {app: after.get(app, 0) - before.get(app, 0) for app in (a.application_id, b.application_id)}
                assert sum(turns.values()) >= 40, turns
                a_share = turns[a.application_id] / sum(turns.values())
                assert a_share <= 0.2, (a_share, turns)
                b_workers.cancel_scope.cancel()
            # B is gone: every turn of the first node goes to A, charged or not.
            before = pool.statistics().turns_by_application.get(a.application_id, 0)
            await trio.sleep(1.5)
            alone = pool.statistics().turns_by_application.get(a.application_id, 0) - before
            assert alone >= 0.5 * 1.5 * sum(turns.values()) / 4.0, (alone, turns)
            workers.cancel_scope.cancel()
