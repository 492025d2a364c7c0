"""S2 load levels: single submits at 10, 50 and 80 % of what they sustain on this machine,
through one node, with the Workers on that node or on another.

Two node processes, A and B, on one database. First the saturation: ``SATURATION_CLIENTS``
clients submit back to back through node A for ``--s2-saturation-seconds`` while the
Worker connections on node A drain the queue; the rate they reach is the most single
submits sustain here (reported). Then, per level and per placement of the Workers (on A,
the accepting node, or on B), open-loop Poisson arrivals at that fraction of it for
``--s2-seconds``, submitted one by one through A, one in four future-dated by 1-3 s
(``pickup.arrivals``): accepted -> started p50/p90/p99/p999 of the tasks due at submit
and due -> started of the others, on the database clock. An arrival is dropped (and
counted) rather than delayed when 64 submits are in flight, so the load stays open-loop.

Issue 25's targets hold at loads where each Worker connection sees at most
``PER_CONNECTION_BOUND`` arrivals/s; the levels above it are reported, not judged.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import trio

from . import pickup
from .clients import connection_plan, submit_closed_loop, worker_fleet
from .database import BenchDb, make_app
from .processes import node_process
from .report import Target, format_table

SATURATION_CLIENTS = 16
# Issue 25: the targets apply where each connection sees at most this many arrivals/s.
PER_CONNECTION_BOUND = 2.0
# (placement, p50 bound ms, p99 bound ms)
LATENCY_TARGETS = (("same", 10.0, 100.0), ("other", 30.0, 150.0))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--s2-seconds", type=float, default=20.0, help="S2: arrival window per level (default 20)")
    parser.add_argument(
        "--s2-loads",
        default="0.05,0.1,0.5,0.8",
        help="S2: fractions of the single-submit saturation rate (default 0.05,0.1,0.5,0.8: 5 %% keeps a "
        "connection at <= 2 arrivals/s, where the targets apply, with the default 8 connections)",
    )
    parser.add_argument(
        "--s2-saturation-seconds",
        type=float,
        default=8.0,
        help=f"S2: closed-loop single submits with {SATURATION_CLIENTS} clients to find the saturation (default 8)",
    )


async def saturation(bdb: BenchDb, node_url: str, *, seconds: float, connections: int, capacity: int) -> dict:
    """Single submits/s that ``SATURATION_CLIENTS`` back-to-back clients reach through
    ``node_url`` while Workers on it drain the queue."""
    app = await make_app(bdb.db, "s2-saturation")
    async with worker_fleet(node_url, connection_plan(app, connections), capacity=capacity):
        await trio.sleep(1.0)
        begin = time.perf_counter()
        latencies = await submit_closed_loop(
            node_url,
            app.token,
            app.queue_id,
            10**9,
            concurrency=SATURATION_CLIENTS,
            stop=lambda: time.perf_counter() - begin >= seconds,
        )
        elapsed = time.perf_counter() - begin
    return {"submits_per_s": len(latencies) / elapsed, "clients": SATURATION_CLIENTS, "seconds": elapsed}


async def measure(bdb: BenchDb, args: argparse.Namespace) -> dict[str, Any]:
    connections = max(1, args.concurrency // args.capacity)
    loads = [float(x) for x in args.s2_loads.split(",")]
    levels = []
    async with node_process(bdb.dsn) as a, node_process(bdb.dsn) as b:
        sat = await saturation(
            bdb, a.url, seconds=args.s2_saturation_seconds, connections=connections, capacity=args.capacity
        )
        for index, load in enumerate(loads):
            rate = load * sat["submits_per_s"]
            for placement, _ in pickup.PLACEMENTS:
                found = await pickup.arrivals(
                    bdb,
                    a.url,
                    a.url if placement == "same" else b.url,
                    label=f"s2-{round(load * 100)}-{placement}",
                    rate=rate,
                    seconds=args.s2_seconds,
                    seed=index + 1,
                    connections=connections,
                    capacity=args.capacity,
                )
                levels.append(
                    {"load": load, "placement": placement, "rate": rate, "per_connection": rate / connections, **found}
                )
    return {"saturation": sat, "connections": connections, "capacity": args.capacity, "levels": levels}


def report(found: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    where = dict(pickup.PLACEMENTS)
    rows = []
    for level in found["levels"]:
        a, d = level["accepted_to_started"], level["due_to_started"]
        rows.append(
            [f"{level['load']:.0%}", level["rate"], level["per_connection"], where[level["placement"]], a["count"]]
            + [level["dropped"], a["p50_ms"], a["p90_ms"], a["p99_ms"], a["p999_ms"], d["p50_ms"], d["p90_ms"]]
        )
    table = format_table(
        ["load", "arrivals/s", "per conn/s", "Workers on", "n", "dropped", "accepted->started p50 ms", "p90"]
        + ["p99", "p999", "due->started p50 ms", "p90"],
        rows,
        align="lrrlrrrrrrrr",
    )
    judged = [lv for lv in found["levels"] if lv["per_connection"] <= PER_CONNECTION_BOUND]
    targets = []
    for placement, p50_bound, p99_bound in LATENCY_TARGETS:
        mine = [lv for lv in judged if lv["placement"] == placement]
        if not mine:
            continue
        worst = {k: max(lv["accepted_to_started"][k] for lv in mine) for k in ("p50_ms", "p99_ms")}
        note = f"levels with <= {PER_CONNECTION_BOUND:g} arrivals/s per connection: " + ", ".join(
            f"{lv['load']:.0%}" for lv in mine
        )
        targets.append(
            Target.at_most(f"S2 levels {where[placement]} p50", worst["p50_ms"], p50_bound, unit=" ms", note=note)
        )
        targets.append(
            Target.at_most(f"S2 levels {where[placement]} p99", worst["p99_ms"], p99_bound, unit=" ms", note=note)
        )
    sat = found["saturation"]
    notes = [
        f"levels: single submits saturate at {sat['submits_per_s']:,.0f}/s here ({sat['clients']} clients back to "
        f"back through node A for {sat['seconds']:.1f} s, Workers on A draining); each level is that fraction of "
        f"it, Poisson arrivals for {args.s2_seconds:g} s through node A, 1 in {pickup.FUTURE_EVERY} future-dated; "
        f"{found['connections']} SDK Worker connections x capacity {found['capacity']} (no-op) on A or on B. "
        f"Targets judged only where a connection sees <= {PER_CONNECTION_BOUND:g} arrivals/s "
        f"({'none here' if not judged else ', '.join(sorted({format(lv['load'], '.0%') for lv in judged}))}).",
    ]
    return {"figures": {"levels": found}, "tables": [table], "targets": targets, "notes": notes}


def plot_levels(found: dict[str, Any], outdir, plots) -> list:
    where = dict(pickup.PLACEMENTS)
    made = [
        plots.cdf(
            outdir / "s2-latency.png",
            {
                f"{lv['load']:.0%}, {where[lv['placement']]}": [max(v, 1e-4) for v in lv["samples"]]
                for lv in found["levels"]
            },
            title="S2 levels: accepted -> started (open loop, single submits)",
            xlabel="seconds after available_at (database clock)",
        )
    ]
    series = {}
    for placement, name in pickup.PLACEMENTS:
        for key in ("p50_ms", "p99_ms", "p999_ms"):
            series[f"{name} {key[:-3]}"] = [
                (lv["load"] * 100, max(lv["accepted_to_started"][key], 1e-2))
                for lv in found["levels"]
                if lv["placement"] == placement
            ]
    made.append(
        plots.lines(
            outdir / "s2-levels.png",
            series,
            title="S2 levels: accepted -> started by load",
            xlabel="offered load, % of the single-submit saturation",
            ylabel="ms",
            log_y=True,
        )
    )
    return made
