"""Shared fixtures: every test gets its own database on a real MariaDB server.

The server comes from ORBIT_TEST_MYSQL_DSN (``make test`` points it at the private
MariaDB under ./var). Each test creates ``orbit_t_<random>``, migrates it and drops
it afterwards, so tests never see each other's rows.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

import pytest
import trio

from orbit_node.config import Dsn, NodeConfig
from orbit_node.db import Database, migrate

from .faults.mariadb import PrivateMariaDB
from .nodeutil import run_node

# Every async test runs under a time cap (tests/timecap.py); pytester tests that cap.
pytest_plugins = ("tests.timecap", "pytester")

REPO = Path(__file__).resolve().parent.parent


def server_dsn() -> Dsn:
    text = os.environ.get("ORBIT_TEST_MYSQL_DSN")
    if not text:
        text = subprocess.run(
            [str(REPO / "scripts" / "devdb.sh"), "dsn"], check=True, capture_output=True, text=True
        ).stdout.strip()
    return Dsn.parse(text)


async def create_database(name: str) -> None:
    admin = Database(server_dsn(), size=1)
    try:
        await admin.run(
            lambda tx: tx.execute_raw(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        )
    finally:
        await admin.aclose()


async def drop_database(name: str) -> None:
    admin = Database(server_dsn(), size=1)
    try:
        await admin.run(lambda tx: tx.execute_raw(f"DROP DATABASE IF EXISTS `{name}`"))
    finally:
        await admin.aclose()


@pytest.fixture
async def empty_dsn():
    """The DSN of a new, empty database (dropped afterwards)."""
    name = "orbit_t_" + secrets.token_hex(6)
    await create_database(name)
    try:
        yield server_dsn().with_database(name)
    finally:
        with trio.CancelScope(shield=True):
            await drop_database(name)


@pytest.fixture
async def dsn(empty_dsn):
    """The DSN of a new database migrated to head."""
    db = Database(empty_dsn, size=1)
    try:
        await migrate.up(db)
    finally:
        await db.aclose()
    return empty_dsn


@pytest.fixture
async def db(dsn):
    database = Database(dsn, size=8)
    try:
        yield database
    finally:
        with trio.CancelScope(shield=True):
            await database.aclose()


@pytest.fixture
def node_config(dsn) -> NodeConfig:
    return NodeConfig(dsn=dsn, http_host="127.0.0.1", http_port=0, shutdown_grace_s=2.0)


@pytest.fixture
async def running_node(node_config):
    """A real ``orbit_node.node.Node`` on a free port of 127.0.0.1, serving this test's database.

    ``running_node.base_url`` is its URL; ``running_node.client(token)`` an httpx client.
    """
    async with run_node(node_config) as running:
        yield running


@pytest.fixture
async def private_mariadb():
    """A private ``mariadbd`` of the test's own (tests/faults/mariadb.py), removed afterwards."""
    server = PrivateMariaDB()
    try:
        await server.start()
        yield server
    finally:
        with trio.CancelScope(shield=True):
            await server.stop()
        server.remove()
