"""Signals between nodes over one database (docs/scheduling.md, "Signals between nodes").

``SignalRelay`` is one shard's: what happens on this node that another node's Workers
or requests may be waiting for is written to ``node_signals`` (tasks due now or later in
a queue, a cancel asked for a task this node's Workers do not hold, a request here
waiting for a task to finish, a task another node's request waits for that finished
here), and what the other nodes write is read and acted on here: a queue's waiting
claims are woken (now, or at the tasks' due time), a cancel is pushed to the Worker
holding the task, and the requests waiting for a task that finished are woken.

Writes leave the request path at once: the route hands the signal over (synchronous,
never blocks) and the writer sends what gathered meanwhile in one INSERT. Reads run
only while this node has Worker connections on the shard or requests waiting for its
tasks, every ``fast_interval_s`` while signals come and backing off to
``slow_interval_s`` when they stop. A failed write or read is logged once per streak
and costs latency only: a waiting claim's empty result still expires after one scan
cycle, a Worker still learns of a cancel at its next renew, and a waiting request's
node still reads its task's state itself (``dispatch/waits.py``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from datetime import datetime

import attrs
import trio

from ..config import SignalTiming
from ..domain.errors import OrbitError
from ..store.signals import Signal, SignalStore
from .claim_pool import ClaimPool
from .signal_core import Heard, Outbox, ReadCursor, ReadPace, Watches, sort_out

log = logging.getLogger("orbit.signals")

# Signals written per statement at most.
PUBLISH_BATCH = 500
# Signals deleted per statement at most, and statements per pruning round at most.
PRUNE_BATCH = 1000
PRUNE_ROUNDS = 16
# Bound on one write that a stopping node lets finish.
WRITE_TIMEOUT_S = 5.0


def _nobody() -> bool:
    return False


def _no_waits(task_ids: Sequence[str]) -> None:
    """No request of this node waits for a task."""


@attrs.frozen
class RelayStatistics:
    published: int
    publish_failures: int
    dropped: int
    reads: int
    read_failures: int
    heard: int
    woken: int
    due: int
    cancels_pushed: int
    gaps_given_up: int
    pruned: int
    # Tasks another node said finished while requests here waited for them.
    finished_heard: int = 0


@attrs.define(eq=False)
class SignalRelay:
    store: SignalStore
    node_id: str
    timing: SignalTiming
    # Wakes a queue's waiting claims now and at a due time (None: this node claims nothing).
    pool: ClaimPool | None = None
    # Whether this node has Worker connections a signal of this shard could concern.
    listening: Callable[[], bool] = _nobody
    # Sends a cancel to the Worker of this node holding the task; False when none does.
    push_cancel: Callable[[str], bool] = lambda task_id: False
    # Whether requests of this node wait for tasks of this shard to finish, and what
    # wakes them (``dispatch/waits.py``).
    waiting: Callable[[], bool] = _nobody
    wake_waits: Callable[[Sequence[str]], None] = _no_waits
    _outbox: Outbox = attrs.field(init=False)
    _watches: Watches = attrs.field(init=False)
    _cursor: ReadCursor = attrs.field(init=False)
    _pace: ReadPace = attrs.field(init=False)
    _to_write: trio.Event = attrs.field(factory=trio.Event, init=False)
    _read_done: trio.Event = attrs.field(factory=trio.Event, init=False)
    _counts: dict[str, int] = attrs.field(factory=dict, init=False)
    _failing: dict[str, bool] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        self._outbox = Outbox(self.timing.outbox_limit)
        self._cursor = ReadCursor(self.timing.gap_wait_s)
        self._pace = ReadPace(self.timing)
        timing = self.timing
        self._watches = Watches(
            keep_s=timing.watch_keep_s,
            repeat_s=timing.watch_repeat_s,
            recent_s=timing.finished_recent_s,
            limit=timing.watch_limit,
        )

    # -- what happens on this node (synchronous, never blocks) ------------------------------

    def tasks_arrived(self, queue_id: str, due_at: datetime | None = None, due_in_s: float | None = None) -> None:
        """Tasks of ``queue_id`` were accepted or requeued through this node, due now
        (``due_at`` None) or at ``due_at`` (database clock), which is ``due_in_s`` after
        the transaction that wrote them (its own clock: no clocks are compared). This
        node's waiting claims are woken now, or then; the other nodes hear of it."""
        if self.pool is not None:
            if due_at is None or due_in_s is None or due_in_s <= 0:
                self.pool.task_arrived(queue_id)
            else:
                # The transaction has committed by now: the timer starts after the due
                # time's origin, so it never fires early.
                self.pool.task_due(queue_id, trio.current_time() + due_in_s)
        self._publish(Signal.tasks(queue_id, due_at))

    def cancel(self, task_id: str) -> bool:
        """A cancel of ``task_id`` was asked through this node: pushed to the Worker here
        that holds it (True), else written for the node whose Worker does."""
        if self.push_cancel(task_id):
            return True
        self._publish(Signal.cancel(task_id))
        return False

    def watch(self, task_id: str) -> None:
        """A request of this node begins to wait for ``task_id`` to finish: the other
        nodes hear of it (once per ``watch_repeat_s``), and the one it finishes on says so."""
        if self._watches.to_send(task_id, trio.current_time()):
            self._publish(Signal.watch(task_id))

    def tasks_finished(self, task_ids: Sequence[str]) -> None:
        """Tasks finished through this node: those another node's requests wait for are
        written as ``finished`` (this node's own waiting requests are woken by its caller).
        A node that reads no signals (no Worker connection, no waiting request: a cancel
        through the API) knows no watch: each of its finishes is written."""
        told = self._watches.finished(task_ids, trio.current_time())
        if not self._cursor.started:
            told = list(task_ids)
        for task_id in told:
            self._publish(Signal.finished(task_id))

    def _publish(self, signal: Signal) -> None:
        # Acted on here already: only what other nodes write makes this node read faster.
        self._outbox.add(signal)
        self._to_write.set()

    # -- the service ---------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write)
            nursery.start_soon(self._read)
            nursery.start_soon(self._prune)
            task_status.started(self)

    async def wait_for_read(self) -> None:
        """Wait until the next read of the table has ended (tests)."""
        await self._read_done.wait()

    async def _write(self) -> None:
        while True:
            await self._to_write.wait()
            self._to_write = trio.Event()
            while self._outbox:
                batch = self._outbox.take(PUBLISH_BATCH)
                # Finished even when the node stops meanwhile (bounded): a statement cut
                # off midway costs a database session.
                with trio.CancelScope(shield=True), trio.move_on_after(WRITE_TIMEOUT_S) as bound:
                    try:
                        await self.store.publish(self.node_id, batch)
                    except OrbitError as exc:
                        self._failed("write", len(batch), exc.message)
                        continue
                if bound.cancelled_caught:
                    self._failed("write", len(batch), f"no answer within {WRITE_TIMEOUT_S:g} s")
                else:
                    self._succeeded("write")
                    self._count("published", len(batch))

    async def _read(self) -> None:
        while True:
            full = False
            if not (self.listening() or self.waiting()):
                self._cursor.stop()
                delay = self.timing.slow_interval_s
            else:
                try:
                    full = await self.read_once()
                except OrbitError as exc:
                    self._failed("read", 0, exc.message)
                else:
                    self._succeeded("read")
                delay = self._pace.next_delay(trio.current_time())
            done, self._read_done = self._read_done, trio.Event()
            done.set()
            if not full:
                await trio.sleep(delay)

    async def read_once(self) -> bool:
        """Read the signals after the cursor and act on them; True when the page was full."""
        if not self._cursor.started:
            self._cursor.start(await self.store.start(self.timing.look_back_s))
        page = await self.store.read(self._cursor.read_from, self.timing.read_limit, self._cursor.missing)
        now = trio.current_time()
        self._count("reads")
        heard = sort_out(self._cursor.accept(page, now), self.node_id)
        if heard:
            self._pace.busy(now)
            self._act(heard, now)
        return len(page) >= self.timing.read_limit

    def _act(self, heard: Heard, now: float) -> None:
        self._count(
            "heard", len(heard.wake) + len(heard.due) + len(heard.cancel) + len(heard.watch) + len(heard.finished)
        )
        if self.pool is not None:
            for queue_id in heard.wake:
                self.pool.task_arrived(queue_id)
            for queue_id, due_in_s in heard.due:
                self.pool.task_due(queue_id, now + due_in_s)
            self._count("woken", len(heard.wake))
            self._count("due", len(heard.due))
        for task_id in heard.cancel:
            if self.push_cancel(task_id):
                self._count("cancels_pushed")
        if heard.watch:
            for task_id in self._watches.heard(heard.watch, now):
                self._publish(Signal.finished(task_id))
        if heard.finished:
            self.wake_waits(heard.finished)
            self._count("finished_heard", len(heard.finished))

    async def _prune(self) -> None:
        # Nodes started together do not prune together.
        await trio.sleep(random.uniform(0, self.timing.prune_interval_s))
        while True:
            try:
                # Back to back while whole batches go (a busy minute), a bounded number of times.
                for _ in range(PRUNE_ROUNDS):
                    pruned = await self.store.prune(self.timing.keep_s, PRUNE_BATCH)
                    self._count("pruned", pruned)
                    if pruned < PRUNE_BATCH:
                        break
            except OrbitError as exc:
                log.debug("could not prune signals: %s", exc)
            await trio.sleep(self.timing.prune_interval_s)

    # -- bookkeeping ---------------------------------------------------------------------

    def _count(self, name: str, n: int = 1) -> None:
        self._counts[name] = self._counts.get(name, 0) + n

    def _failed(self, what: str, lost: int, why: str) -> None:
        self._count(f"{what}_failures")
        if not self._failing.get(what):
            self._failing[what] = True
            log.warning(
                "could not %s signals between nodes (pickup waits up to a scan cycle until it works again): %s",
                what,
                why,
                extra={"signals_lost": lost},
            )

    def _succeeded(self, what: str) -> None:
        if self._failing.pop(what, False):
            log.info("signals between nodes: %s works again", what)

    def statistics(self) -> RelayStatistics:
        c = self._counts
        return RelayStatistics(
            published=c.get("published", 0),
            publish_failures=c.get("write_failures", 0),
            dropped=self._outbox.dropped,
            reads=c.get("reads", 0),
            read_failures=c.get("read_failures", 0),
            heard=c.get("heard", 0),
            woken=c.get("woken", 0),
            due=c.get("due", 0),
            cancels_pushed=c.get("cancels_pushed", 0),
            gaps_given_up=self._cursor.gaps_given_up,
            pruned=c.get("pruned", 0),
            finished_heard=c.get("finished_heard", 0),
        )
