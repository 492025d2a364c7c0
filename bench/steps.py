"""Where the node's time goes, by trio task: a sampling profiler's figures, without its
blind spots.

py-spy counts a thread as on CPU while it sits in a ``send`` that wakes MariaDB, and
truncates many of the node's stacks, so its shares of the node's CPU are skewed (bench/
README.md, "What the profiles really say"). Here the node (``bench.nodeproc
--task-clock``) reads its thread's CPU time before and after every step of every trio
task (``TaskClock``). The time is summed by the task's name (its coroutine) and written
with the node's statistics; a scenario takes the difference over its phase and groups
the names into the node's parts (``by_part``). What no step holds (trio's scheduler and
its I/O polling between steps) is the node's CPU over the phase minus the steps' sum.

Wall time would not do: the node shares two cores with MariaDB and the Workers, and a
step's wall time counts the time the machine ran them instead (the steps' wall times
summed to 1.37x the node's CPU in S1 at capacity 16). A CPU clock read is a system call
(about 1 us here): two per step, about 3 steps per task at capacity 16 (about 1 % of the
node's CPU per task), and the clock's own cost lands partly in the steps, partly outside.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import trio

# The node's parts, by the start of a trio task's name; the first that matches wins.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("claims", ("orbit_node.dispatch.claim_pool.",)),
    ("group commits", ("orbit_node.group_commit.engine.",)),
    ("Worker connections", ("orbit_node.workers.",)),
    ("HTTP and WebSocket server", ("hypercorn.", "quart_trio.", "quart.", "trio._highlevel_serve_listeners.")),
)
OTHER = "other tasks"
OUTSIDE = "outside task steps"


class TaskClock(trio.abc.Instrument):
    """Seconds inside each trio task's steps and their number, by task name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.steps: dict[str, int] = {}
        self._started = 0.0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._started = time.thread_time()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        spent = time.thread_time() - self._started
        name = task.name
        self.seconds[name] = self.seconds.get(name, 0.0) + spent
        self.steps[name] = self.steps.get(name, 0) + 1

    def statistics(self) -> dict[str, Any]:
        return {"task_seconds": dict(self.seconds), "task_steps": dict(self.steps)}


def part_of(name: str) -> str:
    for part, prefixes in PARTS:
        if name.startswith(prefixes):
            return part
    return OTHER


def by_part(before: Mapping[str, Any], after: Mapping[str, Any], node_cpu_s: float) -> dict[str, float]:
    """Seconds per part of the node between two statistics lines (``TaskClock.statistics``
    in each), with ``OUTSIDE`` the node's CPU over the same phase that no step holds. Empty
    when the node wrote no task clock (another source tree's node)."""
    was, now = before.get("task_seconds") or {}, after.get("task_seconds")
    if not now:
        return {}
    parts = {part: 0.0 for part, _ in PARTS} | {OTHER: 0.0}
    for name, seconds in now.items():
        parts[part_of(name)] += seconds - was.get(name, 0.0)
    parts[OUTSIDE] = node_cpu_s - sum(parts.values())
    return parts
