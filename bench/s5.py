"""S5 backlog health: claims beside whatever a queue holds, submits during a claim burst.

* claim latency (``LeaseStore.claim``, batch 16, one loop as a node's one in-flight
  claim per application) for each queue *shape*, one queue per shape, each holding the
  same 1,000 due tasks of the claiming connection: ``plain`` (nothing else),
  ``other handler`` (200,000 due tasks of a handler the connection cannot run, due
  before its own), ``priority window`` (200,000 priority-9 tasks inside the priority
  window, dispatch_at <= now < available_at), ``keyed`` (200,000 resource-keyed due
  tasks ahead, the connection without key support) and ``future + history``
  (1,000,000 future-dated tasks, 100,000 succeeded and cancelled ones). Claims
  alternate between the shapes so every shape sees the same machine; each round
  claims, starts and finishes, then tops the queue up with as many new due tasks.
  Rows are seeded with INSERT ... SELECT.
* rows read per claim: MariaDB's ``Handler_read_*`` session counters around each claim
  on a one-connection pool, index condition pushdown off for that session (so every
  index entry visited counts), as ``tests/integration/test_dispatch_index.py`` does.
* submit latency over HTTP (a real node, 4 clients back to back) idle and during a claim
  burst (a seeded due backlog drained by 32 Worker connections).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import attrs
import trio

from orbit_node.db import Database
from orbit_node.domain.claims import Capability, ClaimRequest
from orbit_node.domain.ownership import FinishItem, Outcome
from orbit_node.store.leases import LeaseStore

from . import HANDLER
from .clients import connection_plan, submit_closed_loop, worker_fleet
from .database import App, bench_database, make_app, seed_tasks
from .processes import node_process
from .report import Target, format_table, ms, ratio, summarize

# Issue 8 / issue 14 target: claim p99 of every shape <= 1.5 x the plain case.
TARGET_CLAIM_RATIO = 1.5
CLAIM_BATCH = 16
BURST_CONNECTIONS = 32
SUBMIT_CLIENTS = 4
# Due tasks of other shapes are dated this far back: ahead of the connection's own.
AHEAD_S = -600
# The priority-window shape: priority 9 buys 270 s, so a task available this many
# seconds from now has dispatch_at 2 s ago and is not due for another 268 s. Its
# claims are measured only while that holds (with a margin).
WINDOW_AHEAD_S = 268
WINDOW_MARGIN_S = 10
# A handler the claiming connection has not registered.
OTHER_HANDLER = ("bench.other", "v1", "v1")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--future", type=int, default=1_000_000, help="S5: future-dated tasks of the future + history shape (1000000)"
    )
    parser.add_argument(
        "--finished",
        type=int,
        default=100_000,
        help="S5: finished tasks (half succeeded, half cancelled) of the future + history shape (default 100000)",
    )
    parser.add_argument(
        "--s5-shape-tasks",
        type=int,
        default=200_000,
        help="S5: tasks ahead in the other handler, priority window and keyed shapes (default 200000)",
    )
    parser.add_argument("--s5-due", type=int, default=1_000, help="S5: due tasks of the claimer per shape (1000)")
    parser.add_argument("--s5-claims", type=int, default=1_000, help="S5: claims timed per shape (default 1000)")
    parser.add_argument(
        "--s5-read-claims", type=int, default=50, help="S5: claims whose rows read are counted, per shape (50)"
    )
    parser.add_argument("--s5-submits", type=int, default=1_500, help="S5: submits timed per case (default 1500)")


@attrs.frozen
class Shape:
    """One queue shape: its name, what it holds beside the claimer's due tasks, its queue."""

    name: str
    holds: str
    queue_id: str


async def seed_shapes(db: Database, app: App, args: argparse.Namespace) -> list[Shape]:
    """Every shape but the priority window (seeded last, see ``seed_window``); its own due tasks each."""
    plain, other, window, keyed, history = app.queue_ids
    many = args.s5_shape_tasks
    ahead = str(AHEAD_S)
    await seed_tasks(db, app, many, queue_id=other, available_s=ahead, handler=OTHER_HANDLER)
    await seed_tasks(db, app, many, queue_id=keyed, available_s=ahead, resource_key="CONCAT('k', n)")
    await seed_tasks(
        db, app, args.future, queue_id=history, available_s="3600 + 3600 * RAND()", priority="FLOOR(RAND() * 10)"
    )
    for state, count in (("succeeded", args.finished - args.finished // 2), ("cancelled", args.finished // 2)):
        await seed_tasks(db, app, count, queue_id=history, available_s="-7200", state=state)
    for queue_id in app.queue_ids:
        await seed_tasks(db, app, args.s5_due, queue_id=queue_id, available_s="-1")
    return [
        Shape("plain", f"{args.s5_due:,} due tasks, nothing else", plain),
        Shape("other handler", f"{many:,} due tasks of another handler ahead", other),
        Shape("priority window", f"{many:,} priority-9 tasks due within {WINDOW_AHEAD_S} s", window),
        Shape("keyed", f"{many:,} resource-keyed due tasks ahead, no key support", keyed),
        Shape("future + history", f"{args.future:,} future, {args.finished:,} succeeded/cancelled", history),
    ]


async def seed_window(db: Database, app: App, shape: Shape, count: int) -> float:
    """The priority-window rows; the ``trio.current_time()`` until which they stay in the window."""
    started = trio.current_time()
    await seed_tasks(db, app, count, queue_id=shape.queue_id, available_s=str(WINDOW_AHEAD_S), priority="9")
    return started + WINDOW_AHEAD_S - WINDOW_MARGIN_S


def _request(app: App, queue_id: str) -> ClaimRequest:
    return ClaimRequest(
        namespace_id=app.namespace_id,
        application_id=app.application_id,
        queue_ids=(queue_id,),
        capabilities=frozenset({Capability(*HANDLER)}),
        resource_key_support=False,
        limit=CLAIM_BATCH,
        node_id="b" * 32,
        connection_id="bench-s5",
    )


async def _settle(db: Database, store: LeaseStore, app: App, queue_id: str, reservations) -> None:
    """Start and finish what a claim took, and top its queue up with as many new due tasks."""
    if not reservations:
        return
    results = await store.start_many([(r.task_id, r.fencing_token) for r in reservations])
    await store.finish_many(
        FinishItem(r.task_id, r.fencing_token, "null")
        for r, s in zip(reservations, results, strict=True)
        if s.outcome is Outcome.STARTED
    )
    await seed_tasks(db, app, len(reservations), queue_id=queue_id, available_s="-1")


def _store(db: Database) -> LeaseStore:
    return LeaseStore(db, reservation_lease_s=30, run_lease_s=60, batch_size=CLAIM_BATCH)


async def interleaved_claims(
    db: Database, app: App, shapes: list[Shape], claims: int, window_until: float
) -> dict[str, list[float]]:
    """``claims`` timed claims per shape, round-robin over the shapes (same machine load,
    purge state and buffer pool for all); the priority window's only while it holds."""
    store = _store(db)
    out: dict[str, list[float]] = {s.name: [] for s in shapes}
    for _ in range(claims):
        for shape in shapes:
            if shape.name == "priority window" and trio.current_time() > window_until:
                continue
            started = time.perf_counter()
            reservations = await store.claim(_request(app, shape.queue_id))
            seconds = time.perf_counter() - started
            if reservations:
                out[shape.name].append(seconds)
            await _settle(db, store, app, shape.queue_id, reservations)
    return out


async def session_reads(tx) -> int:
    """Index and row reads of this session (Handler_read_rnd_next, which reading the
    status itself drives, left out)."""
    rows = await tx.fetchall_raw("SHOW SESSION STATUS LIKE 'Handler_read%%'")
    return sum(int(r["Value"]) for r in rows if r["Variable_name"] != "Handler_read_rnd_next")


async def rows_read(dsn, app: App, shapes: list[Shape], claims: int) -> dict[str, list[int]]:
    """Handler reads of each claim, per shape, on a one-connection pool with index
    condition pushdown off (it filters inside the engine, out of the counters' sight)."""
    one = Database(dsn, size=1)
    out: dict[str, list[int]] = {s.name: [] for s in shapes}
    try:
        store = _store(one)
        await one.run(lambda tx: tx.execute_raw("SET SESSION optimizer_switch = 'index_condition_pushdown=off'"))
        first = await one.run(session_reads)
        baseline = await one.run(session_reads) - first  # what reading the counters costs
        for _ in range(claims):
            for shape in shapes:
                before = await one.run(session_reads)
                reservations = await store.claim(_request(app, shape.queue_id))
                out[shape.name].append(await one.run(session_reads) - before - baseline)
                await _settle(one, store, app, shape.queue_id, reservations)
    finally:
        await one.aclose()
    return out


async def wait_for_purge(db: Database, *, timeout_s: float = 120.0) -> int | None:
    """Wait until InnoDB's history list (undo not yet purged) is short again after seeding; its length."""
    length = None
    with trio.move_on_after(timeout_s):
        while True:
            rows = await db.run(
                lambda tx: tx.fetchall_raw(
                    "SELECT `count` AS n FROM information_schema.innodb_metrics WHERE name = 'trx_rseg_history_len'"
                )
            )
            length = int(rows[0]["n"]) if rows else None
            if length is None or length < PURGED_HISTORY:
                return length
            await trio.sleep(1.0)
    return length


# History list length (undo records not yet purged) below which seeding counts as settled.
PURGED_HISTORY = 1000


async def submit_phase(node, app, count: int, *, burst_app=None, capacity: int = 16) -> dict[str, Any]:
    if burst_app is None:
        return {
            "latency_s": summarize(
                await submit_closed_loop(node.url, app.token, app.queue_id, count, concurrency=SUBMIT_CLIENTS)
            )
        }
    async with worker_fleet(node.url, connection_plan(burst_app, BURST_CONNECTIONS), capacity=capacity) as fleet:
        before = fleet.completed
        started = time.perf_counter()
        latencies = await submit_closed_loop(node.url, app.token, app.queue_id, count, concurrency=SUBMIT_CLIENTS)
        burst_rate = (fleet.completed - before) / (time.perf_counter() - started)
    return {"latency_s": summarize(latencies), "burst_tasks_per_s": burst_rate}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with bench_database(pool_size=4) as bdb:
        app = await make_app(bdb.db, "s5", queues=5)
        seed_started = time.perf_counter()
        shapes = await seed_shapes(bdb.db, app, args)
        seed_s = time.perf_counter() - seed_started
        history = await wait_for_purge(bdb.db)
        # Seeded last, just before the claims: its rows leave the window 268 s after.
        window = next(s for s in shapes if s.name == "priority window")
        window_until = await seed_window(bdb.db, app, window, args.s5_shape_tasks)
        await bdb.db.run(lambda tx: tx.fetchall_raw("ANALYZE TABLE tasks"))
        reads = await rows_read(bdb.dsn, app, shapes, args.s5_read_claims)
        timed = await interleaved_claims(bdb.db, app, shapes, args.s5_claims, window_until)
        window_held = trio.current_time() <= window_until
        buffer_pool_mb = (
            await bdb.db.run(lambda tx: tx.fetchall_raw("SELECT @@innodb_buffer_pool_size DIV 1048576 AS mb"))
        )[0]["mb"]
        table_mb = (
            await bdb.db.run(
                lambda tx: tx.fetchall_raw(
                    "SELECT (data_length + index_length) DIV 1048576 AS mb FROM information_schema.tables "
                    "WHERE table_schema = DATABASE() AND table_name = 'tasks'"
                )
            )
        )[0]["mb"]
        submitter = await make_app(bdb.db, "s5-submit")
        burster = await make_app(bdb.db, "s5-burst")
        await seed_tasks(bdb.db, burster, max(args.s5_submits * 20, 20_000))
        async with node_process(bdb.dsn) as node:
            idle = await submit_phase(node, submitter, args.s5_submits)
            burst = await submit_phase(node, submitter, args.s5_submits, burst_app=burster, capacity=args.capacity)
    claims = {s.name: summarize(timed[s.name]) for s in shapes}
    read_stats = {s.name: summarize(reads[s.name]) for s in shapes}
    plain = claims["plain"]
    ratios = {s.name: ratio(claims[s.name]["p99"], plain["p99"]) for s in shapes}
    shape_rows = [
        [
            s.name,
            s.holds,
            claims[s.name]["count"],
            ms(claims[s.name]["p50"]),
            ms(claims[s.name]["p99"]),
            ms(claims[s.name]["max"]),
            ratios[s.name],
            read_stats[s.name]["mean"],
            read_stats[s.name]["max"],
        ]
        for s in shapes
    ]
    shape_table = format_table(
        ["shape", "queue holds", "claims", "p50 ms", "p99 ms", "max ms", "p99 / plain", "rows read", "max"],
        shape_rows,
        align="llrrrrrrr",
    )
    submit_rows = [
        [
            "submit, idle node",
            idle["latency_s"]["count"],
            ms(idle["latency_s"]["p50"]),
            ms(idle["latency_s"]["p99"]),
            ms(idle["latency_s"]["max"]),
        ],
        [
            f"submit, claim burst ({burst['burst_tasks_per_s']:,.0f} tasks/s)",
            burst["latency_s"]["count"],
            ms(burst["latency_s"]["p50"]),
            ms(burst["latency_s"]["p99"]),
            ms(burst["latency_s"]["max"]),
        ],
    ]
    submit_table = format_table(["operation", "n", "p50 ms", "p99 ms", "max ms"], submit_rows)
    targets = [
        Target.at_most(
            f"S5 claim p99, {s.name} / plain",
            ratios[s.name],
            TARGET_CLAIM_RATIO,
            unit="x",
            note=f"rows read per claim {read_stats[s.name]['mean']:.0f} (plain {read_stats['plain']['mean']:.0f})",
        )
        for s in shapes
        if s.name != "plain"
    ]
    notes = [
        f"one application, one queue per shape, each with the claimer's {args.s5_due:,} due tasks (topped up after "
        f"every claim); seeding took {seed_s:.0f} s, then InnoDB's history list was let drain (now {history}); "
        f"timed claims alternate between the shapes (one loop, batch {CLAIM_BATCH}, each followed by start, finish "
        "and the top-up), so all see the same machine.",
        f"rows read: Handler_read_* (all but rnd_next) of the session around each of {args.s5_read_claims} claims per "
        "shape on a one-connection pool, index condition pushdown off, less what reading the counters costs.",
        f"tasks table {table_mb:,} MB (data + indexes) against a {buffer_pool_mb:,} MB buffer pool.",
        f"submit p99 during the burst is {ratio(burst['latency_s']['p99'], idle['latency_s']['p99']):.2f}x the "
        f"idle node's ({SUBMIT_CLIENTS} clients back to back; burst: {BURST_CONNECTIONS} Worker connections "
        "draining a seeded backlog).",
    ]
    if not window_held:
        notes.append(
            f"the priority window shape stopped being measured {WINDOW_AHEAD_S - WINDOW_MARGIN_S} s after its "
            f"seeding (its tasks were about to become due): {claims['priority window']['count']} claims timed."
        )
    return {
        "scenario": "s5",
        "server": bdb.server_version,
        "figures": {
            "claims_s": claims,
            "rows_read": read_stats,
            "claim_p99_ratio": ratios,
            "submit_idle": idle,
            "submit_burst": burst,
            "seed_s": seed_s,
            "history_after_seed": history,
            "buffer_pool_mb": buffer_pool_mb,
            "tasks_table_mb": table_mb,
            "shapes": [attrs.asdict(s) for s in shapes],
            "samples": timed,
        },
        "tables": [shape_table, submit_table],
        "targets": targets,
        "notes": notes,
    }


def plot(report: dict[str, Any], outdir, plots) -> list:
    return [
        plots.cdf(
            outdir / "s5-claim-latency.png",
            report["figures"]["samples"],
            title="S5: claim latency per queue shape",
            xlabel="seconds per claim (batch 16)",
        )
    ]
