"""A real Orbit node in its own process, for the harness (``python -m bench.nodeproc``).

It runs ``orbit_node.node.Node`` with the production services on 127.0.0.1 (a free
port), writes ``{"url", "pid"}`` to ``--ready`` once it listens, and every
``--stats-interval-s`` appends one JSON line of the claim pool's and the Worker hub's
statistics to ``--stats`` (wall-clock time ``t``): the harness reads claim turns per
application from there, and with ``--task-clock`` the CPU inside each trio task's steps
(``bench.steps``).
SIGTERM (or SIGINT) shuts the node down gracefully.

The node runs in its own process, as in production, so a profiler can attach to it
(py-spy) and its CPU time is accounted separately from the Workers'.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import attrs
import trio

from orbit_node.cli.node import settle_collector
from orbit_node.config import NodeConfig, SchedulerLimits
from orbit_node.domain.dsn import Dsn, parse_shards
from orbit_node.node import Node
from orbit_node.services import default_services

from .steps import TaskClock


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.nodeproc")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--ready", type=Path, required=True)
    parser.add_argument("--stats", type=Path)
    parser.add_argument("--stats-interval-s", type=float, default=0.25)
    parser.add_argument(
        "--claims-per-connection-per-cycle",
        type=int,
        default=None,
        help="override the P3 pacing (default: the node's baseline, 4)",
    )
    parser.add_argument(
        "--claim-batch-size", type=int, default=None, help="tasks one claim may take (default: the node's, 64)"
    )
    parser.add_argument(
        "--run-lease-s", type=float, default=None, help="lease of a running attempt (default: the node's, 60)"
    )
    parser.add_argument("--shards", default="", help="ORBIT_SHARDS of the node (default: none, one database)")
    parser.add_argument(
        "--task-clock", action="store_true", help="time the steps of each trio task (bench.steps) into --stats"
    )
    parser.add_argument("--log-level", default="warning")
    return parser.parse_args(argv)


def _commit_stats(node: Node) -> dict[str, int]:
    """The group commits' counters, summed over the node's shards."""
    stats = [s.commits.statistics() for s in node.state.services.shards.all if s.commits is not None]
    if not stats:
        return {}
    return {
        "transition_groups": sum(c.groups for c in stats),
        "transition_batches": sum(c.batches for c in stats),
        "transition_items": sum(c.items for c in stats),
    }


async def _stats_loop(node: Node, path: Path, interval_s: float, clock: TaskClock | None) -> None:
    with path.open("a", buffering=1) as out:
        while True:
            claims = node.state.services.pool
            hub = node.state.services.hub
            if claims is not None and hub is not None:
                s = claims.statistics()
                out.write(
                    json.dumps(
                        {
                            "t": time.time(),
                            "turns_by_application": s.turns_by_application,
                            "claims_with_tasks": s.claims_with_tasks,
                            "claims_empty": s.claims_empty,
                            "claims_failed": s.claims_failed,
                            "tasks_reserved": s.tasks_reserved,
                            "cached_empty_skips": s.cached_empty_skips,
                            "pending": s.pending,
                            "in_flight": s.in_flight,
                            "dispatched": hub.dispatched,
                            **_commit_stats(node),
                            "connections": len(hub.connections),
                            **({} if clock is None else clock.statistics()),
                        }
                    )
                    + "\n"
                )
            await trio.sleep(interval_s)


async def serve(args: argparse.Namespace, clock: TaskClock | None) -> None:
    limits = SchedulerLimits()
    if args.claims_per_connection_per_cycle is not None:
        limits = attrs.evolve(limits, claims_per_connection_per_cycle=args.claims_per_connection_per_cycle)
    config = NodeConfig(
        dsn=Dsn.parse(args.dsn),
        shards=parse_shards(args.shards),
        http_host="127.0.0.1",
        http_port=0,
        shutdown_grace_s=2.0,
        log_level=args.log_level,
        scheduler=limits,
        **({} if args.claim_batch_size is None else {"claim_batch_size": args.claim_batch_size}),
        **({} if args.run_lease_s is None else {"run_lease_s": args.run_lease_s}),
    )
    node = Node(config, services=default_services())

    async def stop_on_signal() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                node.request_shutdown()
                return

    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as serving:
            bound = await serving.start(node.run)
            serving.start_soon(stop_on_signal)
            if args.stats is not None:
                outer.start_soon(_stats_loop, node, args.stats, args.stats_interval_s, clock)
            tmp = args.ready.with_suffix(".tmp")
            tmp.write_text(json.dumps({"url": bound[0], "pid": os.getpid()}))
            tmp.replace(args.ready)
        # node.run returned: drained and closed.
        outer.cancel_scope.cancel()


def main(argv: list[str]) -> int:
    import logging

    args = parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        stream=sys.stderr,
        format="node %(levelname)s %(name)s: %(message)s",
    )
    settle_collector()  # as `orbit` does
    clock = TaskClock() if args.task_clock else None
    trio.run(serve, args, clock, instruments=[] if clock is None else [clock])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
