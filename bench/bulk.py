"""Bulk submit: tasks/s through OrbitClient.submit_many, beside single submits.

A real node process. ``--bulk-tasks`` tasks go through ``submit_many`` (``POST
/v1/tasks/batch``, ``--bulk-batch`` tasks per request, ``--bulk-clients`` clients back to
back); tasks/s = tasks / (first request -> last answer), every task committed (checked
by counting the rows). In the same run, ``--bulk-single-tasks`` tasks go through
``submit_task`` (16 clients) for the ratio. Target: >= 10,000 tasks/s in batches of 1,000.
"""

from __future__ import annotations

import argparse
import secrets
import time
from typing import Any

import trio

from orbit_node.sdk import OrbitClient

from .common import (
    bench_database,
    count_tasks,
    make_app,
    measured_phase,
    node_process,
    submit_closed_loop,
    submit_request,
)
from .report import Target, format_table, ms, ratio, summarize

TARGET_TASKS_PER_S = 10_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bulk-tasks", type=int, default=50_000, help="bulk: tasks through submit_many (50000)")
    parser.add_argument("--bulk-batch", type=int, default=1_000, help="bulk: tasks per request, 1-1000 (1000)")
    parser.add_argument("--bulk-clients", type=int, default=2, help="bulk: clients sending batches at once (2)")
    parser.add_argument(
        "--bulk-single-tasks", type=int, default=2_000, help="bulk: tasks through submit_task, for the ratio (2000)"
    )


async def submit_bulk(
    url: str, token: str, queue_id: str, tasks: int, *, batch: int, clients: int, return_tasks: bool = True
) -> list[float]:
    """``tasks`` tasks in batches of ``batch`` by ``clients`` clients; per-batch seconds."""
    latencies: list[float] = []
    starts = iter(range(0, tasks, batch))
    run = secrets.token_hex(4)

    async def client_loop() -> None:
        async with OrbitClient(url, token) as client:
            for start in starts:
                pairs = [(f"bulk-{run}-{i}", submit_request(queue_id)) for i in range(start, min(start + batch, tasks))]
                began = time.perf_counter()
                results = await client.submit_many(pairs, batch_size=batch, return_tasks=return_tasks)
                latencies.append(time.perf_counter() - began)
                refused = [r.error for r in results if r.error is not None]
                if refused:
                    raise RuntimeError(f"bulk submit refused {len(refused)} tasks: {refused[0]}")

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(client_loop)
    return latencies


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with bench_database() as bdb, node_process(bdb.dsn) as node:
        single_app = await make_app(bdb.db, "bulk-single")
        started = time.perf_counter()
        single_lat = await submit_closed_loop(node.url, single_app.token, single_app.queue_id, args.bulk_single_tasks)
        single = {"tasks": args.bulk_single_tasks, "seconds": time.perf_counter() - started}
        single["tasks_per_s"] = single["tasks"] / single["seconds"]
        single["latency_s"] = summarize(single_lat)

        # Each mode on an application (and a queue) of its own: the whole answer, then ids
        # and states only (Prefer: return=minimal).
        modes = {}
        for name, return_tasks in (("tasks", True), ("minimal", False)):
            app = await make_app(bdb.db, f"bulk-{name}")
            with measured_phase(node.pid, profile=not args.no_profile and not return_tasks) as phase:
                started = time.perf_counter()
                bulk_lat = await submit_bulk(
                    node.url,
                    app.token,
                    app.queue_id,
                    args.bulk_tasks,
                    batch=args.bulk_batch,
                    clients=args.bulk_clients,
                    return_tasks=return_tasks,
                )
                seconds = time.perf_counter() - started
            stored = await count_tasks(bdb.db, "application_id = %s", (app.application_id,))
            modes[name] = {
                "tasks": args.bulk_tasks,
                "stored": stored,
                "batch": args.bulk_batch,
                "clients": args.bulk_clients,
                "seconds": seconds,
                "tasks_per_s": args.bulk_tasks / seconds,
                "batch_latency_s": summarize(bulk_lat),
                "cpu": phase.cpu,
                "profile": phase.profile,
            }
    bulk, minimal = modes["tasks"], modes["minimal"]
    table = format_table(
        ["mode", "tasks", "seconds", "tasks/s", "x single", "request p50 ms", "request p99 ms", "cpu busy"],
        [
            [
                f"submit_many, batches of {bulk['batch']}, {bulk['clients']} clients",
                bulk["tasks"],
                bulk["seconds"],
                bulk["tasks_per_s"],
                ratio(bulk["tasks_per_s"], single["tasks_per_s"]),
                ms(bulk["batch_latency_s"]["p50"]),
                ms(bulk["batch_latency_s"]["p99"]),
                bulk["cpu"].get("machine_utilisation", "-"),
            ],
            [
                f"submit_many(return_tasks=False), batches of {minimal['batch']}, {minimal['clients']} clients",
                minimal["tasks"],
                minimal["seconds"],
                minimal["tasks_per_s"],
                ratio(minimal["tasks_per_s"], single["tasks_per_s"]),
                ms(minimal["batch_latency_s"]["p50"]),
                ms(minimal["batch_latency_s"]["p99"]),
                minimal["cpu"].get("machine_utilisation", "-"),
            ],
            [
                "submit_task, 16 clients",
                single["tasks"],
                single["seconds"],
                single["tasks_per_s"],
                1.0,
                ms(single["latency_s"]["p50"]),
                ms(single["latency_s"]["p99"]),
                "-",
            ],
        ],
    )
    targets = [
        Target.at_least(
            f"bulk submit (submit_many, batches of {m['batch']}{', ids only' if name == 'minimal' else ''})",
            m["tasks_per_s"],
            TARGET_TASKS_PER_S,
            unit=" tasks/s",
            note="end to end: SDK -> HTTP -> node -> MariaDB -> answer",
        )
        for name, m in modes.items()
    ]
    notes = [
        "tasks/s = tasks / (first request -> last answer); the node, the clients and MariaDB share the machine.",
    ]
    for name, m in modes.items():
        if m["stored"] != m["tasks"]:
            notes.append(f"WARNING: {name}: {m['stored']} of {m['tasks']} tasks stored")
    return {
        "scenario": "bulk",
        "server": bdb.server_version,
        "figures": {
            "bulk": {k: v for k, v in bulk.items() if k != "profile"},
            "minimal": {k: v for k, v in minimal.items() if k != "profile"},
            "single": single,
        },
        "tables": [table],
        "targets": targets,
        "notes": notes,
        "profiles": {"the node, bulk submit (ids only)": minimal["profile"]} if minimal["profile"] else {},
    }


def plot(report: dict[str, Any], outdir, plots) -> list:
    figures = report["figures"]
    return [
        plots.bar(
            outdir / "bulk-throughput.png",
            [f"submit_many ({figures['bulk']['batch']})", "submit_many, ids only", "submit_task"],
            [figures["bulk"]["tasks_per_s"], figures["minimal"]["tasks_per_s"], figures["single"]["tasks_per_s"]],
            title="Bulk submit: tasks/s",
            ylabel="tasks/s",
        )
    ]
