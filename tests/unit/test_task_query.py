"""The task filter, its cursor and what cancel and retry do to one task: pure, no database."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta

import pytest

from orbit_node.domain.errors import FailedPrecondition, InvalidArgument
from orbit_node.domain.rules import LATEST
from orbit_node.domain.task_query import (
    CANCEL_NOW,
    CANCEL_REQUEST,
    STATES,
    UNCHANGED,
    TaskCursor,
    TaskFilter,
    bulk_request,
    cancel_action,
    filter_from_json,
    filter_from_query,
    retry_deadline,
    retry_refusal,
)

ID = "0123456789abcdef" * 2


def test_query_lists_are_repeated_or_comma_separated_and_deduplicated():
    found = filter_from_query({"state": ["failed,expired", "failed"], "priority": ["9", "0"], "task_ids": [ID, ID]})
    assert found.states == ("failed", "expired") and found.priorities == (0, 9) and found.task_ids == (ID,)
    assert filter_from_query({}) == TaskFilter() and TaskFilter().is_empty


@pytest.mark.parametrize(
    ("listed", "low", "high", "levels"),
    [
        (None, None, None, None),
        (None, "0", "9", None),  # every level: no condition at all
        (None, "7", None, (7, 8, 9)),
        (["1", "5", "8"], "4", "8", (5, 8)),
        (["1"], "4", None, ()),  # nothing can match
    ],
)
def test_priority_lists_and_ranges_combine_into_one_set_of_levels(listed, low, high, levels):
    params = {
        "priority": listed,
        "priority_min": None if low is None else [low],
        "priority_max": None if high is None else [high],
    }
    found = filter_from_query({k: v for k, v in params.items() if v is not None})
    assert found.priorities == levels and found.matches_nothing == (levels == ())


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"state": "finished"}, "filter.state"),
        ({"state": ["failed", 3]}, "filter.state[1]"),
        ({"priority": True}, "filter.priority"),
        ({"priority_min": 2, "priority_max": 1}, "filter.priority_max"),
        ({"task_ids": []}, "filter.task_ids"),
        ({"queue_id": ID.upper()}, "filter.queue_id"),
        (
            {"finished_after": "2030-01-01T00:00:00Z", "finished_before": "2030-01-01T00:00:00Z"},
            "filter.finished_before",
        ),
        ({"created_after": "2030-01-01"}, "filter.created_after"),
        ({"handler": ""}, "filter.handler"),
    ],
)
def test_json_filters_name_the_field_they_refuse(body, field):
    with pytest.raises(InvalidArgument) as refused:
        filter_from_json(body)
    assert refused.value.field == field and refused.value.message.startswith(field)


def test_a_bulk_request_needs_a_filter_of_at_least_one_field():
    asked = bulk_request({"filter": {"state": "failed", "created_after": "2030-01-01T01:00:00+01:00"}})
    assert asked.filter.states == ("failed",) and asked.filter.created_after == datetime(2030, 1, 1)
    assert asked.limit == 1000 and asked.after is None
    for body, field in (({}, "filter"), ({"filter": {}}, "filter"), ({"filter": {"state": "failed"}, "x": 1}, "x")):
        with pytest.raises(InvalidArgument) as refused:
            bulk_request(body)
        assert refused.value.field == field


def test_cursors_round_trip_and_refuse_anything_else():
    cursor = TaskCursor(datetime(2030, 1, 2, 3, 4, 5, 678901), ID)
    assert TaskCursor.decode(cursor.encode()) == cursor
    for text in ("", "x", "dDEuMDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY", 5, None):
        with pytest.raises(InvalidArgument) as refused:
            TaskCursor.decode(text)
        assert refused.value.field == "cursor"


def test_what_cancel_and_retry_do_to_each_state():
    actions = {state: cancel_action(ID, state, False) for state in STATES}
    assert actions["queued"] == CANCEL_NOW and actions["running"] == CANCEL_REQUEST
    assert actions["cancelled"] == UNCHANGED and cancel_action(ID, "reserved", True) == UNCHANGED
    assert all(isinstance(actions[s], FailedPrecondition) for s in ("succeeded", "failed", "expired"))
    refusals = {state: retry_refusal(ID, state) for state in STATES}
    assert [s for s, r in refusals.items() if r is None] == ["failed", "cancelled", "expired"]
    assert "it succeeded" in refusals["succeeded"].message and refusals["running"].field == "task_id"


def test_a_retry_keeps_the_time_budget_of_the_original_deadline():
    created, now = datetime(2030, 1, 1), datetime(2030, 6, 1)
    assert retry_deadline(None, created, now) is None
    assert retry_deadline(created + timedelta(hours=1), created, now) == now + timedelta(hours=1)
    assert retry_deadline(created - timedelta(seconds=5), created, now) == now - timedelta(seconds=5)
    assert retry_deadline(LATEST, created, now) == LATEST


def test_the_module_is_pure():
    code = (
        "import sys, orbit_node.domain.task_query; "
        "assert not {'quart', 'hypercorn', 'trio_mysql', 'trio_websocket', 'trio'} & set(sys.modules), sorted(sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
