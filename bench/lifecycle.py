"""Steady live traffic of one application and what it sees, for the retention soak and
catch-up (bench/retention.py).

* **Submits**: ``rate`` tasks/s, one ``POST /v1/tasks`` each, sent at even intervals by a
  pacer and taken by ``clients`` keep-alive SDK clients (an arrival that finds every
  client busy waits in a bounded queue; beyond it, it is dropped and counted). Every
  ``fail_every``-th task asks its handler to fail (``PermanentError``: failed, no retry).
* **Workers**: ``workers`` SDK Worker connections of ``capacity``; the handler notes when
  it began and ended, and a ``Worker`` whose ``_finished`` hook notes when the node
  acknowledged the Finish.
* **The database's side**: every sample, the application's tasks finished since the last
  one, their waits on the database clock: available -> reserved (*dispatch*: the claim)
  and reserved -> started (the Worker's Start committed).

Times are wall-clock seconds from the traffic's start (the database runs on this machine:
its clock is the same clock).
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from orbit_node.db import Database
from orbit_node.domain.retention import CLASS_OF_STATE
from orbit_sdk import OrbitClient, PermanentError, SubmitTaskRequest
from orbit_sdk.worker import Worker, WorkerTask

from . import HANDLER
from .report import summarize

# The terminal states: each a range of ix_tasks_lease (state, NULL lease, application, finished_at).
FINISHED_STATES = tuple(CLASS_OF_STATE)


def finished_ranges(select: str) -> list[str]:
    """``select`` over each terminal state's range of an application's finished tasks in
    ix_tasks_lease, one statement each; ``%s`` is the application. One equality per
    statement: MariaDB 10.11.19 answered an ``IN`` list of outcomes with ``ORDER BY
    finished_at`` with no rows at all whenever it chose ``ref`` on application_id and a
    filesort (docs/benchmarks/retention.md)."""
    return [
        f"{select} FROM tasks FORCE INDEX (ix_tasks_lease) "
        f"WHERE state = '{state}' AND lease_expires_at IS NULL AND application_id = %s"
        for state in FINISHED_STATES
    ]


# Arrivals that may wait for a free client before one is dropped (a steady rate, not a burst).
PENDING_ARRIVALS = 1000
# Tasks finished this recently are left for the next sample (a Finish whose finished_at is
# written may not have committed yet).
COMMIT_MARGIN_S = 2.0


def padding(size: int) -> str:
    """Random hex text of ``size`` characters (what InnoDB stores does not compress by default)."""
    return secrets.token_hex(size // 2 + 1)[:size]


@attrs.define(eq=False)
class Timeline:
    """What the traffic saw, each event as (seconds since the start, value in seconds)."""

    began: float = attrs.field(factory=time.time)
    # Submit request -> answer.
    submits: list[tuple[float, float]] = attrs.field(factory=list)
    # Submit request sent -> handler began.
    to_handler: list[tuple[float, float]] = attrs.field(factory=list)
    # Handler ended -> the node acknowledged the Finish.
    finish_acks: list[tuple[float, float]] = attrs.field(factory=list)
    # Database clock, by finished_at: available -> reserved and reserved -> started.
    dispatch: list[tuple[float, float]] = attrs.field(factory=list)
    start_db: list[tuple[float, float]] = attrs.field(factory=list)
    submitted: int = 0
    submit_errors: int = 0
    dropped: int = 0
    finished: int = 0
    failed: int = 0

    def now(self) -> float:
        return time.time() - self.began


def window(events: Sequence[tuple[float, float]], lo: float, hi: float) -> dict[str, float]:
    """``summarize`` of the values of events at ``lo <= t < hi``, in milliseconds."""
    return {k: (v * 1000.0 if k != "count" else v) for k, v in summarize(v for t, v in events if lo <= t < hi).items()}


def count_in(events: Sequence[tuple[float, float]], lo: float, hi: float) -> int:
    return sum(1 for t, _ in events if lo <= t < hi)


class TimedWorker(Worker):
    """The SDK Worker, noting when the node acknowledged each Finish (``on_ack(task_id)``)."""

    def __init__(self, *args: Any, on_ack: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_ack = on_ack

    def _finished(self, report: Mapping[str, Any], state: str | None, attempt: int, max_attempts: int) -> None:
        self._on_ack(report["task_id"], state)
        super()._finished(report, state, attempt, max_attempts)


@attrs.frozen(kw_only=True)
class Traffic:
    """The shape of the live traffic."""

    rate: float
    clients: int = 4
    workers: int = 2
    capacity: int = 16
    # Every n-th task fails for good (0: none).
    fail_every: int = 33
    payload_bytes: int = 100
    result_bytes: int = 100


@attrs.define(eq=False)
class Live:
    """Running traffic: ``stop_submitting()`` ends the arrivals; the Workers run until the block ends."""

    timeline: Timeline
    workers: list[TimedWorker]
    _stop: trio.Event = attrs.field(factory=trio.Event)

    def stop_submitting(self) -> None:
        self._stop.set()

    @property
    def completed(self) -> int:
        return sum(w.finished for w in self.workers)


@asynccontextmanager
async def live_traffic(url: str, token: str, queue_id: str, traffic: Traffic) -> AsyncIterator[Live]:
    """Workers connected first, then the submits; on exit the submits stop and the Workers drain."""
    timeline = Timeline()
    sent: dict[int, float] = {}
    ended: dict[str, float] = {}

    async def handler(task: WorkerTask) -> Any:
        began = timeline.now()
        index = task.payload["i"]
        if index in sent:
            timeline.to_handler.append((began, began - sent.pop(index)))
        result = {"pad": padding(traffic.result_bytes)}
        ended[task.task_id] = timeline.now()
        if task.payload.get("fail"):
            raise PermanentError("asked to fail (bench)")
        return result

    def on_ack(task_id: str, state: str | None) -> None:
        now = timeline.now()
        end = ended.pop(task_id, None)
        if end is not None:
            timeline.finish_acks.append((now, now - end))
        timeline.finished += 1
        if state == "failed":
            timeline.failed += 1

    workers = []
    for _ in range(traffic.workers):
        worker = TimedWorker(
            url=url, token=token, queues=[queue_id], capacity=traffic.capacity, client_name="orbit-bench", on_ack=on_ack
        )
        worker.register(*HANDLER, handler)
        workers.append(worker)
    live = Live(timeline, workers)
    run = secrets.token_hex(4)
    arrivals_in, arrivals_out = trio.open_memory_channel[int](PENDING_ARRIVALS)

    async def pacer() -> None:
        interval = 1.0 / traffic.rate
        next_at = time.perf_counter()
        index = 0
        async with arrivals_in:
            while not live._stop.is_set():
                try:
                    arrivals_in.send_nowait(index)
                except trio.WouldBlock:
                    timeline.dropped += 1
                index += 1
                next_at += interval
                with trio.move_on_after(max(0.0, next_at - time.perf_counter())):
                    await live._stop.wait()

    async def submitter(client: OrbitClient, arrivals: trio.MemoryReceiveChannel[int]) -> None:
        async with arrivals:
            async for index in arrivals:
                payload: dict[str, Any] = {"i": index, "pad": padding(traffic.payload_bytes)}
                if traffic.fail_every and index % traffic.fail_every == traffic.fail_every - 1:
                    payload["fail"] = True
                request = SubmitTaskRequest(
                    queue_id=queue_id,
                    handler=HANDLER[0],
                    handler_version=HANDLER[1],
                    payload_version=HANDLER[2],
                    payload=payload,
                    max_attempts=1,
                )
                t = timeline.now()
                sent[index] = t
                try:
                    await client.submit_task(f"live-{run}-{index}", request)
                except Exception:
                    timeline.submit_errors += 1
                    sent.pop(index, None)
                    continue
                timeline.submits.append((t, timeline.now() - t))
                timeline.submitted += 1

    clients = [OrbitClient(url, token) for _ in range(traffic.clients)]
    try:
        async with trio.open_nursery() as nursery:
            async with trio.open_nursery() as starting:
                for worker in workers:
                    starting.start_soon(nursery.start, worker.run)
            timeline.began = time.time()
            async with trio.open_nursery() as submitting:
                submitting.start_soon(pacer)
                async with arrivals_out:
                    for client in clients:
                        submitting.start_soon(submitter, client, arrivals_out.clone())
                try:
                    yield live
                finally:
                    live.stop_submitting()
            with trio.CancelScope(shield=True), trio.move_on_after(30):
                async with trio.open_nursery() as draining:
                    for worker in workers:
                        draining.start_soon(worker.drain)
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            for client in clients:
                await client.aclose()


async def wait_settled(live: Live, timeout_s: float) -> bool:
    """Until every submitted task has finished at the Workers (at most ``timeout_s``)."""
    with trio.move_on_after(timeout_s):
        while live.timeline.finished < live.timeline.submitted:
            await trio.sleep(0.1)
        return True
    return False


@attrs.define(eq=False)
class DatabaseWaits:
    """Reads the application's tasks finished since the last read: their database-clock waits."""

    db: Database
    application_id: str
    timeline: Timeline
    _after: float = attrs.field(init=False, default=0.0)

    def __attrs_post_init__(self) -> None:
        self._after = self.timeline.began - 1.0

    async def read(self) -> int:
        """Append the waits of the tasks finished in (last read, now - margin]; how many."""
        select = (
            "SELECT UNIX_TIMESTAMP(finished_at) AS f, "
            "TIMESTAMPDIFF(MICROSECOND, available_at, reserved_at) / 1e6 AS d, "
            "TIMESTAMPDIFF(MICROSECOND, reserved_at, started_at) / 1e6 AS s"
        )
        sql = " UNION ALL ".join(
            f"{one} AND finished_at > FROM_UNIXTIME(%s) AND finished_at <= FROM_UNIXTIME(%s)"
            for one in finished_ranges(select)
        )
        upto = f"{time.time() - COMMIT_MARGIN_S:.6f}"
        after = f"{self._after:.6f}"
        params = (self.application_id, after, upto) * len(FINISHED_STATES)
        rows = await self.db.run(lambda tx: tx.fetchall_raw(sql, params))
        for r in rows:
            t = float(r["f"]) - self.timeline.began
            if r["d"] is not None:
                self.timeline.dispatch.append((t, float(r["d"])))
            if r["s"] is not None:
                self.timeline.start_db.append((t, float(r["s"])))
        self._after = float(upto)
        return len(rows)


def flat_within(values: Sequence[float]) -> float:
    """The largest distance of a value from the values' median, as a share of the median (NaN: none)."""
    data = sorted(v for v in values if v is not None and not math.isnan(v))
    if not data:
        return math.nan
    median = data[len(data) // 2]
    if not median:
        return math.nan if any(data) else 0.0
    return max(abs(v - median) for v in data) / median


def trend(samples: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (t, value), per hour, as a share of the mean value (NaN: too few)."""
    if len(samples) < 3:
        return math.nan
    n = len(samples)
    mt = sum(t for t, _ in samples) / n
    mv = sum(v for _, v in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    if not var or not mv:
        return math.nan
    slope = sum((t - mt) * (v - mv) for t, v in samples) / var
    return slope * 3600.0 / mv
