"""The Worker connection's sans-IO core: held tasks, claim requests, drain (no network, database or trio)."""

from __future__ import annotations

import itertools
import subprocess
import sys
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from orbit_node.domain.claims import Capability, ClaimRequest
from orbit_node.domain.ownership import Outcome, Reservation, TransitionResult
from orbit_node.workers import protocol as p
from orbit_node.workers.core import (
    MAX_PROTOCOL_ERRORS,
    RULES,
    CancelNotice,
    Close,
    ConnectionCore,
    Held,
    Requeued,
    TaskState,
    TransitionKind,
    kind_of,
)
from orbit_node.workers.send_buffer import Frame, SendBuffer

RESERVED, RUNNING = TaskState.RESERVED, TaskState.RUNNING
START, RENEW, FINISH, RELEASE = (
    TransitionKind.START,
    TransitionKind.RENEW,
    TransitionKind.FINISH,
    TransitionKind.RELEASE,
)
CAPS = frozenset({Capability("h", "v1", "v1")})
QUEUES = ("q" * 32, "r" * 32)
BATCH = 16
SCAN_CYCLE_S = 1.0
EPOCH = datetime(2030, 1, 1)
# When a retried task comes due again (database clock).
DUE = datetime(2030, 1, 1, 0, 0, 2)
# The send buffer's bounds: frames, UTF-8 bytes.
SEND_MESSAGES, SEND_BYTES = 4, 100

# Written out here, not read from RULES: the held states each transition accepts ...
ATTACH = TransitionKind.ATTACH
ATTACHING = TaskState.ATTACHING
# Held states each kind accepts: a reservation is never renewed; only a task presented in
# the hello (ATTACHING) is attached.
ACCEPTS = {START: {RESERVED}, RENEW: {RUNNING}, FINISH: {RUNNING}, RELEASE: {RESERVED}, ATTACH: {ATTACHING}}
# ... and what an accepted / a refused store result leaves held (None: dropped).
AFTER_OK: dict[TransitionKind, TaskState | str | None] = {
    START: RUNNING,
    RENEW: "same",
    FINISH: None,
    RELEASE: None,
    ATTACH: RUNNING,
}
AFTER_REFUSED: dict[TransitionKind, TaskState | str | None] = dict.fromkeys(AFTER_OK)
OK_OUTCOME = {
    START: Outcome.STARTED,
    RENEW: Outcome.RENEWED,
    FINISH: Outcome.SUCCEEDED,
    RELEASE: Outcome.RELEASED,
    ATTACH: Outcome.ATTACHED,
}


def task_id(n: int) -> str:
    return f"{n:032x}"


def token(n: int, attempt: int = 1) -> str:
    return f"{attempt}-{n:016x}"


def hello(capacity: int = 8, *, resource_keys: bool = False, tasks: tuple[p.TaskRef, ...] = ()) -> p.Hello:
    return p.Hello(
        queues=QUEUES,
        capabilities=CAPS,
        resource_keys=resource_keys,
        capacity=capacity,
        client_name=None,
        client_version=None,
        tasks=tasks,
    )


def send_buffer() -> SendBuffer:
    return SendBuffer(SEND_MESSAGES, SEND_BYTES)


def core(capacity: int | None = 8, batch: int = BATCH) -> ConnectionCore:
    c = ConnectionCore(
        "c_1", "a" * 32, "n" * 32, claim_batch_size=batch, retry_after_s=SCAN_CYCLE_S, send_buffer=send_buffer()
    )
    if capacity is not None:
        c.hello_received(hello(capacity), node_id="node-1")
    return c


def reservation(n: int, *, queue_id: str = QUEUES[0], attempt: int = 1) -> Reservation:
    return Reservation(
        task_id=task_id(n),
        queue_id=queue_id,
        namespace_id="n" * 32,
        application_id="a" * 32,
        handler="h",
        handler_version="v1",
        payload_version="v1",
        payload_json="{}",
        priority=0,
        attempt=attempt,
        max_attempts=3,
        fencing_token=token(n, attempt),
        lease_expires_at=EPOCH,
        deadline=None,
        resource_key=None,
        available_at=EPOCH,
    )


def ok(
    kind: TransitionKind, n: int, *, cancel_requested: bool = False, deadline_passed: bool = False
) -> TransitionResult:
    return TransitionResult(
        task_id=task_id(n),
        outcome=OK_OUTCOME[kind],
        state="running",
        cancel_requested=cancel_requested,
        deadline_passed=deadline_passed,
    )


def refused(n: int, outcome: Outcome = Outcome.OWNERSHIP_LOST, *, cancel_requested: bool = False) -> TransitionResult:
    return TransitionResult(task_id=task_id(n), outcome=outcome, ok=False, cancel_requested=cancel_requested)


def holding(*tasks: tuple[int, TaskState], dispatched_at: float = 0.0) -> ConnectionCore:
    """A core (capacity 8) that holds task ``n`` in the given state, token ``token(n)``."""
    c = core()
    assert c.next_claim() is not None
    c.claim_delivered([reservation(n) for n, _ in tasks], dispatched_at)
    running = [p.TaskRef(task_id(n), token(n)) for n, state in tasks if state is RUNNING]
    if running:
        c.settle(START, c.split(START, running).mine, [ok(START, int(r.task_id, 16)) for r in running], dispatched_at)
    assert {tid: h.state for tid, h in c.held.items()} == {task_id(n): s for n, s in tasks}
    return c


def ref(kind: TransitionKind, n: int, tok: str) -> p.TaskRef | p.FinishReport:
    if kind is FINISH:
        return p.FinishReport(task_id(n), tok, "succeeded", "null", None, False)
    return p.TaskRef(task_id(n), tok)


# -- transitions: every kind x held state x token x result ------------------------------------------


@pytest.mark.parametrize("kind", list(TransitionKind))
@pytest.mark.parametrize("held_state", [None, RESERVED, RUNNING])
@pytest.mark.parametrize("token_matches", [True, False])
@pytest.mark.parametrize("result_ok", [True, False])
def test_every_transition_kind_state_token_and_result(kind, held_state, token_matches, result_ok):
    c = holding((1, held_state)) if held_state is not None else holding()
    before = dict(c.held)
    split = c.split(kind, [ref(kind, 1, token(1) if token_matches else token(1, attempt=2))])
    assert dict(c.held) == before  # splitting changes nothing

    if held_state is None or not token_matches:
        assert split.mine == () and split.not_held == (task_id(1),) and split.wrong_state == ()
        return
    if held_state not in ACCEPTS[kind]:
        # Held with that token, in a state the transition does not apply to.
        assert split.mine == () and split.not_held == () and split.wrong_state == (task_id(1),)
        return
    assert [r.task_id for r in split.mine] == [task_id(1)] and split.not_held == ()

    result = ok(kind, 1) if result_ok else refused(1)
    settled = c.settle(kind, split.mine, [result], now=5.0)
    after = (AFTER_OK if result_ok else AFTER_REFUSED)[kind]
    if after is None:
        assert task_id(1) not in c.held
        assert settled.dropped == (task_id(1),)
    else:
        expected = held_state if after == "same" else after
        assert c.held[task_id(1)] == Held(token(1), expected, QUEUES[0], 0.0)
        assert settled.dropped == ()
    assert settled.started_after_s == ((5.0,) if kind is START and result_ok else ())
    assert settled.cancels == ()


def test_the_rule_table_is_the_one_the_tests_expect():
    assert {kind: set(rule.accepts) for kind, rule in RULES.items()} == ACCEPTS
    assert [kind for kind, rule in RULES.items() if rule.notices] == [RENEW, ATTACH]


def test_a_start_refused_as_cancelled_drops_the_reservation():
    c = holding((1, RESERVED))
    split = c.split(START, [p.TaskRef(task_id(1), token(1))])
    settled = c.settle(START, split.mine, [refused(1, Outcome.CANCELLED)], now=1.0)
    assert not c.held and settled.dropped == (task_id(1),) and settled.started_after_s == ()


def test_a_mixed_batch_keeps_the_order_of_its_refs():
    c = holding((1, RESERVED), (2, RUNNING), (3, RESERVED), (4, RUNNING))
    refs = [
        p.TaskRef(task_id(4), token(4)),  # running: not startable
        p.TaskRef(task_id(3), token(3)),
        p.TaskRef(task_id(9), token(9)),  # never held
        p.TaskRef(task_id(1), token(1)),
        p.TaskRef(task_id(2), token(2)),
    ]
    split = c.split(START, refs)
    assert [r.task_id for r in split.mine] == [task_id(3), task_id(1)]
    assert split.not_held == (task_id(9),) and split.wrong_state == (task_id(4), task_id(2))
    settled = c.settle(START, split.mine, [ok(START, 3), refused(1)], now=2.0)
    assert {tid: h.state for tid, h in c.held.items()} == {task_id(n): RUNNING for n in (2, 3, 4)}
    assert settled.started_after_s == (2.0,) and settled.dropped == (task_id(1),)


def test_start_latency_is_measured_from_the_dispatch():
    c = core()
    c.next_claim()
    c.claim_delivered([reservation(1), reservation(2)], now=10.0)
    split = c.split(START, [p.TaskRef(task_id(1), token(1)), p.TaskRef(task_id(2), token(2))])
    settled = c.settle(START, split.mine, [ok(START, 1), ok(START, 2)], now=12.5)
    assert settled.started_after_s == (2.5, 2.5)


def test_a_start_repeated_in_one_message_after_a_refusal_does_not_fail():
    c = holding((1, RESERVED))
    refs = [p.TaskRef(task_id(1), token(1))] * 2
    split = c.split(START, refs)
    settled = c.settle(START, split.mine, [refused(1), ok(START, 1)], now=1.0)
    assert not c.held and settled.started_after_s == ()


def test_settle_takes_only_as_many_results_as_refs():
    c = holding((1, RUNNING), (2, RUNNING))
    split = c.split(FINISH, [ref(FINISH, 1, token(1)), ref(FINISH, 2, token(2))])
    c.settle(FINISH, split.mine, [ok(FINISH, 1)], now=1.0)
    assert list(c.held) == [task_id(2)]


# -- cancel notices -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({}, ()),
        ({"cancel_requested": True}, ("cancel_requested",)),
        ({"deadline_passed": True}, ("deadline",)),
        ({"cancel_requested": True, "deadline_passed": True}, ("cancel_requested",)),
    ],
)
@pytest.mark.parametrize("state", [RUNNING])
def test_an_accepted_renew_carries_the_cancel_notice(flags, expected, state):
    c = holding((1, state))
    split = c.split(RENEW, [p.TaskRef(task_id(1), token(1))])
    settled = c.settle(RENEW, split.mine, [ok(RENEW, 1, **flags)], now=1.0)
    assert settled.cancels == tuple(CancelNotice(task_id(1), reason) for reason in expected)
    assert c.held[task_id(1)].state is state  # a cancel notice does not drop the task


def test_a_refused_renew_drops_the_task_and_sends_no_notice():
    c = holding((1, RUNNING))
    split = c.split(RENEW, [p.TaskRef(task_id(1), token(1))])
    settled = c.settle(RENEW, split.mine, [refused(1, cancel_requested=True)], now=1.0)
    assert settled.cancels == () and not c.held


def test_only_renew_sends_cancel_notices():
    c = holding((1, RESERVED))
    split = c.split(START, [p.TaskRef(task_id(1), token(1))])
    settled = c.settle(START, split.mine, [ok(START, 1, cancel_requested=True, deadline_passed=True)], now=1.0)
    assert settled.cancels == ()


def test_notices_keep_the_order_of_the_refs():
    c = holding((1, RUNNING), (2, RUNNING), (3, RUNNING))
    refs = [p.TaskRef(task_id(n), token(n)) for n in (3, 1, 2)]
    split = c.split(RENEW, refs)
    settled = c.settle(
        RENEW,
        split.mine,
        [ok(RENEW, 3, deadline_passed=True), ok(RENEW, 1), ok(RENEW, 2, cancel_requested=True)],
        now=1.0,
    )
    assert settled.cancels == (CancelNotice(task_id(3), "deadline"), CancelNotice(task_id(2), "cancel_requested"))


def test_kind_of_names_each_transition_message():
    refs = (p.TaskRef(task_id(1), token(1)),)
    assert kind_of(p.Start(refs)) is START
    assert kind_of(p.Renew(refs)) is RENEW
    assert kind_of(p.Release(refs)) is RELEASE
    assert kind_of(p.Finish((p.FinishReport(task_id(1), token(1), "succeeded", "1", None, False),))) is FINISH
    assert kind_of(p.Attach(refs)) is ATTACH
    assert [k.value for k in TransitionKind] == ["start", "renew", "finish", "release", "attach"]


# -- claim requests ------------------------------------------------------------------------------------


def test_no_claim_before_hello():
    c = core(capacity=None)
    assert c.free_capacity == 0
    assert c.next_claim() is None and not c.outstanding


def test_the_claim_request_after_hello():
    c = ConnectionCore(
        "c_9", "a" * 32, "n" * 32, claim_batch_size=BATCH, retry_after_s=SCAN_CYCLE_S, send_buffer=send_buffer()
    )
    c.hello_received(hello(5, resource_keys=True), node_id="node-7")
    request = c.next_claim()
    assert request == ClaimRequest(
        connection_id="c_9",
        node_id="node-7",
        application_id="a" * 32,
        namespace_id="n" * 32,
        queue_ids=QUEUES,
        capabilities=CAPS,
        resource_key_support=True,
        limit=5,
    )
    assert c.outstanding


def test_one_outstanding_request_at_a_time():
    c = core()
    assert c.next_claim() is not None
    assert c.next_claim() is None


@pytest.mark.parametrize("stop", ["worker_drain", "node_drain", "start_closing"])
def test_no_claim_while_draining_or_closing(stop):
    c = core()
    getattr(c, stop)()
    assert c.next_claim() is None and not c.outstanding


def test_no_claim_when_full():
    c = core(capacity=2)
    c.next_claim()
    c.claim_delivered([reservation(1), reservation(2)], now=0.0)
    assert c.free_capacity == 0 and not c.outstanding
    assert c.next_claim() is None


@pytest.mark.parametrize(
    ("capacity", "held", "batch", "limit"),
    [(8, 0, 16, 8), (40, 0, 16, 16), (40, 30, 16, 10), (5, 2, 16, 3), (16, 0, 16, 16), (3, 0, 1, 1)],
)
def test_the_limit_is_the_free_capacity_capped_by_the_batch_size(capacity, held, batch, limit):
    c = core(capacity=capacity, batch=batch)
    if held:
        assert c.next_claim() is not None
        c.claim_delivered([reservation(n) for n in range(held)], now=0.0)
    request = c.next_claim()
    assert request is not None and request.limit == limit


def test_a_finished_task_frees_capacity_for_the_next_claim():
    c = core(capacity=1)
    c.next_claim()
    c.claim_delivered([reservation(1)], now=0.0)
    assert c.next_claim() is None
    split = c.split(RELEASE, [p.TaskRef(task_id(1), token(1))])
    c.settle(RELEASE, split.mine, [ok(RELEASE, 1)], now=1.0)
    request = c.next_claim()
    assert request is not None and request.limit == 1


# -- deliveries, refusals, failures --------------------------------------------------------------------


def test_a_delivery_holds_its_reservations_as_reserved():
    c = core()
    c.next_claim()
    c.claim_delivered([reservation(1), reservation(2, queue_id=QUEUES[1], attempt=3)], now=7.0)
    assert not c.outstanding
    assert dict(c.held) == {
        task_id(1): Held(token(1), RESERVED, QUEUES[0], 7.0),
        task_id(2): Held(token(2, 3), RESERVED, QUEUES[1], 7.0),
    }
    assert c.free_capacity == 6


def test_an_empty_delivery_ends_the_request():
    c = core()
    c.next_claim()
    c.claim_delivered([], now=1.0)
    assert not c.outstanding and not c.held and c.retry_claim_at is None
    assert c.next_claim() is not None


def test_a_refused_or_failed_request_is_retried_after_a_scan_cycle():
    c = core()
    c.next_claim()
    c.claim_failed(now=100.0)
    assert not c.outstanding and c.retry_claim_at == 100.0 + SCAN_CYCLE_S
    assert c.claim_retry(100.5) is None and c.retry_claim_at == 101.0
    request = c.claim_retry(101.0)
    assert request is not None and c.outstanding and c.retry_claim_at is None
    assert c.claim_retry(500.0) is None  # nothing left to retry


def test_a_due_retry_is_cleared_even_when_no_claim_may_be_made():
    c = core()
    c.next_claim()
    c.claim_failed(now=0.0)
    assert c.next_claim() is not None  # another path asked again meanwhile
    assert c.claim_retry(1.0) is None and c.retry_claim_at is None
    c.claim_delivered([], now=1.0)
    c.node_drain()
    c.claim_failed(now=2.0)
    assert c.claim_retry(3.0) is None and c.retry_claim_at is None


def test_a_busy_connection_asks_when_half_a_claim_is_free_an_idle_one_at_once():
    c = core(capacity=16, batch=8)
    assert c.claim_threshold == 4
    first = c.next_claim()
    assert first is not None and first.limit == 8
    c.claim_delivered([reservation(i) for i in range(1, 9)], now=0.0)
    second = c.next_claim()  # 8 free of 16: worth a claim
    assert second is not None and second.limit == 8
    c.claim_delivered([reservation(i) for i in range(9, 14)], now=0.0)  # 13 held, 3 free
    assert c.next_claim() is None
    release = c.split(RELEASE, [p.TaskRef(task_id(1), token(1))])
    c.settle(RELEASE, release.mine, [ok(RELEASE, 1)], now=1.0)  # 4 free
    request = c.next_claim()
    assert request is not None and request.limit == 4
    # While the request waits, freed capacity raises the limit it may have.
    release = c.split(RELEASE, [p.TaskRef(task_id(i), token(i)) for i in (2, 3)])
    c.settle(RELEASE, release.mine, [ok(RELEASE, 2), ok(RELEASE, 3)], now=1.0)
    assert c.claim_limit() == 6
    c.node_drain()
    assert c.claim_limit() is None
    idle = core(capacity=16, batch=8)
    assert idle.claim_limit() is None
    assert idle.next_claim() is not None  # idle: asks at once, whatever the threshold


def test_a_capacity_one_connection_asks_as_soon_as_its_slot_is_free():
    c = core(capacity=1, batch=8)
    assert c.claim_threshold == 1
    assert c.next_claim() is not None


def test_a_closed_pool_is_not_retried():
    c = core()
    c.next_claim()
    c.claim_closed()
    assert not c.outstanding and c.retry_claim_at is None
    assert c.claim_retry(1e9) is None


def test_a_worker_drain_withdraws_the_outstanding_request():
    c = core()
    c.next_claim()
    c.worker_drain()
    assert not c.outstanding and c.drained
    assert c.next_claim() is None


def test_a_node_drain_keeps_the_in_flight_request():
    c = core()
    c.next_claim()
    c.node_drain()
    assert c.outstanding and not c.drained
    c.claim_delivered([reservation(1)], now=1.0)  # an in-flight claim still delivers
    assert c.held and not c.outstanding and c.next_claim() is None


# -- drain, clean-up -----------------------------------------------------------------------------------


def test_drain_is_complete_when_nothing_is_held_and_nothing_outstanding():
    c = core()
    assert c.drained
    c.next_claim()
    assert not c.drained
    c.node_drain()
    c.claim_delivered([reservation(1), reservation(2)], now=0.0)
    assert not c.drained
    start = c.split(START, [p.TaskRef(task_id(1), token(1))])
    c.settle(START, start.mine, [ok(START, 1)], now=1.0)
    release = c.split(RELEASE, [p.TaskRef(task_id(2), token(2))])
    c.settle(RELEASE, release.mine, [ok(RELEASE, 2)], now=1.0)
    assert not c.drained
    finish = c.split(FINISH, [ref(FINISH, 1, token(1))])
    c.settle(FINISH, finish.mine, [ok(FINISH, 1)], now=2.0)
    assert c.drained


def test_unstarted_lists_the_reservations_to_release():
    c = holding((1, RESERVED), (2, RUNNING), (3, RESERVED))
    assert c.unstarted() == [(task_id(1), token(1)), (task_id(3), token(3))]


def test_held_is_read_only():
    c = holding((1, RESERVED))
    with pytest.raises(TypeError):
        c.held[task_id(2)] = Held(token(2), RESERVED, QUEUES[0], 0.0)  # type: ignore[index]


def test_the_core_imports_no_trio():
    code = "import sys, orbit_node.workers.core; sys.exit('trio' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# -- a random life of one connection, against a model --------------------------------------------------


class ConnectionLife(RuleBasedStateMachine):
    """Random claims, deliveries, failures, transitions and drains against a dict model."""

    def __init__(self) -> None:
        super().__init__()
        self.capacity = 5
        self.batch = 3
        self.core = core(capacity=self.capacity, batch=self.batch)
        self.now = 0.0
        self.ids = itertools.count(1)
        self.model: dict[str, tuple[str, TaskState]] = {}
        self.outstanding = False
        self.limit = 0
        self.draining = False
        self.ever_held: set[str] = set()

    def tick(self) -> float:
        self.now += 0.25
        return self.now

    def may_ask(self) -> bool:
        """Whether the connection asks for tasks now: nothing outstanding, not draining, and
        room, at least half a claim of it while it holds tasks."""
        free = self.capacity - len(self.model)
        threshold = -(-min(self.capacity, self.batch) // 2)
        return not (self.outstanding or self.draining or free <= 0 or (self.model and free < threshold))

    @rule()
    def ask(self) -> None:
        request = self.core.next_claim()
        if not self.may_ask():
            assert request is None
            return
        assert request is not None and request.limit == min(self.capacity - len(self.model), self.batch)
        self.outstanding, self.limit = True, request.limit

    @rule()
    def widen(self) -> None:
        limit = self.core.claim_limit()
        free = self.capacity - len(self.model)
        if not self.outstanding or self.draining or free <= 0:
            assert limit is None
            return
        assert limit == min(free, self.batch)
        # Capacity only grows while a request is outstanding: a widened limit never
        # exceeds what is free when the claim delivers.
        self.limit = max(self.limit, limit)

    @precondition(lambda self: self.outstanding)
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        count = data.draw(st.integers(0, self.limit))
        reservations = [reservation(next(self.ids)) for _ in range(count)]
        self.core.claim_delivered(reservations, self.tick())
        for r in reservations:
            assert r.task_id not in self.ever_held  # a task is never held twice
            self.ever_held.add(r.task_id)
            self.model[r.task_id] = (r.fencing_token, RESERVED)
        self.outstanding = False

    @precondition(lambda self: self.outstanding)
    @rule(closed=st.booleans())
    def fail(self, closed: bool) -> None:
        if closed:
            self.core.claim_closed()
        else:
            self.core.claim_failed(self.tick())
            assert self.core.retry_claim_at == self.now + SCAN_CYCLE_S
        self.outstanding = False

    @rule()
    def retry(self) -> None:
        due = self.core.retry_claim_at is not None and self.tick() >= self.core.retry_claim_at
        request = self.core.claim_retry(self.now)
        may_ask = self.may_ask()
        if not due:
            assert request is None
        elif may_ask:
            assert request is not None and self.core.retry_claim_at is None
            self.outstanding, self.limit = True, request.limit
        else:
            assert request is None and self.core.retry_claim_at is None

    @rule(data=st.data(), kind=st.sampled_from(list(TransitionKind)))
    def transition(self, data: st.DataObject, kind: TransitionKind) -> None:
        known = sorted(self.model)
        picked = data.draw(st.lists(st.sampled_from(known), max_size=4)) if known else []
        refs = []
        for tid in picked:
            stale = data.draw(st.booleans())
            refs.append(ref(kind, int(tid, 16), token(int(tid, 16), attempt=2 if stale else 1)))
        if data.draw(st.booleans()):
            refs.append(ref(kind, 10_000 + next(self.ids), token(1)))  # never held
        split = self.core.split(kind, refs)
        expect_mine = [
            r
            for r in refs
            if r.task_id in self.model
            and self.model[r.task_id][0] == r.token
            and self.model[r.task_id][1] in ACCEPTS[kind]
        ]
        assert list(split.mine) == expect_mine
        expect_wrong_state = [
            r.task_id
            for r in refs
            if r.task_id in self.model
            and self.model[r.task_id][0] == r.token
            and self.model[r.task_id][1] not in ACCEPTS[kind]
        ]
        assert list(split.wrong_state) == expect_wrong_state
        assert len(split.mine) + len(split.not_held) + len(split.wrong_state) == len(refs)
        oks = [data.draw(st.booleans()) for _ in split.mine]
        results = [
            ok(kind, int(r.task_id, 16)) if good else refused(int(r.task_id, 16))
            for r, good in zip(split.mine, oks, strict=True)
        ]
        self.core.settle(kind, split.mine, results, self.tick())
        for r, good in zip(split.mine, oks, strict=True):
            if r.task_id not in self.model:
                continue  # the same task twice in one message, dropped by the first
            after = (AFTER_OK if good else AFTER_REFUSED)[kind]
            if after is None:
                del self.model[r.task_id]
            elif isinstance(after, TaskState):
                self.model[r.task_id] = (self.model[r.task_id][0], after)

    @rule()
    def reconnect(self) -> None:
        """The connection ends and the Worker opens another, presenting what runs: its
        reservations are gone (released when the old one ended), its running tasks wait
        for the attach, counted in the capacity, on a core that starts afresh."""
        running = tuple(p.TaskRef(tid, tok) for tid, (tok, state) in self.model.items() if state is RUNNING)
        self.core = ConnectionCore(
            "c_2",
            "a" * 32,
            "n" * 32,
            claim_batch_size=self.batch,
            retry_after_s=SCAN_CYCLE_S,
            send_buffer=send_buffer(),
        )
        attach = self.core.hello_received(hello(self.capacity, tasks=running), node_id="node-2", now=self.tick())
        assert (attach is None) == (not running)
        if attach is not None:
            assert attach.tasks == running
        self.model = {r.task_id: (r.token, TaskState.ATTACHING) for r in running}
        self.outstanding = False
        self.draining = False

    @rule(by_worker=st.booleans())
    def drain(self, by_worker: bool) -> None:
        self.draining = True
        if by_worker:
            self.core.worker_drain()
            self.outstanding = False
        else:
            self.core.node_drain()

    @invariant()
    def matches_the_model(self) -> None:
        assert {tid: (h.token, h.state) for tid, h in self.core.held.items()} == self.model
        assert self.core.outstanding == self.outstanding

    @invariant()
    def never_over_capacity(self) -> None:
        assert len(self.core.held) <= self.capacity
        assert self.core.free_capacity == self.capacity - len(self.core.held)

    @invariant()
    def drained_means_nothing_left(self) -> None:
        assert self.core.drained == (not self.model and not self.outstanding)


TestConnectionLife = ConnectionLife.TestCase
TestConnectionLife.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


@pytest.mark.parametrize(
    "kind, outcome, requeued",
    [
        (RELEASE, Outcome.RELEASED, True),
        (FINISH, Outcome.RETRY, True),
        (FINISH, Outcome.SUCCEEDED, False),
        (FINISH, Outcome.FAILED, False),
        (FINISH, Outcome.CANCELLED, False),
    ],
)
def test_a_task_back_in_its_queue_names_the_queue_to_wake_and_when(kind, outcome, requeued):
    state = RESERVED if kind is RELEASE else RUNNING
    c = core()
    assert c.next_claim() is not None
    c.claim_delivered([reservation(1, queue_id=QUEUES[1]), reservation(2, queue_id=QUEUES[1])], 0.0)
    if state is RUNNING:
        refs = [p.TaskRef(task_id(n), token(n)) for n in (1, 2)]
        c.settle(START, c.split(START, refs).mine, [ok(START, 1), ok(START, 2)], 0.0)
    split = c.split(kind, [ref(kind, 1, token(1)), ref(kind, 2, token(2))])
    due = {n: DUE if outcome is Outcome.RETRY else None for n in (1, 2)}
    results = [
        TransitionResult(task_id=task_id(n), outcome=outcome, state="queued", available_at=due[n]) for n in (1, 2)
    ]
    settled = c.settle(kind, split.mine, results, now=1.0)
    assert settled.dropped == (task_id(1), task_id(2))
    # One wake per queue and due time: a retry's when its backoff ends, a release's now.
    assert settled.requeued == ((Requeued(QUEUES[1], due[1]),) if requeued else ())


def test_a_refused_release_wakes_no_queue():
    c = holding((1, RESERVED))
    split = c.split(RELEASE, [p.TaskRef(task_id(1), token(1))])
    settled = c.settle(RELEASE, split.mine, [refused(1)], now=1.0)
    assert settled.dropped == (task_id(1),) and settled.requeued == ()


def test_hello_comes_first_and_once_and_a_heartbeat_at_any_time():
    fresh = core(capacity=None)
    fresh.check_order(p.Heartbeat())
    with pytest.raises(p.MessageRefused) as info:
        fresh.check_order(p.Drain())
    assert (info.value.code, info.value.close_code) == ("OUT_OF_ORDER", p.CLOSE_PROTOCOL)
    fresh.check_order(hello())
    greeted = core()
    greeted.check_order(p.Drain())
    greeted.check_order(p.Heartbeat())
    with pytest.raises(p.MessageRefused) as info:
        greeted.check_order(hello())
    assert (info.value.code, info.value.close_code) == ("OUT_OF_ORDER", None)


def test_a_refusal_closes_when_it_says_so_or_once_the_budget_is_spent():
    c = core()
    closing = p.MessageRefused("MALFORMED_MESSAGE", "binary", close_code=p.CLOSE_PROTOCOL)
    assert c.refused(closing) == Close(p.CLOSE_PROTOCOL, "MALFORMED_MESSAGE")
    c = core()
    soft = p.MessageRefused("INVALID_MESSAGE", "bad field", field="tasks")
    assert [c.refused(soft) for _ in range(MAX_PROTOCOL_ERRORS)] == [None] * MAX_PROTOCOL_ERRORS
    assert c.refused(soft) == Close(p.CLOSE_PROTOCOL, "too many protocol errors")


def test_silence_ends_the_connection_and_the_watchdog_wakes_for_it_or_for_a_claim_retry():
    c = ConnectionCore(
        "c_1",
        "a" * 32,
        "n" * 32,
        claim_batch_size=BATCH,
        retry_after_s=5.0,
        heartbeat_timeout_s=30.0,
        send_buffer=send_buffer(),
    )
    c.hello_received(hello(), node_id="node-1")
    c.received(100.0)
    assert not c.silent(129.9) and c.silent(130.0)
    assert c.watch_until() == 130.0
    c.next_claim()
    c.claim_failed(101.0)  # refused: asks again a scan cycle later
    assert c.watch_until() == 106.0
    c.received(120.0)
    assert c.watch_until() == 106.0 and not c.silent(149.0) and c.silent(150.0)


# -- the send buffer ------------------------------------------------------------------------------

SLOW_CONSUMER = Close(p.CLOSE_SLOW_CONSUMER, "slow consumer")


def sized(size: int) -> dict[str, str]:
    """A message whose frame is ``size`` UTF-8 bytes (at least 8)."""
    message = {"p": "x" * (size - 8)}
    assert len(p.dumps(message).encode()) == size
    return message


def queued(c: ConnectionCore) -> tuple[int, int]:
    return c.send_buffer.messages, c.send_buffer.size


def test_a_frame_is_counted_in_utf8_bytes_until_it_leaves_the_buffer():
    c = core()
    frame = c.frame({"reason": "é"})
    assert frame == Frame('{"reason":"é"}', 15)
    assert queued(c) == (1, 15)
    c.frame_left(frame)
    assert queued(c) == (0, 0)


def test_one_frame_too_many_closes_the_connection_as_a_slow_consumer():
    c = core()
    frames = [c.frame(sized(10)) for _ in range(SEND_MESSAGES)]
    assert all(isinstance(f, Frame) for f in frames)
    assert c.frame(sized(10)) == SLOW_CONSUMER
    assert queued(c) == (SEND_MESSAGES, SEND_MESSAGES * 10)  # the refused frame is not counted
    c.frame_left(frames[0])  # the writer took one: the next fits
    assert isinstance(c.frame(sized(10)), Frame)


def test_one_byte_too_many_closes_the_connection_as_a_slow_consumer():
    c = core()
    first = c.frame(sized(60))
    assert isinstance(first, Frame)
    assert isinstance(c.frame(sized(SEND_BYTES - 60)), Frame)  # exactly the bound fits
    assert c.frame(sized(8)) == SLOW_CONSUMER
    c.frame_left(first)
    assert c.frame(sized(61)) == SLOW_CONSUMER
    assert isinstance(c.frame(sized(60)), Frame)


def test_a_frame_larger_than_the_byte_bound_goes_alone():
    c = core()
    big = c.frame(sized(SEND_BYTES * 3))
    assert isinstance(big, Frame) and queued(c) == (1, SEND_BYTES * 3)
    assert c.frame(sized(8)) == SLOW_CONSUMER
    c.frame_left(big)
    assert isinstance(c.frame(sized(8)), Frame)


def test_nothing_is_queued_once_the_connection_closes():
    c = core()
    frame = c.frame(sized(10))
    c.start_closing()
    assert c.frame(sized(10)) is None
    assert queued(c) == (1, 10)  # what was queued before still goes out
    assert isinstance(frame, Frame)
    c.frame_left(frame)
    assert queued(c) == (0, 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(8, 3 * SEND_BYTES), st.none()), max_size=40))
def test_the_send_buffer_never_holds_more_than_its_bounds(steps):
    """Frames of random sizes, and the writer taking the oldest (None): each frame is
    queued exactly when it keeps both bounds (a lone frame may pass the byte bound)."""
    c = core()
    waiting: list[Frame] = []
    for step in steps:
        if step is None:
            if waiting:
                c.frame_left(waiting.pop(0))
        else:
            fits = not waiting or (len(waiting) < SEND_MESSAGES and sum(f.size for f in waiting) + step <= SEND_BYTES)
            frame = c.frame(sized(step))
            assert (frame == SLOW_CONSUMER) is not fits
            if isinstance(frame, Frame):
                waiting.append(frame)
        assert queued(c) == (len(waiting), sum(f.size for f in waiting))
