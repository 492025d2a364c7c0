"""A multi-host DSN: the pool writes to the first server that answers, moves to the next when
it is lost, and returns to an earlier one only when the cluster's writer record says so.

Two private, independent mariadbd servers stand in for the servers of a cluster (nothing
replicates between them, so each test writes the record on the server it means); the
Galera cluster itself is in test_fault_galera.py."""

from __future__ import annotations

import json

import attrs
import pytest
import trio

from harness.mariadb import PrivateMariaDB
from orbit_node.db import Database, migrate
from orbit_node.db.hosts import HostOrder
from orbit_node.domain.dsn import Dsn, DsnHost
from orbit_node.domain.errors import InvalidArgument, Unavailable

from ..helpers import cli


def pair_dsn(first: PrivateMariaDB, second: PrivateMariaDB) -> Dsn:
    return attrs.evolve(first.dsn(), failover_hosts=(DsnHost("127.0.0.1", second.port),))


async def port_of(db: Database) -> int:
    rows = await db.run(lambda tx: tx.fetchall_raw("SELECT @@port AS port"))
    return int(rows[0]["port"])


async def record(server: PrivateMariaDB, host: str | None) -> None:
    one = Database(server.dsn(), size=1)
    try:
        await one.run(lambda tx: tx.execute_raw("UPDATE database_writer SET host = %s WHERE id = 1", (host,)))
    finally:
        await one.aclose()


async def recorded(server: PrivateMariaDB) -> str | None:
    one = Database(server.dsn(), size=1)
    try:
        rows = await one.run(lambda tx: tx.fetchall_raw("SELECT host FROM database_writer WHERE id = 1"))
        return rows[0]["host"]
    finally:
        await one.aclose()


@pytest.fixture
async def servers():
    pair = [PrivateMariaDB(), PrivateMariaDB()]
    try:
        for server in pair:
            await server.start()
            one = Database(server.dsn(), size=1)
            try:
                await migrate.up(one)
            finally:
                await one.aclose()
        yield pair
    finally:
        for server in pair:
            with trio.CancelScope(shield=True):
                await server.stop()
            server.remove()


def test_host_order_tries_the_writer_first_then_the_rest_in_order():
    order = HostOrder([DsnHost("a"), DsnHost("b", 3307), DsnHost("c")])
    assert order.candidates() == [0, 1, 2]
    assert order.move_to(2) and order.candidates() == [2, 0, 1]
    assert not order.move_to(2) and order.moves == 1
    assert order.index_of("b:3307") == 1
    assert order.index_of("b:3306") is None and order.index_of(None) is None


async def test_the_pool_moves_on_when_its_server_is_lost_and_stays_when_it_comes_back(servers):
    first, second = servers
    db = Database(pair_dsn(first, second), size=2, connect_timeout_s=2)
    try:
        assert await port_of(db) == first.port
        await first.kill9()
        # The idle connection died with its server; the next one goes to the second server,
        # and the move is recorded there for the other nodes.
        assert await port_of(db) == second.port
        assert db.writer == DsnHost("127.0.0.1", second.port)
        assert db.order.moves == 1
        assert await recorded(second) == f"127.0.0.1:{second.port}"
        await first.start()
        # The first server is back: nothing moves by itself (no flapping), not on new
        # connections, not on the periodic check.
        async with db.connection(), db.connection():
            pass
        await db.check_writer()
        assert [await port_of(db) for _ in range(3)] == [second.port] * 3
        assert db.order.moves == 1
        # Told (the record names the first server): the pool goes back.
        await record(second, f"127.0.0.1:{first.port}")
        await db.check_writer()
        assert await port_of(db) == first.port
        assert db.order.moves == 2
    finally:
        await db.aclose()


async def test_a_new_pool_follows_the_recorded_writer_and_ignores_one_that_does_not_answer(servers):
    first, second = servers
    await record(first, f"127.0.0.1:{second.port}")
    db = Database(pair_dsn(first, second), size=1, connect_timeout_s=2)
    try:
        assert await port_of(db) == second.port
    finally:
        await db.aclose()
    await second.stop()
    db = Database(pair_dsn(first, second), size=1, connect_timeout_s=2)
    try:
        # The record names a server that is down: the node stays where it is.
        assert await port_of(db) == first.port
        await db.check_writer()
        assert await port_of(db) == first.port
    finally:
        await db.aclose()


async def test_every_server_lost_is_unavailable_and_set_writer_checks_its_host(servers):
    first, second = servers
    db = Database(pair_dsn(first, second), size=1, connect_timeout_s=2)
    try:
        with pytest.raises(InvalidArgument) as info:
            await db.set_writer("127.0.0.1:1")
        assert info.value.field == "host"
        await db.set_writer(f"127.0.0.1:{second.port}")
        assert await recorded(second) == f"127.0.0.1:{second.port}"
        assert await port_of(db) == second.port
        for server in servers:
            await server.kill9()
        with pytest.raises(Unavailable):
            await port_of(db)
    finally:
        await db.aclose()


async def test_orbit_admin_database_writer_shows_the_servers_and_records_a_failback(servers):
    first, second = servers
    dsn = pair_dsn(first, second)
    await second.kill9()
    shown = cli("orbit-admin", "database", "writer", "--json", dsn=dsn)
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert document["recorded_writer"] is None
    assert [(s["host"], s["answers"], s["writer"]) for s in document["servers"]] == [
        (f"127.0.0.1:{first.port}", True, True),
        (f"127.0.0.1:{second.port}", False, False),
    ]
    refused = cli("orbit-admin", "database", "writer", "--host", f"127.0.0.1:{second.port}", dsn=dsn)
    assert refused.returncode == 1 and "does not answer" in refused.stderr
    moved = cli("orbit-admin", "database", "writer", "--host", f"127.0.0.1:{first.port}", dsn=dsn)
    assert moved.returncode == 0, moved.stderr
    assert f"recorded writer: 127.0.0.1:{first.port} (by operator" in moved.stdout
    bad = cli("orbit-admin", "database", "writer", "--host", "elsewhere:1", dsn=dsn)
    assert bad.returncode == 1 and "not a server of ORBIT_MYSQL_DSN" in bad.stderr
