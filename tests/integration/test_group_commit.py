"""Group commit: transition batches of many connections share one transaction."""

from __future__ import annotations

import attrs
import trio
import trio.testing

from orbit_node.domain.errors import DatabaseError, Unavailable
from orbit_node.domain.ownership import FinishItem, LostReason, Outcome
from orbit_node.group_commit.transitions import GroupCommitter

from ..seed import TaskSpec, claim_request, insert_tasks, lease_store, task_row, tenant


async def reservations(db, store, count):
    owner = await tenant(db)
    await insert_tasks(db, owner, [TaskSpec(available_in_s=-1) for _ in range(count)])
    reserved = await store.claim(claim_request(owner, limit=count))
    assert len(reserved) == count
    return [(r.task_id, r.fencing_token) for r in reserved]


class Gate:
    """A store hook that holds the first group's transaction at a lock point until opened."""

    def __init__(self, point):
        self.point = point
        self.reached = trio.Event()
        self.opened = trio.Event()
        self.points = []

    async def __call__(self, point, task_ids):
        self.points.append((point, task_ids))
        if point == self.point and not self.reached.is_set():
            self.reached.set()
            await self.opened.wait()


async def run_while_held(committer, gate, first, later):
    """Submit ``first``, hold its transaction, submit ``later`` meanwhile, then open."""
    answers = {}

    async def submit(name, call):
        try:
            answers[name] = await call()
        except DatabaseError as exc:
            answers[name] = exc

    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        nursery.start_soon(submit, "first", first)
        await gate.reached.wait()
        for name, call in later.items():
            # One at a time: they queue in this order.
            nursery.start_soon(submit, name, call)
            await trio.testing.wait_all_tasks_blocked()
        assert committer.statistics().pending == len(later)
        gate.opened.set()
        while len(answers) < 1 + len(later):
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    return answers


async def test_batches_that_arrive_during_a_commit_share_the_next_transaction(db):
    gate = Gate("start.locked")
    store = lease_store(db, hook=gate)
    pairs = await reservations(db, store, 6)
    committer = GroupCommitter(store)
    lane = committer.for_application("app")
    later = {f"c{i}": (lambda i=i: lane.start_many([pairs[i]])) for i in range(1, 6)}
    answers = await run_while_held(committer, gate, lambda: lane.start_many([pairs[0]]), later)
    stats = committer.statistics()
    # The first batch alone, then the five that waited in one transaction.
    assert (stats.groups, stats.batches, stats.items) == (2, 6, 6)
    assert [p for p, _ in gate.points if p != "claim.locked" and p != "claim.reserved"] == ["start.locked"] * 6
    for name, results in answers.items():
        (result,) = results
        assert result.outcome is Outcome.STARTED and result.ok, name
    for task_id, _ in pairs:
        assert (await task_row(db, task_id))["state"] == "running"


async def test_kinds_mix_in_one_group_and_a_refused_row_never_fails_the_others(db):
    gate = Gate("start.locked")
    store = lease_store(db)
    pairs = await reservations(db, store, 5)
    await store.start_many(pairs[2:4])
    store.hook = gate
    committer = GroupCommitter(store)
    lane = committer.for_application("app")
    stale = (pairs[1][0], "1-0000000000000000")
    later = {
        # One batch with a stale token beside a good row: the good row still starts.
        "mixed": lambda: lane.start_many([stale, pairs[4]]),
        "finish": lambda: lane.finish_many([FinishItem(pairs[2][0], pairs[2][1], '{"ok":1}', None, False)]),
        "renew": lambda: lane.renew_many([pairs[3]]),
    }
    answers = await run_while_held(committer, gate, lambda: lane.start_many([pairs[0]]), later)
    assert committer.statistics().groups == 2
    lost, started = answers["mixed"]
    assert (lost.outcome, lost.lost_reason) == (Outcome.OWNERSHIP_LOST, LostReason.TOKEN_MISMATCH)
    assert started.outcome is Outcome.STARTED
    assert answers["finish"][0].outcome is Outcome.SUCCEEDED
    assert answers["renew"][0].outcome is Outcome.RENEWED
    assert (await task_row(db, pairs[1][0]))["state"] == "reserved"
    assert (await task_row(db, pairs[2][0]))["state"] == "succeeded"
    assert (await task_row(db, pairs[4][0]))["state"] == "running"


async def test_a_batch_naming_a_task_of_the_forming_group_waits_for_the_next_one(db):
    gate = Gate("start.locked")
    store = lease_store(db, hook=gate)
    pairs = await reservations(db, store, 3)
    committer = GroupCommitter(store)
    lane = committer.for_application("app")
    item = FinishItem(pairs[1][0], pairs[1][1], None, None, False)
    later = {
        "start": lambda: lane.start_many([pairs[1]]),
        # Arrives after the start of the same task: decided after it, in the next group.
        "finish": lambda: lane.finish_many([item]),
        "other": lambda: lane.start_many([pairs[2]]),
    }
    answers = await run_while_held(committer, gate, lambda: lane.start_many([pairs[0]]), later)
    assert committer.statistics().groups == 3
    assert answers["start"][0].outcome is Outcome.STARTED
    assert answers["finish"][0].outcome is Outcome.SUCCEEDED
    assert (await task_row(db, pairs[1][0]))["state"] == "succeeded"


@attrs.define
class FailingStore:
    """The real store, except that a group naming ``bad`` fails as a statement error would."""

    store: object
    bad: str
    groups: list = attrs.field(factory=list)

    def __getattr__(self, name):
        return getattr(self.store, name)

    async def transition(self, parts):
        self.groups.append(len(parts))
        if any(key[0] == self.bad for part in parts for key in part.keys()):
            raise DatabaseError("database error 1366: incorrect value", errno=1366)
        return await self.store.transition(parts)


async def test_a_failed_group_runs_its_batches_alone_so_only_the_faulty_one_fails(db):
    gate = Gate("start.locked")
    store = lease_store(db, hook=gate)
    pairs = await reservations(db, store, 4)
    failing = FailingStore(store, bad=pairs[2][0])
    committer = GroupCommitter(failing)
    lane = committer.for_application("app")
    later = {f"c{i}": (lambda i=i: lane.start_many([pairs[i]])) for i in (1, 2, 3)}
    answers = await run_while_held(committer, gate, lambda: lane.start_many([pairs[0]]), later)
    assert isinstance(answers["c2"], DatabaseError)
    assert answers["c3"][0].outcome is Outcome.STARTED
    # The group of three failed, then each ran alone: two committed, one failed.
    assert failing.groups == [1, 3, 1, 1, 1]
    assert committer.statistics().split == 1
    states = [(await task_row(db, task_id))["state"] for task_id, _ in pairs]
    assert states == ["running", "running", "reserved", "running"]


async def test_without_a_running_committer_a_batch_runs_alone(db):
    store = lease_store(db)
    pairs = await reservations(db, store, 2)
    committer = GroupCommitter(store)
    lane = committer.for_application("app")
    results = await lane.start_many(pairs)
    assert [r.outcome for r in results] == [Outcome.STARTED, Outcome.STARTED]
    assert committer.statistics().groups == 0
    assert await lane.start_many([]) == []


async def test_a_batch_cancelled_before_its_group_formed_is_withdrawn(db):
    gate = Gate("start.locked")
    store = lease_store(db, hook=gate)
    pairs = await reservations(db, store, 2)
    committer = GroupCommitter(store)
    lane = committer.for_application("app")
    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        nursery.start_soon(lane.start_many, [pairs[0]])
        await gate.reached.wait()
        with trio.CancelScope() as scope:
            scope.deadline = trio.current_time() + 0.05
            await lane.start_many([pairs[1]])
        assert scope.cancelled_caught
        assert committer.statistics().pending == 0
        gate.opened.set()
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert (await task_row(db, pairs[1][0]))["state"] == "reserved"
    assert committer.statistics().batches == 1


async def test_batches_left_when_the_committer_stops_get_an_error_not_a_hang(db):
    gate = Gate("start.locked")
    store = lease_store(db, hook=gate)
    pairs = await reservations(db, store, 2)
    committer = GroupCommitter(store)
    lane = committer.for_application("app")
    errors = []

    async def submit(pair):
        try:
            await lane.start_many([pair])
        except Unavailable as exc:
            errors.append(exc)

    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as inner:
            await inner.start(committer.run)
            outer.start_soon(submit, pairs[0])
            await gate.reached.wait()
            outer.start_soon(submit, pairs[1])
            await trio.testing.wait_all_tasks_blocked()
            inner.cancel_scope.cancel()
    assert len(errors) == 2


async def test_batches_of_two_applications_never_share_a_transaction(db):
    """The application is the shard key: each group holds one application's batches; the
    lanes of two applications commit side by side, each grouping its own waiting batches."""
    gate = Gate("start.locked")
    store = lease_store(db, hook=gate)
    pairs = await reservations(db, store, 5)
    seen = []

    class Recording:
        def __getattr__(self, name):
            return getattr(store, name)

        async def transition(self, parts):
            seen.append(sorted(key[0] for part in parts for key in part.keys()))
            return await store.transition(parts)

    committer = GroupCommitter(Recording())
    a, b = committer.for_application("a"), committer.for_application("b")
    answers = {}

    async def submit(name, lane, pair):
        answers[name] = await lane.start_many([pair])

    async def until(names):
        while not names <= answers.keys():
            await trio.sleep(0.01)

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(committer.run)
            nursery.start_soon(submit, "a0", a, pairs[0])
            await gate.reached.wait()  # a's first group holds its transaction open
            # Four batches in one scheduler tick: each lane's next group takes its two.
            for name, lane, pair in (
                ("a1", a, pairs[1]),
                ("b2", b, pairs[2]),
                ("a3", a, pairs[3]),
                ("b4", b, pairs[4]),
            ):
                nursery.start_soon(submit, name, lane, pair)
            # b's group commits while a's transaction is still held.
            await until({"b2", "b4"})
            assert "a1" not in answers and "a3" not in answers
            gate.opened.set()
            await until({"a0", "a1", "a3"})
            nursery.cancel_scope.cancel()
    ids = [p[0] for p in pairs]
    assert seen == [[ids[0]], sorted([ids[2], ids[4]]), sorted([ids[1], ids[3]])]
    assert all(results[0].outcome is Outcome.STARTED for results in answers.values())
