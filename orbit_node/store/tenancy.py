"""Applications, namespaces, queues and credentials."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ..db import Database, Tx
from ..domain.errors import AlreadyExists, InvalidArgument, NotFound, PermissionDenied, Unauthenticated
from ..domain.ids import is_hex32, random_id
from ..domain.rules import DEFAULT_RUNNING_PER_KEY, MAX_WEIGHT, running_per_key
from ..domain.submit_limit import SubmitLimit

SCOPES = (
    "queues:manage",
    "tasks:submit",
    "tasks:read",
    "tasks:cancel",
    "workers:connect",
    "workers:consume",
    "metrics:read",
)
# Scopes about the whole node rather than a namespace's queues: granted as "*" only.
NODE_SCOPES = ("metrics:read",)
ALL_QUEUES = "*"
# The per-queue controls a queue carries (NULL = unlimited; max_running_per_key is never
# NULL, 1-1000).
QUEUE_CONTROLS = ("max_concurrency", "max_starts_per_second", "max_running_per_key")
TOKEN_PREFIX = "orb_"
# orb_ + 32-hex credential id + 64-hex secret.
TOKEN_LENGTH = len(TOKEN_PREFIX) + 32 + 64


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def split_token(token: str) -> tuple[str, str] | None:
    if len(token) != TOKEN_LENGTH or not token.startswith(TOKEN_PREFIX):
        return None
    body = token[len(TOKEN_PREFIX) :]
    credential_id, secret = body[:32], body[32:]
    if not is_hex32(credential_id) or any(c not in "0123456789abcdef" for c in secret):
        return None
    return credential_id, secret


def normalize_scopes(scopes: Mapping[str, Any]) -> dict[str, str | list[str]]:
    """Validate a scope grant: scope name -> "*" or a list of queue ids."""
    result: dict[str, str | list[str]] = {}
    for name, grant in scopes.items():
        if name not in SCOPES:
            raise InvalidArgument(f"scopes: unknown scope {name!r}", field="scopes")
        if grant == ALL_QUEUES:
            result[name] = ALL_QUEUES
        elif name in NODE_SCOPES:
            raise InvalidArgument(f'scopes.{name}: a node-wide scope is granted as "*" only', field=f"scopes.{name}")
        elif isinstance(grant, (list, tuple)) and all(is_hex32(q) for q in grant):
            result[name] = sorted(set(grant))
        else:
            raise InvalidArgument(f'scopes.{name}: expected "*" or a list of queue ids', field=f"scopes.{name}")
    return result


@attrs.frozen
class Principal:
    """Who a request is: derived on the server from the credential, never from the client."""

    credential_id: str
    namespace_id: str
    namespace: str
    environment: str
    application_id: str
    application: str
    scopes: Mapping[str, str | Sequence[str]]
    # The application's ``max_worker_connections`` (Worker connections one node accepts
    # of it at most; None: no limit of its own), as of when the credential was verified.
    max_worker_connections: int | None = None

    def allows(self, scope: str, queue_id: str | None = None) -> bool:
        grant = self.scopes.get(scope)
        if grant is None:
            return False
        if grant == ALL_QUEUES or queue_id is None:
            return True
        return queue_id in grant

    def require(self, scope: str, queue_id: str | None = None) -> None:
        if not self.allows(scope, queue_id):
            target = f" for queue {queue_id}" if queue_id else ""
            raise PermissionDenied(f"authorization: credential lacks scope {scope}{target}", field="authorization")

    def queue_filter(self, scope: str) -> list[str] | None:
        """Queue ids a scope is limited to, or None for all queues of the namespace."""
        grant = self.scopes.get(scope)
        if grant is None:
            return []
        return None if grant == ALL_QUEUES else list(grant)


@attrs.frozen
class Queue:
    queue_id: str
    namespace_id: str
    application_id: str
    name: str
    paused: bool
    max_concurrency: int | None
    max_starts_per_second: int | None
    max_running_per_key: int
    created_at: Any

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Queue:
        return cls(
            queue_id=row["queue_id"],
            namespace_id=row["namespace_id"],
            application_id=row["application_id"],
            name=row["name"],
            paused=bool(row["paused"]),
            max_concurrency=row["max_concurrency"],
            max_starts_per_second=row["max_starts_per_second"],
            max_running_per_key=row["max_running_per_key"],
            created_at=row["created_at"],
        )


@attrs.define(eq=False)
class TenancyStore:
    db: Database

    # -- applications and namespaces -------------------------------------------------

    async def ensure_application(self, name: str) -> dict[str, Any]:
        async def body(tx: Tx):
            await tx.execute("app_insert_ignore", {"application_id": random_id(), "name": name})
            return await tx.fetchone("app_by_name", {"name": name})

        return await self.db.transaction(body)

    async def application_by_name(self, name: str) -> dict[str, Any]:
        row = await self.db.fetchone("app_by_name", {"name": name})
        if row is None:
            raise NotFound(f"application: {name!r} not found", field="application")
        return row

    async def ensure_namespace(self, application_id: str, name: str, environment: str) -> dict[str, Any]:
        async def body(tx: Tx):
            await tx.execute(
                "ns_insert_ignore",
                {
                    "namespace_id": random_id(),
                    "application_id": application_id,
                    "name": name,
                    "environment": environment,
                },
            )
            return await tx.fetchone("ns_by_name", {"application_id": application_id, "name": name})

        row = await self.db.transaction(body)
        if row["environment"] != environment:
            raise AlreadyExists(
                f"environment: namespace {name!r} exists with environment {row['environment']!r}", field="environment"
            )
        return row

    async def set_application_quota(
        self, application_id: str, *, max_concurrent_executions: int | None, max_starts_per_second: int | None
    ) -> None:
        await self.db.execute(
            "app_set_quota",
            {
                "application_id": application_id,
                "max_concurrent_executions": max_concurrent_executions,
                "max_starts_per_second": max_starts_per_second,
            },
        )

    async def set_application_suspended(self, application_id: str, suspended: bool) -> None:
        await self.db.execute("app_set_suspended", {"application_id": application_id, "suspended": int(suspended)})

    async def application_weights(self) -> dict[str, int]:
        """Application id -> fairness weight, of every application whose weight is not 1.

        A weight above the largest (a server that does not enforce the column's CHECK, as
        MySQL before 8.0.16) counts as the largest: the scheduler never sees one it refuses."""
        rows = await self.db.fetchall("app_weights")
        return {r["application_id"]: min(int(r["fairness_weight"]), MAX_WEIGHT) for r in rows}

    async def submit_limits(self, stale_s: int) -> tuple[dict[str, SubmitLimit], int]:
        """(application id -> submit limit, of the applications that have one; the live
        nodes among which each node enforces its share). A negative value (a server that
        does not check the writers' bounds) counts as 0."""
        rows = await self.db.fetchall("app_submit_limits", {"stale_s": stale_s})
        limits = {
            r["application_id"]: SubmitLimit(
                max(0, int(r["submits_per_second"])),
                None if r["submit_burst"] is None else max(0, int(r["submit_burst"])),
            )
            for r in rows
        }
        return limits, max((int(r["live_nodes"]) for r in rows), default=1)

    # -- queues ----------------------------------------------------------------------

    async def create_queue(
        self,
        namespace_id: str,
        application_id: str,
        name: str,
        *,
        max_concurrency: int | None = None,
        max_starts_per_second: int | None = None,
        max_running_per_key: int = DEFAULT_RUNNING_PER_KEY,
        exist_ok: bool = False,
    ) -> tuple[Queue, bool]:
        """Create a queue; returns (queue, created). Names are unique per namespace."""
        running_per_key(max_running_per_key)  # the column has no CHECK (000028): the writers check

        async def body(tx: Tx):
            existing = await tx.fetchone("queue_by_name", {"namespace_id": namespace_id, "name": name})
            if existing is not None:
                return existing, False
            params = {
                "queue_id": random_id(),
                "namespace_id": namespace_id,
                "application_id": application_id,
                "name": name,
                "max_concurrency": max_concurrency,
                "max_starts_per_second": max_starts_per_second,
                "max_running_per_key": max_running_per_key,
            }
            await tx.execute("queue_insert", params)
            return await tx.fetchone("queue_by_id", params), True

        try:
            row, created = await self.db.transaction(body)
        except Exception as exc:  # a concurrent create of the same name
            if getattr(exc, "errno", None) == 1062:
                row, created = (
                    await self.db.fetchone("queue_by_name", {"namespace_id": namespace_id, "name": name}),
                    False,
                )
            else:
                raise
        if not created and not exist_ok:
            raise AlreadyExists(f"name: a queue named {name!r} already exists in this namespace", field="name")
        return Queue.from_row(row), created

    async def get_queue(self, namespace_id: str, queue_id: str) -> Queue:
        row = None
        if is_hex32(queue_id):
            row = await self.db.fetchone("queue_by_id", {"namespace_id": namespace_id, "queue_id": queue_id})
        if row is None:
            raise NotFound(f"queue_id: queue {queue_id} not found", field="queue_id")
        return Queue.from_row(row)

    async def get_queue_by_name(self, namespace_id: str, name: str) -> Queue:
        row = await self.db.fetchone("queue_by_name", {"namespace_id": namespace_id, "name": name})
        if row is None:
            raise NotFound(f"queue: {name!r} not found", field="queue")
        return Queue.from_row(row)

    async def list_queues(
        self, namespace_id: str, *, after: str = "", limit: int = 100, queue_ids: Sequence[str] | None = None
    ) -> list[Queue]:
        """Queues in id order after ``after``; ``queue_ids`` limits them to those ids (None: all)."""
        params = {"namespace_id": namespace_id, "after": after, "limit": limit}
        if queue_ids is None:
            rows = await self.db.fetchall("queue_list", params)
        elif not queue_ids:
            rows = []
        else:
            rows = await self.db.fetchall("queue_list_in", {**params, "queue_ids": tuple(queue_ids)})
        return [Queue.from_row(r) for r in rows]

    async def set_queue_paused(self, namespace_id: str, queue_id: str, paused: bool) -> Queue:
        await self.get_queue(namespace_id, queue_id)
        await self.db.execute(
            "queue_set_paused", {"namespace_id": namespace_id, "queue_id": queue_id, "paused": int(paused)}
        )
        return await self.get_queue(namespace_id, queue_id)

    async def set_queue_controls(
        self, namespace_id: str, queue_id: str, *, max_concurrency: int | None, max_starts_per_second: int | None
    ) -> Queue:
        await self.get_queue(namespace_id, queue_id)
        await self.db.execute(
            "queue_set_controls",
            {
                "namespace_id": namespace_id,
                "queue_id": queue_id,
                "max_concurrency": max_concurrency,
                "max_starts_per_second": max_starts_per_second,
            },
        )
        return await self.get_queue(namespace_id, queue_id)

    async def update_queue_controls(self, namespace_id: str, queue_id: str, changes: Mapping[str, int | None]) -> Queue:
        """Set the named controls (``max_concurrency``, ``max_starts_per_second``: None =
        unlimited; ``max_running_per_key``: 1-1000), keep the others."""
        unknown = set(changes) - set(QUEUE_CONTROLS)
        if unknown:
            raise InvalidArgument(f"{sorted(unknown)[0]}: not a queue control", field=sorted(unknown)[0])
        if "max_running_per_key" in changes:
            running_per_key(changes["max_running_per_key"])
        await self.get_queue(namespace_id, queue_id)
        params: dict[str, Any] = {"namespace_id": namespace_id, "queue_id": queue_id}
        for name in QUEUE_CONTROLS:
            params[f"set_{name}"] = name in changes
            params[name] = changes.get(name)
        await self.db.execute("queue_patch_controls", params)
        return await self.get_queue(namespace_id, queue_id)

    # -- credentials -----------------------------------------------------------------

    async def create_credential(self, namespace_id: str, name: str, scopes: Mapping[str, Any]) -> tuple[str, str]:
        """Create a credential; returns (credential_id, token). The token is shown only here."""
        normalized = normalize_scopes(scopes)
        credential_id = random_id()
        secret = secrets.token_hex(32)
        await self.db.execute(
            "credential_insert",
            {
                "credential_id": credential_id,
                "namespace_id": namespace_id,
                "name": name,
                "secret_sha256": hash_secret(secret),
                "scopes": json.dumps(normalized, sort_keys=True),
            },
        )
        return credential_id, f"{TOKEN_PREFIX}{credential_id}{secret}"

    async def revoke_credential(self, credential_id: str) -> None:
        if (
            not is_hex32(credential_id)
            or await self.db.fetchone("credential_by_id", {"credential_id": credential_id}) is None
        ):
            raise NotFound(f"credential_id: credential {credential_id} not found", field="credential_id")
        await self.db.execute("credential_revoke", {"credential_id": credential_id})

    async def authenticate(self, token: str | None) -> Principal:
        """Resolve a bearer token. Unknown, malformed and revoked tokens look the same."""
        parts = split_token(token or "")
        if parts is None:
            raise Unauthenticated("authorization: missing or malformed bearer credential", field="authorization")
        credential_id, secret = parts
        row = await self.db.fetchone("credential_by_id", {"credential_id": credential_id})
        if (
            row is None
            or row["revoked_at"] is not None
            or not hmac.compare_digest(row["secret_sha256"], hash_secret(secret))
        ):
            raise Unauthenticated("authorization: unknown or revoked credential", field="authorization")
        return _principal(row)

    async def principal_of(self, credential_id: str) -> Principal:
        """The principal of a credential verified before (a console session holds its id, never
        its token). Unknown and revoked credentials look the same."""
        row = None
        if is_hex32(credential_id):
            row = await self.db.fetchone("credential_by_id", {"credential_id": credential_id})
        if row is None or row["revoked_at"] is not None:
            raise Unauthenticated("authorization: unknown or revoked credential", field="authorization")
        return _principal(row)


def _principal(row: Mapping[str, Any]) -> Principal:
    """The principal of a ``credential_by_id`` row."""
    return Principal(
        credential_id=row["credential_id"],
        namespace_id=row["namespace_id"],
        namespace=row["namespace_name"],
        environment=row["environment"],
        application_id=row["application_id"],
        application=row["application_name"],
        scopes=json.loads(row["scopes"]),
        max_worker_connections=row["max_worker_connections"],
    )
