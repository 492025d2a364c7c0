"""Micro-benchmark: the dispatch core's claim -> start -> finish SQL in a bare loop.

No HTTP, no WebSocket: ``W`` concurrent loops each claim a batch, start it and finish
it (three transactions per batch) until the queue is drained. In the same run, on the
same server and the same number of connections, it measures the database's raw commit
rate (single-row autocommit INSERTs) before and after, and prints the ratio.

    python -m bench claim [--tasks N] [--batches 1,16] [--workers W] [--commit-seconds S]

The database comes from ORBIT_BENCH_MYSQL_DSN (default: ``scripts/devdb.sh dsn``); the
benchmark creates its own database there and drops it afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import time
from pathlib import Path
from typing import Any

import attrs
import trio

from orbit_node.db import Database, migrate
from orbit_node.domain.claims import Capability, ClaimRequest
from orbit_node.domain.ownership import FinishItem, Outcome
from orbit_node.store.leases import LeaseStore
from orbit_node.store.tenancy import TenancyStore

from .database import admin_sql, bench_dsn

HANDLER = Capability("bench.noop", "v1", "v1")


@attrs.frozen
class DispatchRun:
    batch: int
    tasks: int
    seconds: float
    transactions: int
    replays: int
    claims: int = 0

    @property
    def tasks_per_s(self) -> float:
        return self.tasks / self.seconds

    @property
    def transactions_per_s(self) -> float:
        return self.transactions / self.seconds


async def commit_rate(db: Database, *, connections: int, seconds: float) -> float:
    """Single-row autocommit INSERTs on ``connections`` connections: commits per second."""
    count = 0
    deadline = trio.current_time() + seconds

    async def loop():
        nonlocal count
        while trio.current_time() < deadline:
            await db.run(lambda tx: tx.execute_raw("INSERT INTO bench_commit (v) VALUES (1)"))
            count += 1

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(loop)
    return count / (time.perf_counter() - started)


async def seed_tasks(db: Database, owner: dict[str, str], count: int) -> None:
    """``count`` due no-op tasks in one INSERT ... SELECT over a cross join of digits."""
    digits = len(str(max(count - 1, 1)))
    tables = ", ".join(
        f"(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL "
        f"SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) d{i}"
        for i in range(digits)
    )
    number = " + ".join(f"d{i}.d * {10**i}" for i in range(digits))
    prefix = secrets.token_hex(4)
    await db.run(
        lambda tx: tx.execute_raw(
            "INSERT INTO tasks (task_id, application_id, namespace_id, queue_id, handler, handler_version, "
            "payload_version, payload, available_at) "
            f"SELECT CONCAT(%s, LPAD(LOWER(HEX(n)), 24, '0')), %s, %s, %s, %s, %s, %s, '{{}}', "
            f"NOW(6) - INTERVAL 1 SECOND FROM (SELECT {number} AS n FROM {tables}) seq WHERE n < %s",
            (prefix, owner["application_id"], owner["namespace_id"], owner["queue_id"], *attrs.astuple(HANDLER), count),
        )
    )


async def drain(store: LeaseStore, owner: dict[str, str], *, tasks: int, workers: int, batch: int) -> DispatchRun:
    done = 0
    transactions = 0
    claims = 0

    async def worker(index: int):
        nonlocal done, transactions, claims
        request = ClaimRequest(
            namespace_id=owner["namespace_id"],
            application_id=owner["application_id"],
            queue_ids=(owner["queue_id"],),
            capabilities=frozenset({HANDLER}),
            resource_key_support=False,
            limit=batch,
            node_id="b" * 32,
            connection_id=f"bench-{index}",
        )
        while done < tasks:
            reservations = await store.claim(request)
            transactions += 1
            claims += 1
            if not reservations:
                continue
            tokens = [(r.task_id, r.fencing_token) for r in reservations]
            started = await store.start_many(tokens)
            finished = await store.finish_many(
                FinishItem(r.task_id, r.fencing_token, "null")
                for r, s in zip(reservations, started, strict=True)
                if s.outcome is Outcome.STARTED
            )
            transactions += 2
            done += sum(1 for f in finished if f.outcome is Outcome.SUCCEEDED)

    replays_before = store.db.replays
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for index in range(workers):
            nursery.start_soon(worker, index)
    seconds = time.perf_counter() - started
    return DispatchRun(batch, done, seconds, transactions, store.db.replays - replays_before, claims)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server = bench_dsn()
    name = "orbit_bench_" + secrets.token_hex(4)
    await admin_sql(server, f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    dsn = server.with_database(name)
    db = Database(dsn, size=args.workers + 2)
    try:
        await migrate.up(db)
        await db.run(
            lambda tx: tx.execute_raw(
                "CREATE TABLE bench_commit (id BIGINT AUTO_INCREMENT PRIMARY KEY, v INT) ENGINE=InnoDB"
            )
        )
        tenancy = TenancyStore(db)
        app = await tenancy.ensure_application("bench")
        ns = await tenancy.ensure_namespace(app["application_id"], "bench", "test")
        queue, _ = await tenancy.create_queue(ns["namespace_id"], app["application_id"], "bench")
        owner = {
            "application_id": app["application_id"],
            "namespace_id": ns["namespace_id"],
            "queue_id": queue.queue_id,
        }
        version = (await db.run(lambda tx: tx.fetchall_raw("SELECT VERSION() AS v")))[0]["v"]

        commits_before = await commit_rate(db, connections=args.workers, seconds=args.commit_seconds)
        runs = []
        for batch in args.batches:
            await seed_tasks(db, owner, args.tasks)
            store = LeaseStore(db, reservation_lease_s=30, run_lease_s=60, batch_size=batch)
            runs.append(await drain(store, owner, tasks=args.tasks, workers=args.workers, batch=batch))
        commits_after = await commit_rate(db, connections=args.workers, seconds=args.commit_seconds)
    finally:
        with trio.CancelScope(shield=True):
            await db.aclose()
            await admin_sql(server, f"DROP DATABASE IF EXISTS `{name}`")

    commits = (commits_before + commits_after) / 2
    return {
        "scenario": "claim",
        "server": version,
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}",
        "workers": args.workers,
        "raw_commits_per_s": {"before": round(commits_before), "after": round(commits_after), "mean": round(commits)},
        "runs": [
            {
                "batch": r.batch,
                "tasks": r.tasks,
                "seconds": round(r.seconds, 3),
                "tasks_per_s": round(r.tasks_per_s),
                "transactions_per_s": round(r.transactions_per_s),
                "tasks_per_raw_commit": round(r.tasks_per_s / commits, 3),
                "transactions_per_raw_commit": round(r.transactions_per_s / commits, 3),
                "replays": r.replays,
            }
            for r in runs
        ],
    }


def print_report(report: dict[str, Any]) -> None:
    commits = report["raw_commits_per_s"]
    print(f"server: {report['server']}   machine: {report['machine']}   connections: {report['workers']}")
    print(
        f"raw commit rate (1-row autocommit INSERT): {commits['mean']:,} commits/s "
        f"(before {commits['before']:,}, after {commits['after']:,})"
    )
    print()
    print(
        f"{'batch':>5}  {'tasks':>7}  {'tasks/s':>9}  {'txn/s':>8}  {'tasks/commit':>12}  {'txn/commit':>10}  {'replays':>7}"
    )
    for r in report["runs"]:
        print(
            f"{r['batch']:>5}  {r['tasks']:>7}  {r['tasks_per_s']:>9,}  {r['transactions_per_s']:>8,}  "
            f"{r['tasks_per_raw_commit']:>12.3f}  {r['transactions_per_raw_commit']:>10.3f}  {r['replays']:>7}"
        )
    print()
    print("tasks/commit: claim->start->finish tasks per second divided by the raw commit rate of the same run;")
    print("txn/commit: the dispatch transactions (3 per batch, plus empty claims) per raw commit.")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench claim", description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks drained per batch size (default 10000)")
    parser.add_argument(
        "--batches",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 16],
        help="comma-separated claim batch sizes (default 1,16)",
    )
    parser.add_argument(
        "--workers", type=int, default=4, help="concurrent loops = connections (default 4, the claim slots)"
    )
    parser.add_argument("--commit-seconds", type=float, default=3.0, help="length of each raw commit-rate measurement")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.workers < 1 or any(b < 1 for b in args.batches) or args.commit_seconds <= 0:
        parser.error("--tasks, --workers, --batches and --commit-seconds must be positive")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    report = trio.run(run, args)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0
