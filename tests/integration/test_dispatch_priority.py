"""P3 ordering: dispatch_at = available_at - priority x 30 s, then available_at, then task_id.

Rows are written with chosen available_at values relative to the database clock (one
statement, so one NOW(6)), never by sleeping.
"""

from __future__ import annotations

from datetime import timedelta

import attrs
import pytest

from ..seed import TaskSpec, claim_request, insert_tasks, lease_store, task_row, tenant


async def first_claimed(db, owner) -> str:
    reservations = await lease_store(db).claim(claim_request(owner, limit=1))
    assert len(reservations) == 1
    return reservations[0].task_id


@pytest.mark.parametrize(
    ("a", "b", "winner"),
    [
        # A: level 0 due 5 s ago; B: level 9 just due -> B (270 s ordering advantage).
        (TaskSpec(available_in_s=-5, priority=0), TaskSpec(available_in_s=0, priority=9), "b"),
        # A: level 0 due 271 s ago; B: level 9 just due -> A (waited longer than the advantage).
        (TaskSpec(available_in_s=-271, priority=0), TaskSpec(available_in_s=0, priority=9), "a"),
        # A: level 0 due; B: level 9 due in one hour -> A (B is not eligible yet).
        (TaskSpec(available_in_s=0, priority=0), TaskSpec(available_in_s=3600, priority=9), "a"),
        # Same priority, different available_at -> the one due earlier.
        (TaskSpec(available_in_s=-1, priority=4), TaskSpec(available_in_s=-2, priority=4), "b"),
    ],
    ids=[
        "fresh-level-9-beats-5s-old-level-0",
        "271s-old-level-0-beats-level-9",
        "future-level-9-not-eligible",
        "same-priority-earlier-due-first",
    ],
)
async def test_p3_ordering_table(db, a, b, winner):
    owner = await tenant(db)
    # The expected winner gets the larger task id: the last tie-break would pick the other one.
    ids = {winner: "c" * 32, ("a" if winner == "b" else "b"): "b" * 32}
    await insert_tasks(db, owner, [attrs.evolve(a, task_id=ids["a"]), attrs.evolve(b, task_id=ids["b"])])
    assert await first_claimed(db, owner) == ids[winner]


async def test_future_high_priority_task_is_never_offered(db):
    owner = await tenant(db)
    due, _future = await insert_tasks(
        db, owner, [TaskSpec(available_in_s=0), TaskSpec(available_in_s=3600, priority=9)]
    )
    reservations = await lease_store(db).claim(claim_request(owner, limit=16))
    assert [r.task_id for r in reservations] == [due]


@pytest.mark.parametrize(
    ("level0_age_s", "winner"),
    [(269, "level9"), (270, "level0"), (271, "level0")],
    ids=["269s-level-9-wins", "270s-tie-older-available-at-wins", "271s-level-0-wins"],
)
async def test_wait_compensation_boundary(db, level0_age_s, winner):
    """The 270 s boundary. At exactly 270 s both dispatch_at values are equal; the tie is
    decided by available_at, so the older level-0 task wins (task_id would come third).
    Both rows are written in ONE statement, so they share one NOW(6) and tie exactly."""
    owner = await tenant(db)
    # The level-9 task gets the smaller task id: if the tie fell through to task_id it would win.
    level9, level0 = await insert_tasks(
        db,
        owner,
        [
            TaskSpec(available_in_s=0, priority=9, task_id="1" * 32),
            TaskSpec(available_in_s=-level0_age_s, priority=0, task_id="2" * 32),
        ],
    )
    rows = {t: await task_row(db, t) for t in (level9, level0)}
    if level0_age_s == 270:
        assert rows[level9]["dispatch_at"] == rows[level0]["dispatch_at"]
    assert await first_claimed(db, owner) == {"level9": level9, "level0": level0}[winner]


async def test_exact_tie_on_both_times_falls_to_task_id(db):
    owner = await tenant(db)
    later, earlier = await insert_tasks(
        db, owner, [TaskSpec(task_id="f" * 32, priority=3), TaskSpec(task_id="a" * 32, priority=3)]
    )
    assert await first_claimed(db, owner) == earlier


async def test_claim_returns_a_batch_in_dispatch_order(db):
    owner = await tenant(db)
    ids = await insert_tasks(
        db,
        owner,
        [
            TaskSpec(available_in_s=-10, priority=0),  # dispatch_at -10
            TaskSpec(available_in_s=-1, priority=9),  # dispatch_at -271
            TaskSpec(available_in_s=-100, priority=1),  # dispatch_at -130
            TaskSpec(available_in_s=-5, priority=4),  # dispatch_at -125
        ],
    )
    reservations = await lease_store(db).claim(claim_request(owner, limit=16))
    assert [r.task_id for r in reservations] == [ids[1], ids[2], ids[3], ids[0]]
    assert [r.priority for r in reservations] == [9, 1, 4, 0]


async def test_retry_keeps_the_frozen_priority_and_recomputes_dispatch_at(db):
    owner = await tenant(db)
    (task_id,) = await insert_tasks(
        db, owner, [TaskSpec(priority=5, available_in_s=-1, backoff_initial_ms=60_000, backoff_max_ms=60_000)]
    )
    before = await task_row(db, task_id)
    assert before["dispatch_at"] == before["available_at"] - timedelta(seconds=150)
    store = lease_store(db)
    (reservation,) = await store.claim(claim_request(owner))
    await store.start(task_id, reservation.fencing_token)
    result = await store.finish(
        task_id, reservation.fencing_token, error={"code": "E", "message": "boom"}, retryable=True
    )
    after = await task_row(db, task_id)
    assert after["state"] == "queued"
    assert after["priority"] == 5
    assert after["available_at"] == result.available_at
    # Equal jitter: the 60 s nominal delay lands in [30 s, 60 s] after the finish.
    assert after["available_at"] - after["updated_at"] >= timedelta(seconds=30) - timedelta(milliseconds=5)
    assert after["dispatch_at"] == after["available_at"] - timedelta(seconds=150)
    # Not due again yet: the next claim does not see it.
    assert await store.claim(claim_request(owner)) == []
