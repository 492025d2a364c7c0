"""S2 pace levels: pickup on one node at 2.5-40 arrivals/s per Worker connection.

Issue 38's shape: one node, two SDK Worker connections of capacity 16 (no-op handler),
single submits through the same node, open-loop Poisson arrivals (one in four
future-dated, ``pickup.arrivals``) at each total rate of ``--s2-pace-rates`` for
``--s2-seconds``. Accepted -> started p50-p999 of the tasks due at submit (database
clock). A connection may claim 4 times per second (P3); what this measures is how long a
task that arrives between two claims waits for the next. With ``--s2-before DIR`` each
rate runs first with that tree's node (on a database its own migrations made), then with
this one (paired).
"""

from __future__ import annotations

import argparse
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from . import pickup
from .database import BenchDb, bench_database
from .processes import node_process
from .report import Target, format_table

CONNECTIONS = 2
CAPACITY = 16
# Total arrivals/s: 2.5, 5, 10, 20 and 40 per connection.
RATES = (5.0, 10.0, 20.0, 40.0, 80.0)
# Issue 38: (arrivals/s per connection, p90 bound ms, p99 bound ms or None).
TARGETS = ((2.5, 50.0, None), (10.0, 300.0, 400.0), (20.0, 300.0, 400.0))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--s2-pace-rates",
        default=",".join(f"{r:g}" for r in RATES),
        help="S2 pace: total arrivals/s over the 2 connections (default 5,10,20,40,80)",
    )


async def measure(bdb: BenchDb, args: argparse.Namespace) -> list[dict[str, Any]]:
    async with AsyncExitStack() as stack:
        codes: list[tuple[str, Path | None, BenchDb]] = [("after", None, bdb)]
        if args.s2_before is not None:
            # The earlier node on a database its own migrations made (a node refuses a newer schema).
            tree = args.s2_before.resolve()
            codes.insert(0, ("before", tree, await stack.enter_async_context(bench_database(migrations_of=tree))))
        return await _levels(codes, args)


async def _levels(codes: list[tuple[str, Path | None, BenchDb]], args: argparse.Namespace) -> list[dict[str, Any]]:
    levels = []
    for index, rate in enumerate(float(r) for r in args.s2_pace_rates.split(",") if r.strip()):
        for code, tree, bdb in codes:
            async with node_process(bdb.dsn, tree=tree) as node:
                found = await pickup.arrivals(
                    bdb,
                    node.url,
                    node.url,
                    label=f"s2-pace-{code}-{rate:g}",
                    rate=rate,
                    seconds=args.s2_seconds,
                    seed=100 + index,
                    connections=CONNECTIONS,
                    capacity=CAPACITY,
                )
            levels.append({"code": code, "rate": rate, "per_connection": rate / CONNECTIONS, **found})
    return levels


def report(levels: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for level in levels:
        a = level["accepted_to_started"]
        rows.append(
            [level["code"], level["rate"], level["per_connection"], a["count"], level["dropped"]]
            + [a["p50_ms"], a["p90_ms"], a["p99_ms"], a["p999_ms"]]
        )
    table = format_table(
        ["pace: code", "arrivals/s", "per conn/s", "n", "dropped", "accepted->started p50 ms", "p90", "p99", "p999"],
        rows,
        align="lrrrrrrrr",
    )
    targets = []
    for per_connection, p90_bound, p99_bound in TARGETS:
        for level in levels:
            if level["code"] != "after" or level["per_connection"] != per_connection:
                continue
            a = level["accepted_to_started"]
            name = f"S2 pace, {per_connection:g} arrivals/s per connection"
            targets.append(Target.at_most(f"{name}: p90", a["p90_ms"], p90_bound, unit=" ms"))
            if p99_bound is not None:
                targets.append(Target.at_most(f"{name}: p99", a["p99_ms"], p99_bound, unit=" ms"))
    notes = [
        f"pace: one node, {CONNECTIONS} SDK Worker connections x capacity {CAPACITY} (no-op handler) on it; single "
        f"submits through it, Poisson for {args.s2_seconds:g} s per rate, 1 in {pickup.FUTURE_EVERY} "
        "future-dated (not counted); accepted -> started on the database clock."
        + (" 'before' ran the --s2-before tree's node, each rate just before 'after'." if args.s2_before else "")
    ]
    return {"figures": {"pace": levels}, "tables": [table], "targets": targets, "notes": notes}
