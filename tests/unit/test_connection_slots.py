"""Who gets a Worker connection slot (``workers/slots.py``): the pure decision, with
properties over any counts, weights, limits and slots."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from orbit_node.workers.slots import Admitted, Refused, decide, fair_shares

APPS = ("a", "b", "c", "d", "e")

weights_st = st.fixed_dictionaries({app: st.integers(1, 100) for app in APPS})


@st.composite
def situations(draw, *, full: bool | None = None):
    """(slots, held per application, weights, newcomer)."""
    slots = draw(st.integers(1, 40))
    counts = draw(st.lists(st.integers(0, slots), min_size=len(APPS), max_size=len(APPS)))
    held: dict[str, int] = {}
    room = slots
    for app, count in zip(APPS, counts, strict=True):
        held[app] = min(count, room)
        room -= held[app]
    if full is True and room:
        held[draw(st.sampled_from(APPS))] += room
    if full is False and not room:
        fewer = draw(st.sampled_from([app for app in APPS if held[app]]))
        held[fewer] -= 1
    return slots, held, draw(weights_st), draw(st.sampled_from(APPS))


def shares_of(slots, held, weights, newcomer):
    return fair_shares(slots, {app for app, n in held.items() if n} | {newcomer}, weights.__getitem__)


def test_a_node_with_room_admits_anyone():
    assert decide("a", {"b": 3}, slots=4, weight=lambda app: 1) == Admitted()


def test_a_full_node_moves_a_connection_of_the_application_over_its_share():
    # A holds every slot; B (share 2 of 4) is admitted and one of A's is moved away.
    assert decide("b", {"a": 4}, slots=4, weight=lambda app: 1) == Admitted(evict="a")
    assert decide("b", {"a": 3, "b": 1}, slots=4, weight=lambda app: 1) == Admitted(evict="a")
    # At its share, B is refused; so is A (over its share), with its share named.
    assert decide("b", {"a": 2, "b": 2}, slots=4, weight=lambda app: 1) == Refused("node_full", 2, 2.0)
    assert decide("a", {"a": 3, "b": 1}, slots=4, weight=lambda app: 1) == Refused("node_full", 3, 2.0)


def test_weights_set_the_shares():
    weights = {"a": 1, "b": 3}.__getitem__
    # B's share of 4 is 3: its third connection still moves one of A's.
    assert decide("b", {"a": 2, "b": 2}, slots=4, weight=weights) == Admitted(evict="a")
    assert decide("b", {"a": 1, "b": 3}, slots=4, weight=weights) == Refused("node_full", 3, 3.0)


def test_an_application_a_fraction_under_its_share_is_refused_so_nothing_ping_pongs():
    # Shares 2.5 each: admitting A's third would put B under its share, and back again.
    assert decide("a", {"a": 2, "b": 3}, slots=5, weight=lambda app: 1) == Refused("node_full", 2, 2.5)


def test_the_most_over_application_with_a_movable_connection_gives_way():
    held = {"a": 3, "b": 2, "c": 1}
    weight = {"a": 1, "b": 1, "c": 1, "d": 3}.__getitem__
    # Shares of 6 among a, b, c (1 each) and d (3): 1, 1, 1, 3.
    assert decide("d", held, slots=6, weight=weight) == Admitted(evict="a")
    # A's connections are all still in their handshake: B is next.
    assert decide("d", held, slots=6, weight=weight, evictable={"b": 2, "c": 1}) == Admitted(evict="b")
    assert decide("d", held, slots=6, weight=weight, evictable={"c": 1}) == Refused("node_full", 0, 3.0)


def test_the_application_limit_refuses_beyond_it_whether_or_not_the_node_has_room():
    assert decide("a", {"a": 2}, slots=8, weight=lambda app: 1, limit=2) == Refused("application_limit", 2, 2)
    assert decide("a", {"a": 1}, slots=8, weight=lambda app: 1, limit=2) == Admitted()
    assert decide("a", {"a": 0, "b": 8}, slots=8, weight=lambda app: 1, limit=0) == Refused("application_limit", 0, 0)


@given(situations(full=False), st.none() | st.integers(0, 50))
def test_with_room_only_the_applications_own_limit_refuses(situation, limit):
    slots, held, weights, app = situation
    decision = decide(app, held, slots=slots, weight=weights.__getitem__, limit=limit)
    if limit is not None and held[app] >= limit:
        assert decision == Refused("application_limit", held[app], limit)
    else:
        assert decision == Admitted()


@given(situations(full=True))
def test_a_full_node_admits_exactly_the_applications_a_whole_slot_under_their_share(situation):
    slots, held, weights, app = situation
    shares = shares_of(slots, held, weights, app)
    decision = decide(app, held, slots=slots, weight=weights.__getitem__)
    if held[app] + 1 <= shares[app]:
        # Never refused: the slots add up to the shares, so another application is over its own.
        assert isinstance(decision, Admitted) and decision.evict is not None
        victim = decision.evict
        assert victim != app and held[victim] > shares[victim]
        # The victim is the most over its share.
        assert all(held[victim] - shares[victim] >= held[o] - shares[o] for o in shares if o != app)
    else:
        assert decision == Refused("node_full", held[app], shares[app])


@given(situations(full=True))
def test_a_moved_application_coming_straight_back_is_refused(situation):
    slots, held, weights, app = situation
    decision = decide(app, held, slots=slots, weight=weights.__getitem__)
    if not (isinstance(decision, Admitted) and decision.evict is not None):
        return
    after = dict(held)
    after[app] += 1
    after[decision.evict] -= 1
    again = decide(decision.evict, after, slots=slots, weight=weights.__getitem__)
    assert isinstance(again, Refused) and again.reason == "node_full"


@given(situations(full=True), st.lists(st.sampled_from(APPS), max_size=200))
def test_reconnecting_workers_settle_every_application_within_its_share_and_never_ping_pong(situation, arrivals):
    """Workers of every application keep connecting (a moved one reconnects at once):
    the node stays full, an application admitted on a full node never goes over its
    share, moves stop, and every application ends with at least its whole share."""
    slots, held, weights, _ = situation
    held = dict(held)
    moves = 0

    def arrive(app: str) -> bool:
        nonlocal moves
        decision = decide(app, held, slots=slots, weight=weights.__getitem__)
        if isinstance(decision, Refused):
            return False
        assert decision.evict is not None  # the node stays full
        held[app] += 1
        held[decision.evict] -= 1
        assert held[app] <= shares_of(slots, held, weights, app)[app]
        moves += 1
        # Bounded (a ping-pong would not be): well under one move per slot per application.
        assert moves <= slots * len(APPS)
        return True

    for app in arrivals:
        arrive(app)
    # Then every application keeps trying until a whole round changes nothing.
    while any([arrive(app) for app in APPS]):
        pass
    assert sum(held.values()) == slots
    shares = fair_shares(slots, APPS, weights.__getitem__)
    # Everyone asked: each holds at least the whole part of its share (the fractions are
    # first come, first served).
    assert all(held[app] >= math.floor(shares[app]) for app in APPS)
