"""The share across nodes, as pure bookkeeping: turns the other nodes granted, from their counters.

Every node writes its cumulative claim turns per application to ``claim_turns``
(``turns.py``). Once a scan cycle a node reads the other live nodes' counters of the
applications its rotation knows; what a counter gained since the previous read is what
that application took on that node meanwhile. ``TurnsElsewhere`` turns two reads into
those gains, per application; the node's scheduler counts them as turns taken here
(``FairScheduler.charge_elsewhere``). No I/O: the reads come in as rows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import attrs


@attrs.define(eq=False)
class TurnsElsewhere:
    """The other nodes' counters as of the latest read, and what they gained since the one before."""

    # (node id, application id) -> cumulative turns, as read last time.
    _last: dict[tuple[str, str], int] = attrs.field(factory=dict, init=False)

    def update(self, counters: Iterable[tuple[str, str, int]]) -> dict[str, int]:
        """The counters read now, as (node id, application id, cumulative turns); returns the
        turns each application gained on other nodes since the previous read.

        Only a counter read both times counts: one seen for the first time (a node that
        started, an application the rotation just met) is a baseline, and so is one that
        went down (a count that started over). A counter not read now is forgotten, so
        what it gains while unread is never counted later as if it were recent."""
        current: dict[tuple[str, str], int] = {}
        gained: Counter[str] = Counter()
        for node_id, application_id, turns in counters:
            key = (node_id, application_id)
            current[key] = turns
            before = self._last.get(key)
            if before is not None and turns > before:
                gained[application_id] += turns - before
        self._last = current
        return dict(gained)

    def forget(self) -> None:
        """The read failed: the next one is a baseline, since its gains would span an unknown time."""
        self._last.clear()

    def __len__(self) -> int:
        return len(self._last)
