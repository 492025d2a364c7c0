"""Group commit: the transitions of many Worker connections share one transaction.

Each Worker connection sends its Start / renew / Finish / release batches here
instead of running a transaction of its own. While one group transaction runs, the
batches that arrive wait; the next transaction takes all of them (group commit, as
a database does with its log). Under load that turns one transaction per message
into one per commit time; a lone message waits for nothing but the commit ahead of
it.

What stays as it was:

* every row is still a compare-and-set on its fencing token, state and lease
  (``store.transitions``); a refused row is an outcome of its own and never fails the
  other rows of its batch or of the group;
* a batch is answered only after the transaction that holds it has committed;
* the batches of one group name distinct tasks. A batch that names a task another
  batch of the forming group already names waits for the next group, so each row
  is decided once per transaction, in arrival order.

When a group transaction fails with an error that is not the database being
unreachable, each of its batches is run again alone, so one batch's bad data cannot
fail the others. If the database cannot be reached, every batch of the group gets
that error (the connection answers its Worker with negative acks, as before).

**One application per transaction.** A group holds the batches of one application only
(the shard key, ``docs/scaling.md``): each application has its own lane, whose groups
follow one another, and the lanes of different applications commit side by side, at
most ``max_concurrent_groups`` at once. A connection's batches go through its
application's lane (``for_application``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Protocol

import attrs
import trio

from ..errors import OrbitError, Unavailable
from ..store.ownership import FinishItem, TransitionResult
from ..store.transitions import TransitionPart

log = logging.getLogger("orbit.commit")

# The most items one group transaction decides; a batch never is split.
MAX_GROUP_ITEMS = 2048
# Transitions a claim leads to: every claimed batch is started and then finished.
TRANSITIONS_PER_CLAIM = 2


def concurrent_groups(sql_slots: int) -> int:
    """Group transactions (of different applications) that run at once beside a claim pool
    of ``sql_slots``: as many as the claims running at once lead to (a Start and a Finish
    each), so that settling keeps up with claiming when every statement is slow.

    With fewer, the group commit becomes the node's bottleneck before the fair claim pool
    does, and a queue of applications waiting for a group slot is not fair in effect: a
    Worker with a few connections waits for its Start and Finish acks before it asks
    again, so its turns shrink as the settle wait grows, while an application with many
    connections always has a request waiting and takes the claim turns the small ones
    leave (bench s4 ``slow-sql``: 1.97x a small application's turns with 4 group slots,
    1.0x with 8). The claim slots, these and the API's traffic share the node's database
    pool (``ORBIT_DB_POOL_SIZE``, 16 by default: 4 + 8 + 4)."""
    return TRANSITIONS_PER_CLAIM * sql_slots


MAX_CONCURRENT_GROUPS = concurrent_groups(4)


class PartStore(Protocol):
    """The dispatch store's transition parts (``store.dispatch.DispatchStore``)."""

    def start_part(self, items: Iterable[tuple[str, str]]) -> TransitionPart: ...
    def renew_part(self, items: Iterable[tuple[str, str]]) -> TransitionPart: ...
    def release_part(self, items: Iterable[tuple[str, str]]) -> TransitionPart: ...
    def finish_part(self, items: Iterable[FinishItem]) -> TransitionPart: ...
    async def transition(self, parts: Sequence[TransitionPart]) -> list[list[TransitionResult]]: ...


@attrs.define(eq=False)
class _Batch:
    part: TransitionPart
    task_ids: frozenset[str]
    done: trio.Event = attrs.field(factory=trio.Event)
    taken: bool = False
    results: list[TransitionResult] | None = None
    error: BaseException | None = None

    def answer(self, results: list[TransitionResult] | None = None, error: BaseException | None = None) -> None:
        self.results, self.error = results, error
        self.done.set()


@attrs.frozen
class CommitStatistics:
    # Group transactions committed (or failed).
    groups: int
    # Batches answered, and the items in them.
    batches: int
    items: int
    # Batches waiting for the next group.
    pending: int
    # Groups that failed and were run again batch by batch.
    split: int


@attrs.define(eq=False)
class Lane:
    """One application's way into the group commit: the four transitions of the
    dispatch store, each batch committed in a group of that application's batches."""

    committer: GroupCommitter
    application_id: str

    async def start_many(self, items: Iterable[tuple[str, str]]) -> list[TransitionResult]:
        return await self.committer.submit(self.committer.store.start_part(items), self.application_id)

    async def renew_many(self, items: Iterable[tuple[str, str]]) -> list[TransitionResult]:
        return await self.committer.submit(self.committer.store.renew_part(items), self.application_id)

    async def release_many(self, items: Iterable[tuple[str, str]]) -> list[TransitionResult]:
        return await self.committer.submit(self.committer.store.release_part(items), self.application_id)

    async def finish_many(self, items: Iterable[FinishItem]) -> list[TransitionResult]:
        return await self.committer.submit(self.committer.store.finish_part(items), self.application_id)


@attrs.define(eq=False)
class GroupCommitter:
    """Runs transition batches from many connections, a group per transaction and
    per application.

    ``for_application(id)`` gives the ``Lane`` with the same ``start_many`` /
    ``renew_many`` / ``release_many`` / ``finish_many`` as the dispatch store, so a
    connection does not know which one it talks to. Until ``run`` is running (and
    after it stopped), a batch runs on its own transaction.
    """

    store: PartStore
    max_group_items: int = MAX_GROUP_ITEMS
    max_concurrent_groups: int = MAX_CONCURRENT_GROUPS
    # Per application, its batches waiting for its next group, in arrival order; an
    # application is in here only while it has some (insertion order: first come first).
    _pending: dict[str, list[_Batch]] = attrs.field(factory=dict, init=False)
    _wake: trio.Event = attrs.field(factory=trio.Event, init=False)
    _running: bool = attrs.field(default=False, init=False)
    # Per application, the group its transaction is deciding now.
    _in_flight: dict[str, list[_Batch]] = attrs.field(factory=dict, init=False)
    _groups: int = attrs.field(default=0, init=False)
    _batches: int = attrs.field(default=0, init=False)
    _items: int = attrs.field(default=0, init=False)
    _split: int = attrs.field(default=0, init=False)

    def for_application(self, application_id: str) -> Lane:
        return Lane(self, application_id)

    async def submit(self, part: TransitionPart, application_id: str) -> list[TransitionResult]:
        """Answer ``part`` once the group transaction that holds it has committed."""
        if not part.items:
            return []
        if not self._running:
            return (await self.store.transition([part]))[0]
        batch = _Batch(part, frozenset(key[0] for key in part.keys()))
        self._pending.setdefault(application_id, []).append(batch)
        self._wake.set()
        try:
            await batch.done.wait()
        except BaseException:
            # Cancelled (the connection ended) before its group was formed: withdrawn.
            # Once taken, the group's transaction decides it; only the answer is lost.
            if not batch.taken:
                waiting = self._pending.get(application_id, [])
                waiting.remove(batch)
                if not waiting:
                    self._pending.pop(application_id, None)
            raise
        if batch.error is not None:
            raise batch.error
        assert batch.results is not None
        return batch.results

    def _take_group(self, application_id: str) -> list[_Batch]:
        """The pending batches of one application that form its next group, in arrival order."""
        group: list[_Batch] = []
        named: set[str] = set()
        items = 0
        waiting: list[_Batch] = []
        for batch in self._pending.pop(application_id, []):
            fits = not group or items + len(batch.part.items) <= self.max_group_items
            if (
                fits
                and named.isdisjoint(batch.task_ids)
                and not any(
                    # Keep a connection's order: nothing overtakes a batch left waiting
                    # that names the same tasks.
                    not w.task_ids.isdisjoint(batch.task_ids)
                    for w in waiting
                )
            ):
                batch.taken = True
                group.append(batch)
                named |= batch.task_ids
                items += len(batch.part.items)
            else:
                waiting.append(batch)
        if waiting:
            self._pending[application_id] = waiting
        return group

    async def _commit(self, group: list[_Batch]) -> None:
        try:
            answers = await self.store.transition([b.part for b in group])
        except Exception as exc:
            if len(group) == 1 or not isinstance(exc, OrbitError) or isinstance(exc, Unavailable):
                for batch in group:
                    batch.answer(error=exc)
                return
            # One batch may be at fault: each runs alone so the others still commit.
            self._split += 1
            log.warning("group transaction of %d batches failed (%s); running them one by one", len(group), exc)
            for batch in group:
                try:
                    batch.answer((await self.store.transition([batch.part]))[0])
                except OrbitError as alone:
                    batch.answer(error=alone)
            return
        for batch, results in zip(group, answers, strict=True):
            batch.answer(results)

    def _startable(self) -> list[str]:
        """Applications whose next group may start now, first come first."""
        room = self.max_concurrent_groups - len(self._in_flight)
        return [app for app in self._pending if app not in self._in_flight][: max(0, room)]

    @staticmethod
    def _abandon(batches: Iterable[_Batch]) -> None:
        """The committer stops: these batches get an error (their connections answer with
        negative acks). A group cancelled mid-transaction may or may not have committed;
        its rows' fencing tokens and leases keep ownership exact either way."""
        for batch in batches:
            if not batch.done.is_set():
                batch.answer(error=Unavailable("the node's group commit stopped"))

    async def _run_group(self, application_id: str, group: list[_Batch]) -> None:
        try:
            await self._commit(group)
        except BaseException:
            self._abandon(group)
            raise
        finally:
            del self._in_flight[application_id]
            self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Commit groups until cancelled."""
        self._running = True
        try:
            async with trio.open_nursery() as groups:
                task_status.started()
                while True:
                    for app in self._startable():
                        group = self._in_flight[app] = self._take_group(app)
                        self._groups += 1
                        self._batches += len(group)
                        self._items += sum(len(b.part.items) for b in group)
                        groups.start_soon(self._run_group, app, group)
                    # Until a batch arrives or a group ends (no checkpoint since the last look).
                    self._wake = trio.Event()
                    await self._wake.wait()
                    # Let every connection made runnable in the same scheduler tick add its batch.
                    await trio.lowlevel.checkpoint()
        finally:
            self._running = False
            # Every group has answered by now (``_run_group``); what still waits, nobody
            # will commit.
            self._abandon(b for waiting in self._pending.values() for b in waiting)
            self._pending.clear()

    def statistics(self) -> CommitStatistics:
        return CommitStatistics(
            groups=self._groups,
            batches=self._batches,
            items=self._items,
            pending=sum(len(w) for w in self._pending.values()),
            split=self._split,
        )
