"""Locks: row lock waits of claims across nodes, with an application quota and resource keys.

``--locks-nodes`` "nodes", each a process of its own (``python -m bench.locks SPEC
OUT``) with its own ``Database`` pool and ``LeaseStore`` as a node has, x
``--locks-claimers`` concurrent claimers each claim a batch of 16 from one of the
application's queues, start it and finish it, until the backlog is drained or the
window ends. Two phases in the same run, each on its own application and
backlog: ``plain`` (no quota, no resource keys) and ``quota + keys`` (the application's
``max_concurrent_executions`` and ``max_starts_per_second`` set, every other task naming
one of ``--locks-keys`` resource keys, claimers with key support). Around each phase
MariaDB's global ``Innodb_row_lock_waits``, ``Innodb_row_lock_time`` and
``Innodb_deadlocks``: how often and how long claims, starts and finishes waited for a
row another transaction held (the quota rows, key rows, task rows).
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from orbit_node.db import Database
from orbit_node.domain.claims import Capability, ClaimRequest
from orbit_node.domain.dsn import Dsn
from orbit_node.domain.ownership import FinishItem, Outcome
from orbit_node.store.leases import LeaseStore
from orbit_node.store.tenancy import TenancyStore

from . import HANDLER, REPO
from .database import App, bench_database, count_tasks, make_app, seed_tasks, server_status
from .report import format_table, ms, ratio, summarize

CLAIM_BATCH = 16
# A claimer that found nothing (quota used up, keys busy, queue drained) waits this
# long before it asks again, as a paced node connection would.
EMPTY_PAUSE_S = 0.005
# Node processes start claiming together this long after they are launched, and stop
# (drained or out of time) within NODE_STOP_S after their window.
NODE_START_S = 3.0
NODE_STOP_S = 15.0
# How often a node checks whether the application has any live task left.
DRAIN_POLL_S = 0.25
# MariaDB's global status counters read around each phase (server-wide).
LOCK_COUNTERS = ("Innodb_row_lock_waits", "Innodb_row_lock_time", "Innodb_deadlocks")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--locks-nodes", type=int, default=4, help="locks: nodes, each its own pool (default 4)")
    parser.add_argument(
        "--locks-claimers", type=int, default=16, help="locks: concurrent claimers per node (default 16)"
    )
    parser.add_argument("--locks-queues", type=int, default=4, help="locks: queues of the application (default 4)")
    parser.add_argument("--locks-tasks", type=int, default=50_000, help="locks: backlog per phase (default 50000)")
    parser.add_argument(
        "--locks-seconds", type=float, default=20.0, help="locks: longest measured window per phase (default 20)"
    )
    parser.add_argument(
        "--locks-keys", type=int, default=64, help="locks: distinct resource keys, quota + keys phase (default 64)"
    )
    parser.add_argument(
        "--locks-max-concurrent",
        type=int,
        default=256,
        help="locks: the application's max_concurrent_executions, quota + keys phase (default 256)",
    )
    parser.add_argument(
        "--locks-max-starts",
        type=int,
        default=1000,
        help="locks: the application's max_starts_per_second, quota + keys phase (default 1000)",
    )


async def _seed(db: Database, app: App, tasks: int, keys: int | None) -> None:
    """The backlog, spread over the queues; with ``keys``, every other task names one of them
    (and, as a submit does, its occupancy row exists)."""
    per_queue = max(1, tasks // len(app.queue_ids))
    key = "NULL" if keys is None else f"IF(MOD(n, 2) = 0, CONCAT('k', MOD(n DIV 2, {keys})), NULL)"
    for queue_id in app.queue_ids:
        await seed_tasks(db, app, per_queue, queue_id=queue_id, available_s="-1", resource_key=key)
    if keys is not None:
        await db.run(
            lambda tx: tx.execute_raw(
                "INSERT IGNORE INTO resource_keys (namespace_id, resource_key) "
                "SELECT DISTINCT namespace_id, resource_key FROM tasks "
                "WHERE application_id = %s AND resource_key IS NOT NULL",
                (app.application_id,),
            )
        )


async def _node(
    dsn: Dsn,
    node: int,
    *,
    claimers: int,
    app: dict[str, Any],
    key_support: bool,
    start_at: float,
    seconds: float,
) -> dict[str, Any]:
    """One node: ``claimers`` loops on one pool, from ``start_at`` (epoch) until the
    application has no live task left or ``seconds`` have passed."""
    pool = Database(dsn, size=claimers)
    store = LeaseStore(pool, reservation_lease_s=30, run_lease_s=60, batch_size=CLAIM_BATCH)
    queue_ids = app["queue_ids"]
    latencies: list[float] = []
    counts = {"claims": 0, "empty": 0, "tasks": 0}

    async def claimer(index: int) -> None:
        request = ClaimRequest(
            namespace_id=app["namespace_id"],
            application_id=app["application_id"],
            queue_ids=(queue_ids[(node * claimers + index) % len(queue_ids)],),
            capabilities=frozenset({Capability(*HANDLER)}),
            resource_key_support=key_support,
            limit=CLAIM_BATCH,
            node_id=f"{node:032x}",
            connection_id=f"locks-{node}-{index}",
        )
        while True:
            started = time.perf_counter()
            reservations = await store.claim(request)
            latencies.append(time.perf_counter() - started)
            counts["claims"] += 1
            if not reservations:
                counts["empty"] += 1
                await trio.sleep(EMPTY_PAUSE_S)
                continue
            results = await store.start_many([(r.task_id, r.fencing_token) for r in reservations])
            finished = await store.finish_many(
                FinishItem(r.task_id, r.fencing_token, "null")
                for r, s in zip(reservations, results, strict=True)
                if s.outcome is Outcome.STARTED
            )
            counts["tasks"] += sum(1 for f in finished if f.ok)

    async def until_drained() -> None:
        while True:
            await trio.sleep(DRAIN_POLL_S)
            live = await count_tasks(
                pool, "application_id = %s AND state IN ('queued', 'reserved', 'running')", (app["application_id"],)
            )
            if not live:
                return

    try:
        await pool.run(lambda tx: tx.fetchall_raw("SELECT 1"))
        await trio.sleep(max(0.0, start_at - time.time()))
        begin = time.time()
        with trio.move_on_after(seconds):
            async with trio.open_nursery() as nursery:
                for index in range(claimers):
                    nursery.start_soon(claimer, index)
                await until_drained()
                nursery.cancel_scope.cancel()
        end = time.time()
    finally:
        with trio.CancelScope(shield=True):
            await pool.aclose()
    return {**counts, "begin": begin, "end": end, "latencies": latencies, "replays": pool.replays}


async def _phase(bdb, name: str, args: argparse.Namespace, *, quota_and_keys: bool) -> dict[str, Any]:
    app = await make_app(bdb.db, f"locks-{name.replace(' ', '')}", queues=args.locks_queues)
    keys = args.locks_keys if quota_and_keys else None
    await _seed(bdb.db, app, args.locks_tasks, keys)
    if quota_and_keys:
        await TenancyStore(bdb.db).set_application_quota(
            app.application_id,
            max_concurrent_executions=args.locks_max_concurrent,
            max_starts_per_second=args.locks_max_starts,
        )
    workdir = Path(tempfile.mkdtemp(prefix="orbit-bench-locks-"))
    spec = {
        "dsn": bdb.dsn.url(),
        "claimers": args.locks_claimers,
        "app": {"application_id": app.application_id, "namespace_id": app.namespace_id, "queue_ids": app.queue_ids},
        "key_support": quota_and_keys,
        "start_at": time.time() + NODE_START_S,
        "seconds": args.locks_seconds,
    }
    procs: list[trio.Process] = []
    try:
        before = await server_status(bdb.db, LOCK_COUNTERS)
        for node in range(args.locks_nodes):
            (workdir / f"spec-{node}.json").write_text(json.dumps({**spec, "node": node}))
            procs.append(
                await trio.lowlevel.open_process(
                    [
                        sys.executable,
                        "-m",
                        "bench.locks",
                        str(workdir / f"spec-{node}.json"),
                        str(workdir / f"out-{node}.json"),
                    ],
                    cwd=REPO,
                    stdin=subprocess.DEVNULL,
                )
            )
        with trio.fail_after(NODE_START_S + args.locks_seconds + NODE_STOP_S):
            for proc in procs:
                await proc.wait()
        after = await server_status(bdb.db, LOCK_COUNTERS)
        failed = [node for node, proc in enumerate(procs) if proc.returncode != 0]
        if failed:
            raise RuntimeError(f"locks {name}: node processes {failed} failed")
        nodes = [json.loads((workdir / f"out-{node}.json").read_text()) for node in range(args.locks_nodes)]
    finally:
        with trio.CancelScope(shield=True):
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                await proc.wait()
            shutil.rmtree(workdir, ignore_errors=True)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in LOCK_COUNTERS}
    seconds = max(n["end"] for n in nodes) - min(n["begin"] for n in nodes)
    claims, tasks = sum(n["claims"] for n in nodes), sum(n["tasks"] for n in nodes)
    live = await count_tasks(
        bdb.db, "application_id = %s AND state IN ('queued', 'reserved', 'running')", (app.application_id,)
    )
    return {
        "name": name,
        "seconds": seconds,
        "drained": live == 0,
        "claims": claims,
        "empty_claims": sum(n["empty"] for n in nodes),
        "tasks": tasks,
        "claims_per_s": claims / seconds,
        "tasks_per_s": tasks / seconds,
        "claim_s": summarize(x for n in nodes for x in n["latencies"]),
        "replays": sum(n["replays"] for n in nodes),
        "lock": delta,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with bench_database(pool_size=2) as bdb:
        phases = [
            await _phase(bdb, "plain", args, quota_and_keys=False),
            await _phase(bdb, "quota + keys", args, quota_and_keys=True),
        ]
    rows = []
    for p in phases:
        waits, wait_ms = p["lock"]["Innodb_row_lock_waits"], p["lock"]["Innodb_row_lock_time"]
        rows.append(
            [
                p["name"],
                p["claims_per_s"],
                p["empty_claims"],
                p["tasks_per_s"],
                ms(p["claim_s"]["p50"]),
                ms(p["claim_s"]["p99"]),
                waits,
                wait_ms,
                ratio(wait_ms, waits),
                ratio(waits, p["claims"]),
                p["lock"]["Innodb_deadlocks"],
                p["replays"],
            ]
        )
    table = format_table(
        [
            "phase",
            "claims/s",
            "empty",
            "tasks/s",
            "claim p50 ms",
            "p99 ms",
            "row lock waits",
            "lock time ms",
            "ms per wait",
            "waits per claim",
            "deadlocks",
            "replays",
        ],
        rows,
    )
    claimers = args.locks_nodes * args.locks_claimers
    notes = [
        f"{args.locks_nodes} nodes (processes, each one Database pool of {args.locks_claimers} and one "
        "LeaseStore) x "
        f"{args.locks_claimers} claimers = {claimers} loops of claim (batch {CLAIM_BATCH}) -> start -> finish over "
        f"{args.locks_queues} queues of one application; {args.locks_tasks:,} due tasks per phase, at most "
        f"{args.locks_seconds:g} s per phase (drained: "
        + ", ".join(f"{p['name']} {'yes' if p['drained'] else 'no'} in {p['seconds']:.1f} s" for p in phases)
        + f"); a claim that found nothing is retried after {EMPTY_PAUSE_S * 1000:g} ms.",
        f"quota + keys: max_concurrent_executions {args.locks_max_concurrent}, max_starts_per_second "
        f"{args.locks_max_starts}; every other task names one of {args.locks_keys} resource keys; claimers "
        "support keys.",
        "row lock waits, lock time and deadlocks: MariaDB's global Innodb_row_lock_waits, Innodb_row_lock_time (ms) "
        "and Innodb_deadlocks before and after each phase; server-wide, so exact only when the benchmark runs "
        "alone. replays: transactions the pools replayed after a deadlock or lock-wait timeout.",
    ]
    return {
        "scenario": "locks",
        "server": bdb.server_version,
        "figures": {"phases": phases},
        "tables": [table],
        "targets": [],
        "notes": notes,
    }


def plot(report: dict[str, Any], outdir, plots) -> list:
    phases = report["figures"]["phases"]
    return [
        plots.bar(
            outdir / "locks-row-lock-waits.png",
            [p["name"] for p in phases],
            [p["lock"]["Innodb_row_lock_waits"] / max(p["claims"], 1) for p in phases],
            title="Locks: InnoDB row lock waits per claim",
            ylabel="waits per claim",
        )
    ]


def node_main(argv: list[str]) -> int:
    """``python -m bench.locks SPEC OUT``: one node of a phase, its counts written to OUT."""
    spec = json.loads(Path(argv[0]).read_text())
    result = trio.run(
        functools.partial(
            _node,
            Dsn.parse(spec["dsn"]),
            spec["node"],
            claimers=spec["claimers"],
            app=spec["app"],
            key_support=spec["key_support"],
            start_at=spec["start_at"],
            seconds=spec["seconds"],
        )
    )
    Path(argv[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(node_main(sys.argv[1:]))
