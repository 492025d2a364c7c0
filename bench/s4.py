"""S4 fairness: one application floods, two small ones keep a steady load.

Application A: 10 queues, 40 connections (4 per queue), a large seeded backlog.
Applications B and C: 1 queue and 1 connection each, Poisson arrivals over HTTP.
Phases, each on a fresh node process (so the claim pool's counters start at zero):

* ``alone``: B and C only: their baseline wait.
* ``flood``: A floods while B and C keep their steady load: claim turns and
  throughput per application, B's and C's p99 wait relative to ``alone``.
* ``busy``: A, B and C all have a backlog: claim turns per busy application (Jain's
  index, min/max share); ``busy, pacing lifted`` repeats it with the per-connection
  pace out of the way (diagnostic), to separate the rotation from the pace.

Claim turns per application come from the node's ``ClaimPool.statistics()``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import trio

from .common import (
    App,
    bench_database,
    connection_plan,
    make_app,
    node_process,
    seed_tasks,
    submit_open_loop,
    task_times,
    worker_fleet,
)
from .report import Target, fairness, format_table, ms, ratio, summarize
from .s1 import LIFTED_PACE

# Issue 8 target: Jain's index on claim turns between busy applications.
TARGET_JAIN = 0.99
# Issue 13 target: B's p99 wait with A flooding over B's p99 alone.
TARGET_FLOOD_P99_RATIO = 1.2
A_QUEUES = 10
A_CONNECTIONS = 40
# Turn counts are plotted per this many seconds.
SERIES_STEP_S = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--s4-seconds", type=float, default=20.0, help="S4: measured window per phase (default 20)")
    parser.add_argument("--s4-backlog", type=int, default=30_000, help="S4: A's backlog (default 30000)")
    parser.add_argument("--s4-rate", type=float, default=20.0, help="S4: B's and C's arrivals/s each (default 20)")


async def _phase(
    bdb,
    name: str,
    *,
    seconds: float,
    rate: float,
    backlog: int,
    flood: bool,
    busy: bool,
    pace: int | None,
    capacity: int,
) -> dict[str, Any]:
    a = await make_app(bdb.db, f"A-{name}", queues=A_QUEUES) if flood else None
    b = await make_app(bdb.db, f"B-{name}")
    c = await make_app(bdb.db, f"C-{name}")
    if a is not None:
        for queue_id in a.queue_ids:
            await seed_tasks(bdb.db, a, backlog // A_QUEUES, queue_id=queue_id)
    if busy:
        for small in (b, c):
            await seed_tasks(bdb.db, small, max(backlog // 4, 1000))
    apps: dict[str, App] = {app.name.split("-")[0]: app for app in (a, b, c) if app is not None}
    plan = (connection_plan(a, A_CONNECTIONS) if a else []) + connection_plan(b, 1) + connection_plan(c, 1)
    async with node_process(bdb.dsn, claims_per_connection_per_cycle=pace) as node:
        async with worker_fleet(node.url, plan, capacity=capacity):
            await trio.sleep(1.0)  # every connection has said hello and made its first claim
            before = node.last_stats()
            t0 = time.time()
            if busy:
                await trio.sleep(seconds)
            else:
                async with trio.open_nursery() as nursery:
                    for index, small in enumerate((b, c)):
                        nursery.start_soon(
                            lambda s=small, i=index: submit_open_loop(
                                node.url, s.token, s.queue_id, rate=rate, duration_s=seconds, seed=11 + i
                            )
                        )
            t1 = time.time()
            await trio.sleep(0.5)
            after = node.last_stats()
            stats = node.stats()
    names = {app.application_id: key for key, app in apps.items()}
    turns = {
        key: after.get("turns_by_application", {}).get(app.application_id, 0)
        - before.get("turns_by_application", {}).get(app.application_id, 0)
        for key, app in apps.items()
    }
    series = _turn_series(stats, names, t0, t1)
    finished, waits = {}, {}
    for key, app in apps.items():
        rows = await task_times(bdb.db, "application_id = %s AND state = 'succeeded'", (app.application_id,))
        finished[key] = sum(1 for r in rows if r["finished"] is not None and t0 <= r["finished"] <= t1)
        if not busy and key in ("B", "C"):
            waits[key] = summarize(r["to_start"] for r in rows)
    return {
        "name": name,
        "window_s": t1 - t0,
        "turns": turns,
        "turn_fairness": fairness(turns),
        "throughput": {k: v / (t1 - t0) for k, v in finished.items()},
        "throughput_fairness": fairness(finished),
        "waits_s": waits,
        "series": series,
        "pace": pace,
    }


def _turn_series(stats: list[dict[str, Any]], names: dict[str, str], t0: float, t1: float) -> dict[str, list]:
    """Claim turns per application per ``SERIES_STEP_S``, from the node's cumulative counters."""
    series: dict[str, list] = {name: [] for name in names.values()}
    previous: dict[str, int] | None = None
    next_t = t0
    for line in stats:
        if line["t"] < next_t:
            continue
        current = {names[a]: n for a, n in line.get("turns_by_application", {}).items() if a in names}
        if previous is not None:
            for name in series:
                series[name].append((round(line["t"] - t0, 2), current.get(name, 0) - previous.get(name, 0)))
        previous = current
        next_t = line["t"] + SERIES_STEP_S
        if line["t"] > t1:
            break
    return series


async def run(args: argparse.Namespace) -> dict[str, Any]:
    common = {"seconds": args.s4_seconds, "rate": args.s4_rate, "backlog": args.s4_backlog, "capacity": args.capacity}
    async with bench_database() as bdb:
        phases = [
            await _phase(bdb, "alone", flood=False, busy=False, pace=None, **common),
            await _phase(bdb, "flood", flood=True, busy=False, pace=None, **common),
            await _phase(bdb, "busy", flood=True, busy=True, pace=None, **common),
        ]
        if not args.no_diagnose:
            phases.append(await _phase(bdb, "busy-lifted", flood=True, busy=True, pace=LIFTED_PACE, **common))
    by = {p["name"]: p for p in phases}
    rows = []
    for p in phases:
        tf, hf = p["turn_fairness"], p["throughput_fairness"]
        rows.append(
            [
                p["name"],
                *(f"{p['turns'].get(k, 0):,} ({tf['shares'].get(k, 0):.0%})" for k in "ABC"),
                tf["jain"],
                tf["min_over_max"],
                *(f"{p['throughput'].get(k, 0):,.0f} ({hf['shares'].get(k, 0):.0%})" for k in "ABC"),
                hf["jain"],
            ]
        )
    table = format_table(
        [
            "phase",
            "turns A",
            "turns B",
            "turns C",
            "turns Jain",
            "min/max",
            "tasks/s A",
            "tasks/s B",
            "tasks/s C",
            "tput Jain",
        ],
        rows,
        align="lrrrrrrrrr",
    )
    wait_rows = []
    for key in ("B", "C"):
        alone, flood = by["alone"]["waits_s"].get(key, {}), by["flood"]["waits_s"].get(key, {})
        wait_rows.append(
            [
                key,
                ms(alone.get("p50", float("nan"))),
                ms(alone.get("p99", float("nan"))),
                ms(flood.get("p50", float("nan"))),
                ms(flood.get("p99", float("nan"))),
                ratio(flood.get("p99"), alone.get("p99")),
            ]
        )
    wait_table = format_table(
        ["app", "alone p50 ms", "alone p99 ms", "with A flooding p50 ms", "p99 ms", "p99 flood/alone"], wait_rows
    )
    b_alone, b_flood = by["alone"]["waits_s"].get("B", {}), by["flood"]["waits_s"].get("B", {})
    targets = [
        Target.at_most(
            "S4 B's p99 wait, A flooding / alone",
            ratio(b_flood.get("p99"), b_alone.get("p99")),
            TARGET_FLOOD_P99_RATIO,
            unit="x",
            note="available -> start, database clock",
        ),
        Target.at_least(
            "S4 Jain on claim turns, busy apps",
            by["busy"]["turn_fairness"]["jain"],
            TARGET_JAIN,
            note="A: 40 connections; B, C: 1 connection each, P3 pacing on",
        ),
    ]
    if "busy-lifted" in by:
        targets.append(
            Target.at_least(
                "S4 Jain, busy apps, pacing lifted",
                by["busy-lifted"]["turn_fairness"]["jain"],
                TARGET_JAIN,
                note="diagnostic: the rotation alone",
            )
        )
    return {
        "scenario": "s4",
        "server": bdb.server_version,
        "figures": {"phases": phases},
        "tables": [table, wait_table],
        "targets": targets,
        "notes": [
            f"A: {A_QUEUES} queues x {A_CONNECTIONS // A_QUEUES} connections, backlog {args.s4_backlog:,}; B, C: 1 queue, "
            f"1 connection, {args.s4_rate:g} arrivals/s each (busy phases: a backlog instead); capacity "
            f"{args.capacity}; {args.s4_seconds:g} s windows. Waits: available -> start, database clock.",
            "One connection may be granted at most 4 claims per 1 s cycle (P3 pacing): B and C with one "
            "connection each can never take more than 4 turns/s, whatever the rotation does.",
        ],
    }


def plot(report: dict[str, Any], outdir, plots) -> list:
    out = []
    for phase in report["figures"]["phases"]:
        out.append(
            plots.lines(
                outdir / f"s4-turns-{phase['name']}.png",
                phase["series"],
                title=f"S4 {phase['name']}: claim turns per application per second",
                xlabel="seconds into the window",
                ylabel="claim turns / s",
            )
        )
    return out
