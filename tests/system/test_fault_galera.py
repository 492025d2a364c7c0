"""Orbit on a private three-server MariaDB Galera cluster that loses a server.

The servers run on loopback with their own datadirs and ports (harness/galera.py);
the shared server and the development server are never touched. Skipped only where
galera-4 (or rsync, its state transfer) is not installed."""

from __future__ import annotations

import itertools
import time

import attrs
import httpx
import pytest
import trio

from harness.galera import GaleraCluster, galera_missing
from harness.nodeproc import NodeProcess
from orbit_node.db import Database, migrate
from orbit_sdk.worker import Worker, WorkerTask

from ..checks import TERMINAL, assert_attempt_history, rows
from ..nodeutil import make_tenant

MISSING = galera_missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))

# Leases short enough that work lost with a server or a node comes back within the test.
NODE_ENV = {"ORBIT_RESERVATION_LEASE_S": "4", "ORBIT_RUN_LEASE_S": "6", "ORBIT_DB_POOL_SIZE": "6"}
# Submits per second of the load (spread over both nodes) and how long each phase runs.
SUBMITS_PER_S = 20
PHASE_S = 4
# Bound on every acknowledged task reaching a terminal state once the load stops.
SETTLE_S = 45


@pytest.fixture
async def cluster():
    galera = GaleraCluster.create(3)
    try:
        await galera.start()
        db = Database(galera.dsn(), size=2)
        try:
            await migrate.up(db)
        finally:
            await db.aclose()
        yield galera
    finally:
        await galera.stop()
        galera.remove()


async def test_skip_locked_on_two_servers_fails_certification_and_is_replayed(cluster):
    """The fact that shapes the design: SKIP LOCKED only sees its own server's locks, so two
    servers lock the same row and the second COMMIT fails (1213); the pool replays it."""
    one, two = (Database(cluster.servers[i].dsn(), size=1) for i in (0, 1))
    try:
        await one.run(lambda tx: tx.execute_raw("CREATE TABLE t (id INT PRIMARY KEY, v INT) ENGINE=InnoDB"))
        await one.run(lambda tx: tx.execute_raw("INSERT INTO t VALUES (1, 0)"))

        # Server two applies the table and the row asynchronously: its reads wait until it
        # has applied everything committed in the cluster before they began.
        async def applied(tx):
            await tx.execute_raw("SET SESSION wsrep_sync_wait = 1")
            return await tx.fetchall_raw("SELECT id, v FROM t")

        assert await two.run(applied) == [{"id": 1, "v": 0}]
        locked, committed = trio.Event(), trio.Event()
        runs: list[list[dict]] = []

        async def first(tx):
            found = await tx.fetchall_raw("SELECT id, v FROM t FOR UPDATE SKIP LOCKED")
            runs.append(found)
            await tx.execute_raw("UPDATE t SET v = v + 1 WHERE id = 1")
            if len(runs) == 1:
                locked.set()
                await committed.wait()

        async def second():
            await locked.wait()

            async def body(tx):
                # The row is locked on the other server; this one does not know.
                found = await tx.fetchall_raw("SELECT id, v FROM t FOR UPDATE SKIP LOCKED")
                assert [r["id"] for r in found] == [1]
                await tx.execute_raw("UPDATE t SET v = v + 10 WHERE id = 1")

            await two.transaction(body)
            committed.set()

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(one.transaction, first)
                nursery.start_soon(second)
        # The first transaction lost certification at COMMIT and ran again until it ran on
        # what the second had committed (a replay that reads before server one applied the
        # other write set loses certification once more): both increments, each once.
        assert one.replays >= 1 and two.replays == 0
        assert len(runs) == one.replays + 1 and [r["v"] for r in runs[-1]] == [10]
        assert (await rows(one, "SELECT v FROM t"))[0]["v"] == 11
    finally:
        await one.aclose()
        await two.aclose()


@attrs.define
class Load:
    """Submits with idempotency keys, alternating nodes; a failed submit is retried with the
    same key (as a client must) until it is acknowledged with 2xx."""

    nodes: list[NodeProcess]
    queue_id: str
    token: str
    acknowledged: dict[str, str] = attrs.field(factory=dict)
    acked_at: list[float] = attrs.field(factory=list)
    failures: int = 0
    stop: trio.Event = attrs.field(factory=trio.Event)

    async def submit(self, http: httpx.AsyncClient, key: str, turn: int) -> None:
        body = {"queue_id": self.queue_id, "handler": "h", "handler_version": "v1", "payload_version": "v1"}
        headers = {"Authorization": f"Bearer {self.token}", "Idempotency-Key": key}
        for attempt in itertools.count(turn):
            node = self.nodes[attempt % len(self.nodes)]
            try:
                response = await http.post(
                    node.base_url + "/v1/tasks", json={**body, "payload": {"k": key}}, headers=headers
                )
            except httpx.TransportError:
                response = None
            if response is not None and response.status_code in (200, 201):
                self.acknowledged[key] = response.json()["data"]["task_id"]
                self.acked_at.append(time.monotonic())
                return
            assert response is None or response.status_code >= 500, response.text
            self.failures += 1
            await trio.sleep(0.2)

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=10) as http, trio.open_nursery() as nursery:
            for n in itertools.count():
                if self.stop.is_set():
                    break
                nursery.start_soon(self.submit, http, f"k{n}", n)
                await trio.sleep(1 / SUBMITS_PER_S)


def watching_worker(node: NodeProcess, token: str, queue_id: str, running: set[str], overlaps: list[str]) -> Worker:
    worker = Worker(url=node.base_url, token=token, queues=[queue_id], capacity=4)

    @worker.handler("h", "v1", "v1")
    async def handle(task: WorkerTask):
        # Seen from the Workers: the same task never runs twice at the same time.
        if task.task_id in running:
            overlaps.append(task.task_id)
        running.add(task.task_id)
        try:
            await trio.sleep(0.05)
        finally:
            running.discard(task.task_id)
        return {"k": task.payload["k"]}

    return worker


async def test_the_writer_server_dies_then_the_nodes_split_over_two_servers(cluster, tmp_path):
    g1, g2, g3 = cluster.servers
    db = Database(cluster.dsn(order=[1, 2, 0]), size=2)
    nodes = [NodeProcess(cluster.dsn(), tmp_path / f"node{i}.log", env=NODE_ENV) for i in (1, 2)]
    try:
        tenant = await make_tenant(db, "galera")
        for node in nodes:
            await node.start()
        load = Load(nodes, tenant.queue_id, tenant.token)
        running: set[str] = set()
        overlaps: list[str] = []
        workers = [watching_worker(node, tenant.token, tenant.queue_id, running, overlaps) for node in nodes]
        with trio.fail_after(PHASE_S * 3 + SETTLE_S + 30):
            async with trio.open_nursery() as nursery:
                for worker in workers:
                    await nursery.start(worker.run)
                nursery.start_soon(load.run)
                await trio.sleep(PHASE_S)
                # Every node writes to g1, the first server of its DSN. Kill it.
                before = len(load.acknowledged)
                assert before > 0
                killed_at = time.monotonic()
                await g1.kill9()
                await trio.sleep(PHASE_S)
                after_kill = [t for t in load.acked_at if t > killed_at]
                assert after_kill, "no submit was acknowledged after the writer server died"
                print(
                    f"failover: first 2xx submit {after_kill[0] - killed_at:.2f} s after SIGKILL of the writer server"
                )
                # Split on purpose: the second node now writes to g3 alone while the first
                # writes to g2; claims of the same queue now race on two servers.
                await nodes[1].terminate()
                nodes[1].dsn = g3.dsn()
                await nodes[1].start()
                await trio.sleep(PHASE_S)
                load.stop.set()
                # Every acknowledged task reaches a terminal state.
                deadline = trio.current_time() + SETTLE_S
                while True:
                    states = await rows(db, "SELECT state, COUNT(*) AS n FROM tasks GROUP BY state")
                    if all(r["state"] in TERMINAL for r in states) and len(load.acknowledged) == sum(
                        r["n"] for r in states
                    ):
                        break
                    assert trio.current_time() < deadline, (states, len(load.acknowledged))
                    await trio.sleep(0.5)
                for worker in workers:
                    await worker.drain()
        replays = await rows(db, "SHOW STATUS LIKE 'wsrep_local_cert_failures'")
        print(
            f"acknowledged={len(load.acknowledged)} (before kill {before}) submit retries={load.failures} "
            f"cert failures on {db.writer}={replays[0]['Value']}"
        )
        assert overlaps == []
        tasks = await rows(db, "SELECT task_id, state FROM tasks")
        assert {t["task_id"] for t in tasks} == set(load.acknowledged.values())
        for task in tasks:
            # Exactly one terminal state, reached by one attempt; one owner at a time.
            history = await assert_attempt_history(db, task["task_id"])
            assert task["state"] == "succeeded", (task, history)
            assert [a["outcome"] for a in history if a["outcome"] in TERMINAL] == ["succeeded"], history
    finally:
        for node in nodes:
            await node.aclose()
        await db.aclose()
