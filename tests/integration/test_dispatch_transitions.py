"""Start, renew, finish and release: compare-and-set on (task, fencing token, state, lease)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from orbit_node.domain.errors import FailedPrecondition
from orbit_node.domain.ownership import FinishItem, LostReason, Outcome, OwnershipLost

from ..seed import (
    TaskSpec,
    attempt_rows,
    claim_request,
    expire_lease,
    insert_task,
    insert_tasks,
    lease_store,
    task_row,
    tenant,
)


async def reserved(db, store, **spec):
    owner = await tenant(db)
    task_id = await insert_task(db, owner, available_in_s=-1, **spec)
    (r,) = await store.claim(claim_request(owner, resource_key_support=True))
    assert r.task_id == task_id
    return owner, r


async def running(db, store, **spec):
    owner, r = await reserved(db, store, **spec)
    await store.start(r.task_id, r.fencing_token)
    return owner, r


async def holder_of(db, key):
    rows = await db.run(
        lambda tx: tx.fetchall_raw("SELECT holder_task_id FROM resource_keys WHERE resource_key = %s", (key,))
    )
    return rows[0]["holder_task_id"]


async def test_start_moves_reserved_to_running_with_a_run_lease(db):
    store = lease_store(db, run_lease_s=45)
    _, r = await reserved(db, store)
    result = await store.start(r.task_id, r.fencing_token)
    assert result.outcome is Outcome.STARTED and not result.duplicate
    assert (result.ok, result.state, result.code) == (True, "running", None)
    row = await task_row(db, r.task_id)
    assert (row["state"], row["attempts"]) == ("running", 1)
    assert row["lease_expires_at"] == result.lease_expires_at == row["started_at"] + timedelta(seconds=45)
    (attempt,) = await attempt_rows(db, r.task_id)
    assert attempt["started_at"] == row["started_at"]
    again = await store.start(r.task_id, r.fencing_token)
    assert again.outcome is Outcome.STARTED and again.duplicate
    assert (await task_row(db, r.task_id))["attempts"] == 1


async def test_ownership_lost_is_a_typed_failed_precondition(db):
    store = lease_store(db)
    _, r = await reserved(db, store)
    with pytest.raises(OwnershipLost) as info:
        await store.start(r.task_id, "1-0000000000000000")
    assert isinstance(info.value, FailedPrecondition)
    assert info.value.code == "OWNERSHIP_LOST"
    assert info.value.reason is LostReason.TOKEN_MISMATCH
    assert (await task_row(db, r.task_id))["state"] == "reserved"
    with pytest.raises(OwnershipLost) as info:
        await store.finish("f" * 32, r.fencing_token)
    assert info.value.reason is LostReason.NOT_FOUND


async def test_batch_forms_return_one_outcome_per_item(db):
    store = lease_store(db)
    owner = await tenant(db)
    await insert_tasks(db, owner, [TaskSpec(available_in_s=-1) for _ in range(3)])
    r1, r2, r3 = await store.claim(claim_request(owner))
    results = await store.start_many(
        [
            (r1.task_id, r1.fencing_token),
            (r2.task_id, "stale"),
            ("0" * 32, "x"),
            (r3.task_id, r3.fencing_token),
            (r1.task_id, r1.fencing_token),
        ]
    )
    assert [x.outcome for x in results] == [
        Outcome.STARTED,
        Outcome.OWNERSHIP_LOST,
        Outcome.OWNERSHIP_LOST,
        Outcome.STARTED,
        Outcome.STARTED,
    ]
    assert [x.lost_reason for x in results[1:3]] == [LostReason.TOKEN_MISMATCH, LostReason.NOT_FOUND]
    assert [(x.ok, x.code, x.state) for x in results[1:3]] == [
        (False, "OWNERSHIP_LOST", "reserved"),
        (False, "OWNERSHIP_LOST", None),
    ]
    assert results[4].duplicate and not results[0].duplicate
    finished = await store.finish_many(
        [
            FinishItem(r1.task_id, r1.fencing_token, '"one"'),
            FinishItem(r3.task_id, r3.fencing_token, None, {"code": "X"}),
        ]
    )
    assert [x.outcome for x in finished] == [Outcome.SUCCEEDED, Outcome.FAILED]
    assert (await task_row(db, r1.task_id))["result"] == '"one"'


async def test_an_expired_reservation_cannot_start_even_before_recovery(db):
    store = lease_store(db)
    _, r = await reserved(db, store)
    await expire_lease(db, r.task_id, seconds_ago=0.001)
    result = (await store.start_many([(r.task_id, r.fencing_token)]))[0]
    assert (result.outcome, result.lost_reason) == (Outcome.OWNERSHIP_LOST, LostReason.LEASE_EXPIRED)
    assert (await task_row(db, r.task_id))["state"] == "reserved"  # left to the sweeper


async def test_start_past_deadline_settles_expired_and_frees_the_key(db):
    store = lease_store(db)
    _, r = await reserved(db, store, deadline_in_s=30, resource_key="k")
    await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET deadline = NOW(6) - INTERVAL 1 SECOND"))
    result = await store.start(r.task_id, r.fencing_token)
    # Not started: ok is false and the outcome says why.
    assert (result.outcome, result.ok, result.code, result.state) == (Outcome.EXPIRED, False, "TASK_EXPIRED", "expired")
    row = await task_row(db, r.task_id)
    assert (row["state"], row["attempts"]) == ("expired", 0)
    assert (await attempt_rows(db, r.task_id))[0]["outcome"] == "expired"
    assert await holder_of(db, "k") is None
    # Named by its own token later, the reservation is told what happened to it.
    assert (await store.start(r.task_id, r.fencing_token)).outcome is Outcome.EXPIRED


async def test_start_with_cancel_requested_settles_cancelled(db):
    store = lease_store(db)
    _, r = await reserved(db, store)
    await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET cancel_requested = 1"))
    assert (await store.start(r.task_id, r.fencing_token)).outcome is Outcome.CANCELLED
    assert (await task_row(db, r.task_id))["state"] == "cancelled"


async def test_renew_extends_a_valid_lease_and_reports_cancellation(db):
    store = lease_store(db, run_lease_s=60)
    _, r = await running(db, store)
    await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET cancel_requested = 1"))
    result = await store.renew(r.task_id, r.fencing_token)
    assert result.outcome is Outcome.RENEWED and result.cancel_requested
    row = await task_row(db, r.task_id)
    assert row["lease_expires_at"] == result.lease_expires_at
    assert row["lease_expires_at"] > row["started_at"] + timedelta(seconds=60)


async def test_renew_of_a_reservation_uses_the_reservation_lease(db):
    store = lease_store(db, reservation_lease_s=7, run_lease_s=60)
    _, r = await reserved(db, store)
    result = await store.renew(r.task_id, r.fencing_token)
    # now + 7 s, not now + 60 s.
    assert r.lease_expires_at <= result.lease_expires_at < r.lease_expires_at + timedelta(seconds=5)
    assert (await task_row(db, r.task_id))["state"] == "reserved"


async def test_an_expired_run_lease_cannot_be_renewed_or_finished(db):
    store = lease_store(db)
    _, r = await running(db, store)
    await expire_lease(db, r.task_id, seconds_ago=0.001)
    with pytest.raises(OwnershipLost) as info:
        await store.renew(r.task_id, r.fencing_token)
    assert info.value.reason is LostReason.LEASE_EXPIRED
    with pytest.raises(OwnershipLost):
        await store.finish(r.task_id, r.fencing_token, result_json="1")
    assert (await task_row(db, r.task_id))["state"] == "running"


async def test_success_stores_the_result_text_exactly_and_frees_the_key(db):
    store = lease_store(db)
    _, r = await running(db, store, resource_key="k")
    assert await holder_of(db, "k") == r.task_id
    result_text = '{"big": 123456789012345678901234567890123, "x": 1.10, "s": "\\"ü🎉\\\\", "n": null}'
    result = await store.finish(r.task_id, r.fencing_token, result_json=result_text)
    assert result.outcome is Outcome.SUCCEEDED
    row = await task_row(db, r.task_id)
    assert (row["state"], row["result"], row["error"], row["lease_expires_at"]) == (
        "succeeded",
        result_text,
        None,
        None,
    )
    assert row["finished_at"] is not None
    assert (await attempt_rows(db, r.task_id))[0]["outcome"] == "succeeded"
    assert await holder_of(db, "k") is None


async def test_retryable_failure_goes_back_to_the_queue_until_attempts_run_out(db):
    store = lease_store(db)
    owner, r = await running(db, store, max_attempts=2, backoff_initial_ms=10, backoff_max_ms=10)
    first = await store.finish(r.task_id, r.fencing_token, error={"code": "E1", "message": "m"}, retryable=True)
    assert (first.outcome, first.ok, first.state) == (Outcome.RETRY, True, "queued")
    # When it is due again, and how long after the transaction's clock (the 10 ms backoff,
    # jittered at most down to half): a node sets its own timer by it.
    assert first.available_at is not None and first.backoff_s is not None and 0.005 <= first.backoff_s <= 0.01
    row = await task_row(db, r.task_id)
    assert row["available_at"] == first.available_at
    assert (row["state"], row["attempts"], row["fencing_token"], row["owner_node_id"]) == ("queued", 1, None, None)
    assert json.loads(row["error"]) == {"code": "E1", "message": "m"}
    await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET available_at = NOW(6) - INTERVAL 1 SECOND"))
    (again,) = await store.claim(claim_request(owner))
    assert again.attempt == 2 and again.fencing_token.startswith("2-")
    await store.start(again.task_id, again.fencing_token)
    last = await store.finish(again.task_id, again.fencing_token, error={"code": "E2"}, retryable=True)
    assert last.outcome is Outcome.FAILED
    row = await task_row(db, r.task_id)
    assert (row["state"], row["attempts"]) == ("failed", 2)
    assert [a["outcome"] for a in await attempt_rows(db, r.task_id)] == ["retry", "failed"]


async def test_non_retryable_failure_fails_at_once(db):
    store = lease_store(db)
    _, r = await running(db, store, max_attempts=5)
    result = await store.finish(r.task_id, r.fencing_token, error={"code": "BAD"}, retryable=False)
    assert result.outcome is Outcome.FAILED
    assert (await task_row(db, r.task_id))["state"] == "failed"


async def test_a_retry_that_could_not_start_before_the_deadline_expires(db):
    store = lease_store(db)
    _, r = await running(db, store, deadline_in_s=5, backoff_initial_ms=60_000)
    result = await store.finish(r.task_id, r.fencing_token, error={"code": "E"}, retryable=True)
    assert result.outcome is Outcome.EXPIRED
    assert (await task_row(db, r.task_id))["state"] == "expired"


async def test_failure_after_cancel_requested_is_cancelled_not_retried(db):
    store = lease_store(db)
    _, r = await running(db, store)
    await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET cancel_requested = 1"))
    result = await store.finish(r.task_id, r.fencing_token, error={"code": "STOPPED"}, retryable=True)
    assert result.outcome is Outcome.CANCELLED
    assert (await task_row(db, r.task_id))["state"] == "cancelled"


async def test_duplicate_finish_returns_the_recorded_outcome_and_writes_nothing(db):
    store = lease_store(db)
    _, r = await running(db, store)
    first = await store.finish(r.task_id, r.fencing_token, result_json='"first"')
    task_before, attempts_before = await task_row(db, r.task_id), await attempt_rows(db, r.task_id)
    second = await store.finish(r.task_id, r.fencing_token, result_json='"second"')
    assert (first.outcome, first.duplicate) == (Outcome.SUCCEEDED, False)
    assert (second.outcome, second.duplicate) == (Outcome.SUCCEEDED, True)
    assert await task_row(db, r.task_id) == task_before
    assert await attempt_rows(db, r.task_id) == attempts_before


async def test_duplicate_finish_of_a_retried_attempt_is_answered_while_the_next_runs(db):
    store = lease_store(db)
    owner, r = await running(db, store, backoff_initial_ms=1, backoff_max_ms=1)
    await store.finish(r.task_id, r.fencing_token, error={"code": "E"}, retryable=True)
    await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET available_at = NOW(6) - INTERVAL 1 SECOND"))
    (next_attempt,) = await store.claim(claim_request(owner))
    await store.start(next_attempt.task_id, next_attempt.fencing_token)
    repeat = await store.finish(r.task_id, r.fencing_token, error={"code": "E"}, retryable=True)
    assert (repeat.outcome, repeat.duplicate, repeat.ok, repeat.state) == (Outcome.RETRY, True, True, "running")
    row = await task_row(db, r.task_id)
    assert (row["state"], row["fencing_token"]) == ("running", next_attempt.fencing_token)


async def test_a_late_finish_from_an_older_attempt_is_refused(db):
    store = lease_store(db)
    owner, r = await reserved(db, store)
    await store.release(r.task_id, r.fencing_token)
    (newer,) = await store.claim(claim_request(owner))
    await store.start(newer.task_id, newer.fencing_token)
    with pytest.raises(OwnershipLost) as info:
        await store.finish(r.task_id, r.fencing_token, result_json="1")
    assert info.value.reason is LostReason.TOKEN_MISMATCH
    assert (await task_row(db, r.task_id))["state"] == "running"


async def test_release_returns_a_reservation_without_using_an_attempt(db):
    store = lease_store(db)
    owner, r = await reserved(db, store, resource_key="k", priority=2)
    before = await task_row(db, r.task_id)
    result = await store.release(r.task_id, r.fencing_token)
    assert result.outcome is Outcome.RELEASED
    row = await task_row(db, r.task_id)
    assert (row["state"], row["attempts"], row["fencing_token"], row["lease_expires_at"]) == ("queued", 0, None, None)
    # Back in its old place in line: available_at (and so dispatch_at) unchanged.
    assert (row["available_at"], row["dispatch_at"]) == (before["available_at"], before["dispatch_at"])
    assert (await attempt_rows(db, r.task_id))[0]["outcome"] == "released"
    assert await holder_of(db, "k") is None
    with pytest.raises(OwnershipLost):
        await store.release(r.task_id, r.fencing_token)
    (again,) = await store.claim(claim_request(owner, resource_key_support=True))
    assert again.attempt == 1


async def test_a_started_task_cannot_be_released(db):
    store = lease_store(db)
    _, r = await running(db, store)
    result = (await store.release_many([(r.task_id, r.fencing_token)]))[0]
    assert (result.outcome, result.lost_reason) == (Outcome.OWNERSHIP_LOST, LostReason.WRONG_STATE)


async def test_an_oversized_error_is_cut_down_to_fit(db):
    store = lease_store(db)
    _, r = await running(db, store)
    await store.finish(
        r.task_id, r.fencing_token, error={"code": "HUGE", "message": "x" * 200_000, "extra": [1] * 9999}
    )
    error = json.loads((await task_row(db, r.task_id))["error"])
    assert error["code"] == "HUGE" and error["truncated"] is True and len(error["message"]) == 4096
