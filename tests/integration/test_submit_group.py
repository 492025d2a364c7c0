"""Single submits share transactions (``orbit_node.group_commit.submits``), each keeping its
own idempotency record and its own answer; nothing acknowledged is lost."""

from __future__ import annotations

import attrs
import httpx
import trio
import trio.testing

from harness.nodeproc import NodeProcess
from orbit_node.domain.errors import IdempotencyConflict, NotFound
from orbit_node.domain.rules import NewTask
from orbit_node.group_commit.submits import SubmitGroups
from orbit_node.store.tasks import TaskStore

from ..checks import rows
from ..helpers import wait_until
from ..nodeutil import make_tenant
from ..seed import tenant


def new_task(queue_id: str, **extra) -> NewTask:
    return NewTask(queue_id=queue_id, handler="h", handler_version="v1", payload_version="v1", payload={}, **extra)


@attrs.define
class HeldFirst:
    """The real TaskStore, whose first ``submit_many`` waits (before its transaction) until
    ``opened``: what arrives meanwhile must form the next group."""

    store: TaskStore
    reached: trio.Event = attrs.Factory(trio.Event)
    opened: trio.Event = attrs.Factory(trio.Event)
    calls: list[list[str]] = attrs.Factory(list)

    async def submit_many(self, namespace_id, submissions, **kwargs):
        self.calls.append([s.idempotency_key for s in submissions])
        if len(self.calls) == 1:
            self.reached.set()
            await self.opened.wait()
        return await self.store.submit_many(namespace_id, submissions, **kwargs)


async def test_submits_that_arrive_during_a_transaction_share_the_next_with_their_own_answers(db):
    owner = await tenant(db)
    store = TaskStore(db)
    earlier = await store.submit(owner.namespace_id, "taken", new_task(owner.queue_id))
    held = HeldFirst(store)
    groups = SubmitGroups(held)  # type: ignore[arg-type]
    answers: dict[str, object] = {}

    async def accept(name, key, new):
        try:
            answers[name] = await groups.accept(owner.namespace_id, key, new)
        except (NotFound, IdempotencyConflict) as exc:
            answers[name] = exc

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(groups.run)
            nursery.start_soon(accept, "first", "k-first", new_task(owner.queue_id))
            await held.reached.wait()
            later = {
                "created": ("k-1", new_task(owner.queue_id, priority=3)),
                "twin-a": ("k-twin", new_task(owner.queue_id)),
                "twin-b": ("k-twin", new_task(owner.queue_id)),
                "no-queue": ("k-2", new_task("f" * 32)),
                "changed": ("taken", new_task(owner.queue_id, priority=9)),
                "repeat": ("taken", new_task(owner.queue_id)),
            }
            for name, (key, new) in later.items():
                nursery.start_soon(accept, name, key, new)
                await trio.testing.wait_all_tasks_blocked()
            held.opened.set()
            while len(answers) < 1 + len(later):
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    # One transaction for the first, one for all six that came while it ran.
    assert held.calls == [["k-first"], ["k-1", "k-twin", "k-twin", "k-2", "taken", "taken"]]
    assert groups.statistics().groups == 2 and groups.statistics().items == 7
    assert answers["first"].created and answers["created"].created
    assert answers["created"].task.priority == 3
    assert answers["twin-a"].created and not answers["twin-b"].created
    assert answers["twin-a"].task.task_id == answers["twin-b"].task.task_id
    assert isinstance(answers["no-queue"], NotFound) and answers["no-queue"].field == "queue_id"
    assert isinstance(answers["changed"], IdempotencyConflict) and answers["changed"].field == "Idempotency-Key"
    assert not answers["repeat"].created and answers["repeat"].task.task_id == earlier.task.task_id
    stored = await rows(db, "SELECT idempotency_key, task_id FROM idempotency_records ORDER BY idempotency_key")
    assert {r["idempotency_key"]: r["task_id"] for r in stored} == {
        "k-1": answers["created"].task.task_id,
        "k-first": answers["first"].task.task_id,
        "k-twin": answers["twin-a"].task.task_id,
        "taken": earlier.task.task_id,
    }
    assert len(await rows(db, "SELECT task_id FROM tasks")) == 4


async def test_concurrent_http_submits_of_a_node_share_transactions(running_node, db):
    """Through the node: 48 submits at once answer 201 each, in fewer transactions."""
    t = await make_tenant(db)
    body = {"queue_id": t.queue_id, "handler": "h", "handler_version": "v1", "payload_version": "v1", "payload": {}}
    groups = running_node.node.state.services.shards.main.submits
    before = groups.statistics()
    statuses = []
    async with running_node.client(t.token) as client:

        async def one(i):
            answer = await client.post("/v1/tasks", json=body, headers={"Idempotency-Key": f"k-{i}"})
            statuses.append(answer.status_code)

        async with trio.open_nursery() as nursery:
            for i in range(48):
                nursery.start_soon(one, i)
    after = groups.statistics()
    assert statuses == [201] * 48
    assert after.items - before.items == 48
    assert after.groups - before.groups < 48
    assert len(await rows(db, "SELECT task_id FROM tasks")) == 48


async def test_a_node_killed_while_submits_group_loses_nothing_it_acknowledged(dsn, db, tmp_path):
    """SIGKILL a node while 64 clients submit: every 201 answered has its task; after a
    restart each key's retry finds exactly one task (200) or creates it (201)."""
    t = await make_tenant(db, "crash")
    body = {"queue_id": t.queue_id, "handler": "h", "handler_version": "v1", "payload_version": "v1", "payload": {}}
    headers = {"Authorization": f"Bearer {t.token}"}
    node = NodeProcess(dsn, tmp_path / "node.log")
    await node.start()
    acknowledged: dict[str, str] = {}
    try:
        with trio.fail_after(60):
            async with httpx.AsyncClient(base_url=node.base_url, timeout=30, headers=headers) as http:

                async def client(c):
                    for i in range(1000):
                        key = f"c{c}-{i}"
                        try:
                            answer = await http.post("/v1/tasks", json=body, headers={"Idempotency-Key": key})
                        except httpx.TransportError:
                            return
                        assert answer.status_code == 201, answer.text
                        acknowledged[key] = answer.json()["data"]["task_id"]

                async with trio.open_nursery() as nursery:
                    for c in range(64):
                        nursery.start_soon(client, c)
                    await wait_until(lambda: len(acknowledged) >= 300)
                    await node.kill()
            stored = {r["idempotency_key"]: r["task_id"] for r in await rows(db, "SELECT * FROM idempotency_records")}
            assert {key: stored.get(key) for key in acknowledged} == acknowledged
            await node.start()
            async with httpx.AsyncClient(base_url=node.base_url, timeout=30, headers=headers) as http:
                keys = sorted({f"c{c}-{i}" for c in range(64) for i in range(3)} | set(stored))
                for key in keys:
                    answer = await http.post("/v1/tasks", json=body, headers={"Idempotency-Key": key})
                    assert answer.status_code == (200 if key in stored else 201), (key, answer.text)
                    if key in stored:
                        assert answer.json()["data"]["task_id"] == stored[key]
            tasks = await rows(db, "SELECT COUNT(*) AS n FROM tasks")
            assert tasks[0]["n"] == len(keys)
    finally:
        await node.aclose()


async def test_a_group_of_submits_is_two_round_trips(db, dsn):
    """The idempotency records and the queues are read in one packet; the records and the
    tasks are written with the COMMIT (the old transaction took five)."""
    from orbit_node.db import Database
    from orbit_node.domain.acceptance import Submission

    owner = await tenant(db)
    one = Database(dsn, size=1)
    try:

        async def commands(tx):
            return tx.commands

        store = TaskStore(one)
        submissions = [Submission(f"k-{i}", new_task(owner.queue_id, priority=i % 3)) for i in range(8)]
        before = await one.run(commands)
        accepted = await store.submit_many(owner.namespace_id, submissions)
        assert await one.run(commands) - before == 2
        assert [a.created for a in accepted] == [True] * 8
        # Each is stored and answered under its own key; the same requests again are repeats.
        again = await store.submit_many(owner.namespace_id, submissions)
        assert [(a.created, a.task.task_id) for a in again] == [(False, a.task.task_id) for a in accepted]
        stored = await rows(db, "SELECT COUNT(*) AS n FROM tasks WHERE namespace_id = %s", owner.namespace_id)
        assert stored == [{"n": 8}]
    finally:
        await one.aclose()
