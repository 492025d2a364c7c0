"""Two shards on this machine: two independent MariaDB servers, one node serving both.

The test's own database on the shared test server is ORBIT_MYSQL_DSN (the main shard:
application ``app-a``); a private ``mariadbd`` (the ``private_mariadb`` fixture) is shard 2,
where ORBIT_SHARDS places ``app-b``. ``orbit-migrate up`` migrates both and
``orbit-admin bootstrap`` puts each application on its own server; then one node serves
both tenants through the API and the Worker WebSocket. Every row is checked on both
servers: an application's rows are on its shard and nowhere else. A transaction is one
``Database``'s, so rows that never leave their server are transactions that never
touched the other one.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from trio_websocket import ConnectionClosed

from harness.mariadb import PrivateMariaDB
from orbit_node.config import NodeConfig
from orbit_node.db import Database
from orbit_node.db.migrate import HEAD
from orbit_node.domain.dsn import Dsn, parse_shards
from orbit_node.group_commit.transitions import Lane
from orbit_node.services import default_services

from .. import seed
from ..checks import rows
from ..helpers import bootstrap, cli, wait_until
from ..nodeutil import Tenant, make_tenant, run_node
from ..wsclient import CAP, raw_worker
from .test_security import TASK, foreign_ids_look_missing


async def names(db: Database, sql: str) -> list[Any]:
    return [next(iter(r.values())) for r in await rows(db, sql)]


async def rows_of(db: Database, tenant: Tenant, task_ids: Iterable[str]) -> dict[str, int]:
    """How many rows of ``tenant`` each table of ``db`` holds."""
    ids = tuple(task_ids) or ("-",)
    app, ns = tenant.application_id, tenant.namespace_id
    counts = {}
    for table, sql, params in (
        ("applications", "SELECT COUNT(*) AS n FROM applications WHERE application_id = %s", (app,)),
        ("namespaces", "SELECT COUNT(*) AS n FROM namespaces WHERE application_id = %s", (app,)),
        ("queues", "SELECT COUNT(*) AS n FROM queues WHERE application_id = %s", (app,)),
        ("credentials", "SELECT COUNT(*) AS n FROM credentials WHERE namespace_id = %s", (ns,)),
        ("tasks", "SELECT COUNT(*) AS n FROM tasks WHERE application_id = %s", (app,)),
        ("task_attempts", "SELECT COUNT(*) AS n FROM task_attempts WHERE task_id IN %s", (ids,)),
        ("idempotency_records", "SELECT COUNT(*) AS n FROM idempotency_records WHERE namespace_id = %s", (ns,)),
        ("claim_turns", "SELECT COUNT(*) AS n FROM claim_turns WHERE application_id = %s", (app,)),
        ("worker_connections", "SELECT COUNT(*) AS n FROM worker_connections WHERE namespace_id = %s", (ns,)),
    ):
        found = await rows(db, sql, *params)
        counts[table] = int(found[0]["n"])
    return counts


async def ordering_fixture(db: Database, tenant: Tenant) -> tuple[str, str]:
    """P3: a level-0 task due 5 s ago and a level-9 task just due (written in one statement);
    the level-9 one must be dispatched first although the other is due earlier and has the
    smaller id. Returns (level 9, level 0)."""
    owner = seed.Tenant(tenant.application_id, tenant.namespace_id, tenant.queue_id)
    level0, level9 = await seed.insert_tasks(
        db,
        owner,
        [
            seed.TaskSpec(available_in_s=-5, priority=0, task_id=tenant.application_id[:16] + "1" * 16),
            seed.TaskSpec(available_in_s=0, priority=9, task_id=tenant.application_id[:16] + "f" * 16),
        ],
    )
    return level9, level0


async def work(base_url: str, tenant: Tenant, expected: int) -> list[str]:
    """A Worker of ``tenant`` takes ``expected`` tasks, runs and finishes each; returns the
    task ids in the order they were dispatched."""
    dispatched: list[str] = []
    async with raw_worker(base_url, tenant.token) as w:
        await w.hello([tenant.queue_id], capacity=16)
        while len(dispatched) < expected:
            refs = (await w.recv_type("dispatch"))["tasks"]
            dispatched += [ref["task_id"] for ref in refs]
            items = [{"task_id": ref["task_id"], "token": ref["token"]} for ref in refs]
            assert all(r["ok"] for r in (await w.request("start", items, f"s{len(dispatched)}"))["results"])
            done = [{**item, "outcome": "succeeded", "result": 1} for item in items]
            assert all(r["ok"] for r in (await w.request("finish", done, f"f{len(dispatched)}"))["results"])
    return dispatched


async def test_two_shards_on_two_servers_one_node(empty_dsn: Dsn, private_mariadb: PrivateMariaDB, tmp_path: Path):
    shard_dsn = private_mariadb.dsn()
    env = {"ORBIT_SHARDS": f"app-b={shard_dsn.url()}"}

    # orbit-migrate up migrates the main database and every shard.
    migrated = await trio.to_thread.run_sync(lambda: cli("orbit-migrate", "up", dsn=empty_dsn, env=env))
    assert migrated.returncode == 0, migrated.stderr
    for label in ("main", "shard 2"):
        assert f"{label}: schema at {HEAD:06d}" in migrated.stdout, migrated.stdout

    # orbit-admin bootstrap places each application on its shard.
    await bootstrap(empty_dsn, tmp_path / "a.json", application="app-a", env=env)
    await bootstrap(empty_dsn, tmp_path / "b.json", application="app-b", env=env)

    main_db, shard_db = Database(empty_dsn, size=4), Database(shard_dsn, size=4)
    try:
        assert await names(main_db, "SELECT name FROM applications") == ["app-a"]
        assert await names(shard_db, "SELECT name FROM applications") == ["app-b"]
        a = await make_tenant(main_db, "app-a")
        b = await make_tenant(shard_db, "app-b")
        order = {"a": await ordering_fixture(main_db, a), "b": await ordering_fixture(shard_db, b)}

        config = NodeConfig(dsn=empty_dsn, shards=parse_shards(env["ORBIT_SHARDS"]), http_port=0, shutdown_grace_s=2.0)
        async with run_node(config, services=default_services()) as node:
            services = node.node.state.services
            submitted: dict[str, list[str]] = {"a": [], "b": []}
            with trio.fail_after(60):
                # Each tenant submits through the API; each sees only its own queues and tasks.
                for key, tenant, other, own_db in (("a", a, b, main_db), ("b", b, a, shard_db)):
                    async with node.client(tenant.token) as http:
                        for n in range(3):
                            made = await http.post(
                                "/v1/tasks",
                                json={**TASK, "queue_id": tenant.queue_id},
                                headers={"Idempotency-Key": f"{key}-{n}"},
                            )
                            assert made.status_code == 201, made.text
                            submitted[key].append(made.json()["data"]["task_id"])
                        queues = await http.get("/v1/queues")
                        own_queues = await names(own_db, "SELECT queue_id FROM queues")
                        assert len(own_queues) == 2  # bootstrap's and make_tenant's
                        assert sorted(q["queue_id"] for q in queues.json()["data"]) == sorted(own_queues)
                        listing = await http.get("/v1/tasks")
                        assert {t["task_id"] for t in listing.json()["data"]} == {*submitted[key], *order[key]}
                        # The other tenant's task and queue: 404, exactly as for ids that exist nowhere.
                        await foreign_ids_look_missing(http, order["b" if key == "a" else "a"][0], other.queue_id)
                # A Worker of A naming B's queue is refused as for a queue that exists nowhere.
                async with raw_worker(node.base_url, a.token) as w:
                    await w.send({"type": "hello", "queues": [b.queue_id], "capabilities": [CAP], "capacity": 1})
                    assert (await w.recv_type("error"))["code"] == "NOT_FOUND"
                    with pytest.raises(ConnectionClosed):
                        await w.recv()

                # Both Workers at once: each gets only its own tasks, level 9 before level 0
                # before the just-submitted level-0 tasks, on both shards.
                got: dict[str, list[str]] = {}

                async def run(key: str, tenant: Tenant) -> None:
                    got[key] = await work(node.base_url, tenant, 5)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(run, "a", a)
                    nursery.start_soon(run, "b", b)
                for key in ("a", "b"):
                    assert got[key][:2] == list(order[key]), key
                    assert sorted(got[key][2:]) == sorted(submitted[key]), key

                shards = services.shards
                # Fairness: the one pool of the node gave claim turns to both applications,
                # and each shard's recorder wrote its own application's counters.
                turns = services.pool.statistics().turns_by_application
                assert turns.get(a.application_id, 0) > 0 and turns.get(b.application_id, 0) > 0
                await wait_until(lambda: rows(main_db, "SELECT 1 FROM claim_turns"))
                await wait_until(lambda: rows(shard_db, "SELECT 1 FROM claim_turns"))

                # Each shard's operator reads see the node (it registers on every shard):
                # the live claim turns and the Worker registry of shard 2 are B's.
                live = await shards.all[1].operations.live_turns()
                assert [r["application_id"] for r in live] == [b.application_id]
                assert await names(shard_db, "SELECT node_id FROM nodes") == [node.node.node_id]

                # The routing a transaction follows: B's claims, transitions and queues are shard 2's.
                assert [s.label for s in shards.all] == ["main", "shard 2"]
                assert shards.of_application(a.application_id).db is node.node.db
                assert shards.of_application(b.application_id).db is node.node.shard_dbs[0]
                assert services.hub is not None
                assert services.hub.queues_for(b.application_id) is shards.all[1].tenancy
                for tenant, shard in ((a, shards.main), (b, shards.all[1])):
                    lane = services.hub.transitions_for(tenant.application_id)
                    assert isinstance(lane, Lane) and lane.committer is shard.commits

                # Every row of each application is on its own server, none on the other.
                tasks = {"a": [*order["a"], *submitted["a"]], "b": [*order["b"], *submitted["b"]]}
                for key, tenant, own, foreign_db in (("a", a, main_db, shard_db), ("b", b, shard_db, main_db)):
                    here = await rows_of(own, tenant, tasks[key])
                    assert here["tasks"] == 5 and here["task_attempts"] == 5 and here["claim_turns"] == 1, here
                    assert here["idempotency_records"] == 3 and here["credentials"] == 2, here
                    assert all(here[t] >= 1 for t in ("applications", "namespaces", "queues")), here
                    assert set((await rows_of(foreign_db, tenant, tasks[key])).values()) == {0}, key
                succeeded = {
                    key: await names(db, "SELECT COUNT(*) AS n FROM tasks WHERE state = 'succeeded'")
                    for key, db in (("a", main_db), ("b", shard_db))
                }
                assert succeeded == {"a": [5], "b": [5]}

                # A fairness weight is set on the application's shard and read from there: a
                # copy of its row left behind on another shard does not count.
                weighted = await trio.to_thread.run_sync(
                    lambda: cli("orbit-admin", "application", "weight", "app-b", "5", dsn=empty_dsn, env=env)
                )
                assert weighted.returncode == 0, weighted.stderr
                assert await names(shard_db, "SELECT fairness_weight FROM applications") == [5]
                scheduler = services.pool.scheduler
                await wait_until(lambda: scheduler.weight(b.application_id) == 5)
                await main_db.run(
                    lambda tx: tx.execute_raw(
                        "INSERT INTO applications (application_id, name, fairness_weight) VALUES (%s, 'app-b', 9)",
                        (b.application_id,),
                    )
                )
                follower = shards.main.weights
                assert follower is not None
                for _ in range(2):
                    await follower.wait_for_pass()
                assert (scheduler.weight(a.application_id), scheduler.weight(b.application_id)) == (1, 5)
    finally:
        with trio.CancelScope(shield=True):
            await main_db.aclose()
            await shard_db.aclose()


def test_without_orbit_shards_every_application_is_on_the_main_database():
    """No ORBIT_SHARDS: one shard, the node's database; no lookup is learnt or needed."""
    from orbit_node.api.state import NodeState
    from orbit_node.store.tenancy import Principal

    config = NodeConfig(dsn=Dsn.parse("mysql://root@127.0.0.1/x"))
    state = NodeState.build(config=config, db=Database(config.dsn, size=1), node_id="0" * 32)
    who = Principal("c" * 32, "n" * 32, "default", "test", "a" * 32, "anything", {})
    assert state.shard(who) is state.shards.main and state.shards.all == (state.shards.main,)
    assert state.shards.of_application("never-seen") is state.shards.main
    assert state.shards.main.db is state.db


def test_a_node_refuses_shard_databases_that_do_not_match_its_configuration():
    config = attrs.evolve(
        NodeConfig(dsn=Dsn.parse("mysql://root@127.0.0.1/x")),
        shards=parse_shards("b=mysql://root@127.0.0.2/x"),
    )
    from orbit_node.api.state import NodeState

    with pytest.raises(ValueError, match="1 shard databases configured, 0 given"):
        NodeState.build(config=config, db=Database(config.dsn, size=1), node_id="0" * 32)
