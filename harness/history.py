"""The history checker of the chaos runs: a pure function over what the Workers logged,
what was seen during the run, and the rows of ``tasks`` and ``task_attempts`` at the end.

Times are seconds since the epoch on this machine's clock. The database writes its
DATETIME(6) values from ``NOW(6)`` in UTC sessions on the same machine, so the caller
converts them (``epoch``) and both sides are on one clock.

The properties (``PROPERTIES``), each with the violations found for it:

* ``one_terminal``: every acknowledged submit ended in exactly one terminal state: its
  key names one task, the task is terminal, no attempt is left open, and at most one
  attempt settled it (with the task's state).
* ``no_overlap``: no two executions of a task overlap in time while both hold a live
  lease, and neither do two of tasks that share a resource key. An execution's lease is
  its attempt row's ``[reserved_at, finished_at]`` (open while ``outcome`` is NULL); a
  handler still running after its lease ended (a Worker cut off from its node) overlaps
  nothing by itself. An execution with no started attempt ran without any lease. Given the
  nodes' lease lengths, an attempt closed as lost must have been closed no earlier than its
  lease could run out (started_at + run lease; reserved_at + reservation lease), else that
  window would understate the lease.
* ``terminal_stable``: a terminal state, once seen, never changed (every later
  observation and the final row show the same state and ``finished_at``).
* ``rerun_after_loss``: a task ran more than once only if an attempt was lost: every
  started attempt but the last ended ``lease_expired``, and no attempt ran twice.
* ``after_parents``: a task with parents (``depends_on``) was reserved only after every
  parent had succeeded (its first reservation no earlier than the last parent's finish,
  both on the database clock), and one whose parent did not succeed never ran and ended
  cancelled.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

import attrs

TERMINAL = ("succeeded", "failed", "cancelled", "expired")
# Attempt outcomes that say the attempt was lost: its lease ran out while it ran.
LOST = ("lease_expired",)
PROPERTIES = ("one_terminal", "no_overlap", "terminal_stable", "rerun_after_loss", "after_parents")


def epoch(value: datetime | None) -> float | None:
    """A naive UTC DATETIME of the database as seconds since the epoch."""
    return None if value is None else value.replace(tzinfo=UTC).timestamp()


@attrs.frozen
class Execution:
    """One run of a handler, as its Worker logged it: from the handler's first line to its
    return (or to the moment it was cut off)."""

    task_id: str
    attempt: int
    start: float
    end: float
    worker: str = ""
    resource_key: str | None = None


@attrs.frozen
class Task:
    """A ``tasks`` row at the end of the run; ``key`` is the idempotency key it was submitted under."""

    task_id: str
    key: str
    state: str
    finished_at: float | None
    resource_key: str | None = None
    # Its parents (depends_on), by id.
    parents: tuple[str, ...] = ()


@attrs.frozen
class Attempt:
    """A ``task_attempts`` row: one reservation, started or not."""

    task_id: str
    attempt: int
    token: str
    reserved_at: float
    started_at: float | None
    finished_at: float | None
    outcome: str | None


@attrs.frozen
class Observation:
    """A task's state as read while the run went on."""

    task_id: str
    state: str
    finished_at: float | None
    seen_at: float


@attrs.frozen
class History:
    # Idempotency key -> task id, for every submit answered 2xx.
    acknowledged: Mapping[str, str]
    executions: Sequence[Execution]
    observations: Sequence[Observation]
    tasks: Sequence[Task]
    attempts: Sequence[Attempt]
    # The nodes' lease lengths: an attempt closed as lost must have been closed after its
    # lease could run out (None: not checked).
    reservation_lease_s: float | None = None
    run_lease_s: float | None = None


@attrs.frozen
class Verdict:
    violations: Mapping[str, tuple[str, ...]]
    figures: Mapping[str, int]

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def failed(self) -> list[str]:
        """The properties that do not hold."""
        return [name for name in PROPERTIES if self.violations[name]]

    def text(self, limit: int = 10) -> str:
        lines = []
        for name in PROPERTIES:
            found = self.violations[name]
            lines.append(f"{name}: {'holds' if not found else f'VIOLATED ({len(found)})'}")
            lines.extend(f"  {v}" for v in found[:limit])
            if len(found) > limit:
                lines.append(f"  ... and {len(found) - limit} more")
        return "\n".join(lines)


@attrs.frozen
class _Live:
    """The part of an execution during which its attempt held a live lease."""

    execution: Execution
    token: str
    start: float
    end: float

    def describe(self) -> str:
        e = self.execution
        return f"{e.task_id} attempt {e.attempt} on {e.worker or '?'} [{self.start:.3f}, {self.end:.3f}]"


def check(history: History) -> Verdict:
    attempts = _by_task(history.attempts)
    started = {task_id: [a for a in rows if a.started_at is not None] for task_id, rows in attempts.items()}
    lives, unleased = _live_windows(history.executions, started)
    violations = {
        "one_terminal": tuple(_one_terminal(history, attempts)),
        "no_overlap": (*_early_losses(history), *_no_overlap(attempts, started, lives, unleased)),
        "terminal_stable": tuple(_terminal_stable(history)),
        "rerun_after_loss": tuple(_rerun_after_loss(history.executions, started)),
        "after_parents": tuple(_after_parents(history, attempts)),
    }
    states = Counter(t.state for t in history.tasks)
    acknowledged = set(history.acknowledged.values())
    ran = Counter(e.task_id for e in history.executions)
    figures = {
        "acknowledged": len(history.acknowledged),
        "tasks": len(history.tasks),
        # Tasks whose submit was never answered 2xx (they promise nothing).
        "unacknowledged_tasks": sum(t.task_id not in acknowledged for t in history.tasks),
        **{f"tasks_{state}": states[state] for state in sorted(states)},
        "executions": len(history.executions),
        "started_attempts": sum(len(rows) for rows in started.values()),
        "lost_attempts": sum(a.outcome in LOST for a in history.attempts),
        "expired_reservations": sum(a.outcome == "reservation_expired" for a in history.attempts),
        "tasks_run_more_than_once": sum(n > 1 for n in ran.values()),
        # Handlers that went on after their lease ended (their Worker was cut off from the node).
        "ran_past_lease": sum(live.end < live.execution.end for live in lives),
        "observations": len(history.observations),
        "tasks_with_parents": sum(bool(t.parents) for t in history.tasks),
    }
    return Verdict(violations, figures)


def _by_task(attempts: Iterable[Attempt]) -> dict[str, list[Attempt]]:
    grouped: dict[str, list[Attempt]] = defaultdict(list)
    for a in attempts:
        grouped[a.task_id].append(a)
    for rows in grouped.values():
        rows.sort(key=lambda a: (a.reserved_at, a.attempt))
    return grouped


def _live_windows(
    executions: Iterable[Execution], started: Mapping[str, list[Attempt]]
) -> tuple[list[_Live], list[Execution]]:
    """Each execution cut to its attempt's lease; the executions with no started attempt apart."""
    lives: list[_Live] = []
    unleased: list[Execution] = []
    for e in executions:
        matching = [a for a in started.get(e.task_id, ()) if a.attempt == e.attempt]
        if not matching:
            unleased.append(e)
            continue
        # Two started rows of one attempt number are reported by _no_overlap; take the widest lease.
        begin = min(a.reserved_at for a in matching)
        ends = [a.finished_at for a in matching]
        end = float("inf") if None in ends else max(x for x in ends if x is not None)
        live = _Live(e, matching[0].token, max(e.start, begin), min(e.end, end))
        if live.start < live.end:
            lives.append(live)
    return lives, unleased


def _one_terminal(history: History, attempts: Mapping[str, list[Attempt]]) -> Iterable[str]:
    tasks = {t.task_id: t for t in history.tasks}
    by_key: dict[str, list[str]] = defaultdict(list)
    for t in history.tasks:
        by_key[t.key].append(t.task_id)
    for key, task_id in sorted(history.acknowledged.items()):
        others = sorted(set(by_key.get(key, ())) - {task_id})
        if others:
            yield f"key {key}: acknowledged as {task_id}, but also made {', '.join(others)}"
        task = tasks.get(task_id)
        if task is None:
            yield f"key {key}: acknowledged task {task_id} is not in the database"
            continue
        if task.key != key:
            yield f"key {key}: acknowledged as {task_id}, which was submitted under key {task.key}"
        if task.state not in TERMINAL:
            yield f"key {key}: task {task_id} ended the run {task.state}, not terminal"
        rows = attempts.get(task_id, [])
        open_rows = [a.attempt for a in rows if a.outcome is None]
        if task.state in TERMINAL and open_rows:
            yield f"task {task_id} is {task.state} with attempt(s) {open_rows} still open"
        settling = [a for a in rows if a.outcome in TERMINAL]
        if len(settling) > 1:
            yield f"task {task_id} settled by {len(settling)} attempts: " + ", ".join(
                f"attempt {a.attempt} {a.outcome}" for a in settling
            )
        elif settling and settling[0].outcome != task.state:
            yield f"task {task_id} is {task.state}, but attempt {settling[0].attempt} settled it {settling[0].outcome}"


def _early_losses(history: History) -> Iterable[str]:
    """Attempts closed as lost before their lease could have run out: the database's
    ``[reserved_at, finished_at]`` would then understate a live lease."""
    for a in history.attempts:
        if a.finished_at is None:
            continue
        if a.outcome in LOST and history.run_lease_s is not None:
            began, lease = a.started_at, history.run_lease_s
        elif a.outcome == "reservation_expired" and history.reservation_lease_s is not None:
            began, lease = a.reserved_at, history.reservation_lease_s
        else:
            continue
        if began is None or a.finished_at < began + lease:
            held = "never started" if began is None else f"{a.finished_at - began:.3f} s after it began"
            yield f"task {a.task_id}: attempt {a.attempt} closed {a.outcome} {held}, before its {lease:g} s lease ran out"


def _no_overlap(
    attempts: Mapping[str, list[Attempt]],
    started: Mapping[str, list[Attempt]],
    lives: Sequence[_Live],
    unleased: Sequence[Execution],
) -> Iterable[str]:
    for task_id, rows in sorted(attempts.items()):
        # The database's side: one lease at a time.
        for earlier, later in itertools.pairwise(rows):
            if earlier.finished_at is None or earlier.finished_at > later.reserved_at:
                yield (
                    f"task {task_id}: attempt {earlier.attempt} (token {earlier.token}) still held its lease "
                    f"when attempt {later.attempt} (token {later.token}) was reserved"
                )
        numbers = Counter(a.attempt for a in started.get(task_id, ()))
        for number, count in sorted(numbers.items()):
            if count > 1:
                yield f"task {task_id}: attempt {number} was started {count} times (under different tokens)"
    for e in unleased:
        yield f"task {e.task_id}: attempt {e.attempt} ran on {e.worker or '?'} without a started attempt (no lease)"
    by_task: dict[str, list[_Live]] = defaultdict(list)
    by_key: dict[str, list[_Live]] = defaultdict(list)
    for live in lives:
        by_task[live.execution.task_id].append(live)
        if live.execution.resource_key is not None:
            by_key[live.execution.resource_key].append(live)
    for task_id, group in sorted(by_task.items()):
        for a, b in _overlapping(group):
            yield f"task {task_id}: {a.describe()} and {b.describe()} overlap, both under a live lease"
    for key, group in sorted(by_key.items()):
        for a, b in _overlapping(group):
            if a.execution.task_id != b.execution.task_id:
                yield f"resource key {key}: {a.describe()} and {b.describe()} overlap, both under a live lease"


def _overlapping(group: Sequence[_Live]) -> Iterable[tuple[_Live, _Live]]:
    """Pairs whose windows intersect: each window against the one reaching furthest before it."""
    ordered = sorted(group, key=lambda live: (live.start, live.end))
    furthest: _Live | None = None
    for live in ordered:
        if furthest is not None and live.start < furthest.end:
            yield furthest, live
        if furthest is None or live.end > furthest.end:
            furthest = live


def _terminal_stable(history: History) -> Iterable[str]:
    final = {t.task_id: t for t in history.tasks}
    seen: dict[str, list[Observation]] = defaultdict(list)
    for o in sorted(history.observations, key=lambda o: o.seen_at):
        seen[o.task_id].append(o)
    for task_id, observed in sorted(seen.items()):
        first = next((o for o in observed if o.state in TERMINAL), None)
        if first is None:
            continue
        for o in observed[observed.index(first) + 1 :]:
            if (o.state, o.finished_at) != (first.state, first.finished_at):
                yield (
                    f"task {task_id}: seen {first.state} (finished {first.finished_at}) at {first.seen_at:.3f}, "
                    f"then {o.state} (finished {o.finished_at}) at {o.seen_at:.3f}"
                )
                break
        else:
            task = final.get(task_id)
            if task is None:
                yield f"task {task_id}: seen {first.state} at {first.seen_at:.3f}, gone at the end"
            elif (task.state, task.finished_at) != (first.state, first.finished_at):
                yield (
                    f"task {task_id}: seen {first.state} (finished {first.finished_at}) at {first.seen_at:.3f}, "
                    f"ended {task.state} (finished {task.finished_at})"
                )


def _rerun_after_loss(executions: Iterable[Execution], started: Mapping[str, list[Attempt]]) -> Iterable[str]:
    for task_id, rows in sorted(started.items()):
        ordered = sorted(rows, key=lambda a: a.attempt)
        for a in ordered[:-1]:
            if a.outcome not in LOST:
                yield (
                    f"task {task_id}: attempt {a.attempt} ended {a.outcome}, not lost, "
                    f"yet attempt {ordered[-1].attempt} started after it"
                )
    runs = Counter((e.task_id, e.attempt) for e in executions)
    for (task_id, number), count in sorted(runs.items()):
        if count > 1:
            yield f"task {task_id}: attempt {number} ran {count} times"


def _after_parents(history: History, attempts: Mapping[str, list[Attempt]]) -> Iterable[str]:
    tasks = {t.task_id: t for t in history.tasks}
    for task in sorted((t for t in history.tasks if t.parents), key=lambda t: t.task_id):
        parents = [tasks.get(p) for p in task.parents]
        reserved = [a.reserved_at for a in attempts.get(task.task_id, [])]
        if any(p is None for p in parents):
            yield f"task {task.task_id}: a parent is gone ({', '.join(task.parents)})"
            continue
        unmet = [p for p in parents if p is not None and p.state != "succeeded"]
        if unmet:
            if reserved:
                yield f"task {task.task_id}: reserved although parent {unmet[0].task_id} ended {unmet[0].state}"
            elif task.state != "cancelled":
                yield f"task {task.task_id}: parent {unmet[0].task_id} ended {unmet[0].state}, yet it ended {task.state}"
            continue
        if reserved:
            last = max(p.finished_at or 0.0 for p in parents if p is not None)
            if min(reserved) < last:
                yield (
                    f"task {task.task_id}: reserved at {min(reserved):.6f}, "
                    f"before its last parent finished at {last:.6f}"
                )
