"""The node registry (``nodes``): a node's row from its start to its stop, with the
heartbeat that tells the others (and the operators' views) it is alive."""

from __future__ import annotations

import attrs

from ..db import Database, migrate


@attrs.define(eq=False)
class NodeStore:
    db: Database

    async def register(self, node_id: str, *, hostname: str, http_addr: str, version: str) -> None:
        await self.db.execute(
            "node_register",
            {
                "node_id": node_id,
                "hostname": hostname[:255],
                "http_addr": http_addr,
                "version": version,
                # The newest migration this code knows: orbit-migrate's check before a
                # step older nodes cannot run against.
                "schema_head": migrate.HEAD,
            },
        )

    async def heartbeat(self, node_id: str) -> None:
        await self.db.execute("node_heartbeat", {"node_id": node_id})

    async def stopped(self, node_id: str) -> None:
        await self.db.execute("node_stopped", {"node_id": node_id})
