"""Chaos: three nodes under a fault schedule, and a history checker's verdict.

Three real node processes on a private ``mariadbd`` (each through its own fault proxy),
two SDK Workers per node, a client submitting ``--chaos-rate`` tasks/s (priorities 0-9,
15 % with a resource key) under idempotency keys, retried with the same key when a
submit fails. Faults one at a time, ``--chaos-gap-s`` apart, for ``--chaos-seconds``:
SIGKILL and SIGSTOP/SIGCONT of a node, restart of the database (kill -9 or SIGTERM),
one node's database connection stalled or dropped, a Worker cut off mid-task, one node's
Worker connections reset while their handlers run, a rolling restart of a node. Then every
acknowledged task must settle (bounded), and the checker proves from the Workers'
execution log and the ``tasks``/``task_attempts`` rows: one terminal state per
acknowledged submit, no two executions of a task (or of a resource key) under live
leases at once, no terminal state changed, a rerun only after a lost attempt. Every
task run more than once is charged to the fault its earlier run ended in: a connection
cut or a drain must re-run nothing.

The run itself is ``harness/chaos.py``; ``tests/system/test_chaos.py`` runs 40 s of it in
``make test``. Not part of ``all``: it takes ten minutes by default.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

from harness.chaos import FAULTS, NO_RERUN_FAULTS, ChaosPlan, run_chaos
from harness.history import PROPERTIES

from .report import Target, format_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chaos-seconds", type=float, default=600.0, help="chaos: length of the faults (600)")
    parser.add_argument("--chaos-rate", type=float, default=10.0, help="chaos: tasks submitted per second (10)")
    parser.add_argument("--chaos-workers", type=int, default=2, help="chaos: SDK Workers per node (2)")
    parser.add_argument("--chaos-capacity", type=int, default=4, help="chaos: capacity of each Worker (4)")
    parser.add_argument(
        "--chaos-gap-s", type=float, nargs=2, default=(2.0, 6.0), help="chaos: pause between faults (2 6)"
    )
    parser.add_argument("--chaos-seed", type=int, default=0, help="chaos: seed of the schedule and the load (0)")
    parser.add_argument(
        "--chaos-keep", action="store_true", help="chaos: keep the node logs and the execution log when all holds"
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    plan = ChaosPlan(
        seconds=args.chaos_seconds,
        submits_per_s=args.chaos_rate,
        workers_per_node=args.chaos_workers,
        capacity=args.chaos_capacity,
        gap_s=tuple(args.chaos_gap_s),
        settle_s=120.0,
        seed=args.chaos_seed,
        rotate=False,
    )
    workdir = Path(tempfile.mkdtemp(prefix="orbit-chaos-"))
    result = await run_chaos(plan, workdir)
    kept = args.chaos_keep or not result.ok
    if not kept:
        shutil.rmtree(workdir, ignore_errors=True)
    verdict = result.verdict
    faults = format_table(
        ["fault", "count", "handlers running through it", "tasks run again after it"],
        [
            [kind, result.faults[kind], result.handlers_through[kind] if kind in NO_RERUN_FAULTS else "-"]
            + [result.reruns[kind]]
            for kind in FAULTS
        ]
        + [["(no fault)", "-", "-", result.reruns["none"]]],
        align="lrrr",
    )
    figures = format_table(["history", "count"], [[name, value] for name, value in verdict.figures.items()])
    properties = format_table(
        ["property", "violations", "verdict"],
        [
            [name, len(verdict.violations[name]), "holds" if not verdict.violations[name] else "VIOLATED"]
            for name in PROPERTIES
        ],
    )
    violations = sum(len(found) for found in verdict.violations.values())
    notes = [
        f"{plan.seconds:g} s of faults, {result.seconds:.0f} s in all; {result.submitted:,} submits "
        f"({result.submit_retries:,} requests retried with the same key, {len(result.refused)} refused); "
        f"{result.handlers_cut} handlers cut off mid-task; {result.worker_sessions} Worker sessions; "
        f"{result.failed_tasks} tasks failed although no handler fails.",
        f"every acknowledged task was terminal {result.settle_seconds:.1f} s after the faults ended"
        if result.settled
        else f"NOT every acknowledged task was terminal {plan.settle_s:g} s after the faults ended",
        f"verdict: {'every property holds' if result.ok else 'FAILED'}"
        + (f" (node logs, execution and fault logs in {workdir})" if kept else ""),
        *(f"violation: {v}" for name in PROPERTIES for v in verdict.violations[name][:20]),
        *(f"refused submit: {r}" for r in result.refused[:10]),
        *(f"Worker rejected: {r}" for r in result.worker_rejections[:10]),
    ]
    return {
        "scenario": "chaos",
        "server": result.server_version,
        "figures": {
            "faults": dict(result.faults),
            "history": dict(verdict.figures),
            "violations": {name: list(verdict.violations[name]) for name in PROPERTIES},
            "settled": result.settled,
            "settle_seconds": result.settle_seconds,
            "submitted": result.submitted,
            "submit_retries": result.submit_retries,
            "refused": result.refused,
            "worker_rejections": result.worker_rejections,
            "handlers_cut": result.handlers_cut,
            "failed_tasks": result.failed_tasks,
            "handlers_through": dict(result.handlers_through),
            "reruns": dict(result.reruns),
            "ok": result.ok,
        },
        "tables": [faults, figures, properties],
        "targets": [
            Target.at_most("chaos: history property violations", violations, 0),
            Target.at_most(
                "chaos: tasks run again after a connection cut or a drain",
                sum(result.reruns[kind] for kind in NO_RERUN_FAULTS),
                0,
            ),
        ],
        "notes": notes,
        "profiles": {},
    }


def plot(report: dict[str, Any], outdir, plots) -> list:
    return []
