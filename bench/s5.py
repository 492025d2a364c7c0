"""S5 backlog health: claims beside a huge future backlog, submits during a claim burst.

* claim latency (``DispatchStore.claim``, batch 16, one loop as a node's one in-flight
  claim per application) with 1,000 and then 1,000,000 future-dated tasks in the same
  queue, plus 100,000 finished ones; each phase claims, starts and finishes freshly
  seeded due tasks. Rows are seeded with INSERT ... SELECT.
* submit latency over HTTP (a real node, 4 clients back to back) idle and during a claim
  burst (a seeded due backlog drained by 32 Worker connections).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import trio

from orbit_node.db import Database
from orbit_node.store.dispatch import Capability, ClaimRequest, DispatchStore, FinishItem, Outcome

from .common import HANDLER, bench_database, connection_plan, make_app, node_process, seed_tasks, submit_closed_loop
from .common import worker_fleet
from .report import Target, format_table, ms, ratio, summarize

# Issue 8 target: claim p99 with 1M future tasks <= 1.5 x the 1k case.
TARGET_CLAIM_RATIO = 1.5
CLAIM_BATCH = 16
BURST_CONNECTIONS = 32
SUBMIT_CLIENTS = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--future", type=int, default=1_000_000, help="S5: future-dated tasks of the big case (default 1000000)")
    parser.add_argument("--future-small", type=int, default=1_000, help="S5: future-dated tasks of the small case (default 1000)")
    parser.add_argument("--finished", type=int, default=100_000, help="S5: finished tasks in the queue (default 100000)")
    parser.add_argument("--s5-claims", type=int, default=1_000, help="S5: claims timed per case (default 1000)")
    parser.add_argument("--s5-submits", type=int, default=1_500, help="S5: submits timed per case (default 1500)")


async def timed_claims(db: Database, app, claims: int) -> list[float]:
    """``claims`` claim -> start -> finish rounds of batch 16 on freshly seeded due tasks; claim seconds each."""
    await seed_tasks(db, app, claims * CLAIM_BATCH, available_s="-1")
    store = DispatchStore(db, reservation_lease_s=30, run_lease_s=60, batch_size=CLAIM_BATCH)
    request = ClaimRequest(namespace_id=app.namespace_id, application_id=app.application_id, queue_ids=(app.queue_id,),
                           capabilities=frozenset({Capability(*HANDLER)}), resource_key_support=False,
                           limit=CLAIM_BATCH, node_id="b" * 32, connection_id="bench-s5")
    latencies = []
    for _ in range(claims):
        started = time.perf_counter()
        reservations = await store.claim(request)
        latencies.append(time.perf_counter() - started)
        if not reservations:
            break
        results = await store.start_many([(r.task_id, r.fencing_token) for r in reservations])
        await store.finish_many(FinishItem(r.task_id, r.fencing_token, "null")
                                for r, s in zip(reservations, results) if s.outcome is Outcome.STARTED)
    return latencies


async def submit_phase(node, app, count: int, *, burst_app=None, capacity: int = 16) -> dict[str, Any]:
    if burst_app is None:
        return {"latency_s": summarize(await submit_closed_loop(node.url, app.token, app.queue_id, count,
                                                                 concurrency=SUBMIT_CLIENTS))}
    async with worker_fleet(node.url, connection_plan(burst_app, BURST_CONNECTIONS), capacity=capacity) as fleet:
        before = fleet.completed
        started = time.perf_counter()
        latencies = await submit_closed_loop(node.url, app.token, app.queue_id, count, concurrency=SUBMIT_CLIENTS)
        burst_rate = (fleet.completed - before) / (time.perf_counter() - started)
    return {"latency_s": summarize(latencies), "burst_tasks_per_s": burst_rate}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with bench_database(pool_size=4) as bdb:
        app = await make_app(bdb.db, "s5")
        seed_started = time.perf_counter()
        await seed_tasks(bdb.db, app, args.finished, available_s="-7200", state="succeeded")
        await seed_tasks(bdb.db, app, args.future_small, available_s="3600 + 3600 * RAND()", priority="FLOOR(RAND() * 10)")
        small = await timed_claims(bdb.db, app, args.s5_claims)
        await seed_tasks(bdb.db, app, args.future - args.future_small, available_s="3600 + 3600 * RAND()",
                         priority="FLOOR(RAND() * 10)")
        seed_s = time.perf_counter() - seed_started
        await trio.sleep(2.0)  # let InnoDB's purge catch up with the seeding, as in a live system
        big = await timed_claims(bdb.db, app, args.s5_claims)
        submitter = await make_app(bdb.db, "s5-submit")
        burster = await make_app(bdb.db, "s5-burst")
        await seed_tasks(bdb.db, burster, max(args.s5_submits * 20, 20_000))
        async with node_process(bdb.dsn) as node:
            idle = await submit_phase(node, submitter, args.s5_submits)
            burst = await submit_phase(node, submitter, args.s5_submits, burst_app=burster, capacity=args.capacity)
    s_small, s_big = summarize(small), summarize(big)
    rows = [[f"claim, {args.future_small:,} future", s_small["count"], ms(s_small["p50"]), ms(s_small["p99"]), ms(s_small["max"])],
            [f"claim, {args.future:,} future", s_big["count"], ms(s_big["p50"]), ms(s_big["p99"]), ms(s_big["max"])],
            ["submit, idle node", idle["latency_s"]["count"], ms(idle["latency_s"]["p50"]), ms(idle["latency_s"]["p99"]),
             ms(idle["latency_s"]["max"])],
            [f"submit, claim burst ({burst['burst_tasks_per_s']:,.0f} tasks/s)", burst["latency_s"]["count"],
             ms(burst["latency_s"]["p50"]), ms(burst["latency_s"]["p99"]), ms(burst["latency_s"]["max"])]]
    table = format_table(["operation", "n", "p50 ms", "p99 ms", "max ms"], rows)
    claim_ratio = ratio(s_big["p99"], s_small["p99"])
    return {
        "scenario": "s5", "server": bdb.server_version,
        "figures": {"claim_small_s": s_small, "claim_big_s": s_big, "claim_p99_ratio": claim_ratio,
                    "submit_idle": idle, "submit_burst": burst, "seed_s": seed_s,
                    "samples": {"small": small, "big": big}},
        "tables": [table],
        "targets": [Target.at_most(f"S5 claim p99 {args.future:,} / {args.future_small:,} future", claim_ratio,
                                   TARGET_CLAIM_RATIO, unit="x")],
        "notes": [f"{args.finished:,} finished tasks in the same queue; future tasks due in 1-2 h, priorities 0-9; "
                  f"seeding took {seed_s:.0f} s; claims: one loop, batch {CLAIM_BATCH}, each followed by start and finish.",
                  f"submit p99 during the burst is {ratio(burst['latency_s']['p99'], idle['latency_s']['p99']):.2f}x the "
                  f"idle node's ({SUBMIT_CLIENTS} clients back to back; burst: {BURST_CONNECTIONS} Worker connections "
                  "draining a seeded backlog)."],
    }


def plot(report: dict[str, Any], outdir, plots) -> list:
    samples = report["figures"]["samples"]
    return [plots.cdf(outdir / "s5-claim-latency.png", {"1k future": samples["small"], "1M future": samples["big"]},
                      title="S5: claim latency beside future-dated tasks", xlabel="seconds per claim (batch 16)")]
