"""Durability settings the benchmarks run at, each on a private ``mariadbd`` of its own.

``prod`` is what docs/operations.md requires in production: ``innodb_flush_log_at_trx_commit=1``,
binary logging on with ``sync_binlog=1`` and ``binlog_format=ROW`` (a deployment with
replicas or point-in-time recovery; ``--prod-binlog off`` leaves binary logging out),
``synchronous_commit=on`` for the PostgreSQL peers and ``appendfsync always`` for the Redis
ones. ``dev`` is the development database's setting (scripts/devdb.sh):
``innodb_flush_log_at_trx_commit=2``, no binary log, ``synchronous_commit=off`` and
``appendfsync everysec`` (each written at every commit, flushed to disk once a second). ``server`` runs on the server of
``ORBIT_BENCH_MYSQL_DSN`` (default ``scripts/devdb.sh dsn``) as it is configured, and
reads its setting from it.

A private server is ``harness/mariadb.py``'s: ``--no-defaults``, a temporary datadir,
its own port and socket, so no other server is ever reconfigured. While one runs,
``bench.database.bench_dsn()`` names it (``active()``).
"""

from __future__ import annotations

import argparse
import contextvars
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from harness.mariadb import PrivateMariaDB
from orbit_node.db import Database
from orbit_node.domain.dsn import Dsn

# What ``--durability`` accepts besides the names of DURABILITIES.
BOTH = "both"
SERVER = "server"
CHOICES = ("prod", "dev", BOTH, SERVER)
# The buffer pool of a private bench server: the development database's (scripts/devdb.sh),
# so the figures differ from the development server's by the durability setting alone.
BUFFER_POOL = "512M"
# Enough for every node pool, Worker and peer a scenario opens at once (devdb.sh's value).
MAX_CONNECTIONS = 1000
# Server variables a report records: what the server really ran with.
SETTINGS_SQL = (
    "SELECT @@innodb_flush_log_at_trx_commit AS innodb_flush_log_at_trx_commit, @@log_bin AS log_bin, "
    "@@sync_binlog AS sync_binlog, @@binlog_format AS binlog_format, "
    "@@innodb_buffer_pool_size AS innodb_buffer_pool_size"
)


@attrs.frozen(kw_only=True)
class Durability:
    """One durability setting: the MariaDB options of its server and the peers' PostgreSQL
    and Redis settings."""

    name: str
    flush_log_at_trx_commit: int
    binlog: bool
    pg_synchronous_commit: str
    # The Redis peers' ``appendfsync`` (their append-only file is always on).
    redis_appendfsync: str
    # False: the server of ORBIT_BENCH_MYSQL_DSN, as it is (``--durability server``).
    private: bool = True

    @property
    def label(self) -> str:
        """How tables and notes name it."""
        binlog = ", binary log with sync_binlog=1, ROW" if self.binlog else ""
        return (
            f"{self.name} (innodb_flush_log_at_trx_commit={self.flush_log_at_trx_commit}{binlog}; "
            f"PostgreSQL synchronous_commit={self.pg_synchronous_commit}; Redis appendfsync {self.redis_appendfsync})"
        )

    def server_args(self) -> list[str]:
        """``mariadbd`` options of its private server (after the common ones: the last one wins)."""
        args = [
            f"--innodb-flush-log-at-trx-commit={self.flush_log_at_trx_commit}",
            f"--innodb-buffer-pool-size={BUFFER_POOL}",
            f"--max-connections={MAX_CONNECTIONS}",
        ]
        if self.binlog:
            # docs/operations.md: sync_binlog=1 and binlog_format=ROW when binary logging is on.
            args += ["--log-bin=binlog", "--server-id=1", "--sync-binlog=1", "--binlog-format=ROW"]
        return args


PROD = Durability(
    name="prod", flush_log_at_trx_commit=1, binlog=True, pg_synchronous_commit="on", redis_appendfsync="always"
)
DEV = Durability(
    name="dev", flush_log_at_trx_commit=2, binlog=False, pg_synchronous_commit="off", redis_appendfsync="everysec"
)
DURABILITIES = {"prod": PROD, "dev": DEV}


class DurabilityError(argparse.ArgumentTypeError):
    """A ``--durability`` value the bench does not know (argparse names the option)."""


def parse_choice(text: str) -> str:
    """``--durability``'s type: one of CHOICES (otherwise an error argparse prints as
    ``argument --durability: 'x' is not one of ...``)."""
    value = text.strip().lower()
    if value not in CHOICES:
        raise DurabilityError(f"{text!r} is not one of {', '.join(CHOICES)}")
    return value


def plan(choice: str | None, *, default: str, columns: bool, prod_binlog: bool = True) -> tuple[Durability, ...]:
    """The durabilities a scenario runs at, in order (prod first).

    ``choice``: ``--durability`` (None: the scenario's ``default``); ``columns``: whether
    the scenario prints one column per durability (otherwise ``both`` runs it at prod
    alone). ``server`` gives a placeholder read from the server later (``of_server``).
    """
    chosen = parse_choice(choice or default)
    if chosen == SERVER:
        return (
            Durability(
                name=SERVER,
                flush_log_at_trx_commit=0,
                binlog=False,
                pg_synchronous_commit="",
                redis_appendfsync="",
                private=False,
            ),
        )
    names = ("prod", "dev") if chosen == BOTH and columns else ("prod",) if chosen == BOTH else (chosen,)
    return tuple(attrs.evolve(DURABILITIES[n], binlog=prod_binlog) if n == "prod" else DURABILITIES[n] for n in names)


def of_server(settings: Mapping[str, Any]) -> Durability:
    """``--durability server``: the setting the server of ORBIT_BENCH_MYSQL_DSN runs with;
    the peers' PostgreSQL and Redis follow it (``on`` and ``always`` with flush=1, ``off`` and
    ``everysec`` otherwise)."""
    flush = int(settings.get("innodb_flush_log_at_trx_commit", 1))
    binlog = bool(int(settings.get("log_bin", 0))) and int(settings.get("sync_binlog", 0)) == 1
    return Durability(
        name="prod" if flush == 1 else "dev",
        flush_log_at_trx_commit=flush,
        binlog=binlog,
        pg_synchronous_commit="on" if flush == 1 else "off",
        redis_appendfsync="always" if flush == 1 else "everysec",
        private=False,
    )


# -- the server of the running scenario -------------------------------------------------


@attrs.frozen
class Active:
    durability: Durability
    dsn: Dsn | None  # None: ORBIT_BENCH_MYSQL_DSN's server


_ACTIVE: contextvars.ContextVar[Active | None] = contextvars.ContextVar("bench_server", default=None)


def active() -> Active | None:
    """The durability server the running scenario uses (None outside ``serving``)."""
    return _ACTIVE.get()


def current() -> Durability:
    """The running scenario's durability (``prod`` outside ``serving``, as ``make bench`` runs)."""
    found = _ACTIVE.get()
    return found.durability if found is not None else PROD


@attrs.define(eq=False)
class BenchServer(PrivateMariaDB):
    """A private ``mariadbd`` with the options of one durability setting."""

    durability: Durability = PROD

    def server_args(self) -> list[str]:
        return self.durability.server_args()


async def server_settings(dsn: Dsn) -> dict[str, Any]:
    """The durability variables the server at ``dsn`` runs with."""
    admin = Database(dsn, size=1)
    try:
        rows = await admin.run(lambda tx: tx.fetchall_raw(SETTINGS_SQL))
    finally:
        await admin.aclose()
    return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in rows[0].items()}


@asynccontextmanager
async def serving(durability: Durability, server_dsn: Dsn) -> AsyncIterator[dict[str, Any]]:
    """Run the block on a private server of ``durability`` (or, for ``server``, on
    ``server_dsn`` as it is); yields the server's settings as read from it."""
    if not durability.private:
        settings = await server_settings(server_dsn)
        token = _ACTIVE.set(Active(of_server(settings), None))
        try:
            yield settings
        finally:
            _ACTIVE.reset(token)
        return
    server = BenchServer(durability=durability)
    try:
        await server.start()
        dsn = server.dsn("mysql")
        settings = await server_settings(dsn)
        token = _ACTIVE.set(Active(durability, dsn))
        try:
            yield settings
        finally:
            _ACTIVE.reset(token)
    finally:
        with trio.CancelScope(shield=True):
            await server.stop()
            server.remove()


def check_settings(durability: Durability, settings: Mapping[str, Any]) -> list[str]:
    """Where the server's variables differ from what ``durability`` asks (empty: none)."""
    problems = []
    if int(settings.get("innodb_flush_log_at_trx_commit", -1)) != durability.flush_log_at_trx_commit:
        problems.append(
            f"innodb_flush_log_at_trx_commit is {settings.get('innodb_flush_log_at_trx_commit')}, "
            f"not {durability.flush_log_at_trx_commit}"
        )
    if durability.binlog and not (int(settings.get("log_bin", 0)) and int(settings.get("sync_binlog", 0)) == 1):
        problems.append("binary logging with sync_binlog=1 is not on")
    if durability.binlog and str(settings.get("binlog_format", "")).upper() != "ROW":
        problems.append(f"binlog_format is {settings.get('binlog_format')}, not ROW")
    return problems
