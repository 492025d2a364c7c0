"""How a claim counts the holders of a resource key (orbit_node.store.claim): pure
functions, no database."""

from __future__ import annotations

import pytest

from orbit_node.store.claim import key_holders, running_per_key


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
