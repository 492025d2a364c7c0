"""A real in-process node for tests, and tenants (application, namespace, queues, credentials).

``run_node(config)`` starts ``orbit_node.node.Node`` on the config's address (port 0
picks a free one) inside the caller's task and stops it on exit; the
``running_node`` fixture in conftest.py wraps it. Tests talk to the node over real
HTTP with httpx.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import trio

# Tenants are the harness's (the chaos run makes them too); the tests know them by these names.
from harness.tenants import ALL_SCOPES, Tenant, make_tenant, make_token  # noqa: F401
from orbit_node.config import NodeConfig
from orbit_node.db import Database
from orbit_node.node import Node
from orbit_sdk import SubmitTaskRequest

# A bound on starting and stopping a node in tests (the database is local).
NODE_START_TIMEOUT_S = 20


@attrs.frozen
class RunningNode:
    node: Node
    base_url: str

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.AsyncClient:
        """An httpx client for the node; with ``token``, every request carries it."""
        headers = dict(kwargs.pop("headers", {}))
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=30, **kwargs)


@asynccontextmanager
async def run_node(config: NodeConfig, **node_kwargs: Any) -> AsyncIterator[RunningNode]:
    node = Node(config, **node_kwargs)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(NODE_START_TIMEOUT_S):
            bound = await nursery.start(node.run)
        try:
            yield RunningNode(node, bound[0])
        finally:
            node.request_shutdown()


async def count_rows(db: Database, table: str) -> int:
    rows = await db.run(lambda tx: tx.fetchall_raw(f"SELECT COUNT(*) AS n FROM `{table}`"))
    return int(rows[0]["n"])


async def stored_counts(db: Database) -> dict[str, int]:
    """Rows a submission writes: tasks, idempotency records and resource keys."""
    return {table: await count_rows(db, table) for table in ("tasks", "idempotency_records", "resource_keys")}


def assert_error(response: httpx.Response, status: int, code: str, field: str | None, *, named: bool = True) -> dict:
    """The error envelope: status, stable code, the field named (also in the message), request id."""
    assert response.status_code == status, response.text
    document = response.json()
    assert set(document) == {"error", "request_id"}, document
    assert set(document["error"]) == {"code", "message", "field"}, document
    assert document["error"]["code"] == code, document
    assert document["error"]["field"] == field, document
    if field is not None and named:
        assert field in document["error"]["message"], document
    assert document["request_id"].startswith("req_")
    assert response.headers["X-Request-Id"] == document["request_id"]
    return document["error"]


def task_request(queue_id: str, payload: Any = None, handler: str = "h", **extra: Any) -> SubmitTaskRequest:
    """An SDK submission of ``handler`` v1/v1 (the triple the SDK tests' Workers serve)."""
    return SubmitTaskRequest(
        queue_id=queue_id, handler=handler, handler_version="v1", payload_version="v1", payload=payload, **extra
    )
