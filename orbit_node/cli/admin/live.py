"""``orbit-admin top``: the live view (``cli/top.py`` draws it)."""

from __future__ import annotations

import argparse
from typing import Any

from ...db import Database
from ...store.operations import OperationsStore
from ..common import console, fail
from .command import streaming


def add_parsers(sub: Any) -> None:
    top = sub.add_parser(
        "top",
        help="live view of queues, backlog per priority, running and claim turns per application",
        description="Refreshes every --interval seconds until interrupted (Ctrl-C), or --iterations times. "
        "Claim turns come from the counters every node records in the database.",
    )
    top.add_argument("--application")
    top.add_argument("--namespace", help="needs --application")
    top.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="refresh period (default 1)")
    top.add_argument("--iterations", type=int, default=None, metavar="N", help="stop after N frames")
    top.add_argument("--once", action="store_true", help="one frame, then exit (same as --iterations 1)")
    top.add_argument("--json", action="store_true", help="one JSON object per frame, one per line")
    streaming(top, run)


async def run(db: Database, args: argparse.Namespace) -> None:
    from ..top import run_top

    if args.namespace and not args.application:
        fail("--namespace needs --application", 2)
    if args.interval <= 0:
        fail("--interval: must be positive", 2)
    if args.iterations is not None and args.iterations < 1:
        fail("--iterations: must be at least 1", 2)
    iterations = 1 if args.once else args.iterations
    try:
        await run_top(
            OperationsStore(db),
            console(),
            interval_s=args.interval,
            iterations=iterations,
            as_json=args.json,
            application=args.application,
            namespace=args.namespace,
        )
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a live view ends
