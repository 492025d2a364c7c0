"""S2 latency: where single submits saturate, pickup at 10, 50 and 80 % of it on the
accepting node and on another (``bench/levels.py``); and pickup at a low rate with delayed
tasks, cross-node cancel and the idle cost, before and after (``bench/pickup.py``); and
pickup on one node at 2.5-40 arrivals/s per Worker connection (``bench/pace_levels.py``)."""

from __future__ import annotations

import argparse
from typing import Any

from . import levels, pace_levels, pickup
from .database import bench_database
from .report import Target, format_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--s2-parts",
        default="levels,pickup,pace",
        help="S2: levels (saturation, then load levels on the same and another node), pickup (delayed, cancel, "
        "idle) and/or pace (one node, 2.5-40 arrivals/s per connection)",
    )
    pickup.add_arguments(parser)
    levels.add_arguments(parser)
    pace_levels.add_arguments(parser)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    parts = {part.strip() for part in args.s2_parts.split(",") if part.strip()}
    if not parts or parts - {"levels", "pickup", "pace"}:
        raise SystemExit("--s2-parts: a comma-separated subset of levels,pickup,pace")
    report: dict[str, Any] = {"scenario": "s2", "figures": {}, "tables": [], "targets": [], "notes": []}
    async with bench_database() as bdb:
        report["server"] = bdb.server_version
        for part, measure in (("levels", levels_part), ("pickup", pickup_part), ("pace", pace_part)):
            if part in parts:
                found = await measure(bdb, args)
                report["figures"].update(found["figures"])
                for key in ("tables", "targets", "notes"):
                    report[key] += found[key]
    return report


async def levels_part(bdb, args: argparse.Namespace) -> dict[str, Any]:
    """The load levels (``bench/levels.py``)."""
    return levels.report(await levels.measure(bdb, args), args)


async def pace_part(bdb, args: argparse.Namespace) -> dict[str, Any]:
    """One node at 2.5-40 arrivals/s per connection (``bench/pace_levels.py``)."""
    return pace_levels.report(await pace_levels.measure(bdb, args), args)


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
        made += levels.plot_levels(figures["levels"], outdir, plots)
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
