"""depends_on in the database: acceptance, release in the parent's Finish, the failure
cascade, concurrency (a child released exactly once; a Finish and a child's submit at
once), and retention keeping parents."""

from __future__ import annotations

import functools

import trio

from orbit_node.domain.acceptance import Submission
from orbit_node.domain.errors import NotFound
from orbit_node.domain.ownership import Outcome
from orbit_node.domain.rules import NewTask
from orbit_node.store.dependencies import DependencyStore
from orbit_node.store.tasks import TaskStore

from ..seed import claim_request, lease_store, task_row, tenant


def new(owner, *, depends_on=(), depends_on_keys=(), **extra) -> NewTask:
    return NewTask(
        queue_id=owner.queue_id,
        handler="h",
        handler_version="v1",
        payload_version="v1",
        payload={},
        depends_on=tuple(depends_on),
        depends_on_keys=tuple(depends_on_keys),
        **extra,
    )


async def submit(tasks: TaskStore, owner, key: str, **spec) -> str:
    accepted = await tasks.submit(owner.namespace_id, key, new(owner, **spec))
    return accepted.task.task_id


async def run_to_end(db, store, owner, task_ids, *, error=None) -> list:
    """Claim, start and finish exactly these tasks (they must be the queue's due ones)."""
    reservations = await store.claim(claim_request(owner, limit=len(task_ids)))
    assert sorted(r.task_id for r in reservations) == sorted(task_ids)
    results = []
    for r in reservations:
        await store.start(r.task_id, r.fencing_token)
        if error is None:
            results.append(await store.finish(r.task_id, r.fencing_token, result_json="{}"))
        else:
            results.append(await store.finish(r.task_id, r.fencing_token, error=error, retryable=False))
    return results


async def states(db, *task_ids) -> list[str]:
    return [(await task_row(db, t))["state"] for t in task_ids]


async def test_a_child_waits_for_every_parent_and_is_released_by_the_last_finish(db):
    owner = await tenant(db)
    tasks, store = TaskStore(db), lease_store(db)
    a = await submit(tasks, owner, "a")
    b = await submit(tasks, owner, "b")
    child = await submit(tasks, owner, "child", depends_on=[a, b])
    assert await states(db, a, b, child) == ["queued", "queued", "waiting"]
    # The waiting child is never claimed.
    (ra,) = await store.claim(claim_request(owner, limit=1))
    assert ra.task_id == a
    await store.start(a, ra.fencing_token)
    done = await store.finish(a, ra.fencing_token, result_json='{"n": 1}')
    assert done.outcome is Outcome.SUCCEEDED and done.released == ()
    assert await states(db, child) == ["waiting"]
    (rb,) = await store.claim(claim_request(owner, limit=4))
    assert rb.task_id == b
    await store.start(b, rb.fencing_token)
    done = await store.finish(b, rb.fencing_token, result_json="{}")
    assert [q for q, _, _ in done.released] == [owner.queue_id]
    row = await task_row(db, child)
    assert row["state"] == "queued" and row["available_at"] >= (await task_row(db, b))["started_at"]
    (rc,) = await store.claim(claim_request(owner, limit=4))
    assert rc.task_id == child


async def test_parents_that_succeeded_already_count_as_met(db):
    owner = await tenant(db)
    tasks, store = TaskStore(db), lease_store(db)
    a = await submit(tasks, owner, "a")
    await run_to_end(db, store, owner, [a])
    child = await submit(tasks, owner, "child", depends_on=[a])
    assert await states(db, child) == ["queued"]


async def test_unknown_parent_and_another_applications_task_are_refused_naming_the_field(db):
    owner = await tenant(db)
    other = await tenant(db, application="other")
    tasks = TaskStore(db)
    theirs = await submit(tasks, other, "theirs")
    for parent in ("f" * 32, theirs):
        (outcome,) = await tasks.submit_many(
            owner.namespace_id, [Submission("k", new(owner, depends_on=[parent]), field_prefix="tasks[0].")]
        )
        assert isinstance(outcome, NotFound) and outcome.field == "tasks[0].depends_on[0]", outcome


async def test_a_batch_is_a_graph_and_resubmitting_it_creates_nothing_twice(db):
    owner = await tenant(db)
    tasks = TaskStore(db)
    graph = [
        Submission("p1", new(owner)),
        Submission("p2", new(owner)),
        Submission("join", new(owner, depends_on_keys=["p1", "p2"])),
    ]
    first = await tasks.submit_many(owner.namespace_id, graph)
    p1, p2, join = (o.task.task_id for o in first)
    assert [o.created for o in first] == [True, True, True]
    assert first[2].task.state == "waiting" and set(first[2].parents) == {p1, p2}
    again = await tasks.submit_many(owner.namespace_id, graph)
    assert [o.task.task_id for o in again] == [p1, p2, join]
    assert [o.created for o in again] == [False, False, False]
    assert set(again[2].parents) == {p1, p2}
    # A key repeated in the batch that creates it: the repeat answers the same task, with
    # its parents listed once.
    twice = [Submission("p3", new(owner)), *[Submission("join2", new(owner, depends_on_keys=["p3"]))] * 2]
    p3, join2, join2_again = await tasks.submit_many(owner.namespace_id, twice)
    assert join2.created and not join2_again.created and join2_again.task.task_id == join2.task.task_id
    assert join2.parents == join2_again.parents == (p3.task.task_id,)
    # A key no earlier item took is refused, naming it.
    (bad,) = await tasks.submit_many(
        owner.namespace_id, [Submission("x", new(owner, depends_on_keys=["nope"]), field_prefix="tasks[0].")]
    )
    assert isinstance(bad, NotFound) and bad.field == "tasks[0].depends_on_keys[0]"


async def test_a_failed_parent_cancels_its_waiting_children_level_by_level(db):
    owner = await tenant(db)
    tasks, store = TaskStore(db), lease_store(db)
    parent = await submit(tasks, owner, "p")
    other = await submit(tasks, owner, "o")
    child = await submit(tasks, owner, "c", depends_on=[parent, other])
    grandchild = await submit(tasks, owner, "g", depends_on=[child])
    reservations = await store.claim(claim_request(owner, limit=1))
    assert [r.task_id for r in reservations] == [parent]
    (r,) = reservations
    await store.start(parent, r.fencing_token)
    failed = await store.finish(parent, r.fencing_token, error={"code": "E", "message": "no"}, retryable=False)
    assert failed.outcome is Outcome.FAILED
    assert await states(db, child, grandchild) == ["waiting", "waiting"]
    cascade = DependencyStore(db)
    first = await cascade.cancel_children()
    assert first.cancelled == 1 and first.saturated
    second = await cascade.cancel_children()
    assert second.cancelled == 1
    assert (await cascade.cancel_children()).cancelled == 0
    assert await states(db, child, grandchild, other) == ["cancelled", "cancelled", "queued"]
    error = (await task_row(db, child))["error"]
    assert '"code":"DEPENDENCY_FAILED"' in error and parent in error
    assert child in (await task_row(db, grandchild))["error"]
    # A child submitted after the failure is cancelled at once.
    late = await submit(tasks, owner, "late", depends_on=[parent])
    assert await states(db, late) == ["cancelled"]
    # The other parent's success releases nothing now.
    done = await run_to_end(db, store, owner, [other])
    assert done[0].released == ()


async def test_cancelling_a_waiting_task_cancels_it_at_once_and_its_children_after_it(db):
    owner = await tenant(db)
    tasks = TaskStore(db)
    parent = await submit(tasks, owner, "p")
    child = await submit(tasks, owner, "c", depends_on=[parent])
    grandchild = await submit(tasks, owner, "g", depends_on=[child])
    cancelled = await tasks.cancel(owner.namespace_id, child)
    assert cancelled.state == "cancelled"
    assert (await DependencyStore(db).cancel_children()).cancelled == 1
    assert await states(db, parent, grandchild) == ["queued", "cancelled"]


async def test_parents_finishing_at_once_on_several_connections_release_the_child_exactly_once(db):
    owner = await tenant(db)
    tasks, store = TaskStore(db), lease_store(db)
    parents = [await submit(tasks, owner, f"p{i}") for i in range(8)]
    child = await submit(tasks, owner, "c", depends_on=parents)
    reservations = await store.claim(claim_request(owner, limit=8))
    for r in reservations:
        await store.start(r.task_id, r.fencing_token)
    released = []

    async def finish(r):
        result = await store.finish(r.task_id, r.fencing_token, result_json="{}")
        released.extend(result.released)

    async with trio.open_nursery() as nursery:
        for r in reservations:
            nursery.start_soon(finish, r)
    assert len(released) == 1
    assert await states(db, child) == ["queued"]
    rows = await db.run(lambda tx: tx.fetchall_raw("SELECT * FROM task_waits WHERE task_id = %s", (child,)))
    assert rows == []


async def test_a_finish_and_a_childs_submit_at_once_count_the_child_once(db):
    """Whichever commits first, the child ends queued (never stuck waiting, never run early)."""
    owner = await tenant(db)
    tasks, store = TaskStore(db), lease_store(db)
    for round_ in range(10):
        parent = await submit(tasks, owner, f"p{round_}")
        (r,) = await store.claim(claim_request(owner, limit=1))
        await store.start(r.task_id, r.fencing_token)
        children: list[str] = []

        async def add_child(parent=parent, round_=round_, children=children):
            children.append(await submit(tasks, owner, f"c{round_}", depends_on=[parent]))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(add_child)
            nursery.start_soon(functools.partial(store.finish, r.task_id, r.fencing_token, result_json="{}"))
        assert await states(db, children[0]) == ["queued"]
        await run_to_end(db, store, owner, children)


async def test_retention_keeps_a_parent_while_a_child_has_not_finished(db):
    from orbit_node.domain.retention import RetentionClass
    from orbit_node.store.pruning import PruneStore

    owner = await tenant(db)
    tasks, store = TaskStore(db), lease_store(db)
    a = await submit(tasks, owner, "a")
    b = await submit(tasks, owner, "b")
    child = await submit(tasks, owner, "c", depends_on=[a, b])
    await run_to_end(db, store, owner, [a])
    # Finished long ago, as far as retention is concerned.
    await db.run(
        lambda tx: tx.execute_raw("UPDATE tasks SET finished_at = NOW(6) - INTERVAL 10 DAY WHERE task_id = %s", (a,))
    )
    pruner = PruneStore(db)
    batch = await pruner.prune_tasks(owner.application_id, RetentionClass.SUCCEEDED, 3600, 100)
    assert batch.stats.tasks == 0
    assert (await task_row(db, a))["state"] == "succeeded"
    await run_to_end(db, store, owner, [b])
    await run_to_end(db, store, owner, [child])
    batch = await pruner.prune_tasks(owner.application_id, RetentionClass.SUCCEEDED, 3600, 100)
    assert batch.stats.tasks == 1


async def test_explain_says_how_many_parents_a_waiting_task_waits_for(db):
    from orbit_node.store.explain import read_explanation

    owner = await tenant(db)
    tasks, store = TaskStore(db), lease_store(db)
    a, b, c = [await submit(tasks, owner, key) for key in "abc"]
    child = await submit(tasks, owner, "child", depends_on=[a, b, c])
    reservations = await store.claim(claim_request(owner, limit=1))
    (r,) = reservations
    await store.start(r.task_id, r.fencing_token)
    await store.finish(r.task_id, r.fencing_token, result_json="{}")
    explained = await read_explanation(db, owner.namespace_id, child)
    (reason,) = explained["reasons"]
    pending = sorted({a, b, c} - {r.task_id})
    assert reason["code"] == "WAITING_FOR_PARENTS"
    assert reason["message"] == f"waiting for 2 of 3 parents: {pending[0]}, {pending[1]}"
    assert reason["pending_parents"] == pending
