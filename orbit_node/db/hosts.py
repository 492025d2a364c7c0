"""Which server of a multi-host DSN a node writes to (pure: no trio, no driver).

``mysql://u:p@h1:3306,h2:3306,h3:3306/db`` names the servers of one cluster (MariaDB
Galera) in order of preference. The rules, so that every node writes to the same server
while they all see the same servers, and none flaps between two:

* A node starts at the first server in that order that it can reach.
* It moves only when the server it writes to is lost (a connection refused or timed
  out, or the server answers that it is not part of the primary component): to the next
  server in order (after the last comes the first) that it can reach.
* Having moved, it records its new server in the cluster (``database_writer``); every
  node that opens a connection, and every node once a check interval, reads that record
  and follows it if it can reach the server named. This is how the other nodes, and a
  node started later, join the same writer.
* It returns to an earlier server only when told: ``orbit-admin database writer --host``
  writes the record, and the nodes follow it. A server coming back is never enough.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ..domain.dsn import DsnHost


@attrs.define
class HostOrder:
    """The servers of one DSN and the index of the one written to now."""

    hosts: Sequence[DsnHost]
    current: int = 0
    # Moves of the writer since the pool started (lost servers and followed records).
    moves: int = 0

    @property
    def writer(self) -> DsnHost:
        return self.hosts[self.current]

    @property
    def several(self) -> bool:
        return len(self.hosts) > 1

    def candidates(self) -> list[int]:
        """Indexes to try for a new connection: the writer first, then the rest in order."""
        n = len(self.hosts)
        return [(self.current + step) % n for step in range(n)]

    def index_of(self, text: str | None) -> int | None:
        """The index of ``host:port`` as the writer record spells it (None: not one of ours)."""
        if not text:
            return None
        for index, host in enumerate(self.hosts):
            if str(host) == text:
                return index
        return None

    def is_writer(self, host: str, port: int) -> bool:
        return (host, port) == (self.writer.host, self.writer.port)

    def move_to(self, index: int) -> bool:
        """Make ``index`` the writer; True when that is a change."""
        if index == self.current:
            return False
        self.current = index
        self.moves += 1
        return True
