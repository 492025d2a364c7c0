"""Tenants for tests and runs: an application with one namespace, its queues and a credential.

``make_tenant(db)`` creates them (idempotently, except the credential) through
``TenancyStore``, as ``orbit-admin bootstrap`` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from orbit_node.db import Database
from orbit_node.store.tenancy import SCOPES, TenancyStore

# Every scope for every queue of the namespace.
ALL_SCOPES: dict[str, str] = {scope: "*" for scope in SCOPES}


@attrs.frozen
class Tenant:
    """One application with one namespace, its queues (name -> id) and a full-scope token."""

    application_id: str
    namespace_id: str
    queues: Mapping[str, str]
    token: str

    @property
    def queue_id(self) -> str:
        """The first queue's id."""
        return next(iter(self.queues.values()))


async def make_tenant(
    db: Database,
    application: str = "app",
    *,
    namespace: str = "default",
    environment: str = "test",
    queues: Sequence[str] = ("q1",),
    scopes: Mapping[str, Any] | None = None,
) -> Tenant:
    tenancy = TenancyStore(db)
    app_row = await tenancy.ensure_application(application)
    ns_row = await tenancy.ensure_namespace(app_row["application_id"], namespace, environment)
    queue_ids = {}
    for name in queues:
        queue, _ = await tenancy.create_queue(ns_row["namespace_id"], app_row["application_id"], name, exist_ok=True)
        queue_ids[name] = queue.queue_id
    _, token = await tenancy.create_credential(ns_row["namespace_id"], "test", ALL_SCOPES if scopes is None else scopes)
    return Tenant(app_row["application_id"], ns_row["namespace_id"], queue_ids, token)


async def make_token(db: Database, tenant: Tenant, scopes: Mapping[str, Any]) -> str:
    """Another credential of the tenant's namespace with exactly ``scopes``."""
    _, token = await TenancyStore(db).create_credential(tenant.namespace_id, "test", scopes)
    return token
