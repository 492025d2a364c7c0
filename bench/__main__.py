"""``python -m bench <scenario> [options]``: run benchmark scenarios.

Scenarios: calibration (S0), burn-down (S1), e2e, latency (S2), priority (S3), fairness (S4), backlog (S5),
locks, bulk, http, soak, cancel, shards, settle, chaos, retention (each: a table, a JSON result and PNG plots
under bench/results/, named by the short name: s1.json, s1-burndown.png); the short names s0-s5 are accepted
as commands too. ``all`` runs calibration through http in that order (E2E using the burn-down's drain);
``claim`` is the dispatch core's micro-benchmark, its own options. ``soak`` (ten minutes and more),
``cancel`` (cancel latency, up to a renew interval per sample), ``shards`` (the burn-down on one and on two
database servers; it starts a private mariadbd), ``settle`` (Start and Finish batches with the transition
statements before and after issue 23, on a private mariadbd), ``chaos`` (ten minutes of faults under three
nodes, then the history checker's verdict), ``retention`` and ``dependencies`` (a released child's latency,
a parent's Finish cost) are not part of ``all``.

Each scenario runs on a private mariadbd per durability setting the bench starts
(``--durability``, bench/durability.py: production by default, the development setting
beside it where the scenario prints a column per setting), after R and H, the units its
costs are printed in, were measured (bench/calibrate.py).
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

import orbit_node

from . import calibrate, database, durability
from .grids import combine_reports, grid_table
from .report import RESULTS_DIR, Target, format_profile, machine_info, targets_table, write_result
from .units import Units

# Short name -> module with add_arguments(parser), async run(args) -> report, plot(report, outdir, plots).
SCENARIOS = {
    "s0": "bench.s0",
    "s1": "bench.s1",
    "e2e": "bench.e2e",
    "s2": "bench.s2",
    "s3": "bench.s3",
    "s4": "bench.s4",
    "s5": "bench.s5",
    "locks": "bench.locks",
    "bulk": "bench.bulk",
    "http": "bench.http",
    "soak": "bench.soak",
    "cancel": "bench.cancel",
    "shards": "bench.shards",
    "settle": "bench.settle",
    "chaos": "bench.chaos",
    "retention": "bench.retention",
    "dependencies": "bench.dependencies",
}
# Commands named for what they measure -> the scenario's short name, which names its module,
# its report, its JSON result and its plots, and stays accepted as a command.
NAMES = {
    "calibration": "s0",
    "burn-down": "s1",
    "latency": "s2",
    "priority": "s3",
    "fairness": "s4",
    "backlog": "s5",
}
# What ``python -m bench --help`` offers, in SCENARIOS' order: each scenario by its command name.
COMMANDS = [next((command for command, short in NAMES.items() if short == name), name) for name in SCENARIOS]
# The order of ``all``.
ALL = ("s0", "s1", "e2e", "s2", "s3", "s4", "s5", "locks", "bulk", "http")
# Scenarios that start the database servers they need (their own private mariadbd, flush=1)
# and measure no CPU cost: no bench server and no R and H for them.
OWN_SERVERS = ("chaos",)
# Scenario name -> why its module could not be imported (filled by ``build_parser``).
UNAVAILABLE: dict[str, str] = {}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "scenario",
        choices=[*COMMANDS, "all", *NAMES.values()],
        metavar="scenario",
        help=f"one of {', '.join(COMMANDS)}, or all (s0-s5: the short names of {', '.join(NAMES)})",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for JSON and PNG (bench/results)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--no-profile", action="store_true", help="do not attach py-spy to the node process")
    parser.add_argument(
        "--durability",
        type=durability.parse_choice,
        default=None,
        metavar="{prod,dev,both,server}",
        help="database durability: prod (innodb_flush_log_at_trx_commit=1, sync_binlog=1; PostgreSQL "
        "synchronous_commit=on), dev (flush=2; synchronous_commit=off), both (a column each where the scenario "
        "prints one, else prod), each on a private mariadbd the bench starts; server: the server of "
        "ORBIT_BENCH_MYSQL_DSN as it is (default: each scenario's own, bench/README.md)",
    )
    parser.add_argument(
        "--prod-binlog",
        choices=("on", "off"),
        default="on",
        help="prod: binary logging (sync_binlog=1, binlog_format=ROW) on the private server (default on)",
    )
    calibrate.add_arguments(parser)
    for name, module in SCENARIOS.items():
        try:
            importlib.import_module(module).add_arguments(parser)
        except ModuleNotFoundError as exc:
            # A scenario whose optional dependency (the ``bench`` extra) is missing: the
            # others still run; running it says what is missing.
            UNAVAILABLE[name] = str(exc)
    return parser


def code_version() -> str:
    """The commit measured: ORBIT_BENCH_COMMIT, else git's HEAD (+ "-dirty" with uncommitted orbit_node changes)."""
    if os.environ.get("ORBIT_BENCH_COMMIT"):
        return os.environ["ORBIT_BENCH_COMMIT"]
    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--", "orbit_node"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def print_report(report: dict[str, Any]) -> None:
    print(f"== {report['scenario'].upper()}: {report.get('title', '')}")
    print(
        f"machine: {report['machine']['cpus']} cpus ({report['machine']['cpu']}), {report['machine']['memory']}, "
        f"Python {report['machine']['python']}; MariaDB {report.get('server', '?')}; "
        f"orbit_node {report.get('commit', '?')}; {report.get('seconds', 0):.0f} s"
    )
    load = report.get("load_average")
    if load:
        cpus = report["machine"]["cpus"] or 1
        busy = load["before"][0]
        print(
            f"load average (1 min) before {load['before'][0]:.1f}, after {load['after'][0]:.1f}"
            + (
                f"  -- WARNING: the machine was shared (more runnable tasks than its {cpus} cpus); "
                "figures of other systems in this run are affected alike, absolute numbers are not comparable"
                if busy > 1.5 * cpus
                else ""
            )
        )
    for ran in report.get("durability") or []:
        if ran:
            print(durability_line(ran))
    if report.get("units"):
        print("units: " + Units.from_json(report["units"]).describe())
    for g in report.get("grids", []):
        print()
        print(grid_table(g))
    for table in report.get("tables", []):
        print()
        print(table)
    targets = [t for t in report.get("targets", []) if isinstance(t, Target)]
    if targets:
        print()
        print(targets_table(targets))
    for note in report.get("notes", []):
        print(f"* {note}")
    for name, summary in report.get("profiles", {}).items():
        print()
        print(format_profile(summary, title=f"profile of {name}"))
    print()


def durability_line(ran: dict[str, Any]) -> str:
    """What the database of one durability ran with, as the server itself said."""
    settings = ran.get("settings") or {}
    said = ", ".join(f"{k}={v}" for k, v in settings.items() if k != "innodb_buffer_pool_size")
    where = "private mariadbd" if ran.get("private_server") else "the server of ORBIT_BENCH_MYSQL_DSN"
    problems = "; ".join(ran.get("problems") or [])
    return f"durability {ran['label']}: {where}, {said}" + (f"  -- WARNING: {problems}" if problems else "")


async def run_one(name: str, args: argparse.Namespace, context: dict[str, Any]) -> dict[str, Any]:
    module = importlib.import_module(SCENARIOS[name])
    started = time.perf_counter()
    load_before = os.getloadavg()
    args.context = context
    if name in OWN_SERVERS:
        report = await module.run(args)
    else:
        report = await run_at_durabilities(module, args)
    report.setdefault("title", (module.__doc__ or "").splitlines()[0])
    report["seconds"] = time.perf_counter() - started
    report["machine"] = machine_info()
    report["load_average"] = {
        "before": [round(x, 2) for x in load_before],
        "after": [round(x, 2) for x in os.getloadavg()],
    }
    report["commit"] = code_version()
    report["orbit_node_path"] = str(Path(orbit_node.__file__).parent)
    context[name] = report
    return report


async def run_at_durabilities(module: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The scenario at each durability of its plan, each on a private server started for
    it (bench/durability.py); R and H measured once, on the first, before the scenario."""
    plan = durability.plan(
        args.durability,
        default=getattr(module, "DURABILITY_DEFAULT", "prod"),
        columns=getattr(module, "DURABILITY_COLUMNS", False),
        prod_binlog=args.prod_binlog == "on",
    )
    reports: dict[str, dict[str, Any]] = {}
    units: Units | None = None
    for wanted in plan:
        async with durability.serving(wanted, database.env_dsn()) as settings:
            if units is None:
                units = await calibrate.measure_units(args, h=not getattr(module, "MEASURES_H", False))
            args.units = units
            ran = durability.current()
            report = await module.run(args)
            report.setdefault("units", units.to_json())
            # The machine's speed can change within minutes: R again, so the report says
            # whether its ratios to R and H held still while it ran.
            report["units"]["r_after_us"] = await calibrate.measure_r_after(args)
            report["durability"] = {
                "name": ran.name,
                "label": ran.label,
                "private_server": ran.private,
                "settings": settings,
                "problems": durability.check_settings(ran, settings),
            }
            reports[ran.name] = report
    return combine_reports(reports)


def finish(name: str, report: dict[str, Any], args: argparse.Namespace) -> None:
    if not args.no_plots:
        outdir = args.out
        outdir.mkdir(parents=True, exist_ok=True)
        try:
            # Inside: without the bench extra (matplotlib), the figures are still written.
            from . import plots

            report["plots"] = [str(p) for p in importlib.import_module(SCENARIOS[name]).plot(report, outdir, plots)]
        except Exception as exc:  # a plot must never lose the figures
            report["plots_error"] = repr(exc)
    path = write_result(report, args.out, name)
    print_report(report)
    print(f"result: {path}" + (f"; plots: {', '.join(report.get('plots', []))}" if report.get("plots") else ""))
    print()


def main(argv: list[str]) -> int:
    if argv and argv[0] == "claim":
        return importlib.import_module("bench.claim").main(argv[1:])
    if not argv or argv[0] in ("-h", "--help") and len(argv) == 1:
        print(f"usage: python -m bench <scenario> [options]; scenarios: {', '.join([*COMMANDS, 'all', 'claim'])}")
        print("       (s0-s5 name calibration, burn-down, latency, priority, fairness and backlog too)")
        print("       python -m bench burn-down --help   (options of every scenario)")
        return 0
    args = build_parser().parse_args(argv)
    names = ALL if args.scenario == "all" else (NAMES.get(args.scenario, args.scenario),)
    missing = [f"{name}: {UNAVAILABLE[name]}" for name in names if name in UNAVAILABLE]
    if missing:
        raise SystemExit("cannot run " + "; ".join(missing) + " (install the bench extra)")
    context: dict[str, Any] = {}
    for name in names:

        async def go(name=name):
            return await run_one(name, args, context)

        report = trio.run(go)
        finish(name, report, args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
