"""S2 latency: open-loop arrivals at 10, 50 and 80 % of S1's Orbit maximum.

Poisson arrivals submitted over HTTP to a real node whatever earlier submissions are
doing; one in four is future-dated (``delay_s`` 1-3 s). Waits on the database clock,
recorded in HdrHistogram (microseconds, 3 significant digits): available -> dispatch
(``reserved_at``) and available -> start (``started_at``); for future-dated tasks that
is their lateness after ``available_at``. The maximum comes from S1 of the same run
(``all``), ``--orbit-max``, or a short burn-down measured first.
"""

from __future__ import annotations

import argparse
import random
from typing import Any

import trio
from hdrh.histogram import HdrHistogram

from . import pickup
from .common import (
    bench_database,
    connection_plan,
    count_tasks,
    make_app,
    measured_phase,
    node_process,
    submit_open_loop,
    task_times,
    wait_until,
    worker_fleet,
)
from .report import Target, format_table
from .s1 import LIFTED_PACE, orbit_burndown

# Issue 8 target: p50 available -> dispatch at 50 % load.
TARGET_P50_MS = 10.0
# One arrival in FUTURE_EVERY is future-dated by FUTURE_DELAY_S.
FUTURE_EVERY = 4
FUTURE_DELAY_S = (1.0, 3.0)
# Histogram range: 1 us .. 1 h, 3 significant digits.
HDR_RANGE = (1, 3_600_000_000, 3)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--s2-parts",
        default="levels,pickup",
        help="S2: levels (load levels, one node) and/or pickup (two nodes: same vs other node, cancel, idle)",
    )
    pickup.add_arguments(parser)
    parser.add_argument("--s2-seconds", type=float, default=20.0, help="S2: arrival window per load level (default 20)")
    parser.add_argument(
        "--s2-loads", default="0.1,0.5,0.8", help="S2: fractions of the Orbit maximum (default 0.1,0.5,0.8)"
    )
    parser.add_argument(
        "--orbit-max", type=float, default=None, help="S2: Orbit's max tasks/s (default: from S1 or measured)"
    )
    parser.add_argument(
        "--s2-calibration-tasks",
        type=int,
        default=4_000,
        help="S2: burn-down size to find the maximum when S1 did not run (default 4000)",
    )


def histogram(values_s) -> dict[str, float]:
    h = HdrHistogram(*HDR_RANGE)
    count = 0
    for v in values_s:
        if v is not None:
            h.record_value(max(1, int(v * 1_000_000)))
            count += 1
    if not count:
        return {"count": 0, "p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    return {
        "count": count,
        "p50_ms": h.get_value_at_percentile(50) / 1000,
        "p99_ms": h.get_value_at_percentile(99) / 1000,
        "max_ms": h.get_max_value() / 1000,
        "mean_ms": h.get_mean_value() / 1000,
    }


async def one_level(
    bdb, node, *, load: float, rate: float, seconds: float, connections: int, capacity: int, seed: int
) -> dict[str, Any]:
    app = await make_app(bdb.db, f"s2-{int(load * 100)}")
    rng = random.Random(seed)
    delays = {}

    def delay(i: int) -> float | None:
        if i % FUTURE_EVERY == FUTURE_EVERY - 1:
            delays[i] = rng.uniform(*FUTURE_DELAY_S)
            return delays[i]
        return None

    async with worker_fleet(node.url, connection_plan(app, connections), capacity=capacity):
        await trio.sleep(1.0)  # connections settled: their first (empty) claims are behind them
        with measured_phase(node.pid, profile=False) as phase:
            sent = await submit_open_loop(
                node.url, app.token, app.queue_id, rate=rate, duration_s=seconds, delay_s=delay, seed=seed
            )
        where = "application_id = %s AND state NOT IN ('succeeded', 'failed', 'cancelled', 'expired')"
        await wait_until(lambda: _none_left(bdb.db, where, app.application_id), timeout_s=60, poll_s=0.25)
    times = await task_times(bdb.db, "application_id = %s AND state = 'succeeded'", (app.application_id,))
    now = [t for t in times if t["dated_ahead"] < 0.5]
    future = [t for t in times if t["dated_ahead"] >= 0.5]
    return {
        "load": load,
        "rate": rate,
        "cpu": phase.cpu,
        "submitted": sent["submitted"],
        "dropped": sent["dropped"],
        "errors": sent["errors"],
        "finished": len(times),
        "submit_ms": histogram(sent["submit_latencies"]),
        "now": {
            "to_dispatch": histogram(t["to_dispatch"] for t in now),
            "to_start": histogram(t["to_start"] for t in now),
        },
        "future": {
            "to_dispatch": histogram(t["to_dispatch"] for t in future),
            "to_start": histogram(t["to_start"] for t in future),
        },
        "samples": {"now": [t["to_dispatch"] for t in now], "future": [t["to_dispatch"] for t in future]},
    }


async def _none_left(db, where: str, application_id: str) -> bool:
    return await count_tasks(db, where, (application_id,)) == 0


async def run(args: argparse.Namespace) -> dict[str, Any]:
    parts = {part.strip() for part in args.s2_parts.split(",") if part.strip()}
    if not parts or parts - {"levels", "pickup"}:
        raise SystemExit("--s2-parts: a comma-separated subset of levels,pickup")
    report: dict[str, Any] = {"scenario": "s2", "figures": {}, "tables": [], "targets": [], "notes": []}
    async with bench_database() as bdb:
        report["server"] = bdb.server_version
        for part, measure in (("levels", levels_part), ("pickup", pickup_part)):
            if part in parts:
                found = await measure(bdb, args)
                report["figures"].update(found["figures"])
                for key in ("tables", "targets", "notes"):
                    report[key] += found[key]
    return report


async def levels_part(bdb, args: argparse.Namespace) -> dict[str, Any]:
    """The load levels: one node, Workers on it, 10/50/80 % of Orbit's maximum."""
    connections = max(1, args.concurrency // args.capacity)
    loads = [float(x) for x in args.s2_loads.split(",")]
    context = getattr(args, "context", {})
    source = "--orbit-max"
    orbit_max = args.orbit_max
    if orbit_max is None and "s1" in context:
        orbit_max, source = context["s1"]["figures"]["orbit"]["tasks_per_s"], "S1 of this run"
    if orbit_max is None:
        burn = await orbit_burndown(
            bdb,
            tasks=args.s2_calibration_tasks,
            connections=connections,
            capacity=args.capacity,
            submit_concurrency=args.submit_concurrency,
            profile=False,
            app_name="s2-max",
        )
        orbit_max, source = burn["tasks_per_s"], f"a {args.s2_calibration_tasks:,}-task burn-down measured first"
    levels = []
    async with node_process(bdb.dsn) as node:
        for index, load in enumerate(loads):
            levels.append(
                await one_level(
                    bdb,
                    node,
                    load=load,
                    rate=load * orbit_max,
                    seconds=args.s2_seconds,
                    connections=connections,
                    capacity=args.capacity,
                    seed=index + 1,
                )
            )
    if not args.no_diagnose:
        async with node_process(bdb.dsn, claims_per_connection_per_cycle=LIFTED_PACE) as node:
            diagnostic = await one_level(
                bdb,
                node,
                load=0.5,
                rate=0.5 * orbit_max,
                seconds=args.s2_seconds,
                connections=connections,
                capacity=args.capacity,
                seed=99,
            )
            diagnostic["label"] = "50%, pacing lifted (diagnostic)"
            levels.append(diagnostic)
    rows = []
    for level in levels:
        for kind, label in (("now", "due at submit"), ("future", "future-dated")):
            d, s = level[kind]["to_dispatch"], level[kind]["to_start"]
            rows.append(
                [
                    level.get("label", f"{level['load']:.0%}"),
                    level["rate"],
                    label,
                    d["count"],
                    d["p50_ms"],
                    d["p99_ms"],
                    d["max_ms"],
                    s["p50_ms"],
                    s["p99_ms"],
                    s["max_ms"],
                ]
            )
    table = format_table(
        ["load", "arrivals/s", "tasks", "n", "dispatch p50 ms", "p99 ms", "max ms", "start p50 ms", "p99 ms", "max ms"],
        rows,
        align="lrlrrrrrrr",
    )
    half = min((lv for lv in levels if "label" not in lv), key=lambda lv: abs(lv["load"] - 0.5))
    targets = [
        Target.at_most(
            f"S2 p50 available->dispatch @ {half['load']:.0%}",
            half["now"]["to_dispatch"]["p50_ms"],
            TARGET_P50_MS,
            unit=" ms",
            note="tasks submitted through the same node",
        )
    ]
    notes = [
        f"Orbit maximum {orbit_max:,.0f} tasks/s from {source}; {connections} connections x capacity {args.capacity}; "
        f"{args.s2_seconds:g} s of Poisson arrivals per level, 1 in {FUTURE_EVERY} future-dated by "
        f"{FUTURE_DELAY_S[0]:g}-{FUTURE_DELAY_S[1]:g} s."
    ]
    notes += [
        f"{lv.get('label', format(lv['load'], '.0%'))}: {lv['submitted']:,} submitted, {lv['dropped']} arrivals "
        f"dropped (64 submits in flight), {lv['errors']} errors, submit p99 {lv['submit_ms']['p99_ms']:.1f} ms, "
        f"node process {lv['cpu']['node_cpu_s'] / lv['cpu']['wall_s']:.0%} of a core, machine busy "
        f"{lv['cpu']['machine_utilisation']:.0%}"
        for lv in levels
    ]
    return {
        "figures": {"orbit_max": orbit_max, "orbit_max_source": source, "levels": levels},
        "tables": [table],
        "targets": targets,
        "notes": notes,
    }


async def pickup_part(bdb, args: argparse.Namespace) -> dict[str, Any]:
    """Two nodes: Workers on the accepting node or on another; delayed tasks; cross-node
    cancel; idle cost (``bench/pickup.py``), before and after when ``--s2-before`` is given."""
    found = await pickup.measure(bdb, args)
    codes = list(found)
    rows = []
    for placement, where in pickup.PLACEMENTS:
        for code in codes:
            part = found[code][placement]
            a, d = part["accepted_to_started"], part["due_to_started"]
            rows.append(
                [where, code, a["count"], a["p50_ms"], a["p90_ms"], a["p99_ms"], a["p999_ms"], d["count"]]
                + [d["p50_ms"], d["p90_ms"]]
            )
    pickup_table = format_table(
        ["Workers on", "code", "n", "accepted->started p50 ms", "p90", "p99", "p999", "delayed n"]
        + ["due->started p50 ms", "p90"],
        rows,
        align="llrrrrrrrr",
    )
    other_rows = []
    for code in codes:
        c, idle = found[code]["cancel"]["cancel_to_cancelled"], found[code]["idle"]
        other_rows.append([code, c["count"], c["p50_ms"], c["p90_ms"], c["max_ms"], idle["node_cpu_share"] * 100])
    other_table = format_table(
        ["code", "cross-node cancels", "cancel->Cancelled p50 ms", "p90", "max", "idle node CPU %"],
        other_rows,
        align="lrrrrr",
    )
    tables = [pickup_table, other_table]
    if "before" in found:
        ratios = []
        for placement, where in pickup.PLACEMENTS:
            before, after = (found[c][placement]["accepted_to_started"] for c in ("before", "after"))
            ratios.append([where, *(before[k] / after[k] if after[k] else float("nan") for k in PICKUP_RATIOS)])
        tables.append(
            format_table(["Workers on", *(f"before/after {k[:-3]}" for k in PICKUP_RATIOS)], ratios, align="lrrr")
        )
    after = found["after"]
    same, other = after["same"]["accepted_to_started"], after["other"]["accepted_to_started"]
    delayed = [after[p]["due_to_started"] for p, _ in pickup.PLACEMENTS]
    targets = [
        Target.at_most("S2 pickup same node p50", same["p50_ms"], 10.0, unit=" ms"),
        Target.at_most("S2 pickup same node p99", same["p99_ms"], 100.0, unit=" ms"),
        Target.at_most("S2 pickup another node p50", other["p50_ms"], 30.0, unit=" ms"),
        Target.at_most("S2 pickup another node p99", other["p99_ms"], 150.0, unit=" ms"),
        Target.at_most("S2 delayed due->started p90", max(d["p90_ms"] for d in delayed), 50.0, unit=" ms"),
        Target.at_most(
            "S2 cancel through another node p90", after["cancel"]["cancel_to_cancelled"]["p90_ms"], 200.0, unit=" ms"
        ),
        Target.at_most("S2 idle node CPU, 16 Workers", after["idle"]["node_cpu_share"] * 100, 2.0, unit=" %"),
    ]
    notes = [
        f"pickup: two node processes; Poisson {args.s2_pickup_rate:g} arrivals/s for {args.s2_pickup_seconds:g} s "
        f"submitted one by one through node A, 1 in {pickup.FUTURE_EVERY} future-dated by "
        f"{pickup.FUTURE_DELAY_S[0]:g}-{pickup.FUTURE_DELAY_S[1]:g} s; {pickup.CONNECTIONS} SDK Worker connections "
        f"of capacity {pickup.CAPACITY} (no-op handler) on node A or on node B. Times on the database clock "
        "(available_at -> started_at). Cancel: through node A of handlers running on node B, random moments "
        f"within {pickup.CANCEL_SPREAD_S:g} s, harness clock. Idle: node B with {pickup.IDLE_WORKERS} idle "
        f"connections, {pickup.IDLE_SECONDS:g} s.",
    ]
    if "before" in found:
        notes.append(f"before = node processes running {args.s2_before} (measured first, same run, same database).")
    return {"figures": {"pickup": found}, "tables": tables, "targets": targets, "notes": notes}


# The figures compared before/after.
PICKUP_RATIOS = ("p50_ms", "p90_ms", "p99_ms")


def plot(report: dict[str, Any], outdir, plots) -> list:
    figures = report["figures"]
    made = []
    if "levels" in figures:
        samples = {}
        for level in figures["levels"]:
            name = level.get("label", f"{level['load']:.0%}")
            samples[f"{name} due"] = [max(v, 1e-4) for v in level["samples"]["now"]]
            samples[f"{name} future"] = [max(v, 1e-4) for v in level["samples"]["future"]]
        made.append(
            plots.cdf(
                outdir / "s2-latency.png",
                samples,
                title="S2: available -> dispatch (open loop)",
                xlabel="seconds after available_at (database clock)",
            )
        )
    if "pickup" in figures:
        samples = {
            f"{where}, {code}": [max(v, 1e-4) for v in parts[placement]["samples"]]
            for code, parts in figures["pickup"].items()
            for placement, where in pickup.PLACEMENTS
        }
        made.append(
            plots.cdf(
                outdir / "s2-pickup.png",
                samples,
                title="S2 pickup: accepted -> started, Workers on the accepting node or another",
                xlabel="seconds after available_at (database clock)",
            )
        )
    return made
