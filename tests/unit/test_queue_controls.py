"""Queue controls as the API reads them (orbit_node.rules), and how a claim counts the
holders of a resource key (orbit_node.store.claim): pure functions, no database."""

from __future__ import annotations

import pytest

from orbit_node.domain import rules
from orbit_node.domain.errors import InvalidArgument
from orbit_node.store.claim import key_holders, running_per_key


def test_a_new_queue_admits_one_task_of_a_key_at_a_time_unless_told_otherwise():
    assert rules.create_queue({"name": "q"})["max_running_per_key"] == 1
    assert rules.create_queue({"name": "q", "max_running_per_key": 3})["max_running_per_key"] == 3
    assert rules.create_queue({"name": "q"})["max_concurrency"] is None


@pytest.mark.parametrize("value", [1, 2, 999, 1000])
def test_max_running_per_key_takes_1_to_1000(value):
    assert rules.queue_controls({"max_running_per_key": value}) == {"max_running_per_key": value}


@pytest.mark.parametrize("value", [0, -1, 1001, None, True, 2.0, 1.5, "3", [3], {"n": 3}])
def test_max_running_per_key_refuses_anything_else_naming_the_field(value):
    with pytest.raises(InvalidArgument) as refused:
        rules.queue_controls({"max_running_per_key": value})
    assert refused.value.field == "max_running_per_key"
    assert "from 1 to 1000" in refused.value.message
    with pytest.raises(InvalidArgument) as refused:
        rules.create_queue({"name": "q", "max_running_per_key": value})
    assert refused.value.field == "max_running_per_key"


def test_controls_name_what_changes_and_only_that():
    assert rules.queue_controls({"max_concurrency": None, "max_running_per_key": 2}) == {
        "max_concurrency": None,
        "max_running_per_key": 2,
    }
    with pytest.raises(InvalidArgument, match="max_running_per_key") as refused:
        rules.queue_controls({})
    assert refused.value.field == "body"


def key_row(holder: str | None, state: str | None, further: int | None = None) -> dict:
    row = {"holder_task_id": holder, "holder_state": state}
    if further is not None:
        row["further_live"] = further
    return row


@pytest.mark.parametrize(
    ("row", "holders"),
    [
        (key_row(None, None), 0),
        (key_row("t", "running"), 1),
        (key_row("t", "reserved", 2), 3),
        # A first holder that no longer holds (repair) does not count; further ones still do.
        (key_row("t", "succeeded", 2), 2),
        (key_row("t", None, 0), 0),
        (key_row(None, None, 4), 4),
    ],
)
def test_a_key_counts_its_live_holders(row, holders):
    assert key_holders(row) == holders


def test_a_stored_limit_below_one_still_admits_one():
    """The column has no CHECK (000028): a claim never reads it as "none at all"."""
    assert [running_per_key(v) for v in (0, -3, 1, 7)] == [1, 1, 1, 7]
