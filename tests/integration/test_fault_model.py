"""Scenario 10: a Hypothesis state machine drives the real LeaseStore on a real MariaDB.

Rules: submit, claim, start, renew, finish, release, cancel, expire (a lease moved into
the past on the database clock), recover, making retries due, and a well-behaved Worker
(claim, start, finish in a row). Any rule may use a
stale token. After every step the database is checked for the invariants:

* at most one live owner per task: a reserved/running task has exactly one open attempt,
  the one its fencing token names; any other task has none;
* attempts never decrease (and never exceed max_attempts);
* terminal states are final (state, result and finish time never change again);
* a token that is not the task's latest one never gets a transition applied.

The machine runs in a worker thread (``trio.to_thread``); each rule runs its database
calls on the test's trio loop through ``trio.from_thread.run``.
"""

from __future__ import annotations

import itertools
import json

import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from orbit_node.domain.errors import FailedPrecondition
from orbit_node.domain.ownership import FinishItem, Outcome
from orbit_node.store.tasks import TaskStore

from .. import seed

TERMINAL = frozenset({"succeeded", "failed", "cancelled", "expired"})
FINISHED = frozenset({Outcome.SUCCEEDED, Outcome.RETRY, Outcome.FAILED, Outcome.CANCELLED, Outcome.EXPIRED})
MAX_TASKS = 5
SETTINGS = settings(
    max_examples=25,
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def machine_for(db, seen: dict[str, int]):
    """The machine class for ``db``; ``seen`` counts what the runs exercised."""
    counter = itertools.count()

    def call(fn, *args, **kwargs):
        return trio.from_thread.run(lambda: fn(*args, **kwargs))

    class DispatchMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.owner = call(seed.tenant, db, application=f"model{next(counter)}")
            self.store = seed.lease_store(db)
            self.tasks: list[str] = []
            # Every token handed out per task, in order: the last one is the latest.
            self.tokens: dict[str, list[str]] = {}
            self.attempts: dict[str, int] = {}
            self.terminal: dict[str, tuple] = {}
            # Tasks whose lease was moved into the past since their latest token was issued.
            self.lapsed: set[str] = set()

        # -- helpers ---------------------------------------------------------------------

        def pick(self, data, stale: bool) -> tuple[str, str, bool] | None:
            """A task with a token: its latest one, or (stale) an older one."""
            candidates = [t for t in self.tasks if self.tokens[t]]
            if not candidates:
                return None
            task_id = data.draw(st.sampled_from(candidates))
            tokens = self.tokens[task_id]
            if stale and len(tokens) > 1:
                return task_id, data.draw(st.sampled_from(tokens[:-1])), True
            return task_id, tokens[-1], False

        def issued(self, task_id: str, token: str) -> None:
            assert token not in self.tokens[task_id]
            self.tokens[task_id].append(token)
            self.lapsed.discard(task_id)

        def check(self, result, is_stale: bool, *, finish: bool = False, lease_matters: bool = True) -> bool:
            """An older token is refused, and so is the latest one once its lease ran out
            (no lease is ever extended after it expired); only a Finish repeated by an
            attempt that did finish is answered (its recorded outcome, nothing written)."""
            if lease_matters and result.task_id in self.lapsed:
                is_stale = True
            key = f"{result.outcome.value}{' stale' if is_stale else ''}{' ok' if result.ok else ''}"
            seen[key] = seen.get(key, 0) + 1
            if is_stale:
                assert not result.ok or (finish and result.duplicate and result.outcome in FINISHED), result
            return result.ok

        # -- rules ---------------------------------------------------------------------

        @precondition(lambda self: len(self.tasks) < MAX_TASKS)
        # Now and then a task whose deadline has already passed (never started, settled expired).
        @rule(max_attempts=st.integers(1, 3), deadline_in_s=st.sampled_from([None, None, None, -1]))
        def submit(self, max_attempts, deadline_in_s):
            task_id = call(
                seed.insert_task,
                db,
                self.owner,
                max_attempts=max_attempts,
                backoff_initial_ms=1,
                backoff_max_ms=1,
                deadline_in_s=deadline_in_s,
            )
            self.tasks.append(task_id)
            self.tokens[task_id] = []

        @precondition(lambda self: self.tasks)
        @rule(limit=st.integers(1, 3))
        def claim(self, limit):
            for r in call(self.store.claim, seed.claim_request(self.owner, limit=limit)):
                self.issued(r.task_id, r.fencing_token)

        @precondition(lambda self: self.tasks)
        @rule()
        def work(self):
            """A well-behaved Worker: claim one task, start it, finish it successfully."""
            for r in call(self.store.claim, seed.claim_request(self.owner, limit=1)):
                self.issued(r.task_id, r.fencing_token)
                if self.check(call(self.store.start_many, [(r.task_id, r.fencing_token)])[0], False):
                    item = FinishItem(r.task_id, r.fencing_token, '"done"')
                    self.check(call(self.store.finish_many, [item])[0], False, finish=True)

        @precondition(lambda self: any(self.tokens.values()))
        @rule(data=st.data(), stale=st.booleans())
        def start(self, data, stale):
            if (picked := self.pick(data, stale)) is not None:
                task_id, token, is_stale = picked
                self.check(call(self.store.start_many, [(task_id, token)])[0], is_stale)

        @precondition(lambda self: any(self.tokens.values()))
        @rule(data=st.data(), stale=st.booleans())
        def renew(self, data, stale):
            if (picked := self.pick(data, stale)) is not None:
                task_id, token, is_stale = picked
                self.check(call(self.store.renew_many, [(task_id, token)])[0], is_stale)

        @precondition(lambda self: any(self.tokens.values()))
        @rule(data=st.data(), stale=st.booleans(), success=st.booleans(), retryable=st.booleans())
        def finish(self, data, stale, success, retryable):
            if (picked := self.pick(data, stale)) is not None:
                task_id, token, is_stale = picked
                item = (
                    FinishItem(task_id, token, json.dumps(token))
                    if success
                    else FinishItem(task_id, token, error={"code": "E", "message": "boom"}, retryable=retryable)
                )
                self.check(call(self.store.finish_many, [item])[0], is_stale, finish=True)

        @precondition(lambda self: any(self.tokens.values()))
        @rule(data=st.data(), stale=st.booleans())
        def release(self, data, stale):
            if (picked := self.pick(data, stale)) is not None:
                task_id, token, is_stale = picked
                # A reservation may be given back after its lease ran out (nothing is extended).
                result = call(self.store.release_many, [(task_id, token)])[0]
                self.check(result, is_stale, lease_matters=False)

        @precondition(lambda self: self.tasks)
        @rule(data=st.data())
        def cancel(self, data):
            task_id = data.draw(st.sampled_from(self.tasks))
            try:
                call(TaskStore(db).cancel, self.owner.namespace_id, task_id)
            except FailedPrecondition:
                pass

        @precondition(lambda self: self.tasks)
        @rule(data=st.data())
        def expire(self, data):
            task_id = data.draw(st.sampled_from(self.tasks))
            call(seed.expire_lease, db, task_id)
            self.lapsed.add(task_id)

        @precondition(lambda self: self.tasks)
        @rule()
        def recover(self):
            call(self.store.recover)

        @precondition(lambda self: self.tasks)
        @rule()
        def make_due(self):
            call(
                db.run,
                lambda tx: tx.execute_raw(
                    "UPDATE tasks SET available_at = NOW(6) WHERE queue_id = %s AND state = 'queued'",
                    (self.owner.queue_id,),
                ),
            )

        # -- invariants ----------------------------------------------------------------

        @invariant()
        def database_invariants(self):
            seen["steps"] = seen.get("steps", 0) + 1
            if not self.tasks:
                return
            task_rows = call(
                db.run,
                lambda tx: tx.fetchall_raw(
                    "SELECT task_id, state, fencing_token, attempts, max_attempts, result, finished_at, owner_node_id "
                    "FROM tasks WHERE queue_id = %s",
                    (self.owner.queue_id,),
                ),
            )
            open_rows = call(
                db.run,
                lambda tx: tx.fetchall_raw(
                    "SELECT a.task_id, a.fencing_token FROM task_attempts a JOIN tasks t ON t.task_id = a.task_id "
                    "WHERE t.queue_id = %s AND a.outcome IS NULL",
                    (self.owner.queue_id,),
                ),
            )
            open_by_task: dict[str, list[str]] = {}
            for a in open_rows:
                open_by_task.setdefault(a["task_id"], []).append(a["fencing_token"])
            assert len(task_rows) == len(self.tasks)
            for row in task_rows:
                task_id, state = row["task_id"], row["state"]
                live = state in ("reserved", "running")
                # At most one live owner: exactly the attempt the token names, and only while live.
                assert open_by_task.get(task_id, []) == ([row["fencing_token"]] if live else []), (row, open_by_task)
                assert row["owner_node_id"] is not None or not live, row
                if live:
                    assert row["fencing_token"] == self.tokens[task_id][-1], row
                # Attempts never decrease, never exceed the maximum.
                assert row["attempts"] >= self.attempts.get(task_id, 0), row
                assert row["attempts"] <= row["max_attempts"], row
                self.attempts[task_id] = row["attempts"]
                # Terminal states are final.
                snapshot = (state, row["result"], row["finished_at"], row["attempts"])
                if task_id in self.terminal:
                    assert snapshot == self.terminal[task_id], (snapshot, self.terminal[task_id])
                elif state in TERMINAL:
                    self.terminal[task_id] = snapshot

    return DispatchMachine


async def test_dispatch_state_machine_keeps_its_invariants(db):
    seen: dict[str, int] = {}
    machine = machine_for(db, seen)
    await trio.to_thread.run_sync(lambda: run_state_machine_as_test(machine, settings=SETTINGS))
    # The runs reached the interesting transitions, with current and with stale tokens.
    for key in ("started ok", "succeeded ok", "ownership_lost stale"):
        assert seen.get(key, 0) > 0, seen
    assert sum(seen.values()) >= 50, seen
