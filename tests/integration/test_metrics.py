"""GET /metrics on a real node against a real MariaDB: a scripted workload must show
exactly the counts it produced; the endpoint is off, open on its own address, or behind
a credential, as configured."""

from __future__ import annotations

import attrs
import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from trio_websocket import ConnectionRejected, open_websocket_url

from orbit_node.config import NodeConfig, SchedulerLimits
from orbit_node.db import Database
from orbit_node.domain.errors import ConfigError
from orbit_node.services import default_services

from .. import seed
from ..nodeutil import make_tenant, make_token, run_node
from ..wsclient import raw_worker, ws_url

# The whole test on the real clock (a node, a database, WebSockets).
TEST_TIMEOUT_S = 60


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition: (name, sorted labels) -> value."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"no sample {name}{labels}; have {sorted(k for k in samples if k[0] == name)}"
    return samples[key]


async def scrape(url: str, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.get(url, headers=headers)


def task_body(queue_id: str, n: int) -> dict:
    return {"queue_id": queue_id, "handler": "h", "handler_version": "v1", "payload_version": "v1", "payload": {"n": n}}


class ClaimWatch:
    """Chains onto the pool's ``observe`` hook: wait until a number of claims finished."""

    def __init__(self, pool):
        self.finished = 0
        self._hook = pool.observe
        self._changed = trio.Event()
        pool.observe = self

    def __call__(self, grant, outcome, seconds):
        self._hook(grant, outcome, seconds)
        self.finished += 1
        self._changed.set()

    async def wait_for(self, count: int) -> None:
        while self.finished < count:
            self._changed = trio.Event()
            await self._changed.wait()


async def test_a_scripted_workload_shows_exactly_its_counts(node_config, db):
    # One scan cycle lasts an hour: an empty result stays cached and no connection is
    # paced out during the test (P3's pace per second, 4 claims a second, kept over the
    # hour's cycle), so the number of claims is exactly what the script does.
    config = attrs.evolve(
        node_config,
        metrics="open",
        metrics_port=0,
        max_connections=2,
        scheduler=SchedulerLimits(scan_cycle_s=3600.0, claims_per_connection_per_cycle=4 * 3600),
    )
    alpha = await make_tenant(db, "alpha")
    beta = await make_tenant(db, "beta")
    with trio.fail_after(TEST_TIMEOUT_S):
        async with run_node(config, services=default_services()) as running:
            pool = running.node.state.services.pool
            claims = ClaimWatch(pool)
            async with running.client(alpha.token) as a, running.client(beta.token) as b, running.client() as nobody:
                for n in range(3):
                    response = await a.post(
                        "/v1/tasks", json=task_body(alpha.queue_id, n), headers={"Idempotency-Key": f"a{n}"}
                    )
                    assert response.status_code == 201
                for n in range(2):
                    response = await b.post(
                        "/v1/tasks", json=task_body(beta.queue_id, n), headers={"Idempotency-Key": f"b{n}"}
                    )
                    assert response.status_code == 201
                again = await a.post("/v1/tasks", json=task_body(alpha.queue_id, 0), headers={"Idempotency-Key": "a0"})
                assert again.status_code == 200
                assert (await a.get("/v1/tasks/" + "0" * 32)).status_code == 404
                assert (await nobody.get("/v1/tasks")).status_code == 401

            async with raw_worker(running.base_url, alpha.token) as wa, raw_worker(running.base_url, beta.token) as wb:
                for worker, tenant, outcomes in (
                    (wa, alpha, ["succeeded", "succeeded", "failed"]),
                    (wb, beta, ["succeeded", "succeeded"]),
                ):
                    await worker.hello([tenant.queue_id], capacity=5)
                    tasks = (await worker.recv_type("dispatch"))["tasks"]
                    assert len(tasks) == len(outcomes)
                    refs = [{"task_id": t["task_id"], "token": t["token"]} for t in tasks]
                    ack = await worker.request("start", refs, "s")
                    assert all(r["ok"] for r in ack["results"])
                    finishes = []
                    for ref, outcome in zip(refs, outcomes, strict=True):
                        if outcome == "succeeded":
                            finishes.append({**ref, "outcome": "succeeded", "result": {"ok": True}})
                        else:
                            finishes.append(
                                {
                                    **ref,
                                    "outcome": "failed",
                                    "retryable": False,
                                    "error": {"code": "BROKEN", "message": "no"},
                                }
                            )
                    ack = await worker.request("finish", finishes, "f")
                    assert [r["state"] for r in ack["results"]] == outcomes
                # Each connection claimed once, and took fewer tasks than its capacity: the
                # queue is remembered empty, so its next request (after the Finish) runs no
                # SQL: 2 claims.
                await claims.wait_for(2)
                # A third connection is over the limit of 2.
                with pytest.raises(ConnectionRejected) as refused:
                    async with open_websocket_url(
                        ws_url(running.base_url), extra_headers=[(b"authorization", f"Bearer {alpha.token}".encode())]
                    ):
                        pass
                assert refused.value.status_code == 503

                response = await scrape(running.node.metrics_bound[0] + "/metrics")
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/plain")
                m = parse(response.text)

            # Connections, claim requests and SQL slots (both connections wait, cached empty).
            assert value(m, "orbit_worker_connections") == 2
            assert value(m, "orbit_worker_connections_limit") == 2
            # The third is alpha's: at its fair share (1 of 2), it is refused, nobody is moved.
            assert value(m, "orbit_worker_connections_refused_total", reason="node_full") == 1
            assert value(m, "orbit_worker_connections_refused_total", reason="application_limit") == 0
            assert value(m, "orbit_worker_connections_moved_total") == 0
            assert value(m, "orbit_worker_connections_by_application", application="alpha") == 1
            assert value(m, "orbit_worker_connections_by_application", application="beta") == 1
            assert value(m, "orbit_claim_requests_pending") == 2
            assert value(m, "orbit_claim_requests_in_flight") == 0
            assert value(m, "orbit_claim_sql_slots_in_use") == 0
            assert value(m, "orbit_claim_sql_slots") == 4
            # Claims by outcome, their latency, and the fairness signal.
            assert value(m, "orbit_claims_total", outcome="tasks") == 2
            assert value(m, "orbit_claims_total", outcome="empty") == 0
            assert value(m, "orbit_claims_total", outcome="error") == 0
            assert value(m, "orbit_claims_total", outcome="cached_empty") >= 2
            assert value(m, "orbit_claim_duration_seconds_count", outcome="tasks") == 2
            assert value(m, "orbit_claim_duration_seconds_count", outcome="empty") == 0
            assert value(m, "orbit_claim_turns_total", application_id=alpha.application_id, application="alpha") == 1
            assert value(m, "orbit_claim_turns_total", application_id=beta.application_id, application="beta") == 1
            # How long each request waited for its turn, per application (by name).
            for name in ("alpha", "beta"):
                assert value(m, "orbit_claim_turn_wait_seconds_count", application=name) == 1
                assert value(m, "orbit_claim_turn_wait_seconds_bucket", application=name, le="+Inf") == 1
                assert 0 <= value(m, "orbit_claim_turn_wait_seconds_sum", application=name) < TEST_TIMEOUT_S
            # Tasks: exact counts of what the script did.
            assert value(m, "orbit_tasks_reserved_total") == 5
            assert value(m, "orbit_tasks_dispatched_total") == 5
            assert value(m, "orbit_dispatch_to_start_seconds_count") == 5
            assert value(m, "orbit_tasks_finished_total", outcome="succeeded") == 4
            assert value(m, "orbit_tasks_finished_total", outcome="failed") == 1
            assert value(m, "orbit_tasks_finished_total", outcome="retry") == 0
            # HTTP requests by route template and status.
            assert value(m, "orbit_http_requests_total", method="POST", route="/v1/tasks", status="201") == 5
            assert value(m, "orbit_http_requests_total", method="POST", route="/v1/tasks", status="200") == 1
            assert value(m, "orbit_http_requests_total", method="GET", route="/v1/tasks/<task_id>", status="404") == 1
            assert value(m, "orbit_http_requests_total", method="GET", route="/v1/tasks", status="401") == 1
            assert value(m, "orbit_http_request_duration_seconds_count", method="POST", route="/v1/tasks") == 6
            assert value(m, "orbit_node_info", node_id=running.node.node_id, version="0.1.0") == 1
            assert value(m, "orbit_db_pool_size") == config.db_pool_size

            # The same turns reach the database, where every node's are seen together.
            turns = running.node.state.services.shards.main.turns
            await turns.flush()
            rows = await db.run(
                lambda tx: tx.fetchall_raw(
                    "SELECT application_id, turns FROM claim_turns WHERE node_id = %s", (running.node.node_id,)
                )
            )
            assert {r["application_id"]: r["turns"] for r in rows} == {alpha.application_id: 1, beta.application_id: 1}
            # And to the minute's row of the history; a flush with nothing new adds nothing.
            await turns.flush()
            minutes = await db.run(
                lambda tx: tx.fetchall_raw(
                    "SELECT application_id, SUM(turns) AS turns, COUNT(*) AS n FROM claim_turn_minutes"
                    " WHERE node_id = %s GROUP BY application_id",
                    (running.node.node_id,),
                )
            )
            assert {r["application_id"]: int(r["turns"]) for r in minutes} == {
                alpha.application_id: 1,
                beta.application_id: 1,
            }

            # The open server serves /metrics and nothing else; the node's HTTP address has none.
            async with httpx.AsyncClient(timeout=10) as client:
                assert (await client.get(running.node.metrics_bound[0] + "/other")).status_code == 404
                assert (await client.post(running.node.metrics_bound[0] + "/metrics")).status_code == 405
                assert (await client.get(running.base_url + "/metrics")).status_code == 404
    # A node that stopped leaves no turn counters behind.
    rows = await db.run(lambda tx: tx.fetchall_raw("SELECT COUNT(*) AS n FROM claim_turns"))
    assert rows[0]["n"] == 0


async def test_metrics_behind_a_credential_need_scope_metrics_read(node_config, db):
    config = attrs.evolve(node_config, metrics="credential")
    tenant = await make_tenant(db, scopes={"tasks:read": "*"})
    reader = await make_token(db, tenant, {"metrics:read": "*"})
    with trio.fail_after(TEST_TIMEOUT_S):
        async with run_node(config) as running:
            url = running.base_url + "/metrics"
            missing = await scrape(url)
            assert missing.status_code == 401 and missing.json()["error"]["code"] == "UNAUTHENTICATED"
            lacking = await scrape(url, tenant.token)
            assert lacking.status_code == 403 and lacking.json()["error"]["code"] == "PERMISSION_DENIED"
            assert "metrics:read" in lacking.json()["error"]["message"]
            granted = await scrape(url, reader)
            assert granted.status_code == 200 and granted.headers["content-type"].startswith("text/plain")
            m = parse(granted.text)
            assert value(m, "orbit_node_info", node_id=running.node.node_id, version="0.1.0") == 1
            # The refusals were counted by route and status; no separate server was started.
            assert value(m, "orbit_http_requests_total", method="GET", route="/metrics", status="401") == 1
            assert value(m, "orbit_http_requests_total", method="GET", route="/metrics", status="403") == 1
            assert running.node.metrics_bound == []


async def test_metrics_off_is_an_unknown_path_even_with_the_scope(node_config, db):
    tenant = await make_tenant(db)  # every scope, metrics:read included
    with trio.fail_after(TEST_TIMEOUT_S):
        async with run_node(node_config) as running:
            response = await scrape(running.base_url + "/metrics", tenant.token)
            assert response.status_code == 404 and response.json()["error"]["code"] == "NOT_FOUND"
            assert running.node.metrics_bound == []


async def test_two_nodes_in_one_process_keep_separate_registries(node_config, db):
    config = attrs.evolve(node_config, metrics="open", metrics_port=0)
    tenant = await make_tenant(db)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with run_node(config) as first, run_node(config) as second:
            async with first.client(tenant.token) as client:
                assert (await client.get("/v1/tasks")).status_code == 200
            m1 = parse((await scrape(first.node.metrics_bound[0] + "/metrics")).text)
            m2 = parse((await scrape(second.node.metrics_bound[0] + "/metrics")).text)
    assert value(m1, "orbit_http_requests_total", method="GET", route="/v1/tasks", status="200") == 1
    assert ("orbit_http_requests_total", (("method", "GET"), ("route", "/v1/tasks"), ("status", "200"))) not in m2


async def test_recovered_leases_and_replayed_transactions_are_counted(node_config, db, dsn):
    config = attrs.evolve(node_config, metrics="open", metrics_port=0, sweep_interval_s=0.05)
    owner = await seed.tenant(db)
    store = seed.lease_store(db)
    task_id = await seed.insert_task(db, owner)
    (reservation,) = await store.claim(seed.claim_request(owner))
    await seed.expire_lease(db, reservation.task_id)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with run_node(config, services=default_services()) as running:
            sweeper = running.node.state.services.shards.main.sweeper
            # The second pass that ends from now began after the lease had expired.
            await sweeper.wait_for_pass()
            await sweeper.wait_for_pass()
            assert (await seed.task_row(db, task_id))["state"] == "queued"

            # A real lock-wait timeout (1205) on the node's pool, replayed once.
            node_db = running.node.db
            replayed = trio.Event()
            metric_hook = node_db.on_replay

            def on_replay(errno):
                metric_hook(errno)
                replayed.set()

            node_db.on_replay = on_replay
            holder = Database(dsn, size=1)
            locked = trio.Event()

            async def hold(tx):
                await tx.execute_raw("SELECT * FROM tasks WHERE task_id = %s FOR UPDATE", (task_id,))
                locked.set()
                await replayed.wait()

            async def contend(tx):
                await tx.execute_raw("SET SESSION innodb_lock_wait_timeout = 1")
                await tx.execute_raw("SELECT * FROM tasks WHERE task_id = %s FOR UPDATE", (task_id,))
                await tx.execute_raw("SET SESSION innodb_lock_wait_timeout = DEFAULT")

            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(holder.transaction, hold)
                    await locked.wait()
                    await node_db.transaction(contend)
            finally:
                await holder.aclose()
            m = parse((await scrape(running.node.metrics_bound[0] + "/metrics")).text)
    assert value(m, "orbit_leases_recovered_total", outcome="requeued") == 1
    assert value(m, "orbit_leases_recovered_total", outcome="retried") == 0
    assert value(m, "orbit_db_replays_total", errno="1205") == 1


def test_metrics_settings_are_validated():
    base = {"ORBIT_MYSQL_DSN": "mysql://r@h/d"}
    config = NodeConfig.from_env(
        {**base, "ORBIT_METRICS": "open", "ORBIT_METRICS_ADDR": "0.0.0.0:9100", "ORBIT_LOG_FORMAT": "json"}
    )
    assert (config.metrics, config.metrics_host, config.metrics_port, config.log_format) == (
        "open",
        "0.0.0.0",
        9100,
        "json",
    )
    defaults = NodeConfig.from_env(base)
    assert (defaults.metrics, defaults.log_format) == ("off", "auto")
    for env, field in [
        ({"ORBIT_METRICS": "public"}, "ORBIT_METRICS"),
        ({"ORBIT_METRICS": "credential", "ORBIT_METRICS_ADDR": "127.0.0.1:9100"}, "ORBIT_METRICS_ADDR"),
        ({"ORBIT_METRICS": "open", "ORBIT_METRICS_ADDR": "nowhere"}, "ORBIT_METRICS_ADDR"),
        ({"ORBIT_METRICS": "open", "ORBIT_METRICS_ADDR": "127.0.0.1:8080"}, "ORBIT_METRICS_ADDR"),
        ({"ORBIT_LOG_FORMAT": "xml"}, "ORBIT_LOG_FORMAT"),
    ]:
        with pytest.raises(ConfigError) as info:
            NodeConfig.from_env({**base, **env})
        assert info.value.field == field and "\n" not in info.value.message


async def test_pruned_rows_per_table_and_the_pruner_s_lag_are_exposed(node_config, db):
    config = attrs.evolve(node_config, metrics="open", metrics_port=0, retain_succeeded_s=60, prune_interval_s=0.05)
    owner = await seed.tenant(db)
    ids = await seed.insert_tasks(db, owner, [seed.TaskSpec() for _ in range(3)])

    async def finish_long_ago(tx):
        await tx.execute_raw(
            "UPDATE tasks SET state = 'succeeded', finished_at = NOW(6) - INTERVAL 1 HOUR WHERE task_id IN %s",
            (tuple(ids),),
        )
        for task_id in ids:
            await tx.execute_raw(
                "INSERT INTO task_attempts (task_id, attempt, fencing_token, reserved_at) VALUES (%s, 1, 't', NOW(6))",
                (task_id,),
            )

    await db.transaction(finish_long_ago)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with run_node(config, services=default_services()) as running:
            pruner = running.node.state.services.shards.main.pruner
            await pruner.wait_for_pass()
            m = parse((await scrape(running.node.metrics_bound[0] + "/metrics")).text)
            # A backlog the pruner cannot take in one batch: the lag says how far behind it is.
            pruner.batch = 1
            more = await seed.insert_tasks(db, owner, [seed.TaskSpec() for _ in range(3)])
            await db.run(
                lambda tx: tx.execute_raw(
                    "UPDATE tasks SET state = 'failed', finished_at = NOW(6) - INTERVAL 30 DAY WHERE task_id IN %s",
                    (tuple(more),),
                )
            )
            pruner.rate = 0.5
            while pruner.pruned.tasks < 4:
                await trio.sleep(0.01)
            behind = parse((await scrape(running.node.metrics_bound[0] + "/metrics")).text)
    assert value(m, "orbit_retention_pruned_rows_total", table="tasks") == 3
    assert value(m, "orbit_retention_pruned_rows_total", table="task_attempts") == 3
    assert value(m, "orbit_retention_pruned_rows_total", table="idempotency_records") == 0
    assert value(m, "orbit_retention_pruned_rows_total", table="audit_records") == 0
    assert value(m, "orbit_retention_lag_seconds") == 0
    # 30 days finished, 7 days kept: the oldest not yet deleted is about 23 days overdue.
    assert 22 * 86400 < value(behind, "orbit_retention_lag_seconds") < 24 * 86400
