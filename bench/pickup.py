"""S2 pickup: how fast what one node accepts reaches Workers on the same node and on another.

Two real node processes (A and B) on one database. Open-loop Poisson arrivals, submitted
one by one through node A (``--s2-pickup-rate``/s for ``--s2-pickup-seconds``), one in
four future-dated by 1-3 s; two SDK Worker connections of capacity 8 with a no-op
handler, on node A ("same node") or on node B ("another node"). Per task, on the
database clock: accepted -> started (``started_at - available_at`` of tasks due at
submit) and, for the future-dated ones, due -> started. Then cross-node cancel: a
Worker on node B runs ``--s2-cancels`` handlers that wait until cancelled; each is
cancelled through node A at a random moment within 1 s; from sending the cancel to the
handler catching ``trio.Cancelled`` (the harness's clock). Last, the idle cost: node B's
CPU with 16 idle Worker connections and no traffic.

With ``--s2-before DIR`` (another checkout, e.g. a scratch worktree of an earlier commit)
everything runs twice in the same run, the two codes taking turns part by part (the
earlier first), so that the two columns are paired: same machine, same minutes, same
database server.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import Any

import trio

from orbit_sdk import OrbitClient, Worker

from .accounting import cpu_seconds
from .cancel import HANDLER as BLOCKING_HANDLER
from .cancel import Blocking, cancel_path
from .clients import connection_plan, submit_open_loop, wait_until, worker_fleet
from .database import BenchDb, count_tasks, make_app, task_times
from .processes import node_process
from .report import percentile, summarize

# The measurement: two connections of capacity 8, ~3 arrivals/s.
CONNECTIONS = 2
CAPACITY = 8
FUTURE_EVERY = 4
FUTURE_DELAY_S = (1.0, 3.0)
# Cancels land at random moments within this spread.
CANCEL_SPREAD_S = 1.0
# Idle cost: Worker connections, settling time (longer than the signal reads' busy
# period after the last signal: the node is idle, not just after traffic), measured window.
IDLE_WORKERS = 16
IDLE_SETTLE_S = 13.0
IDLE_SECONDS = 10.0
PLACEMENTS = (("same", "same node"), ("other", "another node"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--s2-pickup-rate", type=float, default=3.0, help="S2 pickup: Poisson arrivals/s through node A (default 3)"
    )
    parser.add_argument(
        "--s2-pickup-seconds", type=float, default=40.0, help="S2 pickup: arrival window per placement (default 40)"
    )
    parser.add_argument("--s2-cancels", type=int, default=20, help="S2 pickup: cross-node cancels (default 20)")
    parser.add_argument(
        "--s2-before",
        type=Path,
        default=None,
        help="S2 pickup and pace: a checkout of earlier code measured first in the same run (paired before/after)",
    )


def latency(values_s: list[float]) -> dict[str, float]:
    """count, p50, p90, p99, p999 and max in milliseconds."""
    data = sorted(values_s)
    s = summarize(data)
    return {
        "count": s["count"],
        "p50_ms": s["p50"] * 1000,
        "p90_ms": s["p90"] * 1000,
        "p99_ms": s["p99"] * 1000,
        "p999_ms": (percentile(data, 99.9) if data else float("nan")) * 1000,
        "max_ms": s["max"] * 1000,
    }


async def arrivals(
    bdb: BenchDb,
    submit_url: str,
    workers_url: str,
    *,
    label: str,
    rate: float,
    seconds: float,
    seed: int,
    connections: int = CONNECTIONS,
    capacity: int = CAPACITY,
) -> dict[str, Any]:
    """Poisson arrivals at ``rate``/s for ``seconds`` through ``submit_url``, one in
    ``FUTURE_EVERY`` future-dated; ``connections`` SDK Workers of ``capacity`` (no-op) on
    ``workers_url``. Accepted -> started of the tasks due at submit, due -> started of the
    others (database clock)."""
    app = await make_app(bdb.db, label)
    rng = random.Random(seed)

    def delay(i: int) -> float | None:
        return rng.uniform(*FUTURE_DELAY_S) if i % FUTURE_EVERY == FUTURE_EVERY - 1 else None

    async with worker_fleet(workers_url, connection_plan(app, connections), capacity=capacity):
        await trio.sleep(1.5)  # connections settled: their first (empty) claims are behind them
        sent = await submit_open_loop(
            submit_url,
            app.token,
            app.queue_id,
            rate=rate,
            duration_s=seconds,
            delay_s=delay,
            seed=seed,
        )
        where = "application_id = %s AND state NOT IN ('succeeded', 'failed', 'cancelled', 'expired')"
        await wait_until(lambda: _none_left(bdb, where, app.application_id), timeout_s=60, poll_s=0.25)
    times = await task_times(bdb.db, "application_id = %s AND state = 'succeeded'", (app.application_id,))
    now = [t["to_start"] for t in times if t["dated_ahead"] < 0.5 and t["to_start"] is not None]
    future = [t["to_start"] for t in times if t["dated_ahead"] >= 0.5 and t["to_start"] is not None]
    return {
        "submitted": sent["submitted"],
        "dropped": sent["dropped"],
        "errors": sent["errors"],
        "accepted_to_started": latency(now),
        "due_to_started": latency(future),
        "samples": now,
    }


async def _none_left(bdb: BenchDb, where: str, application_id: str) -> bool:
    return await count_tasks(bdb.db, where, (application_id,)) == 0


async def cross_node_cancel(bdb: BenchDb, via_url: str, holding_url: str, *, label: str, tasks: int) -> dict:
    app = await make_app(bdb.db, label)
    handler = Blocking()
    async with OrbitClient(holding_url, app.token) as via_holding, OrbitClient(via_url, app.token) as via_other:
        worker = Worker(holding_url, app.token, [app.queue_id], capacity=tasks, client_name="bench")
        worker.register(*BLOCKING_HANDLER, handler)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            try:
                row = await cancel_path(via_holding, via_other, worker, handler, app, tasks, CANCEL_SPREAD_S)
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(10):
                    await worker.drain()
                nursery.cancel_scope.cancel()
    return {"tasks": row["tasks"], "cancel_to_cancelled": latency(row["samples_s"])}


async def idle_cost(bdb: BenchDb, node_url: str, node_pid: int, *, label: str) -> dict[str, float]:
    app = await make_app(bdb.db, label)
    async with worker_fleet(node_url, connection_plan(app, IDLE_WORKERS), capacity=1):
        await trio.sleep(IDLE_SETTLE_S)
        cpu, wall = cpu_seconds(node_pid), time.perf_counter()
        await trio.sleep(IDLE_SECONDS)
        used = cpu_seconds(node_pid) - cpu
        wall = time.perf_counter() - wall
    return {"node_cpu_share": used / wall, "seconds": wall}


async def measure(bdb: BenchDb, args: argparse.Namespace) -> dict[str, Any]:
    """Every part for each code. With ``--s2-before``, the two codes take turns part by part
    (the earlier code first), each on a fresh pair of node processes: what the machine
    does meanwhile falls on both alike."""
    codes: list[tuple[str, Path | None]] = [("after", None)]
    if args.s2_before is not None:
        codes.insert(0, ("before", args.s2_before.resolve()))
    out: dict[str, dict[str, Any]] = {code: {} for code, _ in codes}
    for part in (*(placement for placement, _ in PLACEMENTS), "cancel", "idle"):
        for code, source in codes:
            label = f"s2p-{code}-{part}"
            async with node_process(bdb.dsn, tree=source) as a, node_process(bdb.dsn, tree=source) as b:
                if part == "cancel":
                    out[code][part] = await cross_node_cancel(bdb, a.url, b.url, label=label, tasks=args.s2_cancels)
                elif part == "idle":
                    out[code][part] = await idle_cost(bdb, b.url, b.pid, label=label)
                else:
                    workers_url = a.url if part == "same" else b.url
                    seed = 1 + [p for p, _ in PLACEMENTS].index(part)
                    out[code][part] = await arrivals(
                        bdb,
                        a.url,
                        workers_url,
                        label=label,
                        rate=args.s2_pickup_rate,
                        seconds=args.s2_pickup_seconds,
                        seed=seed,
                    )
    return out
