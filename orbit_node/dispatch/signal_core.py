"""The bookkeeping of signals between nodes, sans-IO (``signals.py`` awaits what it says).

* ``Outbox``: signals this node has yet to write, each once, bounded.
* ``ReadCursor``: where a node's reads of the signal table stand. Ids are given out
  when an insert starts and become visible when it commits, so a read may see id 12
  before id 11: the hole is looked for again for ``gap_wait_s`` (then given up: a signal
  missed costs latency, never correctness) and every id is handled once.
* ``ReadPace``: how long until the next read: the fast interval while signals come,
  doubling up to the slow one when they stop.
* ``Watches``: which tasks that finish here another node's requests wait for.
* ``sort_out``: what a page of signals asks this node to do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from ..config import SignalTiming
from ..store.signals import CANCEL, FINISHED, TASKS, WATCH, ReadSignal, Signal


@attrs.define(eq=False)
class Outbox:
    limit: int
    # Insertion-ordered, each signal once.
    _items: dict[Signal, None] = attrs.field(factory=dict, init=False)
    dropped: int = attrs.field(default=0, init=False)

    def add(self, signal: Signal) -> bool:
        """Queue ``signal`` (False when the outbox is full and it is dropped)."""
        if signal in self._items:
            return True
        if len(self._items) >= self.limit:
            self.dropped += 1
            return False
        self._items[signal] = None
        return True

    def take(self, most: int) -> list[Signal]:
        """The oldest ``most`` signals, out of the outbox."""
        taken: list[Signal] = []
        for signal in self._items:
            if len(taken) >= most:
                break
            taken.append(signal)
        for signal in taken:
            del self._items[signal]
        return taken

    def __len__(self) -> int:
        return len(self._items)


@attrs.define(eq=False)
class ReadCursor:
    gap_wait_s: float
    # Holes tracked at most; a wider jump in the ids is taken as it is.
    max_gaps: int = 256
    # The highest id handled; None: not started.
    _high: int | None = attrs.field(default=None, init=False)
    # Ids below ``_high`` not seen yet -> when to stop looking for them.
    _gaps: dict[int, float] = attrs.field(factory=dict, init=False)
    gaps_given_up: int = attrs.field(default=0, init=False)

    @property
    def started(self) -> bool:
        return self._high is not None

    @property
    def read_from(self) -> int:
        """Read the ids above this one..."""
        if self._high is None:
            raise ValueError("the cursor has not started")
        return self._high

    @property
    def missing(self) -> tuple[int, ...]:
        """... and these (holes still looked for), in order."""
        return tuple(sorted(self._gaps))

    def start(self, after: int) -> None:
        """Hear the signals after id ``after`` (where the node begins to listen)."""
        self._high = after
        self._gaps.clear()

    def stop(self) -> None:
        """Stop listening; ``start`` begins afresh."""
        self._high = None
        self._gaps.clear()

    def accept(self, page: Sequence[ReadSignal], now: float) -> list[ReadSignal]:
        """The signals of a page (read above ``read_from`` and of ``missing``) not handled
        before, in id order."""
        high = self.read_from
        fresh = [s for s in page if s.signal_id > high or s.signal_id in self._gaps]
        for signal in fresh:
            self._gaps.pop(signal.signal_id, None)
        top = max((s.signal_id for s in fresh), default=high)
        if top > high:
            returned = {s.signal_id for s in fresh}
            holes = (top - high) - sum(1 for i in returned if i > high)
            if holes <= self.max_gaps - len(self._gaps):
                for signal_id in range(high + 1, top):
                    if signal_id not in returned:
                        self._gaps[signal_id] = now + self.gap_wait_s
            self._high = top
        for signal_id, until in list(self._gaps.items()):
            if until <= now:
                del self._gaps[signal_id]
                self.gaps_given_up += 1
        return fresh


@attrs.define(eq=False)
class ReadPace:
    timing: SignalTiming
    _busy_until: float = attrs.field(default=float("-inf"), init=False)
    _interval: float = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._interval = self.timing.slow_interval_s

    def busy(self, now: float) -> None:
        """A signal was read or written: read at the fast interval for ``busy_s``."""
        self._busy_until = now + self.timing.busy_s
        self._interval = self.timing.fast_interval_s

    def next_delay(self, now: float) -> float:
        """Seconds from ``now`` (a read just ended) to the next read."""
        if now < self._busy_until:
            self._interval = self.timing.fast_interval_s
        else:
            self._interval = min(self.timing.slow_interval_s, self._interval * 2)
        return self._interval


@attrs.define(eq=False)
class Watches:
    """Which of the tasks that finish here other nodes' requests wait for, so that only
    those finishes are written as ``finished`` signals (a node that writes one for every
    task would pay a row per task with nobody waiting).

    A ``watch`` heard is kept ``keep_s`` (a waiting node repeats it every ``repeat_s``
    while its requests wait, and a request waits at most ``MAX_TASK_WAIT_S``). The tasks
    that finished here in the last ``recent_s`` are kept too: a watch heard just after its
    task finished here (it was written while the task finished) is answered at once.
    Each is bounded by ``limit``, the oldest forgotten first: a forgotten one costs its
    waiting request latency (its node's own check finds the task finished), never an answer.
    """

    keep_s: float
    repeat_s: float
    recent_s: float
    limit: int
    # Task id -> until when it is watched (insertion order is that order).
    _watched: dict[str, float] = attrs.field(factory=dict, init=False)
    # Task id -> when it finished here (insertion order is that order).
    _recent: dict[str, float] = attrs.field(factory=dict, init=False)
    # Task id -> when this node last wrote a watch of it.
    _sent: dict[str, float] = attrs.field(factory=dict, init=False)

    def to_send(self, task_id: str, now: float) -> bool:
        """Whether a request of this node that begins to wait for ``task_id`` writes a
        watch (none written for it in the last ``repeat_s``)."""
        _expire(self._sent, now - self.repeat_s)
        if task_id in self._sent:
            return False
        _remember(self._sent, task_id, now, self.limit)
        return True

    def heard(self, task_ids: Iterable[str], now: float) -> list[str]:
        """Watches other nodes wrote: kept; the ones of tasks that finished here lately
        are returned (their ``finished`` is written now)."""
        _expire(self._recent, now - self.recent_s)
        finished = []
        for task_id in task_ids:
            _remember(self._watched, task_id, now + self.keep_s, self.limit)
            if task_id in self._recent:
                finished.append(task_id)
        return finished

    def finished(self, task_ids: Iterable[str], now: float) -> list[str]:
        """Tasks that finished here: the ones another node waits for (their ``finished``
        is written), all kept as recent."""
        _expire(self._watched, now)
        _expire(self._recent, now - self.recent_s)
        watched = []
        for task_id in task_ids:
            if task_id in self._watched:
                watched.append(task_id)
            _remember(self._recent, task_id, now, self.limit)
        return watched


def _expire(entries: dict[str, float], before: float) -> None:
    """Drop the entries (in the order of their times) whose time is before ``before``."""
    while entries:
        first = next(iter(entries))
        if entries[first] >= before:
            return
        del entries[first]


def _remember(entries: dict[str, float], key: str, when: float, limit: int) -> None:
    """``key`` at time ``when``, after every other entry (``when`` never goes back)."""
    entries.pop(key, None)
    entries[key] = when
    if len(entries) > limit:
        del entries[next(iter(entries))]


@attrs.frozen
class Heard:
    """What a page of signals asks of this node."""

    # Queues with tasks due now: wake their waiting claims.
    wake: tuple[str, ...] = ()
    # (queue, seconds until due): wake the queue then.
    due: tuple[tuple[str, float], ...] = ()
    # Tasks whose cancel was asked through another node: push it if a Worker here holds one.
    cancel: tuple[str, ...] = ()
    # Tasks another node's requests wait for: tell them when one finishes here.
    watch: tuple[str, ...] = ()
    # Tasks that finished through another node: wake this node's requests waiting for them.
    finished: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.wake or self.due or self.cancel or self.watch or self.finished)


def sort_out(signals: Iterable[ReadSignal], node_id: str) -> Heard:
    """What ``signals`` ask of node ``node_id``: nothing of its own signals (it acted on
    them when it wrote them)."""
    wake: dict[str, None] = {}
    due: dict[tuple[str, float], None] = {}
    cancel: dict[str, None] = {}
    watch: dict[str, None] = {}
    finished: dict[str, None] = {}
    for signal in signals:
        if signal.origin_node_id == node_id:
            continue
        if signal.kind == TASKS and signal.queue_id is not None:
            if signal.due_in_s is not None and signal.due_in_s > 0:
                due[(signal.queue_id, signal.due_in_s)] = None
            else:
                wake[signal.queue_id] = None
        elif signal.kind == CANCEL and signal.task_id is not None:
            cancel[signal.task_id] = None
        elif signal.kind == WATCH and signal.task_id is not None:
            watch[signal.task_id] = None
        elif signal.kind == FINISHED and signal.task_id is not None:
            finished[signal.task_id] = None
    return Heard(tuple(wake), tuple(due), tuple(cancel), tuple(watch), tuple(finished))
