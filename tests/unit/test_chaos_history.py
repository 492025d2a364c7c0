"""The chaos runs' history checker (harness/history.py) on hand-made histories: pure, no database.

A clean history passes; each property has a history that breaks it, and only it where
the property can be broken alone."""

from __future__ import annotations

from datetime import datetime

import attrs

from harness.history import Attempt, Execution, History, Observation, Task, check, epoch

SUCCEEDED_T1 = Attempt("t1", 1, "1-a", reserved_at=0.0, started_at=0.1, finished_at=1.1, outcome="succeeded")
# t2's first attempt is lost (its Worker went on running past the lease), the second succeeds.
LOST_T2 = Attempt("t2", 1, "1-b", reserved_at=0.5, started_at=0.6, finished_at=7.0, outcome="lease_expired")
RETRIED_T2 = Attempt("t2", 2, "2-b", reserved_at=7.5, started_at=7.6, finished_at=8.6, outcome="succeeded")
# t3 shares t1's resource key and is reserved once t1 let it go.
AFTER_T1 = Attempt("t3", 1, "1-c", reserved_at=1.2, started_at=1.25, finished_at=2.1, outcome="succeeded")
# t4 depends on t1: reserved after t1 finished.
CHILD_T4 = Attempt("t4", 1, "1-d", reserved_at=1.3, started_at=1.35, finished_at=1.6, outcome="succeeded")


def clean() -> History:
    return History(
        acknowledged={"k1": "t1", "k2": "t2", "k3": "t3", "k4": "t4"},
        executions=[
            Execution("t1", 1, 0.2, 1.0, "w1", "r"),
            Execution("t2", 1, 0.7, 9.0, "w2"),  # cut off from its node: it ran past its lease
            Execution("t2", 2, 7.7, 8.5, "w1"),
            Execution("t3", 1, 1.3, 2.0, "w2", "r"),
            Execution("t4", 1, 1.4, 1.5, "w1"),
        ],
        observations=[
            Observation("t1", "running", None, 0.5),
            Observation("t1", "succeeded", 1.1, 1.5),
            Observation("t2", "queued", None, 7.2),
            Observation("t1", "succeeded", 1.1, 3.0),
        ],
        tasks=[
            Task("t1", "k1", "succeeded", 1.1, "r"),
            Task("t2", "k2", "succeeded", 8.6),
            Task("t3", "k3", "succeeded", 2.1, "r"),
            # A child of t1 (depends_on): reserved once t1 had succeeded.
            Task("t4", "k4", "succeeded", 1.6, parents=("t1",)),
        ],
        attempts=[SUCCEEDED_T1, LOST_T2, RETRIED_T2, AFTER_T1, CHILD_T4],
        reservation_lease_s=4.0,
        run_lease_s=6.0,
    )


def replace_attempt(history: History, old: Attempt, **changes) -> History:
    return attrs.evolve(history, attempts=[attrs.evolve(a, **changes) if a == old else a for a in history.attempts])


def failed(history: History) -> list[str]:
    verdict = check(history)
    print(verdict.text())
    return verdict.failed()


def test_a_clean_history_holds_every_property():
    verdict = check(clean())
    assert verdict.ok, verdict.text()
    assert verdict.figures["lost_attempts"] == 1
    assert verdict.figures["tasks_run_more_than_once"] == 1
    assert verdict.figures["ran_past_lease"] == 1


def test_the_database_clock_is_utc():
    assert epoch(datetime(1970, 1, 2)) == 86400.0
    assert epoch(None) is None


# -- one_terminal


def test_an_acknowledged_task_missing_from_the_database():
    history = attrs.evolve(clean(), acknowledged={**clean().acknowledged, "k5": "t5"})
    assert failed(history) == ["one_terminal"]


def test_an_acknowledged_task_that_never_settled():
    history = clean()
    history = attrs.evolve(
        history,
        tasks=[attrs.evolve(t, state="running", finished_at=None) if t.task_id == "t3" else t for t in history.tasks],
    )
    history = replace_attempt(history, AFTER_T1, finished_at=None, outcome=None)
    assert failed(history) == ["one_terminal"]


def test_a_task_settled_by_two_attempts():
    extra = Attempt("t1", 2, "2-a", reserved_at=1.15, started_at=None, finished_at=1.16, outcome="cancelled")
    history = attrs.evolve(clean(), attempts=[*clean().attempts, extra])
    assert failed(history) == ["one_terminal"]


def test_a_task_whose_state_is_not_what_its_attempt_settled():
    history = replace_attempt(clean(), SUCCEEDED_T1, outcome="failed")
    assert failed(history) == ["one_terminal"]


def test_a_terminal_task_with_an_attempt_left_open():
    extra = Attempt("t1", 2, "2-a", reserved_at=1.15, started_at=None, finished_at=None, outcome=None)
    history = attrs.evolve(clean(), attempts=[*clean().attempts, extra])
    assert failed(history) == ["one_terminal"]


def test_a_key_acknowledged_with_another_keys_task():
    history = attrs.evolve(clean(), acknowledged={**clean().acknowledged, "k5": "t3"})
    verdict = check(history)
    assert verdict.failed() == ["one_terminal"]
    assert "submitted under key k3" in verdict.violations["one_terminal"][0]


def test_one_key_that_made_two_tasks():
    history = attrs.evolve(clean(), tasks=[*clean().tasks, Task("t1b", "k1", "succeeded", 1.0)])
    assert failed(history) == ["one_terminal"]


# -- no_overlap


def test_two_attempts_whose_leases_overlap_in_the_database():
    # The lost attempt was closed after the next one was reserved: both ran under a lease.
    history = replace_attempt(clean(), LOST_T2, finished_at=8.0)
    verdict = check(history)
    assert verdict.failed() == ["no_overlap"]
    assert any("still held its lease" in v for v in verdict.violations["no_overlap"])
    assert any("overlap, both under a live lease" in v for v in verdict.violations["no_overlap"])


def test_an_attempt_still_open_when_the_next_was_reserved():
    history = replace_attempt(clean(), LOST_T2, finished_at=None, outcome=None)
    assert "no_overlap" in failed(history)


def test_one_attempt_run_by_two_workers_at_once():
    history = attrs.evolve(clean(), executions=[*clean().executions, Execution("t1", 1, 0.5, 0.9, "w3", "r")])
    verdict = check(history)
    assert "no_overlap" in verdict.failed()
    assert any(v.startswith("task t1:") and "overlap" in v for v in verdict.violations["no_overlap"])


def test_two_tasks_of_one_resource_key_under_live_leases_at_once():
    history = replace_attempt(clean(), AFTER_T1, reserved_at=0.9, started_at=0.92)
    history = attrs.evolve(
        history,
        executions=[attrs.evolve(e, start=0.95) if e.task_id == "t3" else e for e in history.executions],
    )
    verdict = check(history)
    assert verdict.failed() == ["no_overlap"]
    assert verdict.violations["no_overlap"][0].startswith("resource key r:")


def test_an_attempt_closed_as_lost_before_its_lease_could_run_out():
    # Started at 0.6 with a 6 s lease, closed lease_expired at 6.5: taken from a live owner.
    history = replace_attempt(clean(), LOST_T2, finished_at=6.5)
    verdict = check(history)
    assert verdict.failed() == ["no_overlap"]
    assert "before its 6 s lease ran out" in verdict.violations["no_overlap"][0]


def test_a_reservation_taken_back_before_its_lease_could_run_out():
    early = Attempt("t3", 1, "0-c", reserved_at=0.0, started_at=None, finished_at=1.0, outcome="reservation_expired")
    history = attrs.evolve(clean(), attempts=[*clean().attempts, early])
    assert failed(history) == ["no_overlap"]
    late = attrs.evolve(early, finished_at=1.2 - 0.05)
    history = attrs.evolve(clean(), attempts=[*clean().attempts, late], reservation_lease_s=1.0)
    assert failed(history) == []


def test_an_execution_without_a_started_attempt():
    history = attrs.evolve(clean(), executions=[*clean().executions, Execution("t3", 2, 3.0, 3.5, "w1")])
    assert failed(history) == ["no_overlap"]


def test_an_attempt_started_twice():
    extra = attrs.evolve(AFTER_T1, token="1-c2", reserved_at=2.2, started_at=2.3, finished_at=2.4, outcome="failed")
    history = attrs.evolve(clean(), attempts=[*clean().attempts, extra])
    assert "no_overlap" in failed(history)


# -- terminal_stable


def test_a_terminal_state_that_changed_at_the_end():
    history = attrs.evolve(clean(), observations=[*clean().observations, Observation("t2", "failed", 8.0, 8.1)])
    assert failed(history) == ["terminal_stable"]


def test_a_terminal_state_that_went_back_to_the_queue():
    history = attrs.evolve(clean(), observations=[*clean().observations, Observation("t1", "queued", None, 2.0)])
    assert failed(history) == ["terminal_stable"]


def test_a_terminal_task_that_disappeared():
    history = attrs.evolve(clean(), observations=[*clean().observations, Observation("t9", "succeeded", 1.0, 1.0)])
    assert failed(history) == ["terminal_stable"]


# -- rerun_after_loss


def test_a_rerun_after_an_attempt_that_was_not_lost():
    history = replace_attempt(clean(), LOST_T2, outcome="retry")
    assert failed(history) == ["rerun_after_loss"]


def test_one_attempt_run_twice_one_after_the_other():
    # After its lease ended: no overlap under a live lease, but a run nothing lost justifies.
    history = attrs.evolve(clean(), executions=[*clean().executions, Execution("t1", 1, 1.2, 1.3, "w2", "r")])
    assert failed(history) == ["rerun_after_loss"]


def test_a_child_reserved_before_its_parent_finished_breaks_after_parents():
    early = replace_attempt(clean(), CHILD_T4, reserved_at=1.05)
    assert "after_parents" in failed(early)


def test_a_child_that_ran_although_its_parent_did_not_succeed_breaks_after_parents():
    history = clean()
    parent_failed = attrs.evolve(
        history, tasks=[attrs.evolve(t, state="failed") if t.task_id == "t1" else t for t in history.tasks]
    )
    assert "after_parents" in failed(parent_failed)
    # Never reserved and cancelled: what a child of a failed parent must end as.
    cancelled = attrs.evolve(
        parent_failed,
        tasks=[attrs.evolve(t, state="cancelled") if t.task_id == "t4" else t for t in parent_failed.tasks],
        attempts=[a for a in parent_failed.attempts if a.task_id != "t4"],
        executions=[e for e in parent_failed.executions if e.task_id != "t4"],
    )
    assert "after_parents" not in failed(cancelled)
