"""Fair claim turns on one node through real SDK Workers, with every SQL statement slowed.

Issue 24's measurement, as a test: the node reaches MariaDB through the fault proxy,
which holds every chunk ~20 ms each way (~40 ms a statement), so the claim pool's 4 SQL
slots are the bottleneck. Six applications with a backlog each; every Worker is the SDK
Worker of capacity 4 with a no-op handler. A has 10 queues and 20 connections, B-F one
queue and 2 connections each. A small application's Workers spend part of each cycle
waiting for the ack of their Start/Finish batch, with no request waiting: a rotation
that sends an application coming back to the end of the line gave A 1.7-1.9x the turns
of each small one. Counted after a warm-up, from the node's scheduler statistics.
"""

from __future__ import annotations

import attrs
import trio

from harness.proxy import open_fault_proxy
from orbit_node.services import default_services
from orbit_sdk.worker import Worker, WorkerTask

from .. import seed
from ..nodeutil import make_tenant, run_node

# Added to every chunk in each direction: ~40 ms a statement. With 10 ms (issue 24's
# figure) the claim slots stop being the bottleneck on a machine loaded 3-4x over its
# cores (the node's process, not SQL, decides when a small application asks again):
# beside five spinning processes A/mean was 1.28 and 1.47 (140 turns each quiet, 90
# there). With 20 ms it was 1.04 and 1.05 beside the same five.
LATENCY_S = 0.02
CAPACITY = 4
SMALL = "BCDEF"
WARM_UP_S = 6.0
WINDOW_S = 20.0
# What this test measures (20 s window): 0.99-1.01 (A over the small ones' mean), Jain
# 0.9999, on a quiet machine and beside two processes spinning on both cores. With the
# group commit limited to 4 transactions at once (as before it followed the claim
# slots), 1.99-2.02 and Jain 0.905: settling, not claiming, was the bottleneck, and a
# small application's two Workers, each waiting for its Start and Finish acks before it
# asks again, asked less and less often while A always had a request waiting. With the
# rotation of 2f1cfde (an application that comes back goes behind everyone) 1.65-1.69.
# The bounds leave room for a busy machine and still fail both; at 20 ms each way both
# mutants fail as before: 4 group slots 1.48, a returning application behind everyone 1.66
# (with 10 ms the 4-slot mutant gave 1.47).
MAX_A_OVER_SMALL = 1.25
MIN_JAIN = 0.98
# Tasks finished in the window, each small application over an even share of the node's:
# 0.96 measured here. Issue 38 measured 0.25x of alone from outside on 15723f5 (B-F 8.2
# tasks/s each beside A's 48.6); neither this test nor bench s4's isolation phase (which
# runs 15723f5's node beside today's) reproduced it: 0.98-1.15 there. The bound is the
# promise in a gross form; a mutant whose group commits run 4 at once (turns A/mean 1.5,
# failing the bound above) still gives 0.91 here: isolation is the weaker promise.
MIN_TASK_SHARE = 0.8


def jain(values: list[int]) -> float:
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


async def test_a_big_application_gets_no_more_turns_than_small_ones_when_sql_is_slow(node_config, db, dsn):
    tenants = {"A": await make_tenant(db, "A", queues=[f"a{i}" for i in range(10)])}
    for key in SMALL:
        tenants[key] = await make_tenant(db, key)
    plan: list[tuple[str, str]] = []  # (application, queue id) of each Worker connection
    for key, tenant in tenants.items():
        queue_ids = list(tenant.queues.values())
        for i, queue_id in enumerate(queue_ids):
            owner = seed.Tenant(tenant.application_id, tenant.namespace_id, queue_id)
            await seed.bulk_insert_tasks(db, owner, 2000 // len(queue_ids), id_prefix=f"{ord(key):02x}{i:06x}")
        plan += [(key, queue_ids[i % len(queue_ids)]) for i in range(20 if key == "A" else 2)]

    async def noop(task: WorkerTask) -> None:
        return None

    with trio.fail_after(WARM_UP_S + WINDOW_S + 30):
        async with open_fault_proxy(dsn.host, dsn.port) as proxy:
            proxy.latency_s = LATENCY_S
            config = attrs.evolve(node_config, dsn=proxy.dsn_for(dsn))
            async with run_node(config, services=default_services()) as running, trio.open_nursery() as nursery:
                scheduler = running.node.state.services.pool.scheduler
                workers: dict[str, list[Worker]] = {key: [] for key in tenants}
                for key, queue_id in plan:
                    worker = Worker(running.base_url, tenants[key].token, [queue_id], capacity=CAPACITY)
                    worker.register("h", "v1", "v1", noop)
                    workers[key].append(worker)
                    nursery.start_soon(worker.run)
                await trio.sleep(WARM_UP_S)
                before = dict(scheduler.statistics().turns_by_application)
                done_before = {key: sum(w.completed for w in ws) for key, ws in workers.items()}
                await trio.sleep(WINDOW_S)
                after = scheduler.statistics()
                done = {key: sum(w.completed for w in ws) - done_before[key] for key, ws in workers.items()}
                nursery.cancel_scope.cancel()
    turns = {
        key: after.turns_by_application.get(t.application_id, 0) - before.get(t.application_id, 0)
        for key, t in tenants.items()
    }
    small_mean = sum(turns[key] for key in SMALL) / len(SMALL)
    # The pool was the bottleneck: every slot busy most of the window, more asking than served.
    assert after.max_in_flight_seen == 4 and small_mean >= 20, turns
    assert turns["A"] / small_mean <= MAX_A_OVER_SMALL, turns
    assert jain(list(turns.values())) >= MIN_JAIN, turns
    # Isolation in a gross form (bench s4's isolation phase has the exact one): each small
    # application finishes at least MIN_TASK_SHARE of an even share of the node's tasks.
    # Alone, each of them finishes more than that share here (bench s4: 29.6 tasks/s
    # alone, 31.9 an even share beside A, 20 ms), so the share is the bound that applies.
    even = sum(done.values()) / len(done)
    assert min(done[key] for key in SMALL) >= MIN_TASK_SHARE * even, done
