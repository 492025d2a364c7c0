"""The database clock seen from a later moment, without waiting for it.

A ``LaterDatabase`` is a pool whose sessions run with MariaDB's ``SET timestamp``:
``NOW(6)`` and ``UNIX_TIMESTAMP()`` in those sessions answer the real database time
of the connect plus ``ahead_s`` (frozen there). A ``LeaseStore`` over it acts like
a node whose statements run ``ahead_s`` seconds later: a lease that is valid now has
run out for it, while every other session still sees it valid.
"""

from __future__ import annotations

import attrs

from orbit_node.db import Database


@attrs.define(eq=False)
class LaterDatabase(Database):
    ahead_s: float = 0.0

    async def _connect(self):
        conn = await super()._connect()
        await conn.query(f"SET timestamp = UNIX_TIMESTAMP(NOW(6)) + {float(self.ahead_s)!r}")
        return conn
