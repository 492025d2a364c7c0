"""Running work belongs to its fencing tokens, not to one connection, at the level of raw
frames (docs/worker-protocol.md, "Re-attaching running tasks"): a hello that presents
running tasks, a Finish repeated after its ack was lost, the node's drain, the Worker's
drain, and the renew of a reservation."""

from __future__ import annotations

import pytest
import trio
from trio_websocket import ConnectionClosed

from orbit_node.services import default_services

from .. import seed
from ..checks import tenant_with_token
from ..nodeutil import run_node
from ..wsclient import raw_worker

pytestmark = pytest.mark.time_cap(60)


async def dispatched(w, count: int) -> list[dict]:
    """References (task id and token) of the next ``count`` dispatched tasks."""
    tasks: list[dict] = []
    while len(tasks) < count:
        tasks += (await w.recv_type("dispatch"))["tasks"]
    return [{"task_id": t["task_id"], "token": t["token"]} for t in tasks]


async def started(w, count: int = 1) -> list[dict]:
    """The next ``count`` dispatched tasks, started."""
    refs = await dispatched(w, count)
    assert all(r["ok"] for r in (await w.request("start", refs, "start"))["results"])
    return refs


async def started_task(w, owner) -> dict:
    return (await started(w))[0]


async def test_a_new_connection_re_attaches_running_tasks_and_refuses_the_others_one_by_one(node_config, db):
    owner, token = await tenant_with_token(db)
    other, other_token = await tenant_with_token(db, application="other")
    running, lapsed = [await seed.insert_task(db, owner) for _ in range(2)]
    foreign = await seed.insert_task(db, other)
    async with run_node(node_config, services=default_services()) as node:
        async with raw_worker(node.base_url, token) as first:
            await first.hello([owner.queue_id], capacity=2)
            refs = await started(first, 2)
        async with raw_worker(node.base_url, other_token) as w:
            await w.hello([other.queue_id])
            foreign_ref = await started_task(w, other)
        by_id = {r["task_id"]: r for r in refs}
        assert set(by_id) == {running, lapsed}
        await seed.expire_lease(db, lapsed)
        unknown = {"task_id": "f" * 32, "token": "1-" + "0" * 16}
        presented = [by_id[running], by_id[lapsed], unknown, foreign_ref]
        async with raw_worker(node.base_url, token) as stale:
            await stale.hello([owner.queue_id], tasks=[{"task_id": running, "token": "9-" + "0" * 16}])
            refused = (await stale.recv_type("ack"))["results"]
            assert refused == [{"task_id": running, "ok": False, "code": "OWNERSHIP_LOST", "state": "running"}]
        async with raw_worker(node.base_url, token) as again:
            welcome = await again.hello([owner.queue_id], capacity=4, tasks=presented)
            ack = await again.recv_type("ack")
            assert ack["of"] == "attach" and "id" not in ack
            results = {r["task_id"]: r for r in ack["results"]}
            assert results[running]["ok"] and results[running]["state"] == "running"
            assert "lease_expires_at" in results[running] and results[running]["cancel_requested"] is False
            assert results[lapsed] == {"task_id": lapsed, "ok": False, "code": "OWNERSHIP_LOST", "state": "running"}
            assert results[unknown["task_id"]] == {"task_id": unknown["task_id"], "ok": False, "code": "OWNERSHIP_LOST"}
            # Another application's task is answered as one that does not exist.
            assert results[foreign] == {"task_id": foreign, "ok": False, "code": "OWNERSHIP_LOST"}
            assert len(ack["results"]) == 4
            row = await seed.task_row(db, running)
            assert row["connection_id"] == welcome["connection_id"]
            # Adopted: renewed and finished through this connection.
            renewed = await again.request("renew", [by_id[running]], "r1")
            assert renewed["results"][0]["ok"]
            done = await again.request("finish", [{**by_id[running], "outcome": "succeeded", "result": 7}], "f1")
            assert done["results"][0] == {"task_id": running, "ok": True, "state": "succeeded"}
        row = await seed.task_row(db, running)
        assert (row["state"], row["attempts"]) == ("succeeded", 1)
        # The lapsed one is the sweeper's, as any expired lease.
        assert (await seed.task_row(db, lapsed))["state"] in ("running", "queued")


async def test_adopted_tasks_count_against_capacity(node_config, db):
    owner, token = await tenant_with_token(db)
    first_task = await seed.insert_task(db, owner)
    async with run_node(node_config, services=default_services()) as node:
        async with raw_worker(node.base_url, token) as first:
            await first.hello([owner.queue_id])
            ref = await started_task(first, owner)
        assert ref["task_id"] == first_task
        second_task = await seed.insert_task(db, owner)
        async with raw_worker(node.base_url, token) as again:
            await again.hello([owner.queue_id], capacity=1, tasks=[ref])
            assert (await again.recv_type("ack"))["results"][0]["ok"]
            # Full with the adopted task: nothing is dispatched until it finishes.
            with trio.move_on_after(1.5):
                await again.recv_type("dispatch")
                pytest.fail("a task was dispatched beyond the capacity")
            await again.request("finish", [{**ref, "outcome": "succeeded"}], "f1")
            assert (await again.recv_type("dispatch"))["tasks"][0]["task_id"] == second_task


@pytest.mark.parametrize(
    ("count", "twice", "field"), [(3, False, "tasks"), (2, True, "tasks[1].task_id")], ids=["over-capacity", "twice"]
)
async def test_a_hello_presenting_too_many_tasks_or_one_twice_is_refused_naming_the_field(
    node_config, db, count, twice, field
):
    owner, token = await tenant_with_token(db)
    refs = [{"task_id": f"{0 if twice else n:032x}", "token": f"1-{n:016x}"} for n in range(count)]
    async with run_node(node_config, services=default_services()) as node, raw_worker(node.base_url, token) as w:
        await w.send(
            {
                "type": "hello",
                "queues": [owner.queue_id],
                "capabilities": [{"handler": "h", "handler_version": "v1", "payload_version": "v1"}],
                "capacity": 2,
                "tasks": refs,
            }
        )
        error = await w.recv_type("error")
        assert (error["code"], error["field"]) == ("INVALID_MESSAGE", field)


async def test_a_finish_repeated_on_a_later_connection_is_answered_with_the_recorded_outcome(node_config, db):
    owner, token = await tenant_with_token(db)
    task_id = await seed.insert_task(db, owner)
    async with run_node(node_config, services=default_services()) as node:
        async with raw_worker(node.base_url, token) as first:
            await first.hello([owner.queue_id])
            ref = await started_task(first, owner)
            finish = [{**ref, "outcome": "succeeded", "result": {"n": 1}}]
            assert (await first.request("finish", finish, "f1"))["results"][0]["ok"]
            # Repeated in a later message on the same connection: the recorded outcome.
            again = await first.request("finish", finish, "f2")
            assert again["results"][0] == {"task_id": task_id, "ok": True, "state": "succeeded"}
        async with raw_worker(node.base_url, token) as later:
            await later.hello([owner.queue_id])
            repeat = await later.request("finish", [{**ref, "outcome": "failed", "error": {"message": "x"}}], "f3")
            assert repeat["results"][0] == {"task_id": task_id, "ok": True, "state": "succeeded"}
            # A token that never finished, on a connection that does not hold it: NOT_HELD.
            other = await seed.insert_task(db, owner)
            assert (await later.recv_type("dispatch"))["tasks"][0]["task_id"] == other
            unheld = {"task_id": other, "token": "1-" + "0" * 16, "outcome": "succeeded"}
            refused = await later.request("finish", [unheld], "f4")
            assert refused["results"][0] == {"task_id": other, "ok": False, "code": "NOT_HELD"}
    row = await seed.task_row(db, task_id)
    assert (row["state"], row["result"]) == ("succeeded", '{"n":1}')


async def test_a_reservation_is_not_renewed_and_a_finish_before_start_is_the_wrong_state(node_config, db):
    owner, token = await tenant_with_token(db)
    task_id = await seed.insert_task(db, owner)
    async with run_node(node_config, services=default_services()) as node:
        async with raw_worker(node.base_url, token) as w:
            await w.hello([owner.queue_id])
            dispatched = (await w.recv_type("dispatch"))["tasks"][0]
            ref = {"task_id": task_id, "token": dispatched["token"]}
            before = (await seed.task_row(db, task_id))["lease_expires_at"]
            renew = await w.request("renew", [ref], "r1")
            assert renew["results"][0] == {"task_id": task_id, "ok": False, "code": "WRONG_STATE"}
            finish = await w.request("finish", [{**ref, "outcome": "succeeded"}], "f1")
            assert finish["results"][0] == {"task_id": task_id, "ok": False, "code": "WRONG_STATE"}
            assert (await seed.task_row(db, task_id))["lease_expires_at"] == before
            # Still held: it can be started.
            assert (await w.request("start", [ref], "s1"))["results"][0]["ok"]


async def test_a_worker_s_drain_is_acknowledged_and_the_node_closes_once_nothing_is_held(node_config, db):
    owner, token = await tenant_with_token(db)
    await seed.insert_task(db, owner)
    async with run_node(node_config, services=default_services()) as node:
        async with raw_worker(node.base_url, token) as w:
            await w.hello([owner.queue_id])
            ref = await started_task(w, owner)
            await w.send({"type": "drain"})
            assert await w.recv_type("ack") == {"type": "ack", "of": "drain", "results": []}
            # Repeated: acknowledged again; the connection stays while a task is held.
            await w.send({"type": "drain", "reason": "deploy"})
            assert await w.recv_type("ack") == {"type": "ack", "of": "drain", "results": []}
            await w.request("finish", [{**ref, "outcome": "succeeded"}], "f1")
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await w.recv()
            assert closed.value.reason.code == 1000


async def test_the_node_s_drain_says_why_releases_reservations_at_once_and_keeps_running_leases(node_config, db):
    owner, token = await tenant_with_token(db)
    first, second = await seed.insert_task(db, owner), await seed.insert_task(db, owner)
    node_cm = run_node(node_config, services=default_services())
    async with node_cm as node, raw_worker(node.base_url, token) as w:
        await w.hello([owner.queue_id], capacity=2)
        refs = {r["task_id"]: r for r in await dispatched(w, 2)}
        assert (await w.request("start", [refs[first]], "s1"))["results"][0]["ok"]
        lease = (await seed.task_row(db, first))["lease_expires_at"]
        node.node.request_shutdown()
        assert await w.recv_type("drain") == {"type": "drain", "reason": "shutdown"}

        async def released() -> bool:
            return (await seed.task_row(db, second))["state"] == "queued"

        with trio.fail_after(5):
            while not await released():
                await trio.sleep(0.05)
        row = await seed.task_row(db, first)
        assert (row["state"], row["lease_expires_at"]) == ("running", lease)
        # A Start of the released reservation is refused.
        late = await w.request("start", [refs[second]], "s2")
        assert late["results"][0]["ok"] is False


async def test_a_running_task_is_told_when_its_deadline_passes_and_a_failed_finish_then_ends_expired(node_config, db):
    """A deadline bounds the run as well as the start: the Worker is told at the deadline
    (the node's own timer, not the next renew), and the attempt's failure ends the task
    ``expired`` whatever its retryable flag; the run lease here is far longer."""
    owner, token = await tenant_with_token(db)
    task_id = await seed.insert_task(db, owner, deadline_in_s=1.5, max_attempts=5)
    async with run_node(node_config, services=default_services()) as node:
        async with raw_worker(node.base_url, token) as w:
            welcome = await w.hello([owner.queue_id])
            assert welcome["run_lease_s"] >= 30
            ref = await started_task(w, owner)
            began = trio.current_time()
            cancel = await w.recv_type("cancel")
            waited = trio.current_time() - began
            assert cancel["tasks"] == [{"task_id": task_id, "reason": "deadline"}]
            assert 0.5 < waited < 3.0, waited
            failed = {**ref, "outcome": "failed", "retryable": False, "error": {"code": "CANCELLED", "message": "x"}}
            ack = await w.request("finish", [failed], "f1")
            assert ack["results"][0] == {"task_id": task_id, "ok": True, "state": "expired"}
