"""The pure rules of depends_on (orbit_node.dependencies), property-tested: when a new
task starts waiting, queued or cancelled, and which children a set of successes releases."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from orbit_node.domain.dependencies import (
    DEPENDENCY_FAILED,
    FAILED_ENDS,
    Start,
    count_off,
    start_of,
    waiting_summary,
)

STATES = ("waiting", "queued", "reserved", "running", "succeeded", "failed", "cancelled", "expired")
ids = st.text(alphabet="0123456789abcdef", min_size=2, max_size=2)
parent_states = st.dictionaries(ids, st.sampled_from(STATES), min_size=1, max_size=12)


@given(parent_states)
def test_a_new_task_starts_by_its_parents_states(parents):
    start = start_of(parents)
    failed = sorted(p for p, s in parents.items() if s in FAILED_ENDS)
    if failed:
        # Any parent that ended without success: cancelled at once, naming the first by id.
        assert start.state == "cancelled" and start.failed_parent == failed[0]
        error = json.loads(start.error)
        assert error["code"] == DEPENDENCY_FAILED and error["parent_task_id"] == failed[0]
        assert parents[failed[0]] in error["message"]
    elif all(s == "succeeded" for s in parents.values()):
        assert start == Start("queued") and start.error is None
    else:
        assert start.state == "waiting"
        assert start.parents_left == sum(s != "succeeded" for s in parents.values())


@st.composite
def families(draw):
    """Children, each with a set of parents and how many of them were still pending."""
    parents = draw(st.lists(ids, min_size=1, max_size=8, unique=True))
    children = draw(st.lists(ids.map(lambda i: "c" + i), min_size=1, max_size=6, unique=True))
    edges = []
    waits = {}
    for child in children:
        mine = draw(st.lists(st.sampled_from(parents), min_size=1, unique=True))
        edges.extend((p, child) for p in mine)
        waits[child] = len(mine)
    return parents, edges, waits


@given(families(), st.data())
def test_successes_counted_in_any_grouping_release_each_child_exactly_once(family, data):
    """However the parents' successes are split over transactions (and in whatever order),
    a child is released exactly once: in the transaction of its last parent."""
    parents, edges, waits = family
    order = data.draw(st.permutations(parents))
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(order) - 1)), max_size=len(order))))
    groups, start = [], 0
    for cut in [*cuts, len(order)]:
        if cut > start:
            groups.append(order[start:cut])
            start = cut
    released: list[str] = []
    state = dict(waits)
    done: set[str] = set()
    for group in groups:
        counted = count_off(edges * 2, group, state)  # an edge given twice counts once
        done.update(group)
        for child in counted.released:
            assert all(p in done for p, c in edges if c == child)
            del state[child]
        state.update(counted.still_waiting)
        released.extend(counted.released)
    assert sorted(released) == sorted(waits)
    assert state == {}


def test_a_child_no_longer_waiting_is_left_alone():
    counted = count_off([("p", "c")], ["p"], {})
    assert counted.released == () and counted.still_waiting == {}


def test_the_summary_names_the_parents_still_pending():
    summary = waiting_summary({"a": "succeeded", "b": "running", "c": None})
    assert summary == "waiting for 2 of 3 parents: b, c"
    many = waiting_summary({f"{i:02d}": "queued" for i in range(12)})
    assert many.endswith("09 and 2 more") and many.startswith("waiting for 12 of 12 parents: 00, 01")
