"""The fair scheduler's pure core: rotation, limits, pacing and the empty-result cache."""

from __future__ import annotations

import random
import weakref
from collections import Counter

import pytest

from orbit_node.config import SchedulerLimits
from orbit_node.dispatch.cache import CacheKey, EmptyResultCache
from orbit_node.dispatch.scheduler import AlreadyOutstanding, FairScheduler, SchedulerFull
from orbit_node.domain.claims import ClaimRequest

CAPS = frozenset({("h", "v1", "v1")})


def ticket(conn: str, app: str, *queues: str, caps=CAPS, rk=False, ns=None) -> ClaimRequest:
    return ClaimRequest(
        connection_id=conn,
        node_id="n",
        application_id=app,
        namespace_id=ns or f"ns-{app}",
        queue_ids=tuple(queues),
        capabilities=caps,
        resource_key_support=rk,
        limit=4,
    )


# The time each scheduler of a test has reached (``tick``): grants of one connection are
# paced, so a test that grants again and again lets time pass between its grants.
_CLOCKS: weakref.WeakKeyDictionary[FairScheduler, float] = weakref.WeakKeyDictionary()


def tick(s: FairScheduler) -> float:
    """The scheduler's time, a little over one pace interval (a connection's next slot) after
    the last tick (over: a sum of floating-point steps must not fall short of the slot)."""
    step = s.pacing.interval_s * 1.001
    now = _CLOCKS.get(s, -step) + step
    _CLOCKS[s] = now
    return now


def drain_one_at_a_time(s: FairScheduler, now: float | None = None, *, resubmit=None, rounds: int = 100):
    """Grant, complete, (optionally resubmit) repeatedly, one pace interval apart (the
    time a connection's next slot takes to open); returns the grant sequence."""
    order = []
    for _ in range(rounds):
        now = tick(s) if now is None else now
        grants = s.grant(now)
        if not grants:
            break
        for g in grants:
            order.append((g.request.application_id, g.queue_id, g.request.connection_id))
            s.complete(g, now, empty=False)
            if resubmit:
                s.submit(resubmit(g.request))
        now = None
    return order


def test_rotation_applications_then_queues_then_connections():
    s = FairScheduler(SchedulerLimits(sql_slots=1))
    # Application A: queues qa1 (connections a1, a2) and qa2 (a3); B: qb1 (b1, b2); C: qc1 (c1).
    for t in [
        ticket("a1", "A", "qa1"),
        ticket("a2", "A", "qa1"),
        ticket("a3", "A", "qa2"),
        ticket("b1", "B", "qb1"),
        ticket("b2", "B", "qb1"),
        ticket("c1", "C", "qc1"),
    ]:
        s.submit(t)
    order = drain_one_at_a_time(s)
    assert order == [
        ("A", "qa1", "a1"),
        ("B", "qb1", "b1"),
        ("C", "qc1", "c1"),
        ("A", "qa2", "a3"),
        ("B", "qb1", "b2"),
        ("A", "qa1", "a2"),
    ]


def test_rotation_with_continuous_demand_three_apps_many_queues():
    s = FairScheduler(SchedulerLimits(sql_slots=1, claims_per_connection_per_cycle=10**6))
    conns = []
    for app, nq, per_q in (("A", 3, 2), ("B", 2, 1), ("C", 1, 3)):
        for q in range(nq):
            for c in range(per_q):
                conns.append(ticket(f"{app}{q}{c}", app, f"{app}-q{q}"))
    for t in conns:
        s.submit(t)
    order = drain_one_at_a_time(s, resubmit=lambda t: t, rounds=60)
    apps = [a for a, _, _ in order]
    assert apps[:9] == ["A", "B", "C"] * 3
    # Inside A, queues rotate: q0, q1, q2, q0, ...
    a_queues = [q for a, q, _ in order if a == "A"][:6]
    assert a_queues == ["A-q0", "A-q1", "A-q2", "A-q0", "A-q1", "A-q2"]
    # Inside A-q0, connections take turns in request order.
    a_q0 = [c for a, q, c in order if q == "A-q0"][:4]
    assert a_q0 == ["A00", "A01", "A00", "A01"]


def test_big_application_gets_no_more_turns_than_small_one_while_both_busy():
    s = FairScheduler(SchedulerLimits(claims_per_connection_per_cycle=10**6))
    for q in range(10):
        for c in range(4):
            s.submit(ticket(f"big-{q}-{c}", "big", f"big-q{q}"))
    s.submit(ticket("small", "small", "small-q"))
    in_flight = []
    for step in range(400):
        in_flight.extend(s.grant(float(step)))
        # Complete the oldest claim and resubmit for that connection: both stay busy.
        g = in_flight.pop(0)
        s.complete(g, float(step), empty=False)
        s.submit(g.request)
    turns = s.statistics().turns_by_application
    assert abs(turns["big"] - turns["small"]) <= 1, turns


def test_limits_are_never_exceeded_under_random_load():
    limits = SchedulerLimits()
    s = FairScheduler(limits)
    rng = random.Random(7)
    conns = [ticket(f"c{i}", f"app{i % 9}", *(f"q{i % 9}-{k}" for k in range(1 + i % 3))) for i in range(200)]
    in_flight = []
    refused_full = 0
    now = 0.0
    for _ in range(5000):
        now += rng.random() * 0.05
        action = rng.random()
        if action < 0.5:
            t = rng.choice(conns)
            try:
                s.submit(t)
            except AlreadyOutstanding:
                pass
            except SchedulerFull:
                refused_full += 1
        elif action < 0.6:
            s.forget_connection(rng.choice(conns).connection_id)
        else:
            if in_flight and rng.random() < 0.5:
                g = in_flight.pop(rng.randrange(len(in_flight)))
                s.complete(g, now, empty=rng.random() < 0.3)
        granted = s.grant(now)
        in_flight.extend(granted)
        stats = s.statistics()
        assert stats.in_flight <= 4
        assert stats.pending + stats.in_flight <= 128
        per_app = {}
        for g in in_flight:
            per_app[g.request.application_id] = per_app.get(g.request.application_id, 0) + 1
        assert max(per_app.values(), default=0) <= 1
        per_conn = [g.request.connection_id for g in in_flight]
        assert len(per_conn) == len(set(per_conn))
    stats = s.statistics()
    assert stats.max_in_flight_seen == 4
    assert stats.max_application_in_flight_seen == 1
    assert stats.max_requests_seen <= 128


def test_request_limit_and_one_outstanding_per_connection():
    s = FairScheduler(SchedulerLimits())
    for i in range(128):
        s.submit(ticket(f"c{i}", f"a{i}", "q"))
    with pytest.raises(SchedulerFull):
        s.submit(ticket("c128", "a128", "q"))
    with pytest.raises(AlreadyOutstanding):
        s.submit(ticket("c0", "a0", "q"))
    grants = s.grant(0.0)
    assert len(grants) == 4
    # In-flight requests still count against the 128 and against their connection.
    with pytest.raises(AlreadyOutstanding):
        s.submit(grants[0].request)
    with pytest.raises(SchedulerFull):
        s.submit(ticket("c999", "a999", "q"))
    s.complete(grants[0], 0.0, empty=False)
    s.submit(ticket("c999", "a999", "q"))


def test_one_in_flight_per_application_lets_other_applications_claim():
    s = FairScheduler(SchedulerLimits())
    for i in range(10):
        s.submit(ticket(f"a{i}", "A", f"qa{i}"))
    s.submit(ticket("b0", "B", "qb"))
    grants = s.grant(0.0)
    assert [g.request.application_id for g in grants] == ["A", "B"]
    assert s.grant(0.0) == []


def test_pacing_four_claims_per_connection_per_cycle():
    s = FairScheduler(SchedulerLimits())
    t = ticket("c", "A", "q")
    times = []
    now = 0.0
    while len(times) < 12:
        s.submit(t)
        grants = s.grant(now)
        if grants:
            times.append(now)
            s.complete(grants[0], now, empty=False)
        else:
            wake = s.next_wakeup(now)
            assert wake is not None and wake > now
            s.withdraw("c")
            now = wake
            continue
        s.withdraw("c")
        now += 0.01
    cycles = [int(t // 1.0) for t in times]
    assert cycles == [0] * 4 + [1] * 4 + [2] * 4


def test_multi_queue_request_is_served_once_at_the_first_turn():
    s = FairScheduler(SchedulerLimits(sql_slots=1))
    s.submit(ticket("x", "A", "q1", "q2"))
    s.submit(ticket("y", "A", "q2"))
    g1 = s.grant(0.0)
    assert [(g.request.connection_id, g.queue_id) for g in g1] == [("x", "q1")]
    s.complete(g1[0], 0.0, empty=False)
    g2 = s.grant(0.0)
    # x left q2's line when it was granted in q1; y is next there.
    assert [(g.request.connection_id, g.queue_id) for g in g2] == [("y", "q2")]
    s.complete(g2[0], 0.0, empty=False)
    assert s.grant(0.0) == []
    assert s.statistics().pending == 0


def test_empty_result_cache_holds_requests_without_sql_until_expiry_or_arrival():
    s = FairScheduler(SchedulerLimits())
    t = ticket("c1", "A", "q")
    s.submit(t)
    [g] = s.grant(0.0)
    s.complete(g, 0.0, empty=True)
    # Same key within the cycle: no grant (no SQL), for this and for another connection alike.
    s.submit(t)
    s.submit(ticket("c2", "A", "q"))
    assert s.grant(0.5) == []
    assert s.statistics().cached_empty_skips >= 2
    assert s.next_wakeup(0.5) == pytest.approx(1.0)
    # A different capability set never shares the entry.
    s.submit(ticket("c3", "A", "q", caps=frozenset({("h", "v2", "v1")})))
    assert [g.request.connection_id for g in s.grant(0.5)] == ["c3"]
    # Expiry: one scan cycle later the queue is asked again.
    assert [g.request.connection_id for g in s.grant(1.0)] == []  # A's one in-flight claim (c3) still runs
    s.complete(s._in_flight["c3"], 1.0, empty=False)
    assert [g.request.connection_id for g in s.grant(1.0)] == ["c1"]


def test_task_arrival_wakes_the_queue_at_once():
    s = FairScheduler(SchedulerLimits())
    t = ticket("c1", "A", "q")
    s.submit(t)
    [g] = s.grant(0.0)
    s.complete(g, 0.0, empty=True)
    s.submit(t)
    assert s.grant(0.3) == []  # its next slot is open (0.25), but the queue is cached empty
    s.task_arrived("q")
    assert [g.request.connection_id for g in s.grant(0.3)] == ["c1"]


def test_cache_bound_and_expiry():
    cache = EmptyResultCache(ttl_s=1.0, max_entries=128)
    keys = [CacheKey("ns", f"q{i}", CAPS, False) for i in range(200)]
    for key in keys:
        cache.store_empty(key, 0.0)
        assert len(cache) <= 128
    assert len(cache) == 128 and cache.evictions == 72
    assert not cache.is_empty(keys[0], 0.1)  # evicted first
    assert cache.is_empty(keys[-1], 0.1)
    assert not cache.is_empty(keys[-1], 1.0)  # expired after one cycle
    assert not cache.is_empty(CacheKey("ns", "q199", CAPS, True), 0.1)  # resource-key support differs


def test_widen_raises_a_waiting_request_and_keeps_its_place():
    s = FairScheduler(SchedulerLimits(sql_slots=1))
    s.submit(ticket("c1", "a1", "q1"))
    s.submit(ticket("c2", "a1", "q1"))
    assert s.widen("c1", 5)
    assert not s.widen("c1", 4)  # never lowered
    assert not s.widen("nobody", 9)
    (grant,) = s.grant(0.0)
    assert grant.request.connection_id == "c1" and grant.claim.limit == 5
    assert not s.widen("c1", 9)  # running: left alone


def test_an_application_keeps_its_place_while_its_only_request_runs():
    """Where the SQL slots are the bottleneck, an application with one connection (its one
    request always in flight or just resubmitted) gets as many turns as one with 40
    connections over 10 queues: it does not fall to the back of the rotation each time
    its only request is granted."""
    s = FairScheduler(SchedulerLimits(sql_slots=2, claims_per_connection_per_cycle=10**9))
    requests = [ticket(f"a{i}", "A", f"qa{i % 10}") for i in range(40)]
    requests += [ticket("b1", "B", "qb"), ticket("c1", "C", "qc"), ticket("c2", "C", "qc"), ticket("d1", "D", "qd")]
    for request in requests:
        s.submit(request)
    in_flight: list = []
    turns: Counter[str] = Counter()
    now = 0.0
    for _ in range(2000):
        for grant in s.grant(now):
            in_flight.append(grant)
            turns[grant.request.application_id] += 1
        done = in_flight.pop(0)
        now += 0.001
        s.complete(done, now, empty=False)
        s.submit(done.request)  # the connection asks again at once
    counts = [turns[app] for app in "ABCD"]
    assert max(counts) - min(counts) <= 1, turns
    jain = sum(counts) ** 2 / (len(counts) * sum(c * c for c in counts))
    assert jain >= 0.99


def test_an_application_whose_claim_ended_without_a_new_request_leaves_the_rotation():
    s = FairScheduler(SchedulerLimits(sql_slots=1))
    s.submit(ticket("a1", "A", "qa"))
    (grant,) = s.grant(0.0)
    assert s.statistics().active_applications == 1  # in flight: keeps its place
    s.complete(grant, 0.1, empty=False)
    assert s.grant(0.2) == []
    assert s.statistics().active_applications == 0


def test_pacing_records_are_bounded_by_live_and_in_flight_connections():
    """A connection that leaves while its claim runs loses its pacing record when the claim
    completes: 10,000 such departures leave nothing behind."""
    s = FairScheduler(SchedulerLimits(sql_slots=4, max_requests=16))
    for i in range(10_000):
        s.submit(ticket(f"c{i}", "A", "q"))
        (grant,) = s.grant(float(i))
        s.forget_connection(f"c{i}")  # gone with the claim in flight
        assert s.statistics().tracked_connections == 1
        s.complete(grant, float(i), empty=False)
        assert s.statistics().tracked_connections == 0
    # A live connection keeps its record (pacing still applies to it) until it leaves.
    s.submit(ticket("live", "A", "q"))
    (grant,) = s.grant(0.0)
    s.complete(grant, 0.0, empty=False)
    assert s.statistics().tracked_connections == 1
    s.forget_connection("live")
    assert s.statistics().tracked_connections == 0
    assert s._departed == set() and s._overtaken == set()


def test_an_arrival_during_a_probe_wins_over_its_empty_result():
    """An empty claim that ran while a task arrived for its queue is not remembered: its read
    may predate the task's commit, and the task must not wait a whole cycle."""
    s = FairScheduler(SchedulerLimits(sql_slots=4, scan_cycle_s=1.0))
    s.submit(ticket("c1", "A", "q"))
    (probe,) = s.grant(0.0)
    s.task_arrived("q")  # committed while the probe's read ran
    s.complete(probe, 0.1, empty=True)
    s.submit(ticket("c1", "A", "q"))
    assert [g.queue_id for g in s.grant(0.25)] == ["q"]  # at its next slot, no cached empty
    # Without an arrival the empty result is remembered for the cycle, as before.
    (again,) = s._in_flight.values()
    s.complete(again, 0.3, empty=True)
    s.submit(ticket("c1", "A", "q"))
    assert s.grant(0.4) == []
    # An arrival for another queue does not discard a probe's result.
    s.task_arrived("other")
    assert s.grant(0.5) == []


# -- virtual time ----------------------------------------------------------------------


def run_with_a_pause(s: FairScheduler, pausing: str, gap: int, grants: int) -> str:
    """One request per connection, one SQL slot, each claim completed at once. Every
    connection asks again at once, except ``pausing``, which asks again only after
    ``gap`` further grants (its Worker still waits for its Finish ack). Returns the
    connections in grant order."""
    requests = {r.connection_id: r for r in s._pending.values()}
    back_at: dict[str, int] = {}
    order = []
    for i in range(grants):
        for connection_id in [c for c, at in back_at.items() if at <= i]:
            s.submit(requests[connection_id])
            del back_at[connection_id]
        now = tick(s)
        (grant,) = s.grant(now)
        connection_id = grant.request.connection_id
        order.append(connection_id)
        s.complete(grant, now, empty=False)
        if connection_id == pausing:
            back_at[connection_id] = i + 1 + gap
        else:
            s.submit(grant.request)
    return "".join(order)


@pytest.mark.parametrize("level", ["applications", "queues"])
def test_a_pause_costs_only_the_turns_missed_not_a_place_at_the_back(level):
    """A's connection asks again only three turns after each of its claims: it is away
    when its next turn comes, so it misses that turn. It then takes the first turn after
    those already waiting (C), not a place behind everyone (P3's rotation before virtual
    time put it behind B as well: 'ABCBCBACBCBC', a turn in 6-7 instead of 5). The same
    holds for the queues of one application."""
    s = FairScheduler(SchedulerLimits(sql_slots=1, claims_per_connection_per_cycle=10**9))
    for name in "ABC":
        if level == "applications":
            s.submit(ticket(name, name, f"q{name}"))
        else:
            s.submit(ticket(name, "app", f"q{name}"))
    order = run_with_a_pause(s, "A", gap=3, grants=300)
    assert order[:15] == "ABCBC" * 3
    assert order.count("A") == 60


def test_a_pause_shorter_than_the_round_costs_nothing():
    s = FairScheduler(SchedulerLimits(sql_slots=1, claims_per_connection_per_cycle=10**9))
    for name in "ABCD":
        s.submit(ticket(name, name, f"q{name}"))
    assert run_with_a_pause(s, "A", gap=3, grants=40) == "ABCD" * 10


def test_weights_share_the_turns_and_weight_one_is_the_plain_rotation():
    s = FairScheduler(SchedulerLimits(sql_slots=1, claims_per_connection_per_cycle=10**9))
    s.set_weight("Z", 4)
    s.set_weight("Y", 2)
    s.set_weight("X", 3)
    s.set_weight("X", 1)  # back to the default
    for name in "XYZ":
        s.submit(ticket(name, name, f"q{name}"))
    order = "".join(a for a, _, _ in drain_one_at_a_time(s, resubmit=lambda t: t, rounds=700))
    assert Counter(order) == {"Z": 400, "Y": 200, "X": 100}
    # Within every 7 turns: 4, 2 and 1, in virtual-time order (ties: who waited longest).
    assert order[:14] == "XYZZYZZ" * 2
    stats = s.statistics()
    assert stats.weight_by_application == {"X": 1, "Y": 2, "Z": 4}
    assert stats.virtual_time == 99.75
    assert stats.virtual_time_by_application == {"X": 100.0, "Y": 100.0, "Z": 100.0}


@pytest.mark.parametrize("weight", [0, 101, -1, 1.5, True, "2"])
def test_a_weight_is_an_integer_from_1_to_100(weight):
    s = FairScheduler(SchedulerLimits())
    with pytest.raises(ValueError):
        s.set_weight("A", weight)
    s.set_weight("A", 100)
    assert s.weight("A") == 100


def test_an_application_idle_for_long_starts_at_the_node_s_virtual_time():
    """B works, goes away while A takes 100 turns, comes back: it starts level with A
    (no credit for the 100 turns), then they alternate."""
    s = FairScheduler(SchedulerLimits(sql_slots=1, claims_per_connection_per_cycle=10**9))
    s.submit(ticket("a", "A", "qa"))
    s.submit(ticket("b", "B", "qb"))
    assert [a for a, _, _ in drain_one_at_a_time(s, rounds=2)] == ["A", "B"]
    s.submit(ticket("a", "A", "qa"))
    drain_one_at_a_time(s, resubmit=lambda t: t, rounds=100)
    assert s.statistics().virtual_time_by_application == {"A": 101.0}  # B is forgotten
    s.submit(ticket("b", "B", "qb"))
    assert s.statistics().virtual_time_by_application == {"A": 101.0, "B": 100.0}
    order = [a for a, _, _ in drain_one_at_a_time(s, resubmit=lambda t: t, rounds=10)]
    assert order == ["B", "A"] * 5


def test_charge_counts_turns_taken_elsewhere():
    """The hook for a share across nodes: A, charged 3 turns, waits 3 turns longer; a charge
    to an application this node does not know is dropped (it would start at the node's
    virtual time anyway); with weight 2, 4 turns elsewhere cost 2."""
    s = FairScheduler(SchedulerLimits(sql_slots=1, claims_per_connection_per_cycle=10**9))
    for name in "AB":
        s.submit(ticket(name, name, f"q{name}"))
    s.charge("A", 3)
    s.charge("nobody", 5)
    order = "".join(a for a, _, _ in drain_one_at_a_time(s, resubmit=lambda t: t, rounds=7))
    assert order == "BBBABAB"
    assert s.statistics().virtual_time_by_application == {"A": 5.0, "B": 5.0}
    s.set_weight("B", 2)
    s.charge("B", 4)
    assert s.statistics().virtual_time_by_application == {"A": 5.0, "B": 7.0}
    with pytest.raises(ValueError):
        s.charge("A", -1)


def cycles_with_turns_elsewhere(s: FairScheduler, elsewhere, *, cycles: int, grants_per_cycle: int) -> Counter:
    """One SQL slot, every request asked again at once. Each cycle (a node's scan cycle):
    ``charge_elsewhere(elsewhere(cycle))`` (the turns the other nodes granted since the
    previous read), then ``grants_per_cycle`` local turns. Returns the local turns per
    application."""
    local: Counter[str] = Counter()
    for cycle in range(cycles):
        s.charge_elsewhere(elsewhere(cycle))
        for app, _, _ in drain_one_at_a_time(s, resubmit=lambda t: t, rounds=grants_per_cycle):
            local[app] += 1
    return local


def test_turns_taken_elsewhere_even_out_the_cluster_wide_share():
    """A takes 3 turns a cycle on other nodes; this node grants 12 a cycle to A, B and C,
    all always asking. Counted across the cluster they share evenly: A 2 + 3, B 5, C 5."""
    s = FairScheduler(SchedulerLimits(sql_slots=1, claims_per_connection_per_cycle=10**9))
    for name in "ABC":
        s.submit(ticket(name, name, f"q{name}"))
    local = cycles_with_turns_elsewhere(s, lambda _: {"A": 3}, cycles=100, grants_per_cycle=12)
    assert abs(local["A"] - 200) <= 3 and abs(local["B"] - 500) <= 3 and abs(local["C"] - 500) <= 3, local
    # With weights: B of weight 2 is charged half as much per turn, so it takes twice A's share.
    s = FairScheduler(SchedulerLimits(sql_slots=1, claims_per_connection_per_cycle=10**9))
    s.set_weight("B", 2)
    for name in "AB":
        s.submit(ticket(name, name, f"q{name}"))
    local = cycles_with_turns_elsewhere(s, lambda _: {"A": 2, "B": 4}, cycles=100, grants_per_cycle=12)
    # A takes 4 here + 2 elsewhere a cycle, B 8 + 4: 6 and 12 across the cluster, as 1 : 2.
    assert abs(local["A"] - 400) <= 3 and abs(local["B"] - 800) <= 3, local


def test_an_application_served_enough_elsewhere_gets_no_turn_while_others_ask_and_every_turn_when_they_do_not():
    """A takes 20 turns a cycle elsewhere, more than this node's whole cycle: while B and C
    ask, it gets none here. The debt does not pile up: once the turns elsewhere stop, A is
    back within the turns of one cycle elsewhere (20 rounds of B and C), then the plain
    rotation. And the charge never withholds a turn: alone, A gets every one."""
    s = FairScheduler(SchedulerLimits(sql_slots=1, claims_per_connection_per_cycle=10**9))
    for name in "ABC":
        s.submit(ticket(name, name, f"q{name}"))
    local = cycles_with_turns_elsewhere(s, lambda _: {"A": 20}, cycles=50, grants_per_cycle=12)
    assert local == {"B": 300, "C": 300}
    assert s.statistics().virtual_time_by_application["A"] - s.statistics().virtual_time <= 21
    order = "".join(app for app, _, _ in drain_one_at_a_time(s, resubmit=lambda t: t, rounds=60))
    assert "A" in order[:43], order
    assert Counter(order[order.index("A") :][:12]) == {"A": 4, "B": 4, "C": 4}, order
    # Alone, A is granted at once whatever it was charged.
    s = FairScheduler(SchedulerLimits(sql_slots=1, claims_per_connection_per_cycle=10**9))
    s.submit(ticket("A", "A", "qA"))
    local = cycles_with_turns_elsewhere(s, lambda _: {"A": 1000}, cycles=10, grants_per_cycle=12)
    assert local == {"A": 120}


def test_charge_elsewhere_skips_unknown_applications_and_refuses_negative_turns():
    s = FairScheduler(SchedulerLimits(sql_slots=1))
    s.submit(ticket("a", "A", "qA"))
    s.charge_elsewhere({"A": 0, "nobody": 7})
    assert s.statistics().virtual_time_by_application == {"A": 0.0}
    s.charge_elsewhere({"A": 2})
    assert s.statistics().virtual_time_by_application == {"A": 2.0}
    with pytest.raises(ValueError):
        s.charge_elsewhere({"A": -1})


def test_virtual_time_state_is_bounded_by_the_applications_of_about_a_round():
    """10,000 applications come once and go: the rotation remembers only those whose
    virtual time is still ahead of the node's (the last round), and forgets each queue
    with its application."""
    s = FairScheduler(SchedulerLimits(sql_slots=2, claims_per_connection_per_cycle=10**9))
    s.submit(ticket("steady", "steady", "q-steady"))
    for i in range(10_000):
        s.submit(ticket(f"c{i}", f"app{i}", f"q{i}"))
        for grant in s.grant(float(i)):
            s.complete(grant, float(i), empty=False)
            if grant.request.application_id == "steady":
                s.submit(grant.request)
        assert len(s.statistics().virtual_time_by_application) <= 3
        assert len(s._app_queues) <= 3
    assert s.statistics().turns_by_application["steady"] >= 5_000


def test_the_rotation_stays_in_virtual_time_order_under_random_load():
    """Whatever happens (requests, withdrawals, grants, completions, weights, charges),
    the applications are offered turns by their virtual time (the node's, or their own where
    it is ahead, or behind it while their claim in flight held them back) and then by how
    long they waited, the rotation holds exactly those with a waiting or running
    request, and it remembers no application that left and is not ahead of the node."""
    s = FairScheduler(SchedulerLimits(sql_slots=3, in_flight_per_application=2, claims_per_connection_per_cycle=10**9))
    rng = random.Random(24)
    conns = [ticket(f"c{i}", f"app{i % 12}", *(f"q{i % 12}-{k}" for k in range(1 + i % 3))) for i in range(60)]
    in_flight = []
    for _ in range(5000):
        action = rng.random()
        if action < 0.4:
            t = rng.choice(conns)
            if not s.outstanding(t.connection_id):
                s.submit(t)
        elif action < 0.5:
            s.withdraw(rng.choice(conns).connection_id)
        elif action < 0.55:
            s.set_weight(f"app{rng.randrange(12)}", rng.choice([1, 2, 3, 7, 100]))
        elif action < 0.58:
            s.charge(f"app{rng.randrange(12)}", rng.randrange(3))
        elif action < 0.6:
            s.charge_elsewhere({f"app{rng.randrange(12)}": rng.randrange(4) for _ in range(3)})
        elif in_flight:
            s.complete(in_flight.pop(rng.randrange(len(in_flight))), tick(s), empty=False)
        in_flight.extend(s.grant(tick(s)))
        apps = s._apps
        line = list(apps.order())
        now = apps.now
        assert line == sorted(line, key=lambda k: (apps._time[k], apps._since[k]))
        # Behind the node's virtual time only while P3's rules hold it back (in flight here).
        assert all(apps._time[k] >= now or s._app_in_flight[k] for k in line)
        busy = {r.application_id for r in s._pending.values()} | {g.request.application_id for g in in_flight}
        assert set(line) == busy
        assert all(apps._time[k] > now for k in apps._time.keys() - busy)
        assert s._app_queues.keys() == apps._time.keys()
