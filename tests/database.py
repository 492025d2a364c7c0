"""The database fixtures: every test that asks gets its own database on a real MariaDB server.

The server comes from ORBIT_TEST_MYSQL_DSN (``make test`` points it at the private
MariaDB under ./var; the database it names need not exist). Each test process (each pytest-xdist worker) migrates one template
database ``orbit_tpl_<random>`` once; each test then gets ``orbit_t_<random>``, a copy of
the template's tables (``CREATE TABLE ... LIKE`` and the rows the migrations wrote), and
drops it afterwards, so tests never see each other's rows and none pays for replaying
every migration.

The conftest.py of each folder whose tests need a database (integration, system,
repository) imports these fixtures; tests/unit sees none of them, so a unit test cannot
ask for a database, and importing tests/conftest.py needs no server.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import trio

from harness.mariadb import PrivateMariaDB
from orbit_node.config import NodeConfig
from orbit_node.db import Database, migrate
from orbit_node.domain.dsn import Dsn
from orbit_node.domain.errors import OrbitError
from orbit_node.services import default_services

from .nodeutil import run_node

REPO = Path(__file__).resolve().parent.parent


def server_dsn() -> Dsn:
    """The test server's address and account. The DSN's database is not used (it need not
    exist): every test creates its own, and connections that belong to no test's database
    (creating and dropping them) use ``information_schema``, which every account can open."""
    text = os.environ.get("ORBIT_TEST_MYSQL_DSN")
    if not text:
        text = subprocess.run(
            [str(REPO / "scripts" / "devdb.sh"), "dsn"], check=True, capture_output=True, text=True
        ).stdout.strip()
    return Dsn.parse(text).with_database("information_schema")


async def create_database(name: str) -> None:
    admin = Database(server_dsn(), size=1)
    try:
        await admin.run(
            lambda tx: tx.execute_raw(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        )
    finally:
        await admin.aclose()


class TransactionLeft(AssertionError):
    """A test ended with a database session still inside a transaction."""


# How long a session whose client has gone may take to end on the server (it notices the
# closed socket at its next read) before it counts as left behind.
SESSION_END_S = 3


async def drop_database(name: str) -> None:
    """Drop ``name``, first ending every session still connected to it.

    An idle session (``Sleep``) still inside a transaction holds metadata locks that would
    make the ``DROP`` wait for ever; it means the test, or the code it runs, neither
    committed nor closed a transaction: it is killed and reported as the test's failure.
    A session still running a statement (its client may be gone) is only killed."""
    admin = Database(server_dsn(), size=1)
    sql = (
        "SELECT p.id, p.command, t.trx_started FROM information_schema.processlist p"
        " LEFT JOIN information_schema.innodb_trx t ON t.trx_mysql_thread_id = p.id"
        " WHERE p.db = %s AND p.id <> CONNECTION_ID()"
    )

    def left_in_transaction(sessions):
        return [s for s in sessions if s["command"] == "Sleep" and s["trx_started"] is not None]

    try:
        with trio.move_on_after(SESSION_END_S):
            while left_in_transaction(sessions := await admin.run(lambda tx: tx.fetchall_raw(sql, (name,)))):
                await trio.sleep(0.05)
        left = left_in_transaction(sessions)
        for session in sessions:
            try:
                await admin.run(lambda tx, i=session["id"]: tx.execute_raw(f"KILL CONNECTION {int(i)}"))
            except OrbitError:
                pass  # it ended meanwhile
        await admin.run(lambda tx: tx.execute_raw(f"DROP DATABASE IF EXISTS `{name}`"))
    finally:
        await admin.aclose()
    if left:
        raise TransactionLeft(
            f"{len(left)} idle session(s) of {name} were still inside a transaction {SESSION_END_S} s after the "
            f"test ended (started {min(s['trx_started'] for s in left)})"
        )


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


async def _migrate_template(name: str) -> list[tuple[str, bool]]:
    """Create and migrate the template; its tables, each with whether it holds rows."""
    await create_database(name)
    db = Database(server_dsn().with_database(name), size=1)
    try:
        await migrate.up(db)
        tables = await db.run(
            lambda tx: tx.fetchall_raw(
                "SELECT table_name AS name FROM information_schema.tables"
                " WHERE table_schema = %s AND table_type = 'BASE TABLE' ORDER BY table_name",
                (name,),
            )
        )
        found = []
        for table in tables:
            rows = await db.run(lambda tx, t=table["name"]: tx.fetchall_raw(f"SELECT 1 FROM `{t}` LIMIT 1"))
            found.append((table["name"], bool(rows)))
        return found
    finally:
        await db.aclose()


@attrs.frozen
class Template:
    """A database migrated to head once per test process, copied for each test."""

    name: str
    tables: list[tuple[str, bool]]

    async def copy_into(self, target: str) -> None:
        admin = Database(server_dsn(), size=1)

        async def copy(tx):
            for table, has_rows in self.tables:
                await tx.execute_raw(f"CREATE TABLE `{target}`.`{table}` LIKE `{self.name}`.`{table}`")
                if has_rows:
                    await tx.execute_raw(f"INSERT INTO `{target}`.`{table}` SELECT * FROM `{self.name}`.`{table}`")

        try:
            await admin.run(copy)
        finally:
            await admin.aclose()


@attrs.define
class _Shared:
    """The process's one template and how many folders' fixtures hold it."""

    template: Template | None = None
    users: int = 0


_SHARED = _Shared()


@pytest.fixture(scope="session")
def migrated_template() -> Iterator[Template]:
    """One template per test process. Each folder's conftest declares this fixture, so a
    run over several folders has several session fixtures: they share the template (one
    migration per process, not one per folder) and the last to end drops it."""
    if _SHARED.template is None:
        name = "orbit_tpl_" + secrets.token_hex(6)
        _SHARED.template = Template(name, trio.run(_migrate_template, name))
    _SHARED.users += 1
    try:
        yield _SHARED.template
    finally:
        _SHARED.users -= 1
        if _SHARED.users == 0:
            template, _SHARED.template = _SHARED.template, None
            trio.run(drop_database, template.name)


@pytest.fixture
async def dsn(empty_dsn, migrated_template):
    """The DSN of a new database at the head migration (a copy of the template)."""
    await migrated_template.copy_into(empty_dsn.database)
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
async def full_node(node_config):
    """``running_node`` with every background service (dispatch, recovery, plans): what a
    Worker needs to be sent tasks."""
    async with run_node(node_config, services=default_services()) as running:
        yield running


@pytest.fixture
async def private_mariadb():
    """A private ``mariadbd`` of the test's own (harness/mariadb.py), removed afterwards."""
    server = PrivateMariaDB()
    try:
        await server.start()
        yield server
    finally:
        with trio.CancelScope(shield=True):
            await server.stop()
        server.remove()
