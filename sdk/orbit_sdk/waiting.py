"""A producer waits for its tasks: ``OrbitClient.wait`` and ``OrbitClient.as_finished``.

Each round reads every task not yet seen finished (``GET /v1/tasks/{id}``, at most
``POLL_CONCURRENCY`` at once). A read may ask the node to wait (``wait_s``): it then
answers as soon as the task is in a terminal state, or after ``wait_s`` (at most
``MAX_TASK_WAIT_S``) with the task as it is. ``wait`` asks that of every read, so a
round lasts until every task it reads has ended or 30 s have passed, and the next one
follows at once: about one request per task per 30 s. ``as_finished`` yields each task
as soon as it is seen finished, so it cannot hold a round for one task while another
ends: it asks the node to wait only when one task is left, and otherwise polls.

Polling: the pause between rounds grows from ``POLL_INITIAL_S`` by ``POLL_FACTOR`` up to
``POLL_MAX_S``, so a round costs one request per unfinished task and a wait of T seconds
sends at most ``rounds(T)`` rounds (6 in the first 3.1 s, then one every 2 s). A round
whose reads asked the node to wait but came back sooner (a node of a version before
``wait_s`` ignores it; a node that shuts down answers at once) is followed by that
pause too, and a node that refuses ``wait_s`` is polled for the rest of the wait. A
task's ``finished_at`` is exact whenever it is read.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING

import trio

from orbit_protocol.limits import MAX_TASK_WAIT_S

from .encoding import is_id
from .errors import (
    InvalidArgumentError,
    InvalidRequestError,
    OrbitClientError,
    ResourceExhaustedError,
    TransportError,
    UnavailableError,
    WaitTimeoutError,
)
from .models import Task

if TYPE_CHECKING:
    from .client import OrbitClient

# States a task never leaves.
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "expired"})
# Pause after the first round: short, so a task that takes a moment is seen soon after it ends.
POLL_INITIAL_S = 0.1
# Growth of the pause per round, and its cap: a long wait settles at one round per 2 s,
# which keeps a wait for N tasks at N/2 requests per second at most.
POLL_FACTOR = 2.0
POLL_MAX_S = 2.0
# Reads in flight at once in one round: a round of many tasks takes a few round trips,
# not one per task, without opening a connection per task.
POLL_CONCURRENCY = 16
# Failures of one read that say nothing about the task (the node or its database out of
# reach, a limit hit): the task stays unfinished and is read again next round.
TRANSIENT = (TransportError, UnavailableError, ResourceExhaustedError)
# Unfinished task ids a timeout message names (all are in ``WaitTimeoutError.unfinished``).
NAMED_IN_MESSAGE = 10
# A round whose reads asked the node to wait W seconds and lasted at least this share of
# W was held by the node: the next round goes at once. A shorter one is followed by the
# polling pause (the node did not wait: an older version, its shutdown, a failure).
HELD_SHARE = 0.9
# A read that asks the node to wait ends this long before the wait's own end, so that its
# answer (the task's state, for the timeout's message) arrives in time; with less time
# than this left, or a wait shorter than ``MIN_WAIT_S``, the reads ask for no wait.
WAIT_MARGIN_S = 0.5
MIN_WAIT_S = 0.01


def task_id_list(task_ids: Iterable[str]) -> list[str]:
    """The ids to wait for, in order, each once; an id that is not 32-hex is an
    ``InvalidRequestError`` naming ``task_ids[i]``."""
    if isinstance(task_ids, (str, bytes)):
        raise InvalidRequestError("task_ids: expected a list of task ids, not one string", field="task_ids")
    ids: list[str] = []
    for index, task_id in enumerate(task_ids):
        if not isinstance(task_id, str) or not is_id(task_id):
            raise InvalidRequestError(
                f"task_ids[{index}]: expected a 32-hex task id, got {task_id!r}", field=f"task_ids[{index}]"
            )
        if task_id not in ids:
            ids.append(task_id)
    return ids


def pauses() -> Iterable[float]:
    """The pause after each round: ``POLL_INITIAL_S`` growing by ``POLL_FACTOR`` to ``POLL_MAX_S``."""
    pause = POLL_INITIAL_S
    while True:
        yield pause
        pause = min(pause * POLL_FACTOR, POLL_MAX_S)


def _check_timeout(timeout_s: float | None) -> float:
    if timeout_s is None:
        return math.inf
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s >= 0:
        raise InvalidRequestError(
            f"timeout_s: expected a number of seconds (0 or more) or None, got {timeout_s!r}", field="timeout_s"
        )
    return float(timeout_s)


async def as_finished(
    client: OrbitClient, task_ids: Iterable[str], timeout_s: float | None, *, every_task_waits: bool = False
) -> AsyncIterator[Task]:
    """Each task of ``task_ids`` once it is in a terminal state, in the order they are
    seen finished (see ``OrbitClient.as_finished``). With ``every_task_waits`` (``wait``:
    the tasks are wanted all together), every read asks the node to wait for its task,
    else only the read of the last unfinished one does."""
    ids = task_id_list(task_ids)
    position = {task_id: index for index, task_id in enumerate(ids)}
    deadline = trio.current_time() + _check_timeout(timeout_s)
    # id -> the state last read (None until read); insertion order is the caller's.
    unfinished: dict[str, str | None] = dict.fromkeys(ids)
    finished: list[Task] = []
    last_failure: OrbitClientError | None = None
    schedule = iter(pauses())
    # False once the node refused ``wait_s``: polled from then on.
    node_waits = True
    while unfinished:
        read: dict[str, Task] = {}
        failures: list[OrbitClientError] = []
        began = trio.current_time()
        wait_s = None
        if node_waits and (every_task_waits or len(unfinished) == 1):
            wait_s = min(float(MAX_TASK_WAIT_S), deadline - began - WAIT_MARGIN_S)
            if wait_s < MIN_WAIT_S:
                wait_s = None
        with trio.move_on_at(deadline):
            await _read_round(client, list(unfinished), read, failures, wait_s)
        held = wait_s is not None and not failures and trio.current_time() - began >= wait_s * HELD_SHARE
        for failure in failures:
            if wait_s is not None and isinstance(failure, InvalidArgumentError) and failure.field == "wait_s":
                node_waits = False
                continue
            if not isinstance(failure, TRANSIENT):
                raise failure
            last_failure = failure
        done = []
        for task_id, task in read.items():
            unfinished[task_id] = task.state
            if task.state in TERMINAL_STATES:
                done.append(task)
        # Within a round, in the caller's order of the ids.
        done.sort(key=lambda task: position[task.task_id])
        for task in done:
            del unfinished[task.task_id]
            finished.append(task)
        # Yielded outside every cancel scope and nursery (the caller runs during a yield).
        for task in done:
            yield task
        if not unfinished:
            return
        remaining = deadline - trio.current_time()
        if remaining <= 0:
            raise _timeout(ids, unfinished, finished, timeout_s) from last_failure
        if not held:
            await trio.sleep(min(next(schedule), remaining))


async def _read_round(
    client: OrbitClient,
    task_ids: list[str],
    read: dict[str, Task],
    failures: list[OrbitClientError],
    wait_s: float | None = None,
) -> None:
    """Read ``task_ids`` (``POLL_CONCURRENCY`` at once, each asking the node to wait
    ``wait_s`` for its task to end) into ``read``; a read that fails goes to ``failures``
    (so nothing escapes the nursery as a group)."""
    limit = trio.CapacityLimiter(POLL_CONCURRENCY)

    async def read_one(task_id: str) -> None:
        async with limit:
            try:
                read[task_id] = await client.get_task(task_id, wait_s=wait_s)
            except OrbitClientError as exc:
                failures.append(exc)

    async with trio.open_nursery() as nursery:
        for task_id in task_ids:
            nursery.start_soon(read_one, task_id)


def _timeout(
    ids: list[str], unfinished: dict[str, str | None], finished: list[Task], timeout_s: float | None
) -> WaitTimeoutError:
    named = [f"{task_id} ({state or 'not read'})" for task_id, state in list(unfinished.items())[:NAMED_IN_MESSAGE]]
    more = len(unfinished) - len(named)
    message = f"{len(unfinished)} of {len(ids)} tasks not finished within {timeout_s:g} s: {', '.join(named)}" + (
        f" (and {more} more)" if more else ""
    )
    return WaitTimeoutError(message, unfinished=unfinished, finished=finished)
