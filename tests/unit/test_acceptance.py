"""The acceptance decisions (``orbit_node.domain.acceptance``), without a database."""

from __future__ import annotations

import itertools

import attrs

from orbit_node.domain.acceptance import Create, Record, Repeat, Submission, decide
from orbit_node.domain.errors import IdempotencyConflict, NotFound
from orbit_node.domain.rules import NewTask

QUEUE = "a" * 32
OTHER_QUEUE = "b" * 32
NEW = NewTask(queue_id=QUEUE, handler="h", handler_version="v1", payload_version="v1", payload={})


def ids():
    counter = itertools.count()
    return lambda: f"{next(counter):032x}"


def item(key: str, new: NewTask = NEW, index: int | None = None) -> Submission:
    if index is None:
        return Submission(key, new)
    return Submission(key, new, f"tasks[{index}].idempotency_key", f"tasks[{index}].queue_id")


def test_new_keys_create_and_recorded_keys_repeat_or_conflict():
    changed = attrs.evolve(NEW, priority=9)
    subs = [item("new"), item("same"), item("changed", changed)]
    digests = [s.new.digest() for s in subs]
    records = {"same": Record(NEW.digest(), "1" * 32), "changed": Record(NEW.digest(), "2" * 32)}
    got = decide(subs, digests, records, {QUEUE: "app"}, ids())
    assert got[0] == Create(f"{0:032x}", "app", NEW.digest())
    assert got[1] == Repeat("1" * 32)
    assert isinstance(got[2], IdempotencyConflict) and got[2].field == "Idempotency-Key"


def test_a_key_taken_earlier_in_the_batch_answers_like_a_repeat():
    changed = attrs.evolve(NEW, priority=3)
    subs = [item("k", index=0), item("k", index=1), item("k", changed, index=2)]
    got = decide(subs, [s.new.digest() for s in subs], {}, {QUEUE: "app"}, ids())
    assert isinstance(got[0], Create)
    assert got[1] == Repeat(got[0].task_id)
    assert isinstance(got[2], IdempotencyConflict)
    assert got[2].field == "tasks[2].idempotency_key" and got[2].message.startswith("tasks[2].idempotency_key: ")


def test_an_unknown_queue_is_refused_and_takes_no_key():
    elsewhere = attrs.evolve(NEW, queue_id=OTHER_QUEUE)
    subs = [item("k", elsewhere, index=0), item("k", index=1)]
    got = decide(subs, [s.new.digest() for s in subs], {}, {QUEUE: "app"}, ids())
    assert isinstance(got[0], NotFound) and got[0].field == "tasks[0].queue_id"
    assert OTHER_QUEUE in got[0].message
    assert isinstance(got[1], Create)


def test_a_replay_is_answered_before_the_queue_is_looked_at():
    # As the single submit always did: a recorded key answers even if the queue is unknown now.
    subs = [item("k")]
    got = decide(subs, [NEW.digest()], {"k": Record(NEW.digest(), "3" * 32)}, {}, ids())
    assert got == [Repeat("3" * 32)]
