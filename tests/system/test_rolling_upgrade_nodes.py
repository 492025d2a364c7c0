"""A rolling upgrade's middle: the previous commit's node and this one, side by side on the
database this commit migrated, both serve the API and Workers (docs/operations.md,
"Rolling upgrade").

The previous commit is ``HEAD~1`` of this checkout, exported with ``git archive`` and run
as a process of its own from that tree (its ``orbit_node``, SDK and protocol before this
checkout's on the path). When the migrations it does not know are not all marked
``-- orbit: compatible``, a rolling upgrade is not what the docs promise for that step
(older nodes stop first), and the test says so and skips.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from harness.nodeproc import free_port, orbit_environment, wait_answering
from harness.processes import stop_process
from orbit_node.db.migrate import COMPATIBLE_MARK
from orbit_node.services import default_services
from orbit_sdk import OrbitClient, SubmitTaskRequest, Worker, WorkerTask

from ..helpers import REPO
from ..nodeutil import make_tenant, run_node

START_TIMEOUT_S = 30
TASKS_PER_NODE = 10
KEYED_TASKS = 40
# The commit whose node runs beside this one: the previous one, or another to check with.
PREVIOUS = os.environ.get("ORBIT_TEST_PREVIOUS_COMMIT", "HEAD~1")


def previous_tree(tmp_path: Path) -> Path:
    """``PREVIOUS`` of this checkout, exported into ``tmp_path``; skip when there is none."""
    try:
        subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", PREVIOUS], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"not a git checkout with the commit {PREVIOUS}")
    tree = tmp_path / "previous"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def unknown_migrations(tree: Path) -> list[Path]:
    """This checkout's migrations the previous commit does not have."""
    known = {p.name for p in (tree / "schema" / "migrations").glob("*.sql")}
    return sorted(p for p in (REPO / "schema" / "migrations").glob("*.sql") if p.name not in known)


def settings(tree: Path, port: int) -> dict[str, str]:
    """The previous node's settings, its own tree's code first on the path."""
    return {
        "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "protocol"), str(tree / "sdk")]),
        "ORBIT_HTTP_ADDR": f"127.0.0.1:{port}",
        "ORBIT_LOG_LEVEL": "warning",
        "ORBIT_SHUTDOWN_GRACE_S": "1",
    }


@asynccontextmanager
async def previous_node(dsn, tmp_path: Path) -> AsyncIterator[str]:
    """The previous commit's node, a process of its own on this database: its base URL.
    Skips when this commit adds migrations older nodes cannot run against."""
    tree = previous_tree(tmp_path)
    newer = unknown_migrations(tree)
    contracting = [p.name for p in newer if not p.read_text().startswith(COMPATIBLE_MARK)]
    if contracting:
        pytest.skip(
            f"this commit adds migrations not marked compatible ({', '.join(contracting)}): older nodes stop first"
        )
    port = free_port()
    env = orbit_environment(dsn, settings(tree, port))
    # The previous node's code is the previous tree's, not this checkout's installed one.
    where = subprocess.run(
        [sys.executable, "-c", "import orbit_node; print(orbit_node.__file__)"],
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(tree), where
    log = tmp_path / "previous-node.log"
    with log.open("wb") as out:
        previous = await trio.lowlevel.open_process(
            [sys.executable, "-c", "from orbit_node.cli.node import main; main()"],
            cwd=tree,
            env=env,
            stdout=out,
            stderr=out,
        )
    old_url = f"http://127.0.0.1:{port}"
    try:
        await wait_answering(old_url + "/readyz", previous, START_TIMEOUT_S, lambda: log.read_text()[-3000:])
        yield old_url
    finally:
        with trio.CancelScope(shield=True):
            await stop_process(previous, 10)


def request(queue_id: str, n: int, **extra) -> SubmitTaskRequest:
    return SubmitTaskRequest(
        queue_id=queue_id, handler="h", handler_version="v1", payload_version="v1", payload={"n": n}, **extra
    )


@pytest.mark.time_cap(180)
async def test_the_previous_commits_node_serves_beside_this_one(node_config, dsn, db, tmp_path):
    tenant = await make_tenant(db, "upgrade")
    done: list[str] = []

    async def work(task: WorkerTask) -> dict[str, int]:
        done.append(task.task_id)
        return {"n": task.payload["n"]}

    async with previous_node(dsn, tmp_path) as old_url:
        async with run_node(node_config, services=default_services()) as running, trio.open_nursery() as nursery:
            workers = []
            for url in (old_url, running.base_url):
                worker = Worker(url, tenant.token, [tenant.queue_id], capacity=4)
                worker.register("h", "v1", "v1", work)
                workers.append(worker)
                await nursery.start(worker.run)
            accepted = []
            for index, url in enumerate((old_url, running.base_url)):
                async with OrbitClient(url, tenant.token) as client:
                    for n in range(TASKS_PER_NODE):
                        accepted.append(
                            (await client.submit_task(f"up-{index}-{n}", request(tenant.queue_id, n))).task.task_id
                        )
            async with OrbitClient(old_url, tenant.token) as client:
                finished = await client.wait(accepted, timeout_s=60)
            assert [t.state for t in finished] == ["succeeded"] * len(accepted)
            assert sorted(done) == sorted(accepted), "each task ran once"
            for worker in workers:
                await worker.drain()
            nursery.cancel_scope.cancel()


@pytest.mark.time_cap(180)
async def test_a_key_never_has_more_than_its_limit_with_the_previous_commits_node_claiming(
    node_config, dsn, db, tmp_path
):
    """max_running_per_key 3 (000028), Workers of both nodes taking tasks of one key: the
    previous node fills only the key's first holder's place, so the key still never has
    more than 3 running (read back from the attempts' start/finish intervals)."""
    tenant = await make_tenant(db, "upgrade-keys")
    # Set in the database: the previous node's API may not know the control.
    await db.run(
        lambda tx: tx.execute_raw("UPDATE queues SET max_running_per_key = 3 WHERE queue_id = %s", (tenant.queue_id,))
    )

    async def work(task: WorkerTask) -> None:
        await trio.sleep(0.03)

    async with previous_node(dsn, tmp_path) as old_url:
        async with run_node(node_config, services=default_services()) as running, trio.open_nursery() as nursery:
            workers = []
            for url in (old_url, running.base_url):
                worker = Worker(url, tenant.token, [tenant.queue_id], capacity=4, resource_keys=True)
                worker.register("h", "v1", "v1", work)
                workers.append(worker)
                await nursery.start(worker.run)
            async with OrbitClient(running.base_url, tenant.token) as client:
                accepted = [
                    (await client.submit_task(f"key-{n}", request(tenant.queue_id, n, resource_key="k"))).task.task_id
                    for n in range(KEYED_TASKS)
                ]
                finished = await client.wait(accepted, timeout_s=90)
            assert [t.state for t in finished] == ["succeeded"] * len(accepted)
            for worker in workers:
                await worker.drain()
            nursery.cancel_scope.cancel()
    rows = await db.run(
        lambda tx: tx.fetchall_raw(
            "SELECT a.started_at, a.finished_at, a.owner_node_id FROM task_attempts a"
            " JOIN tasks t ON t.task_id = a.task_id WHERE t.queue_id = %s AND a.started_at IS NOT NULL",
            (tenant.queue_id,),
        )
    )
    assert len(rows) == KEYED_TASKS, "each task ran once"
    events = sorted([(r["started_at"], 1) for r in rows] + [(r["finished_at"], -1) for r in rows])
    running_now = most = 0
    for _, step in events:
        running_now += step
        most = max(most, running_now)
    assert most <= 3
    # Both nodes took some of the key's tasks.
    assert len({r["owner_node_id"] for r in rows}) == 2
