"""Claims: what is offered, what is locked, what is written."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
import trio

from orbit_node.claims import Capability
from orbit_node.db import Database
from orbit_node.store.tenancy import TenancyStore

from ..seed import (
    CAP,
    TaskSpec,
    add_queue,
    attempt_rows,
    claim_request,
    insert_task,
    insert_tasks,
    lease_store,
    task_row,
    tenant,
)

A = Capability("a", "v1", "v1")
B = Capability("b", "v1", "v1")


async def hold_claim_open(db, owner, capability, task_id, nursery):
    """Start a claim for ``capability`` that pauses, transaction open, once it locked ``task_id``.

    Returns (locked event, release event, list that receives the claim's result)."""
    locked, release, result = trio.Event(), trio.Event(), []

    async def hook(point, task_ids):
        if point == "claim.locked" and task_id in task_ids:
            locked.set()
            await release.wait()

    async def run():
        result.extend(await lease_store(db, hook=hook).claim(claim_request(owner, capabilities=(capability,))))

    nursery.start_soon(run)
    with trio.fail_after(10):
        await locked.wait()
    return release, result


async def test_claim_never_locks_a_row_it_does_not_take(db):
    """While a claimer for handler A holds its claim transaction open, a claimer for
    handler B still gets the B task that sits earlier in the same queue."""
    owner = await tenant(db)
    b_task, a_task = await insert_tasks(
        db, owner, [TaskSpec(handler="b", available_in_s=-10), TaskSpec(handler="a", available_in_s=-5)]
    )
    async with trio.open_nursery() as nursery:
        release, a_result = await hold_claim_open(db, owner, A, a_task, nursery)
        with trio.fail_after(10):
            b_result = await lease_store(db).claim(claim_request(owner, capabilities=(B,), connection_id="conn-b"))
        assert [r.task_id for r in b_result] == [b_task]
        release.set()
    assert [r.task_id for r in a_result] == [a_task]


async def test_control_a_skip_locked_scan_would_hide_the_earlier_task(db, dsn):
    """The failure the design avoids, measured on this server: an ordered
    ``FOR UPDATE SKIP LOCKED`` scan filtered by handler keeps the lock on the B row it
    read and filtered out, so B's claimer finds nothing while the scan's transaction is
    open."""
    owner = await tenant(db)
    b_task, _a_task = await insert_tasks(
        db, owner, [TaskSpec(handler="b", available_in_s=-10), TaskSpec(handler="a", available_in_s=-5)]
    )
    naive = Database(dsn, size=1)
    scanned, release = trio.Event(), trio.Event()

    async def naive_claim(tx):
        await tx.fetchall_raw(
            "SELECT task_id FROM tasks FORCE INDEX (ix_tasks_dispatch) WHERE queue_id = %s AND state = 'queued' "
            "AND dispatch_at <= NOW(6) AND handler = 'a' ORDER BY dispatch_at, available_at, task_id LIMIT 1 "
            "FOR UPDATE SKIP LOCKED",
            (owner.queue_id,),
        )
        scanned.set()
        await release.wait()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(naive.transaction, naive_claim)
            with trio.fail_after(10):
                await scanned.wait()
            b_result = await lease_store(db).claim(claim_request(owner, capabilities=(B,)))
            release.set()
    finally:
        await naive.aclose()
    if b_result:
        pytest.skip("this server releases the locks of rows a SKIP LOCKED scan filtered out")
    assert b_result == []
    assert (await task_row(db, b_task))["state"] == "queued"


async def test_concurrent_claims_take_disjoint_rows(db):
    owner = await tenant(db)
    ids = await insert_tasks(db, owner, [TaskSpec(available_in_s=-i) for i in range(10)])
    async with trio.open_nursery() as nursery:
        # The first claim (up to 16) locked all 10 tasks and pauses before committing.
        release, first = await hold_claim_open(db, owner, CAP, ids[-1], nursery)
        with trio.fail_after(10):  # SKIP LOCKED: the second claim does not wait, it finds nothing
            second = await lease_store(db).claim(claim_request(owner, connection_id="conn-2"))
        release.set()
    assert second == []
    assert sorted(r.task_id for r in first) == sorted(ids)


async def test_reservation_is_written_from_the_database_clock(db):
    owner = await tenant(db)
    payload = '{"n": 123456789012345678901234567890, "s": "ünï\\u0000code 🎉", "f": 1.0e400}'
    task_id = await insert_task(db, owner, payload=payload, priority=3, max_attempts=5, available_in_s=-1)
    (r,) = await lease_store(db, reservation_lease_s=12.5).claim(
        claim_request(owner, connection_id="conn-x", node_id="n" * 32)
    )
    row = await task_row(db, task_id)
    assert row["state"] == "reserved"
    assert row["owner_node_id"] == "n" * 32 and row["connection_id"] == "conn-x"
    assert row["fencing_token"] == r.fencing_token
    assert re.fullmatch(r"1-[0-9a-f]{16}", r.fencing_token)
    assert row["lease_expires_at"] == r.lease_expires_at == row["reserved_at"] + timedelta(seconds=12.5)
    assert row["attempts"] == 0  # attempts count starts, not reservations
    assert (r.attempt, r.max_attempts, r.priority, r.payload_json) == (1, 5, 3, payload)
    assert (r.queue_id, r.namespace_id, r.application_id) == (owner.queue_id, owner.namespace_id, owner.application_id)
    (attempt,) = await attempt_rows(db, task_id)
    assert (attempt["attempt"], attempt["fencing_token"], attempt["outcome"]) == (1, r.fencing_token, None)
    assert attempt["connection_id"] == "conn-x"


async def claim_round_trips(dsn, owner, **request):
    """The reservations of one claim and the round trips it took (on a pool of one connection)."""
    one = Database(dsn, size=1)
    try:

        async def commands(tx):
            return tx.commands

        before = await one.run(commands)
        got = await lease_store(one).claim(claim_request(owner, **request))
        return got, await one.run(commands) - before
    finally:
        await one.aclose()


async def test_a_claim_is_three_round_trips_unless_a_quota_lock_comes_first(db, dsn):
    """Without quotas: the gates with the first queue's candidates, the lock, then the
    reservation and attempt rows with the commit. A queue's quota lock comes before its
    candidates are read, and a paused first queue's early candidates are not used."""
    owner = await tenant(db)
    ids = await insert_tasks(db, owner, [TaskSpec(available_in_s=-5 + i) for i in range(5)])
    got, trips = await claim_round_trips(dsn, owner)
    assert ([r.task_id for r in got], trips) == (ids, 3)
    assert [a["fencing_token"] for i in ids for a in await attempt_rows(db, i)] == [r.fencing_token for r in got]

    limited = await tenant(db, application="limited", max_concurrency=3)
    ids = await insert_tasks(db, limited, [TaskSpec(available_in_s=-5 + i) for i in range(5)])
    got, trips = await claim_round_trips(dsn, limited)
    # + the queue's lock and its live count, and the candidates read under them.
    assert ([r.task_id for r in got], trips) == (ids[:3], 6)

    second = await add_queue(db, owner, "second")
    (later,) = await insert_tasks(db, second, [TaskSpec(available_in_s=-1)])
    await TenancyStore(db).set_queue_paused(owner.namespace_id, owner.queue_id, True)
    await insert_tasks(db, owner, [TaskSpec(available_in_s=-9)])
    got, trips = await claim_round_trips(dsn, owner, queue_ids=(owner.queue_id, second.queue_id))
    assert ([r.task_id for r in got], trips) == ([later], 4)


async def test_trace_contexts_travel_with_the_claims_commit(db, dsn):
    """The lock statement only marks the tasks that have a trace context (000026); their
    contexts are read in the packet that commits the claim: a claim of traced and untraced
    tasks is still three round trips, and each reservation carries its own task's context."""
    owner = await tenant(db)
    ids = await insert_tasks(db, owner, [TaskSpec(available_in_s=-5 + i) for i in range(4)])
    contexts = {
        ids[0]: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ids[2]: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00 vendor=a",
    }
    await db.run(
        lambda tx: tx.execute_raw(
            "INSERT INTO task_trace_contexts (task_id, trace_context) VALUES (%s, %s), (%s, %s)",
            [value for pair in contexts.items() for value in pair],
        )
    )
    got, trips = await claim_round_trips(dsn, owner)
    assert ([r.task_id for r in got], trips) == (ids, 3)
    assert {r.task_id: r.trace_context for r in got} == {task_id: contexts.get(task_id) for task_id in ids}
    assert [a["fencing_token"] for i in ids for a in await attempt_rows(db, i)] == [r.fencing_token for r in got]


async def test_each_reservation_gets_a_fresh_token(db):
    owner = await tenant(db)
    task_id = await insert_task(db, owner, available_in_s=-1)
    store = lease_store(db)
    tokens = []
    for _ in range(3):
        (r,) = await store.claim(claim_request(owner))
        tokens.append(r.fencing_token)
        await store.release(task_id, r.fencing_token)
    assert len(set(tokens)) == 3
    assert all(t.startswith("1-") for t in tokens)


async def test_paused_queue_and_suspended_application_yield_nothing(db):
    owner = await tenant(db)
    await insert_task(db, owner, available_in_s=-1)
    tenancy = TenancyStore(db)
    store = lease_store(db)
    await tenancy.set_queue_paused(owner.namespace_id, owner.queue_id, True)
    assert await store.claim(claim_request(owner)) == []
    await tenancy.set_queue_paused(owner.namespace_id, owner.queue_id, False)
    await tenancy.set_application_suspended(owner.application_id, True)
    assert await store.claim(claim_request(owner)) == []
    await tenancy.set_application_suspended(owner.application_id, False)
    assert len(await store.claim(claim_request(owner))) == 1


async def test_paused_queue_with_controls_yields_nothing(db):
    owner = await tenant(db, max_concurrency=10, max_starts_per_second=10)
    await insert_task(db, owner, available_in_s=-1)
    await TenancyStore(db).set_queue_paused(owner.namespace_id, owner.queue_id, True)
    assert await lease_store(db).claim(claim_request(owner)) == []


async def test_only_declared_capabilities_are_offered(db):
    owner = await tenant(db)
    await insert_tasks(
        db,
        owner,
        [
            TaskSpec(handler="h", handler_version="v2"),
            TaskSpec(handler="h", payload_version="v2"),
            TaskSpec(handler="other"),
        ],
    )
    store = lease_store(db)
    assert await store.claim(claim_request(owner, capabilities=(CAP,))) == []
    got = await store.claim(claim_request(owner, capabilities=(CAP, Capability("h", "v2", "v1"))))
    assert [(r.handler, r.handler_version, r.payload_version) for r in got] == [("h", "v2", "v1")]


async def test_resource_keyed_tasks_only_go_to_connections_that_declared_support(db):
    owner = await tenant(db)
    keyed, plain = await insert_tasks(
        db, owner, [TaskSpec(available_in_s=-2, resource_key="printer"), TaskSpec(available_in_s=-1)]
    )
    store = lease_store(db)
    assert [r.task_id for r in await store.claim(claim_request(owner))] == [plain]
    got = await store.claim(claim_request(owner, resource_key_support=True))
    assert [(r.task_id, r.resource_key) for r in got] == [(keyed, "printer")]


async def test_tasks_past_deadline_or_out_of_attempts_are_settled_not_offered(db):
    owner = await tenant(db)
    late, spent, cancelled, good = await insert_tasks(
        db,
        owner,
        [
            TaskSpec(available_in_s=-40, deadline_in_s=-1),
            TaskSpec(available_in_s=-30, attempts=3, max_attempts=3),
            TaskSpec(available_in_s=-20, cancel_requested=True),
            TaskSpec(available_in_s=-10),
        ],
    )
    got = await lease_store(db).claim(claim_request(owner, limit=1))
    # Settled candidates do not count toward the batch of one.
    assert [r.task_id for r in got] == [good]
    states = {t: (await task_row(db, t)) for t in (late, spent, cancelled)}
    assert states[late]["state"] == "expired"
    assert json.loads(states[late]["error"])["code"] == "DEADLINE_EXCEEDED"
    assert states[spent]["state"] == "failed"
    assert states[cancelled]["state"] == "cancelled"
    assert all(s["finished_at"] is not None for s in states.values())


async def test_batch_size_caps_the_claim(db):
    owner = await tenant(db)
    await insert_tasks(db, owner, [TaskSpec(available_in_s=-1) for _ in range(5)])
    assert len(await lease_store(db, batch_size=2).claim(claim_request(owner, limit=10))) == 2
    assert len(await lease_store(db).claim(claim_request(owner, limit=1))) == 1
    assert await lease_store(db).claim(claim_request(owner, limit=0)) == []


async def test_queues_are_served_in_the_requested_order(db):
    owner = await tenant(db)
    second = await add_queue(db, owner, "second")
    (in_first,) = await insert_tasks(db, owner, [TaskSpec(available_in_s=-1)])
    # Older tasks in the second queue: there is no cross-queue priority comparison.
    in_second = await insert_tasks(db, second, [TaskSpec(available_in_s=-100), TaskSpec(available_in_s=-99)])
    got = await lease_store(db).claim(claim_request(owner, limit=2, queue_ids=(owner.queue_id, second.queue_id)))
    assert [r.task_id for r in got] == [in_first, in_second[0]]


async def test_queues_of_other_namespaces_are_ignored(db):
    owner = await tenant(db)
    stranger = await tenant(db, application="other-app")
    await insert_task(db, stranger, available_in_s=-1)
    forged = claim_request(owner, queue_ids=(stranger.queue_id,))
    assert await lease_store(db).claim(forged) == []


async def test_claim_creates_a_missing_occupancy_row_and_holds_it(db):
    owner = await tenant(db)
    task_id = await insert_task(db, owner, available_in_s=-1, resource_key="k")
    await db.run(lambda tx: tx.execute_raw("DELETE FROM resource_keys"))
    (r,) = await lease_store(db).claim(claim_request(owner, resource_key_support=True))
    assert r.task_id == task_id
    rows = await db.run(lambda tx: tx.fetchall_raw("SELECT * FROM resource_keys"))
    assert [(x["resource_key"], x["holder_task_id"]) for x in rows] == [("k", task_id)]


async def test_a_stale_holder_does_not_block_a_key_forever(db):
    owner = await tenant(db)
    done, waiting = await insert_tasks(
        db, owner, [TaskSpec(available_in_s=-2, resource_key="k"), TaskSpec(available_in_s=-1, resource_key="k")]
    )

    async def corrupt(tx):
        await tx.execute_raw("UPDATE tasks SET state = 'succeeded' WHERE task_id = %s", (done,))
        await tx.execute_raw("UPDATE resource_keys SET holder_task_id = %s", (done,))

    await db.transaction(corrupt)
    (r,) = await lease_store(db).claim(claim_request(owner, resource_key_support=True))
    assert r.task_id == waiting
