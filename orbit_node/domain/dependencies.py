"""Tasks that wait for other tasks, pure: the rules of ``depends_on`` (docs/api.md,
"Dependencies"), decided here and applied by the store in the transactions that accept a
task and finish its parents.

* A new task whose parents all succeeded is ``queued`` as any other; one with a parent
  that has not finished yet (or was accepted in the same transaction) is ``waiting``,
  never claimed, with the count of parents it still waits for; one with a parent that
  ended failed, cancelled or expired is ``cancelled`` at once with ``DEPENDENCY_FAILED``
  (it could never run). The order in which parents and children arrive does not matter:
  a child accepted just before its parent's Finish and one accepted just after end alike.
* The Finish that makes a parent succeed counts it off each waiting child, in the same
  transaction; a child whose count reaches 0 is released: ``queued``, available at the
  later of its own time and now, and from then on dispatched as every task (P3).
* A parent that ends without success cancels its waiting children (``DEPENDENCY_FAILED``
  naming it), and theirs, level by level (``store/dependencies.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

import attrs

WAITING = "waiting"
SUCCEEDED = "succeeded"
# The terminal states that are not success: a parent in one of them fails its children.
FAILED_ENDS = ("failed", "cancelled", "expired")
# The error code of a task cancelled because a parent did not succeed.
DEPENDENCY_FAILED = "DEPENDENCY_FAILED"


@attrs.frozen
class Start:
    """The state a new task starts in, given its parents' states."""

    state: str
    # Parents it still waits for (``waiting`` only).
    parents_left: int = 0
    # ``cancelled``: the parent that did not succeed, and how it ended.
    failed_parent: str | None = None
    failed_state: str | None = None

    @property
    def error(self) -> str | None:
        """The stored error of a task cancelled at acceptance (None otherwise)."""
        if self.failed_parent is None or self.failed_state is None:
            return None
        return dependency_error(self.failed_parent, self.failed_state)


def start_of(parents: Mapping[str, str]) -> Start:
    """Where a task whose parents are in these states (parent id -> state) starts.

    A parent in any state other than the terminal ones (including ``waiting`` and a
    parent accepted in the same transaction, ``queued``) is waited for.
    """
    failed = sorted((task_id, state) for task_id, state in parents.items() if state in FAILED_ENDS)
    if failed:
        task_id, state = failed[0]
        return Start("cancelled", failed_parent=task_id, failed_state=state)
    left = sum(1 for state in parents.values() if state != SUCCEEDED)
    return Start(WAITING, parents_left=left) if left else Start("queued")


@attrs.frozen
class Counted:
    """What a transaction's successes do to the waiting children it locked."""

    # Children released (their count reached 0), in id order.
    released: tuple[str, ...]
    # Children still waiting: id -> the parents they still wait for.
    still_waiting: Mapping[str, int]


def count_off(edges: Iterable[tuple[str, str]], succeeded: Iterable[str], waits: Mapping[str, int]) -> Counted:
    """Count the ``succeeded`` parents off their children.

    ``edges``: (parent, child) of those parents; ``waits``: child -> parents it waited
    for before this transaction, for the children still waiting (a child that is gone
    from it was released or cancelled before and is left alone). A parent is counted
    once per child however often an edge is given.
    """
    done = set(succeeded)
    counts: dict[str, int] = {}
    for parent, child in set(edges):
        if parent in done and child in waits:
            counts[child] = counts.get(child, 0) + 1
    released: list[str] = []
    still: dict[str, int] = {}
    for child in sorted(counts):
        left = waits[child] - counts[child]
        if left <= 0:
            released.append(child)
        else:
            still[child] = left
    return Counted(tuple(released), still)


def dependency_error(parent_task_id: str, parent_state: str) -> str:
    """The stored error of a task cancelled because ``parent_task_id`` ended ``parent_state``."""
    return json.dumps(
        {
            "code": DEPENDENCY_FAILED,
            "message": f"parent task {parent_task_id} ended {parent_state}",
            "parent_task_id": parent_task_id,
        },
        separators=(",", ":"),
    )


def waiting_summary(parents: Mapping[str, str | None]) -> str:
    """How explain says what a waiting task waits for: parent id -> its state (None: the
    parent is gone, which retention never does while a child waits)."""
    pending = [task_id for task_id, state in sorted(parents.items()) if state != SUCCEEDED]
    shown = ", ".join(pending[:10]) + (f" and {len(pending) - 10} more" if len(pending) > 10 else "")
    return f"waiting for {len(pending)} of {len(parents)} parents: {shown}"
