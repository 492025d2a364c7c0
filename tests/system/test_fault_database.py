"""Database faults against a running node: a killed session, a stalled or black-holed
network, a ``kill -9`` of mariadbd, recovery racing Finish (real MariaDB, real WebSockets)."""

from __future__ import annotations

import re

import attrs
import httpx
import pytest
import trio

from harness.clock import LaterDatabase
from harness.nodeproc import NodeProcess, free_port
from harness.proxy import open_fault_proxy
from orbit_node.db import Database, migrate
from orbit_node.domain.ownership import RecoveryStats
from orbit_node.services import default_services
from orbit_node.store.leases import LeaseStore

from .. import seed
from ..checks import assert_attempt_history, rows, tenant_with_token
from ..helpers import wait_until
from ..nodeutil import make_tenant, run_node
from ..wsclient import heartbeat_roundtrip, raw_worker


async def node_transactions(db: Database) -> dict[int, bool]:
    """Other sessions on this test's database with an open InnoDB transaction: server thread
    id -> whether it waits for a lock.

    Read from ``SHOW ENGINE INNODB STATUS``, made afresh on every call. INNODB_TRX is not:
    InnoDB refreshes it only after 0.1 s without a reader, so a test polling it (or another
    test polling beside it) can keep seeing a picture from before the transaction began.
    """
    status = (await rows(db, "SHOW ENGINE INNODB STATUS"))[0]["Status"]
    section = status.split("LIST OF TRANSACTIONS FOR EACH SESSION:", 1)[1].split("\n--------\n", 1)[0]
    found: dict[int, bool] = {}
    for entry in section.split("---TRANSACTION ")[1:]:
        thread = re.search(r"(?:MariaDB|MySQL) thread id (\d+)", entry)
        if thread is not None and ", ACTIVE" in entry.split("\n", 1)[0]:
            found[int(thread.group(1))] = "LOCK WAIT" in entry
    ours = await rows(
        db, "SELECT ID AS id FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> CONNECTION_ID()"
    )
    return {r["id"]: found[r["id"]] for r in ours if r["id"] in found}


async def node_transaction_threads(db: Database) -> list[int]:
    """Server thread ids of other sessions on this test's database with an open InnoDB transaction."""
    return sorted(await node_transactions(db))


async def locked_state(db: Database, task_id: str) -> str:
    """The task's state read with a lock: waits until no uncommitted change is left on the row."""

    async def body(tx):
        found = await tx.fetchall_raw("SELECT state FROM tasks WHERE task_id = %s FOR UPDATE", (task_id,))
        return found[0]["state"]

    return await db.transaction(body)


# -- scenario 4 --------------------------------------------------------------------------------


async def test_kill_of_the_claim_session_rolls_back_and_the_node_reconnects_by_itself(node_config, db):
    owner, token = await tenant_with_token(db)
    task_id = await seed.insert_task(db, owner)
    async with run_node(node_config, services=default_services()) as running:
        store = running.node.state.services.shards.main.leases
        pool = running.node.state.services.pool
        reserved, resume = trio.Event(), trio.Event()

        async def hook(point, task_ids):
            if point == "claim.reserved" and not reserved.is_set():
                reserved.set()
                await resume.wait()

        store.hook = hook
        with trio.fail_after(20):
            async with raw_worker(running.base_url, token) as w:
                await w.hello([owner.queue_id])
                await reserved.wait()
                # The claim holds its rows' locks and has chosen its reservations, not committed.
                threads = await wait_until(lambda: node_transaction_threads(db), timeout_s=5)
                assert len(threads) == 1, threads
                await db.run(lambda tx: tx.execute_raw(f"KILL {int(threads[0])}"))
                resume.set()
                # The server rolled the claim back: nothing stuck reserved, no attempt used.
                assert await locked_state(db, task_id) == "queued"
                row = await seed.task_row(db, task_id)
                assert (row["attempts"], row["owner_node_id"], row["fencing_token"]) == (0, None, None)
                assert await seed.attempt_rows(db, task_id) == []
                # The node noticed, dropped that connection and claims again by itself.
                dispatch = await w.recv_type("dispatch")
                again = dispatch["tasks"][0]
                assert again["task_id"] == task_id and again["attempt"] == 1
                ack = await w.request("start", [{"task_id": task_id, "token": again["token"]}], "s")
                assert ack["results"][0]["ok"]
                ack = await w.request(
                    "finish", [{"task_id": task_id, "token": again["token"], "outcome": "succeeded", "result": 1}], "f"
                )
                assert ack["results"][0]["state"] == "succeeded"
        assert pool.statistics().claims_failed == 1
    row = await seed.task_row(db, task_id)
    assert (row["state"], row["attempts"]) == ("succeeded", 1)
    assert [a["outcome"] for a in await assert_attempt_history(db, task_id)] == ["succeeded"]


# -- scenario 6 --------------------------------------------------------------------------------


async def test_database_stalled_longer_than_the_lease_no_second_concurrent_run(node_config, db, dsn):
    """Node 1 reaches the database through a proxy that stalls; node 2 directly.

    While node 1's database traffic is held, the running attempt's lease runs out on the
    database clock; node 2 recovers the task and runs it again. When the stall ends, the
    first Worker's renew and finish are refused: there was never a second run beyond the
    lease. Heartbeats of node 1's connections are answered throughout the stall.
    """
    owner, token = await tenant_with_token(db)
    idle_queue = await seed.add_queue(db, owner, "idle")
    task_id = await seed.insert_task(db, owner, backoff_initial_ms=1, backoff_max_ms=1)
    async with (
        open_fault_proxy(dsn.host, dsn.port) as proxy,
        run_node(attrs.evolve(node_config, dsn=proxy.dsn_for(dsn)), services=default_services()) as node1,
        run_node(node_config, services=default_services()) as node2,
    ):
        with trio.fail_after(30):
            async with raw_worker(node1.base_url, token) as first, raw_worker(node1.base_url, token) as healthy:
                await first.hello([owner.queue_id])
                await healthy.hello([idle_queue.queue_id])
                old = (await first.recv_type("dispatch"))["tasks"][0]
                ref = {"task_id": task_id, "token": old["token"]}
                assert (await first.request("start", [ref], "s1"))["results"][0]["ok"]

                proxy.stall()
                await first.send({"type": "renew", "id": "r1", "tasks": [ref]})
                await first.send(
                    {"type": "finish", "id": "f1", "tasks": [{**ref, "outcome": "succeeded", "result": "first"}]}
                )
                # The lease runs out on the database clock while node 1 cannot reach it.
                await seed.expire_lease(db, task_id)
                async with raw_worker(node2.base_url, token) as second:
                    await second.hello([owner.queue_id])
                    again = (await second.recv_type("dispatch"))["tasks"][0]  # node 2's sweeper requeued it
                    assert again["task_id"] == task_id and again["attempt"] == 2
                    new = {"task_id": task_id, "token": again["token"]}
                    assert (await second.request("start", [new], "s2"))["results"][0]["ok"]
                    # Node 1's control loops never waited on the stalled database.
                    for _ in range(3):
                        for w in (first, healthy):
                            with trio.fail_after(1):
                                await heartbeat_roundtrip(w)
                    assert proxy.open_links > 0
                    proxy.heal()
                    renew = await first.recv_type("ack")
                    finish = await first.recv_type("ack")
                    assert renew["id"] == "r1" and renew["results"][0]["ok"] is False
                    assert renew["results"][0]["code"] == "OWNERSHIP_LOST"
                    assert finish["id"] == "f1" and finish["results"][0]["ok"] is False
                    row = await seed.task_row(db, task_id)
                    assert (row["state"], row["fencing_token"]) == ("running", again["token"])
                    ack = await second.request("finish", [{**new, "outcome": "succeeded", "result": "second"}], "f2")
                    assert ack["results"][0]["state"] == "succeeded"
    row = await seed.task_row(db, task_id)
    assert (row["state"], row["attempts"], row["result"]) == ("succeeded", 2, '"second"')
    history = await assert_attempt_history(db, task_id)
    assert [a["outcome"] for a in history] == ["lease_expired", "succeeded"]


async def test_a_black_holed_database_connection_does_not_wedge_the_node(node_config, db, dsn):
    """Answers lost in the network (no RST, no FIN) must not hold the node's sweeper, claim
    slots or transitions forever: once the network is back the node works without a restart."""
    owner, token = await tenant_with_token(db)
    task_id = await seed.insert_task(db, owner)
    config = attrs.evolve(node_config, db_operation_timeout_s=2.0)
    async with (
        open_fault_proxy(dsn.host, dsn.port) as proxy,
        run_node(attrs.evolve(config, dsn=proxy.dsn_for(dsn)), services=default_services()) as node,
    ):
        sweeper_passes = node.node.state.services.shards.main.sweeper
        with trio.fail_after(30):
            async with raw_worker(node.base_url, token) as w:
                await w.hello([owner.queue_id])
                held = (await w.recv_type("dispatch"))["tasks"][0]
                ref = {"task_id": task_id, "token": held["token"]}
                proxy.blackhole()
                await w.send({"type": "start", "id": "s1", "tasks": [ref]})
                ack = await w.recv_type("ack")
                # The start could not be confirmed: a negative ack the Worker may retry.
                assert ack["results"][0] == {"task_id": task_id, "ok": False, "code": "UNAVAILABLE"}
                proxy.heal()
                ack = await w.request("start", [ref], "s2")
                assert ack["results"][0]["ok"]
                ack = await w.request("finish", [{**ref, "outcome": "succeeded", "result": 1}], "f")
                assert ack["results"][0]["state"] == "succeeded"
            # The sweeper and the API still work.
            for _ in range(2):
                await sweeper_passes.wait_for_pass()
            async with node.client(token) as http:
                response = await http.get(f"/v1/tasks/{task_id}")
                assert response.status_code == 200 and response.json()["data"]["state"] == "succeeded"
    assert [a["outcome"] for a in await assert_attempt_history(db, task_id)] == ["succeeded"]


# -- scenario 5 --------------------------------------------------------------------------------


# The node start (20 s), the scenario's own bound (90 s) and the checks after it.
@pytest.mark.time_cap(180)
async def test_kill_9_of_mariadbd_under_load_loses_no_accepted_task(private_mariadb, tmp_path):
    """Submitters keep posting while mariadbd is killed with SIGKILL and started again.

    Every task that was answered 2xx exists after the restart; /readyz says 503 while the
    server is gone; the same node process (never restarted) serves again once the server
    is back: readiness returns and every submission after that succeeds.
    """
    dsn = private_mariadb.dsn()
    db = Database(dsn, size=2)
    try:
        await migrate.up(db)
        tenant = await make_tenant(db, "load")
    finally:
        await db.aclose()
    node = NodeProcess(dsn, tmp_path / "node.log", env={"ORBIT_DB_POOL_SIZE": "6"})
    accepted: dict[str, str] = {}  # idempotency key -> task id, for every 2xx
    refused: list[str] = []  # keys answered otherwise (or not at all)
    phase = {"name": "before"}
    statuses: dict[str, list[int]] = {"before": [], "outage": [], "after": [], "after quiet restart": []}
    gate = {"open": trio.Event()}  # submitters pause while it is not set
    gate["open"].set()
    in_flight = {"requests": 0}  # submissions sent and not answered yet

    def body(key: str) -> dict:
        return {
            "queue_id": tenant.queue_id,
            "handler": "h",
            "handler_version": "v1",
            "payload_version": "v1",
            "payload": {"key": key},
        }

    async def submitter(number: int, http: httpx.AsyncClient, stop: trio.Event) -> None:
        sequence = 0
        while not stop.is_set():
            await gate["open"].wait()
            if not gate["open"].is_set():  # closed again before this submitter ran
                continue
            key = f"s{number}-{sequence}"
            sequence += 1
            current = phase["name"]
            in_flight["requests"] += 1
            try:
                response = await http.post("/v1/tasks", json=body(key), headers={"Idempotency-Key": key})
            except httpx.TransportError:
                refused.append(key)
                continue
            finally:
                in_flight["requests"] -= 1
            statuses[current].append(response.status_code)
            if response.status_code in (200, 201):
                accepted[key] = response.json()["data"]["task_id"]
            else:
                assert response.status_code == 503 and response.json()["error"]["code"] == "UNAVAILABLE", response.text
                refused.append(key)
                await trio.sleep(0.02)  # a client's pause before it tries again

    async def ready(http: httpx.AsyncClient) -> int:
        return (await http.get("/readyz")).status_code

    try:
        await node.start()
        node_id = (await httpx.AsyncClient().get(node.base_url + "/healthz")).json()["data"]["node_id"]
        async with httpx.AsyncClient(
            base_url=node.base_url, timeout=10, headers={"Authorization": f"Bearer {tenant.token}"}
        ) as http:
            with trio.fail_after(90):
                async with trio.open_nursery() as nursery:
                    stop = trio.Event()
                    for number in range(4):
                        nursery.start_soon(submitter, number, http, stop)
                    await wait_until(lambda: len(statuses["before"]) >= 40, timeout_s=30)
                    await private_mariadb.kill9()
                    phase["name"] = "outage"
                    assert await ready(http) == 503
                    await wait_until(lambda: len(statuses["outage"]) >= 20, timeout_s=30)
                    assert await ready(http) == 503
                    await private_mariadb.start()

                    async def is_ready() -> bool:
                        return await ready(http) == 200

                    await wait_until(is_ready, timeout_s=30)
                    phase["name"] = "after"
                    await wait_until(lambda: len(statuses["after"]) >= 40, timeout_s=30)
                    # A restart nobody noticed: the node's pooled connections all died with
                    # the old server, and no request failed on them in between.
                    gate["open"] = trio.Event()
                    await wait_until(lambda: in_flight["requests"] == 0)  # (the requests in flight finish)
                    await private_mariadb.kill9()
                    await private_mariadb.start()
                    # The server answers again: so does the node, on the first try (a dead
                    # pooled connection is noticed before it is used, not by a failed request).
                    assert await ready(http) == 200
                    phase["name"] = "after quiet restart"
                    gate["open"].set()
                    await wait_until(lambda: len(statuses["after quiet restart"]) >= 40, timeout_s=30)
                    stop.set()
        assert (
            node.running
            and (await httpx.AsyncClient().get(node.base_url + "/healthz")).json()["data"]["node_id"] == node_id
        )
    finally:
        await node.aclose()
    assert set(statuses["outage"]) <= {503, 200, 201}, statuses["outage"]
    assert 503 in statuses["outage"]
    # Ready means ready: nothing failed once /readyz had said 200 again.
    assert set(statuses["after"]) <= {200, 201}, statuses["after"]
    assert set(statuses["after quiet restart"]) <= {200, 201}, statuses["after quiet restart"]
    db = Database(dsn, size=1)
    try:
        stored = {r["task_id"] for r in await rows(db, "SELECT task_id FROM tasks")}
        assert set(accepted.values()) <= stored, set(accepted.values()) - stored
        # Nothing else was created: every stored task belongs to a key (one task per key).
        keys = {
            r["idempotency_key"]: r["task_id"]
            for r in await rows(db, "SELECT idempotency_key, task_id FROM idempotency_records")
        }
        assert len(stored) == len(keys) and set(keys.values()) == stored
        assert all(keys[key] == task_id for key, task_id in accepted.items())
    finally:
        await db.aclose()


# -- scenario 3 --------------------------------------------------------------------------------


@pytest.mark.parametrize("first", ["finish", "recovery"])
async def test_recovery_racing_a_workers_finish_settles_the_attempt_once(node_config, db, dsn, first):
    """A Worker's Finish (through the node) and a sweeper (another node) race for one
    running task; each interleaving is forced with the store's hooks. To let the Finish
    lock a row whose lease is valid while the sweeper finds it expired, the sweeper's
    session runs on the database clock of a later moment (``LaterDatabase``).

    finish first: Finish locked the row while its lease was valid; the sweeper sees the
    lease expired but skips the locked row; the finished task stays finished, and later
    sweeps never touch it. recovery first: the Finish waits for the row, then is refused;
    the task is retried and finished by its next attempt: one terminal state either way.
    """
    owner, token = await tenant_with_token(db)
    task_id = await seed.insert_task(db, owner, backoff_initial_ms=1, backoff_max_ms=1)
    later_db = LaterDatabase(dsn, size=1, ahead_s=3600)
    paused, resume = trio.Event(), trio.Event()

    async def hook(point, task_ids):
        if point == f"{first}.locked".replace("recovery", "recover") and task_ids and not paused.is_set():
            paused.set()
            await resume.wait()

    try:
        # The node's own sweeper passes once at start, then stays out of the race.
        config = attrs.evolve(node_config, sweep_interval_s=3600)
        async with run_node(config, services=default_services()) as running:
            node_store: LeaseStore = running.node.state.services.shards.main.leases
            later = LeaseStore.from_config(later_db if first == "finish" else db, node_config)
            (node_store if first == "finish" else later).hook = hook
            with trio.fail_after(60):
                async with raw_worker(running.base_url, token) as w:
                    await w.hello([owner.queue_id])
                    held = (await w.recv_type("dispatch"))["tasks"][0]
                    ref = {"task_id": task_id, "token": held["token"]}
                    assert (await w.request("start", [ref], "s"))["results"][0]["ok"]
                    finish = {"type": "finish", "id": "f", "tasks": [{**ref, "outcome": "succeeded", "result": "one"}]}
                    async with trio.open_nursery() as nursery:
                        swept: list[RecoveryStats] = []

                        async def sweep():
                            swept.append(await later.recover())

                        if first == "finish":
                            await w.send(finish)
                            await paused.wait()
                            assert await later.recover() == RecoveryStats()  # skipped, did not wait
                            resume.set()
                            ack = await w.recv_type("ack")
                            assert ack["results"][0]["ok"] and ack["results"][0]["state"] == "succeeded"
                        else:
                            await seed.expire_lease(db, task_id)
                            nursery.start_soon(sweep)
                            await paused.wait()
                            await w.send(finish)
                            # The Finish reaches the row through the node's group commit: bounded
                            # generously, the machine may be busy with other tests.
                            await wait_until(lambda: waiting_for_a_row_lock(db), timeout_s=40)
                            resume.set()
                            ack = await w.recv_type("ack")
                            assert ack["results"][0] == {
                                "task_id": task_id,
                                "ok": False,
                                "code": "OWNERSHIP_LOST",
                                "state": "queued",
                            }
                    if first == "recovery":
                        assert swept[0].retried == 1
                        # Its next attempt runs and finishes (its backoff is 1 ms).
                        held = (await w.recv_type("dispatch"))["tasks"][0]
                        ref = {"task_id": task_id, "token": held["token"]}
                        assert (await w.request("start", [ref], "s2"))["results"][0]["ok"]
                        ack = await w.request("finish", [{**ref, "outcome": "succeeded", "result": "two"}], "f2")
                        assert ack["results"][0]["state"] == "succeeded"
                    # However many sweeps follow, from any clock, the finished task stays finished.
                    assert await later.recover() == RecoveryStats()
                    assert await node_store.recover() == RecoveryStats()
    finally:
        await later_db.aclose()
    row = await seed.task_row(db, task_id)
    history = await assert_attempt_history(db, task_id)
    if first == "finish":
        assert (row["state"], row["result"], row["attempts"]) == ("succeeded", '"one"', 1)
        assert [a["outcome"] for a in history] == ["succeeded"]
    else:
        assert (row["state"], row["result"], row["attempts"]) == ("succeeded", '"two"', 2)
        assert [a["outcome"] for a in history] == ["lease_expired", "succeeded"]


async def waiting_for_a_row_lock(db: Database) -> bool:
    return any((await node_transactions(db)).values())


async def test_sigterm_while_the_database_is_black_holed_still_exits_within_the_grace(dsn, db, tmp_path):
    """A node process whose database stopped answering (packets dropped) with Workers
    connected, a claim and a renew in flight: SIGTERM still drains and exits 0 within the
    grace period plus a bounded clean-up, instead of waiting on the database forever."""
    owner, token = await tenant_with_token(db)
    task_id = await seed.insert_task(db, owner)
    metrics_addr = f"127.0.0.1:{free_port()}"
    async with open_fault_proxy(dsn.host, dsn.port) as proxy:
        node = NodeProcess(
            proxy.dsn_for(dsn),
            tmp_path / "node.log",
            env={
                "ORBIT_SHUTDOWN_GRACE_S": "2",
                "ORBIT_METRICS": "open",
                "ORBIT_METRICS_ADDR": metrics_addr,
            },
        )
        await node.start()

        async def claims_in_flight() -> float:
            async with httpx.AsyncClient(timeout=5) as http:
                text = (await http.get(f"http://{metrics_addr}/metrics")).text
            return float(re.search(r"^orbit_claim_requests_in_flight (\S+)$", text, re.MULTILINE).group(1))

        try:
            with trio.fail_after(40):
                async with raw_worker(node.base_url, token) as busy, raw_worker(node.base_url, token) as idle:
                    await busy.hello([owner.queue_id])
                    held = (await busy.recv_type("dispatch"))["tasks"][0]
                    ref = {"task_id": task_id, "token": held["token"]}
                    assert (await busy.request("start", [ref], "s"))["results"][0]["ok"]
                    await idle.hello([owner.queue_id])  # its claim request waits in the pool
                    proxy.blackhole()
                    await busy.send({"type": "renew", "id": "r", "tasks": [ref]})
                    await seed.insert_task(db, owner)  # a claim of the idle Worker will hang on the database
                    await wait_until(claims_in_flight)  # (the idle Worker's claim is in the black hole)
                    started = trio.current_time()
                    code = await node.terminate(timeout_s=30)
                    assert code == 0, node.log_text()[-2000:]
                    # Grace (2 s), then each connection's bounded clean-up (5 s) and the node's
                    # last write (2 s) give up on the database; nothing waits longer. The
                    # slack (8 s) is for a busy machine starting and stopping processes; a
                    # wait on the black hole itself would last until terminate's 30 s.
                    assert trio.current_time() - started < 2 + 5 + 2 + 8
        finally:
            await node.aclose()
    # The running task was left to its lease (nothing half-written), the other never reserved twice.
    row = await seed.task_row(db, task_id)
    assert (row["state"], row["fencing_token"]) == ("running", held["token"])
    await assert_attempt_history(db, task_id)
