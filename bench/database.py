"""Each scenario's own database: created on the private server of its durability setting
(``bench/durability.py``; with ``--durability server``, on the server of
``ORBIT_BENCH_MYSQL_DSN``, default ``scripts/devdb.sh dsn``), migrated, and dropped at the
end whatever happened; tenants, seeded tasks, statement counts and task timings. Every
server is on 127.0.0.1."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from orbit_node.db import Database, migrate
from orbit_node.domain.dsn import Dsn
from orbit_node.store.tenancy import SCOPES, TenancyStore

from . import HANDLER, REPO, durability
from .report import STATUS_COUNTERS, status_delta

# Rows per INSERT ... SELECT when seeding (keeps each statement's undo log modest).
SEED_CHUNK = 100_000


def bench_dsn() -> Dsn:
    """The MariaDB server the benchmarks create their databases on: the running scenario's
    private server of its durability setting (bench/durability.py), else ``env_dsn()``."""
    found = durability.active()
    if found is not None and found.dsn is not None:
        return found.dsn
    return env_dsn()


def env_dsn() -> Dsn:
    """The server of ``ORBIT_BENCH_MYSQL_DSN`` (default ``scripts/devdb.sh dsn``)."""
    text = os.environ.get("ORBIT_BENCH_MYSQL_DSN")
    if not text:
        text = subprocess.run(
            [str(REPO / "scripts" / "devdb.sh"), "dsn"], check=True, capture_output=True, text=True
        ).stdout.strip()
    dsn = Dsn.parse(text)
    if dsn.unix_socket is None and dsn.host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"benchmarks only talk to this machine; ORBIT_BENCH_MYSQL_DSN names {dsn.host}")
    return dsn


async def admin_sql(server: Dsn, sql: str) -> None:
    admin = Database(server, size=1)
    try:
        await admin.run(lambda tx: tx.execute_raw(sql))
    finally:
        await admin.aclose()


@attrs.frozen
class BenchDb:
    dsn: Dsn
    db: Database
    server_version: str


@asynccontextmanager
async def bench_database(*, pool_size: int = 8, migrations_of: Path | None = None) -> AsyncIterator[BenchDb]:
    """A new migrated database, dropped on exit. ``migrations_of``: a source tree of an
    older commit whose ``orbit-migrate up`` migrates it, so that the tree's node (which
    refuses a schema newer than its own) can run on it."""
    server = bench_dsn()
    name = "orbit_bench_" + secrets.token_hex(4)
    await admin_sql(server, f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    dsn = server.with_database(name)
    db = Database(dsn, size=pool_size)
    try:
        if migrations_of is None:
            await migrate.up(db)
        else:
            await trio.run_process(
                [sys.executable, "-m", "orbit_node.cli.migrate", "up"],
                cwd=migrations_of,
                env={**os.environ, "ORBIT_MYSQL_DSN": dsn.url()},
                stdout=subprocess.DEVNULL,
            )
        version = (await db.run(lambda tx: tx.fetchall_raw("SELECT VERSION() AS v")))[0]["v"]
        yield BenchDb(dsn, db, version)
    finally:
        with trio.CancelScope(shield=True):
            await db.aclose()
            with trio.move_on_after(60):
                await admin_sql(server, f"DROP DATABASE IF EXISTS `{name}`")


async def server_status(db: Database, counters: Sequence[str] = STATUS_COUNTERS) -> dict[str, int]:
    """MariaDB's global status ``counters`` (server-wide: every client counts)."""
    names = ", ".join(f"'{name}'" for name in counters)
    rows = await db.run(lambda tx: tx.fetchall_raw(f"SHOW GLOBAL STATUS WHERE Variable_name IN ({names})"))
    return {_text(r["Variable_name"]): int(_text(r["Value"])) for r in rows}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@attrs.define(eq=False)
class Statements:
    """What ``count_statements`` found: the counters' change over the block."""

    delta: dict[str, int] = attrs.field(factory=dict)


@asynccontextmanager
async def count_statements(db: Database) -> AsyncIterator[Statements]:
    """The server's statement counters before and after the block (``Statements.delta``)."""
    result = Statements()
    before = await server_status(db)
    yield result
    result.delta = status_delta(before, await server_status(db))


@attrs.frozen
class App:
    """An application with one namespace, its queues and a token with every scope."""

    name: str
    application_id: str
    namespace_id: str
    queue_ids: tuple[str, ...]
    token: str

    @property
    def queue_id(self) -> str:
        return self.queue_ids[0]


async def make_app(db: Database, name: str, *, queues: int = 1) -> App:
    tenancy = TenancyStore(db)
    app = await tenancy.ensure_application(name)
    ns = await tenancy.ensure_namespace(app["application_id"], "bench", "test")
    queue_ids = []
    for index in range(queues):
        queue, _ = await tenancy.create_queue(ns["namespace_id"], app["application_id"], f"q{index}", exist_ok=True)
        queue_ids.append(queue.queue_id)
    _, token = await tenancy.create_credential(ns["namespace_id"], "bench", {scope: "*" for scope in SCOPES})
    return App(name, app["application_id"], ns["namespace_id"], tuple(queue_ids), token)


def _digits_table(count: int) -> tuple[str, str]:
    digits = max(1, len(str(max(count - 1, 1))))
    tables = ", ".join(
        "(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL "
        f"SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) d{i}"
        for i in range(digits)
    )
    number = " + ".join(f"d{i}.d * {10**i}" for i in range(digits))
    return number, tables


async def seed_tasks(
    db: Database,
    app: App,
    count: int,
    *,
    queue_id: str | None = None,
    available_s: str = "-1",
    priority: str = "0",
    state: str = "queued",
    handler: tuple[str, str, str] = HANDLER,
    resource_key: str = "NULL",
) -> None:
    """``count`` task rows through INSERT ... SELECT over a cross join of digits.

    ``available_s``, ``priority`` and ``resource_key`` are SQL expressions of the row
    number ``n`` (seconds relative to ``NOW(6)``; e.g. ``"-600 * RAND()"``,
    ``"CONCAT('k', MOD(n, 100))"``; the statement carries parameters, so
    ``%`` is written ``MOD()``). ``state='succeeded'`` (or ``'cancelled'``) writes
    finished history rows; ``handler`` is (handler, handler_version, payload_version),
    the no-op handler by default. Chunks of ``SEED_CHUNK`` rows, one statement each.
    """
    queue_id = queue_id or app.queue_id
    finished = state != "queued"
    for offset in range(0, count, SEED_CHUNK):
        size = min(SEED_CHUNK, count - offset)
        number, tables = _digits_table(size)
        prefix = secrets.token_hex(4)
        extra_cols = ", state, attempts, reserved_at, started_at, finished_at, result" if finished else ""
        extra_vals = (
            ", %s, 1, NOW(6) - INTERVAL 1 HOUR, NOW(6) - INTERVAL 1 HOUR, NOW(6) - INTERVAL 1 HOUR, 'null'"
            if finished
            else ""
        )
        sql = (
            "INSERT INTO tasks (task_id, application_id, namespace_id, queue_id, handler, handler_version, "
            f"payload_version, payload, available_at, priority, resource_key{extra_cols}) "
            f"SELECT CONCAT(%s, LPAD(LOWER(HEX(n)), 24, '0')), %s, %s, %s, %s, %s, %s, '{{}}', "
            f"NOW(6) + INTERVAL ROUND(({available_s}) * 1000000) MICROSECOND, {priority}, {resource_key}{extra_vals} "
            f"FROM (SELECT {number} AS n FROM {tables}) seq WHERE n < %s"
        )
        params: list[Any] = [prefix, app.application_id, app.namespace_id, queue_id, *handler]
        if finished:
            params.append(state)
        params.append(size)
        await db.run(lambda tx: tx.execute_raw(sql, params))  # noqa: B023 - awaited within the iteration


async def count_tasks(db: Database, where: str = "1", params: Sequence[Any] = ()) -> int:
    rows = await db.run(lambda tx: tx.fetchall_raw(f"SELECT COUNT(*) AS n FROM tasks WHERE {where}", params))
    return int(rows[0]["n"])


async def task_times(db: Database, where: str = "state = 'succeeded'", params: Sequence[Any] = ()) -> list[dict]:
    """Per task (database clock): waits available->reserve (dispatch) and available->start, in seconds."""
    sql = (
        "SELECT application_id, queue_id, priority, UNIX_TIMESTAMP(available_at) AS available, "
        "TIMESTAMPDIFF(MICROSECOND, available_at, reserved_at) / 1e6 AS to_dispatch, "
        "TIMESTAMPDIFF(MICROSECOND, available_at, started_at) / 1e6 AS to_start, "
        "UNIX_TIMESTAMP(reserved_at) AS reserved, UNIX_TIMESTAMP(finished_at) AS finished, "
        "TIMESTAMPDIFF(MICROSECOND, created_at, available_at) / 1e6 AS dated_ahead "
        f"FROM tasks WHERE {where} ORDER BY reserved_at, dispatch_at, available_at, task_id"
    )
    rows = await db.run(lambda tx: tx.fetchall_raw(sql, params))
    return [
        {
            k: (float(v) if k not in ("application_id", "queue_id", "priority") and v is not None else v)
            for k, v in r.items()
        }
        for r in rows
    ]
