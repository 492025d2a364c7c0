"""S4 fairness: claim turns where the claim pool is the bottleneck; isolation under a flood.

Phases, each on a fresh node process (so the claim pool's counters start at zero):

* ``alone``: applications B and C (1 queue, 1 connection each) with Poisson arrivals
  over HTTP: their baseline wait.
* ``flood``: application A (10 queues, 40 connections, a large seeded backlog) floods
  while B and C keep their steady load: B's and C's p99 wait relative to ``alone``.
* ``pool-bound``: six busy applications (A as above; B-F with 1 queue and 1-2
  connections), each with a seeded backlog, and the node's claim SQL slowed: a proxy in
  front of MariaDB (``bench/proxy.py``) holds each claim's candidate read (the statement
  that names ``ix_tasks_claim``) for ``--s4-claim-delay-ms``, as a slow candidate read
  would take; the node's other SQL passes at once. More busy applications than claim SQL
  slots, and claims slow enough that the slots, not the per-connection pace, limit
  claiming. Claim turns per application: Jain's index and A's share.

Claim turns per application come from the node's ``ClaimPool.statistics()``.
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext
from typing import Any

import attrs
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
from .proxy import delayed_dsn
from .report import Target, fairness, format_table, ms, ratio, summarize
from .s1 import PACE_CLAIMS_PER_S

# Issues 8 and 14: Jain's index on claim turns between busy applications, pool-bound.
TARGET_JAIN = 0.99
# Issue 14: the big application's share of claim turns, pool-bound: at most 1/6 + 2 %.
TARGET_BIG_SHARE = 1 / 6 + 0.02
# Issue 13: B's p99 wait with A flooding over B's p99 alone.
TARGET_FLOOD_P99_RATIO = 1.2
A_QUEUES = 10
A_CONNECTIONS = 40
# The node's claim SQL slots (SchedulerLimits.sql_slots), for the saturation figure.
SQL_SLOTS = 4
# Added to each claim's candidate read in the pool-bound phase: 4 slots then serve about
# 15 claims/s, 2.5 per application of six, under the pace of 4 per connection.
CLAIM_DELAY_MS = 250.0
# The statement the delay applies to: the claim's candidate read names this index.
SLOW_STATEMENT = "ix_tasks_claim"
# Pool-bound phase: the node's claim batch and the Workers' capacity. A connection of
# twice the batch asks again while a batch runs (a request is made once half a batch is
# free), so every application always has a request waiting for its turn.
POOL_CLAIM_BATCH = 16
POOL_CAPACITY = 2 * POOL_CLAIM_BATCH
# Turn counts are plotted per this many seconds.
SERIES_STEP_S = 1.0


@attrs.frozen
class AppSpec:
    """One application of a phase; ``backlog`` 0 means steady arrivals over HTTP instead."""

    key: str
    queues: int
    connections: int
    backlog: int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--s4-seconds", type=float, default=20.0, help="S4: measured window per phase (default 20)")
    parser.add_argument("--s4-backlog", type=int, default=30_000, help="S4: A's backlog, flood phase (default 30000)")
    parser.add_argument("--s4-rate", type=float, default=20.0, help="S4: B's and C's arrivals/s each (default 20)")
    parser.add_argument(
        "--s4-claim-delay-ms",
        type=float,
        default=CLAIM_DELAY_MS,
        help=f"S4: delay added to each claim's candidate read, pool-bound phase (default {CLAIM_DELAY_MS:g})",
    )
    parser.add_argument(
        "--s4-pool-backlog",
        type=int,
        default=6_000,
        help="S4: seeded backlog of each application, pool-bound phase (default 6000)",
    )


def pool_bound_apps(backlog: int) -> list[AppSpec]:
    """A: 10 queues, 40 connections; B-F: 1 queue and 1 or 2 connections."""
    small = [AppSpec(key, 1, connections, backlog) for key, connections in zip("BCDEF", (1, 2, 1, 2, 1), strict=True)]
    return [AppSpec("A", A_QUEUES, A_CONNECTIONS, backlog), *small]


async def _phase(
    bdb,
    name: str,
    specs: list[AppSpec],
    *,
    seconds: float,
    rate: float,
    capacity: int,
    claim_delay_ms: float = 0.0,
    claim_batch_size: int | None = None,
) -> dict[str, Any]:
    apps: dict[str, App] = {}
    for spec in specs:
        app = await make_app(bdb.db, f"{spec.key}-{name}", queues=spec.queues)
        for queue_id in app.queue_ids:
            if spec.backlog:
                await seed_tasks(bdb.db, app, max(1, spec.backlog // spec.queues), queue_id=queue_id)
        apps[spec.key] = app
    steady = [spec.key for spec in specs if not spec.backlog]
    plan = [c for spec in specs for c in connection_plan(apps[spec.key], spec.connections)]
    async with (
        _node_dsn(bdb.dsn, claim_delay_ms) as node_dsn,
        node_process(node_dsn, claim_batch_size=claim_batch_size) as node,
    ):
        async with worker_fleet(node.url, plan, capacity=capacity):
            await trio.sleep(1.0)  # every connection has said hello and made its first claim
            before = node.last_stats()
            t0 = time.time()
            if not steady:
                await trio.sleep(seconds)
            else:
                async with trio.open_nursery() as nursery:
                    for index, key in enumerate(steady):
                        nursery.start_soon(
                            lambda s=apps[key], i=index: submit_open_loop(
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
    window = [line for line in stats if t0 <= line["t"] <= t1]
    if not window or "turns_by_application" not in after:
        raise RuntimeError(f"S4 {name}: the node wrote no statistics during the window (did it stop?)")
    finished, waits = {}, {}
    for key, app in apps.items():
        rows = await task_times(bdb.db, "application_id = %s AND state = 'succeeded'", (app.application_id,))
        finished[key] = sum(1 for r in rows if r["finished"] is not None and t0 <= r["finished"] <= t1)
        if key in steady:
            waits[key] = summarize(r["to_start"] for r in rows)
    return {
        "name": name,
        "apps": [attrs.asdict(s) for s in specs],
        "window_s": t1 - t0,
        "turns": turns,
        "turn_fairness": fairness(turns),
        "throughput": {k: v / (t1 - t0) for k, v in finished.items()},
        "throughput_fairness": fairness(finished),
        "waits_s": waits,
        "series": _turn_series(stats, names, t0, t1),
        "claim_delay_ms": claim_delay_ms,
        "mean_in_flight": _mean(line.get("in_flight", 0) for line in window),
        "mean_pending": _mean(line.get("pending", 0) for line in window),
    }


def _node_dsn(dsn, claim_delay_ms: float):
    """The DSN the node gets: through the delay proxy when ``claim_delay_ms`` is set."""
    return delayed_dsn(dsn, claim_delay_ms, only=SLOW_STATEMENT) if claim_delay_ms > 0 else nullcontext(dsn)


def _mean(values) -> float:
    data = list(values)
    return sum(data) / len(data) if data else float("nan")


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
    common = {"seconds": args.s4_seconds, "rate": args.s4_rate}
    steady = [AppSpec("B", 1, 1, 0), AppSpec("C", 1, 1, 0)]
    async with bench_database() as bdb:
        phases = [
            await _phase(bdb, "alone", steady, capacity=args.capacity, **common),
            await _phase(
                bdb,
                "flood",
                [AppSpec("A", A_QUEUES, A_CONNECTIONS, args.s4_backlog), *steady],
                capacity=args.capacity,
                **common,
            ),
            await _phase(
                bdb,
                "pool-bound",
                pool_bound_apps(args.s4_pool_backlog),
                capacity=POOL_CAPACITY,
                claim_delay_ms=args.s4_claim_delay_ms,
                claim_batch_size=POOL_CLAIM_BATCH,
                **common,
            ),
        ]
    by = {p["name"]: p for p in phases}
    turn_rows = []
    for p in phases:
        tf, hf = p["turn_fairness"], p["throughput_fairness"]
        for spec in p["apps"]:
            key = spec["key"]
            turn_rows.append(
                [
                    p["name"],
                    key,
                    f"{spec['queues']} x {spec['connections']}",
                    p["turns"].get(key, 0) / p["window_s"],
                    f"{tf['shares'].get(key, 0):.1%}",
                    p["throughput"].get(key, 0),
                    f"{hf['shares'].get(key, 0):.1%}",
                ]
            )
    turn_table = format_table(
        ["phase", "app", "queues x conns", "turns/s", "turn share", "tasks/s", "task share"],
        turn_rows,
        align="lllrrrr",
    )
    phase_rows = [
        [
            p["name"],
            len(p["apps"]),
            f"{p['claim_delay_ms']:g}",
            sum(p["turns"].values()) / p["window_s"],
            p["turn_fairness"]["jain"],
            p["turn_fairness"]["min_over_max"],
            p["throughput_fairness"]["jain"],
            f"{p['mean_in_flight']:.2f} / {SQL_SLOTS}",
            p["mean_pending"],
            ms(ratio(p["mean_in_flight"], sum(p["turns"].values()) / p["window_s"])),
        ]
        for p in phases
    ]
    phase_table = format_table(
        [
            "phase",
            "apps",
            "claim delay ms",
            "turns/s",
            "turns Jain",
            "min/max",
            "tasks Jain",
            "claims in flight",
            "requests waiting",
            "claim ms",
        ],
        phase_rows,
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
    pool = by["pool-bound"]
    targets = [
        Target.at_most(
            "S4 B's p99 wait, A flooding / alone",
            ratio(b_flood.get("p99"), b_alone.get("p99")),
            TARGET_FLOOD_P99_RATIO,
            unit="x",
            note="available -> start, database clock",
        ),
        Target.at_least(
            "S4 Jain on claim turns, pool-bound",
            pool["turn_fairness"]["jain"],
            TARGET_JAIN,
            note=f"6 busy apps, candidate read +{args.s4_claim_delay_ms:g} ms",
        ),
        Target.at_most(
            "S4 A's share of claim turns, pool-bound",
            100 * pool["turn_fairness"]["shares"].get("A", float("nan")),
            100 * TARGET_BIG_SHARE,
            unit="%",
            note=f"A: {A_QUEUES} queues, {A_CONNECTIONS} connections",
        ),
    ]
    return {
        "scenario": "s4",
        "server": bdb.server_version,
        "figures": {"phases": phases},
        "tables": [phase_table, turn_table, wait_table],
        "targets": targets,
        "notes": [
            f"alone / flood: A has {A_QUEUES} queues x {A_CONNECTIONS // A_QUEUES} connections and a backlog of "
            f"{args.s4_backlog:,}; B, C: 1 queue, 1 connection, {args.s4_rate:g} arrivals/s each over HTTP; capacity "
            f"{args.capacity}. Waits: available -> start, database clock.",
            f"pool-bound: A as above, B-F 1 queue with 1, 2, 1, 2, 1 connections; every application a seeded backlog "
            f"of {args.s4_pool_backlog:,}; node claim batch {POOL_CLAIM_BATCH}, Worker capacity {POOL_CAPACITY} (a "
            "connection asks again while a batch runs: every application always waits for a turn); the node reaches MariaDB through a proxy that "
            f"holds each claim's candidate read (the statement naming {SLOW_STATEMENT}) for "
            f"{args.s4_claim_delay_ms:g} ms; its other SQL passes at once.",
            f"the claim pool is the bottleneck when its {SQL_SLOTS} slots stay busy (claims in flight near "
            f"{SQL_SLOTS}, requests waiting) and turns per application stay under the pace of "
            f"{PACE_CLAIMS_PER_S:g} claims/s per connection; claim ms = claims in flight / turns per second (Little's law).",
            f"{args.s4_seconds:g} s windows; claim turns from the node's ClaimPool.statistics().turns_by_application.",
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
