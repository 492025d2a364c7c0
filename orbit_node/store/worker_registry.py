"""The registry of connected Workers (operators' view and dispatch explanations only)."""

from __future__ import annotations

import json

from ..db import Database


class WorkerRegistryStore:
    def __init__(self, db: Database):
        self.db = db

    async def add(
        self,
        *,
        connection_id: str,
        node_id: str,
        namespace_id: str,
        queues,
        capabilities,
        resource_key_support: bool,
        capacity: int,
        client_name: str | None,
        client_version: str | None,
    ) -> None:
        await self.db.execute(
            "worker_connection_insert",
            {
                "connection_id": connection_id,
                "node_id": node_id,
                "namespace_id": namespace_id,
                "queues": json.dumps(list(queues)),
                "capabilities": json.dumps(
                    sorted([c.handler, c.handler_version, c.payload_version] for c in capabilities)
                ),
                "resource_key_support": int(resource_key_support),
                "capacity": capacity,
                "client_name": client_name,
                "client_version": client_version,
            },
        )

    async def remove(self, connection_id: str) -> None:
        await self.db.execute("worker_connection_delete", {"connection_id": connection_id})

    async def remove_node(self, node_id: str) -> None:
        await self.db.execute("worker_connections_of_node_delete", {"node_id": node_id})

    async def heartbeat_node(self, node_id: str) -> None:
        await self.db.execute("worker_connections_heartbeat", {"node_id": node_id})
