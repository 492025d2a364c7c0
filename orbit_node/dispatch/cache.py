"""The node's empty-result cache (P3 section 3), sans-IO.

An empty claim for (namespace, queue, exact capability set, resource-key support)
is remembered for one scan cycle, so identical probes in that cycle cost no SQL.
It authorizes nothing and changes no persistent state: a hit only means "do not
ask the database for this queue yet". Different capability sets never share an
entry. At most ``max_entries`` are kept (least recently used goes first). A task
accepted for a queue (through this node, or heard of from another) forgets that
queue's entries at once; one that comes due later ends them at its due time
(``forget_queue_at``: at most ``max_due`` such times are kept, the earliest).
"""

from __future__ import annotations

import bisect
from collections import OrderedDict

import attrs

from ..domain.claims import Capability


@attrs.frozen
class CacheKey:
    namespace_id: str
    queue_id: str
    # The connection's exact capability set and resource-key declaration.
    capabilities: frozenset[Capability]
    resource_key_support: bool


@attrs.frozen
class CacheStatistics:
    entries: int
    hits: int
    misses: int
    stores: int
    evictions: int


@attrs.define(eq=False)
class EmptyResultCache:
    ttl_s: float
    max_entries: int
    max_due: int = 1024
    _entries: OrderedDict[CacheKey, float] = attrs.field(factory=OrderedDict, init=False)
    # (when, queue id), sorted: queues whose entries end at a due time.
    _due: list[tuple[float, str]] = attrs.field(factory=list, init=False)
    # Due times dropped because ``max_due`` earlier ones filled the list (latency only).
    dues_dropped: int = attrs.field(default=0, init=False)
    hits: int = attrs.field(default=0, init=False)
    misses: int = attrs.field(default=0, init=False)
    stores: int = attrs.field(default=0, init=False)
    evictions: int = attrs.field(default=0, init=False)

    def is_empty(self, key: CacheKey, now: float, *, count: bool = True) -> bool:
        """True while a fresh empty result is remembered for ``key``."""
        expires = self._entries.get(key)
        if expires is not None and now < expires:
            if count:
                self.hits += 1
            return True
        if expires is not None:
            del self._entries[key]
        if count:
            self.misses += 1
        return False

    def store_empty(self, key: CacheKey, now: float) -> None:
        self._entries[key] = now + self.ttl_s
        self._entries.move_to_end(key)
        self.stores += 1
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
            self.evictions += 1

    def forget(self, key: CacheKey) -> None:
        self._entries.pop(key, None)

    def forget_queue(self, queue_id: str) -> None:
        for key in [k for k in self._entries if k.queue_id == queue_id]:
            del self._entries[key]

    def forget_queue_at(self, queue_id: str, when: float) -> None:
        """A task of ``queue_id`` comes due at ``when``: its entries are to end then
        (``due_queues`` names it from then on, once)."""
        bisect.insort(self._due, (when, queue_id))
        if len(self._due) > self.max_due:
            self._due.pop()
            self.dues_dropped += 1

    def due_queues(self, now: float) -> list[str]:
        """The queues whose due time has come (each once), out of the due list: the caller
        forgets their entries and wakes their waiting requests (``FairScheduler.task_arrived``)."""
        passed = bisect.bisect_right(self._due, now, key=lambda due: due[0])
        queues = list(dict.fromkeys(queue_id for _, queue_id in self._due[:passed]))
        del self._due[:passed]
        return queues

    def next_due(self) -> float | None:
        """The earliest due time still to come, if any."""
        return self._due[0][0] if self._due else None

    def expires_at(self, key: CacheKey, now: float) -> float | None:
        """When the fresh empty entry of ``key`` expires; None when there is none."""
        expires = self._entries.get(key)
        return expires if expires is not None and now < expires else None

    def __len__(self) -> int:
        return len(self._entries)

    def statistics(self) -> CacheStatistics:
        return CacheStatistics(len(self._entries), self.hits, self.misses, self.stores, self.evictions)
