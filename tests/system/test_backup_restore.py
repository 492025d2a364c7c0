"""A backup taken while the node serves, restored into a new database: a node serves from
it with every task acknowledged before the backup began (docs/operations.md, "Backup and
restore"). The commands are the documented ones: ``mariadb-dump --single-transaction``
and the ``mariadb`` client."""

from __future__ import annotations

import secrets
from pathlib import Path

import attrs
import pytest
import trio

from orbit_node.services import default_services
from orbit_sdk.client import OrbitClient
from orbit_sdk.models import SubmitTaskRequest
from orbit_sdk.worker import Worker

from ..database import create_database, drop_database, server_dsn
from ..nodeutil import make_tenant, run_node

# mariadb-dump and mariadb come with the server make test installs: no skip.
pytestmark = pytest.mark.time_cap(120)


def client_args(database: str) -> list[str]:
    """The test server's address and account for the ``mariadb`` tools (TCP, not a socket)."""
    server = server_dsn()
    args = ["--protocol=TCP", "-h", server.host, "-P", str(server.port), "-u", server.user]
    if server.password:
        args.append(f"--password={server.password}")
    return [*args, database]


async def dump(database: str, path: Path) -> None:
    """The documented backup: one consistent snapshot of InnoDB, no table locked."""
    with path.open("wb") as out:
        await trio.run_process(
            ["mariadb-dump", "--single-transaction", "--quick", "--no-tablespaces", *client_args(database)],
            stdout=out,
            capture_stderr=True,
        )


async def restore(database: str, path: Path) -> None:
    with path.open("rb") as dumped:
        await trio.run_process(["mariadb", *client_args(database)], stdin=dumped.read(), capture_stderr=True)


async def test_a_backup_of_a_live_database_restored_into_a_new_one_serves_every_acknowledged_task(
    node_config, db, dsn, tmp_path
):
    owner = await make_tenant(db, "app")
    request = SubmitTaskRequest(
        queue_id=owner.queue_id, handler="h", handler_version="v1", payload_version="v1", payload={"n": 1}
    )
    acknowledged: list[str] = []
    # Short leases: tasks running when the backup was taken come back quickly in the copy.
    config = attrs.evolve(node_config, run_lease_s=3.0, reservation_lease_s=3.0)

    async def handle(task):
        await trio.sleep(0.05)
        return {"done": task.payload}

    async def submit_forever(client: OrbitClient) -> None:
        n = 0
        while True:
            n += 1
            result = await client.submit_task(f"k-{n}", request)
            acknowledged.append(result.task.task_id)

    path = tmp_path / "orbit.sql"
    async with run_node(config, services=default_services()) as node:
        async with OrbitClient(node.base_url, owner.token) as client, trio.open_nursery() as load:
            worker = Worker(node.base_url, owner.token, [owner.queue_id], capacity=4)
            worker.register("h", "v1", "v1", handle)
            await load.start(worker.run)
            load.start_soon(submit_forever, client)
            with trio.fail_after(30):
                while worker.completed < 20:
                    await trio.sleep(0.05)
            before = list(acknowledged)
            await dump(dsn.database, path)  # under load: submits and Finishes go on
            after = len(acknowledged)
            load.cancel_scope.cancel()
    assert after > len(before), "the load went on during the backup"

    copy = "orbit_restored_" + secrets.token_hex(4)
    await create_database(copy)
    try:
        await restore(copy, path)
        restored = attrs.evolve(config, dsn=server_dsn().with_database(copy))
        async with run_node(restored, services=default_services()) as node:
            async with OrbitClient(node.base_url, owner.token) as client, trio.open_nursery() as serving:
                worker = Worker(node.base_url, owner.token, [owner.queue_id], capacity=4)
                worker.register("h", "v1", "v1", handle)
                await serving.start(worker.run)
                # Every task acknowledged before the backup began is there, and ends:
                # queued ones run, running ones come back when their lease runs out.
                with trio.fail_after(60):
                    tasks = await client.wait(before)
                assert [t.task_id for t in tasks] == before
                assert {t.state for t in tasks} == {"succeeded"}
                # The copy accepts new work.
                fresh = await client.submit_task("after-restore", request)
                with trio.fail_after(30):
                    (done,) = await client.wait([fresh.task.task_id])
                assert done.state == "succeeded"
                serving.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await drop_database(copy)
