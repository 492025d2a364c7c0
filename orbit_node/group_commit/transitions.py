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
that error (the connection answers its Worker with negative acks, as before). The
engine (lanes, groups, withdrawal, splitting) is ``engine.py``'s, shared with the
grouped HTTP submits (``submits.py``).

**One application per transaction.** A group holds the batches of one application only
(the shard key, ``docs/scaling.md``): each application has its own lane, whose groups
follow one another, and the lanes of different applications commit side by side, at
most ``max_concurrent_groups`` at once. A connection's batches go through its
application's lane (``for_application``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import attrs

from ..domain.ownership import AttachItem, FinishItem, TransitionResult
from ..store.transitions import TransitionPart
from .engine import GroupCommit

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
    """The lease store's transition parts (``store.leases.LeaseStore``)."""

    def start_part(self, items: Iterable[tuple[str, str]]) -> TransitionPart: ...
    def renew_part(self, items: Iterable[tuple[str, str]]) -> TransitionPart: ...
    def release_part(self, items: Iterable[tuple[str, str]]) -> TransitionPart: ...
    def finish_part(self, items: Iterable[FinishItem], *, recorded_only: str | None = None) -> TransitionPart: ...
    def attach_part(self, items: Iterable[AttachItem]) -> TransitionPart: ...
    async def transition(self, parts: Sequence[TransitionPart]) -> list[list[TransitionResult]]: ...


@attrs.define(eq=False)
class Lane:
    """One application's way into the group commit: the four transitions of the
    lease store, each batch committed in a group of that application's batches."""

    committer: GroupCommitter
    application_id: str

    async def start_many(self, items: Iterable[tuple[str, str]]) -> list[TransitionResult]:
        return await self.committer.commit(self.committer.store.start_part(items), self.application_id)

    async def renew_many(self, items: Iterable[tuple[str, str]]) -> list[TransitionResult]:
        return await self.committer.commit(self.committer.store.renew_part(items), self.application_id)

    async def release_many(self, items: Iterable[tuple[str, str]]) -> list[TransitionResult]:
        return await self.committer.commit(self.committer.store.release_part(items), self.application_id)

    async def finish_many(
        self, items: Iterable[FinishItem], *, recorded_only: str | None = None
    ) -> list[TransitionResult]:
        part = self.committer.store.finish_part(items, recorded_only=recorded_only)
        return await self.committer.commit(part, self.application_id)

    async def attach_many(self, items: Iterable[AttachItem]) -> list[TransitionResult]:
        return await self.committer.commit(self.committer.store.attach_part(items), self.application_id)


@attrs.define(eq=False, kw_only=True)
class GroupCommitter(GroupCommit[TransitionPart, list[TransitionResult]]):
    """Runs transition batches from many connections, a group per transaction and
    per application (the lane).

    ``for_application(id)`` gives the ``Lane`` with the same ``start_many`` /
    ``renew_many`` / ``release_many`` / ``finish_many`` as the lease store, so a
    connection does not know which one it talks to. Until ``run`` is running (and
    after it stopped), a batch runs on its own transaction.
    """

    store: PartStore = attrs.field(kw_only=False)
    max_group_size: int = MAX_GROUP_ITEMS
    max_concurrent_groups: int = MAX_CONCURRENT_GROUPS

    def for_application(self, application_id: str) -> Lane:
        return Lane(self, application_id)

    async def commit(self, part: TransitionPart, application_id: str) -> list[TransitionResult]:
        """Answer ``part`` once the group transaction that holds it has committed."""
        if not part.items:
            return []
        return await self.submit(application_id, part)

    async def run_group(self, lane: str, items: Sequence[TransitionPart]) -> list[list[TransitionResult]]:
        return await self.store.transition(items)

    def keys(self, item: TransitionPart) -> frozenset[str]:
        return frozenset(key[0] for key in item.keys())

    def size(self, item: TransitionPart) -> int:
        return len(item.items)
