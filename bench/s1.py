"""S1 burn-down: N pre-submitted tasks drained by Orbit in several Worker shapes, against its peers.

Orbit: a real node process (HTTP bulk submit, SDK Workers over WebSocket), 8 Worker
connections of each capacity of ``--capacities`` (1, 16, 64), each with a no-op handler
and with a 10 ms one (``--handler-ms``): node CPU per executed task in microseconds and
in R. Peers, each in its own process and at each of ``--peer-concurrency`` (8, 32, 128):
Procrastinate and PgQueuer on the local PostgreSQL, Huey's SQL storage on the same
MariaDB, Celery and Dramatiq each on a private Redis started for the run
(``bench/peers.py``, ``bench/redisserver.py``), at the run's durability setting. The SQL floor (S0) is
measured in the same run. Headline: Orbit's best no-op shape / each peer at the peer's
best concurrency, and Orbit / floor; MariaDB's statement counters per task, claim and
submit. At production durability by default (``--durability both`` adds a development
column and doubles a run of about ten minutes).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

import attrs
import trio

from . import REPO, durability
from .accounting import measured_phase
from .bulk import submit_bulk
from .calibrate import lowest_r
from .clients import connection_plan, wait_until, worker_fleet
from .database import admin_sql, bench_database, count_statements, count_tasks, make_app, seed_tasks
from .grids import grid
from .peers import E2E_PEERS, PEERS, REDIS_PEERS
from .processes import node_process
from .redisserver import private_redis
from .report import STATEMENTS_NOTE, Target, fmt_number, ratio, statement_costs, statements_table, summarize
from .s0 import floor_statement_rows, measure_floor
from .steps import OTHER, OUTSIDE, PARTS, by_part
from .units import Units, cost

# The columns of the node's CPU by part (bench/steps.py).
PART_NAMES = (*(part for part, _ in PARTS), OTHER, OUTSIDE)

# bench/__main__.py: a column per durability when asked; production durability alone by default.
DURABILITY_COLUMNS = True
DURABILITY_DEFAULT = "prod"
# Issue 13 targets: Orbit's tasks/s over each peer's at the peer's best concurrency
# (PgQueuer: Orbit at least as fast; issue 27: judged at production durability) and over
# the SQL floor. A peer not named here (Celery, Dramatiq) is measured and printed, not judged.
TARGET_VS_PEER = {"procrastinate": 3.0, "huey": 3.0, "pgqueuer": 1.0}
TARGET_VS_FLOOR = 0.60
# Issue 27: node CPU per executed task, in R, by Worker capacity (no-op handler).
TARGET_NODE_CPU_R = {64: 2.0, 16: 3.0}
# The P3 pacing: at most this many claims per connection per 1 s scan cycle.
PACE_CLAIMS_PER_S = 4
# Largest claim batch of a node (config.claim_batch_size).
# S1 pre-submits its tasks with POST /v1/tasks/batch: batches of this many, this many clients.
BULK_BATCH = 1000
BULK_CLIENTS = 2
# The node's default claim batch (ORBIT_CLAIM_BATCH_SIZE).
CLAIM_BATCH = 64
# S1 runs each Worker shape with this many connections (the targets per capacity are
# judged there).
S1_CONNECTIONS = 8
# Time a peer process may take beyond its drain bound (creating its database, pre-submitting).
PEER_SETUP_S = 180.0
# Claims per connection per cycle of the diagnostic runs: high enough never to bind.
LIFTED_PACE = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tasks", type=int, default=20_000, help="S1: tasks burned down per run (default 20000)")
    parser.add_argument(
        "--concurrency", type=int, default=128, help="S2: total Worker concurrency of Orbit (default 128)"
    )
    parser.add_argument(
        "--capacities",
        default="1,16,64",
        help="S1/e2e: Worker shapes: 8 connections of each of these capacities (default 1,16,64)",
    )
    parser.add_argument(
        "--handler-ms",
        default="0,10",
        help="S1/e2e: each shape runs with a handler that waits this many ms (0: no-op; default 0,10)",
    )
    parser.add_argument(
        "--shape-seconds",
        type=float,
        default=30.0,
        help="S1/e2e: a shape runs at most its pacing bound x this many seconds of tasks (default 30: "
        "capacity 1 is paced to 32 tasks/s)",
    )
    parser.add_argument(
        "--capacity",
        type=int,
        default=16,
        help="S2/S3/S4/S5: capacity of one Orbit Worker connection (default 16 = the claim batch)",
    )
    parser.add_argument(
        "--orbit-connections",
        default="8,32",
        help="S1: Orbit at its best concurrency, as each peer at --peer-concurrency: the no-op shape of the "
        "largest capacity also runs with each of these numbers of Worker connections (default 8,32)",
    )
    parser.add_argument(
        "--peers",
        default=",".join(PEERS),
        help=f"S1/e2e: peers to run (comma-separated, or none; e2e runs those of {', '.join(E2E_PEERS)}; "
        f"default {','.join(PEERS)})",
    )
    parser.add_argument(
        "--peer-concurrency",
        default="8,32,128",
        help="S1/e2e: each peer runs at each of these concurrencies; its best counts (default 8,32,128)",
    )
    parser.add_argument(
        "--peer-timeout-s",
        type=float,
        default=60.0,
        help="S1/e2e: a peer drains at most this long; its rate is then done / elapsed (default 60)",
    )
    parser.add_argument("--submit-concurrency", type=int, default=16, help="HTTP submitters at once (default 16)")
    parser.add_argument(
        "--no-diagnose",
        action="store_true",
        help="S1/S2: skip the diagnostic Orbit run with the per-connection pacing lifted",
    )


@attrs.frozen(order=True)
class Shape:
    """How users run Workers: ``connections`` SDK Worker connections of ``capacity``, each
    task's handler waiting ``handler_ms`` (0: the no-op handler)."""

    capacity: int
    handler_ms: int
    connections: int = S1_CONNECTIONS

    @property
    def judged(self) -> bool:
        """A no-op shape with S1's connections: where node CPU per task is judged."""
        return not self.handler_ms and self.connections == S1_CONNECTIONS

    @property
    def handler(self) -> str:
        return "no-op" if self.handler_ms == 0 else f"{self.handler_ms} ms"

    def tasks(self, wanted: int, seconds: float) -> int:
        """``wanted`` tasks, at most what the pace lets this shape take in ``seconds`` (and
        at least one full claim per connection)."""
        bound = pacing_bound(self.connections, self.capacity)
        return max(self.connections * self.capacity, min(wanted, int(bound * seconds)))


def parse_shapes(capacities: str, handler_ms: str, *, connections: int) -> list[Shape]:
    """The shapes of ``--capacities`` x ``--handler-ms`` (each a comma-separated list of
    positive/non-negative integers), capacity first, no-op before the waiting handler."""
    try:
        caps = [int(c) for c in capacities.split(",") if c.strip()]
        waits = [int(m) for m in handler_ms.split(",") if m.strip()]
    except ValueError:
        raise ValueError(f"--capacities {capacities!r} / --handler-ms {handler_ms!r}: integers expected") from None
    if not caps or any(c < 1 for c in caps):
        raise ValueError(f"--capacities {capacities!r}: positive integers expected")
    if not waits or any(m < 0 for m in waits):
        raise ValueError(f"--handler-ms {handler_ms!r}: integers >= 0 expected")
    return sorted({Shape(c, m, connections) for c in caps for m in waits})


def concurrency_shapes(shapes: Sequence[Shape], connections: str) -> list[Shape]:
    """``shapes`` and, for Orbit's best concurrency, the no-op shape of the largest
    capacity with each number of Worker connections of ``--orbit-connections``
    (comma-separated positive integers), in order."""
    try:
        counts = [int(c) for c in connections.split(",") if c.strip()]
    except ValueError:
        raise ValueError(f"--orbit-connections {connections!r}: integers expected") from None
    if any(c < 1 for c in counts):
        raise ValueError(f"--orbit-connections {connections!r}: positive integers expected")
    largest = max(s.capacity for s in shapes)
    return sorted({*shapes, *(Shape(largest, 0, c) for c in counts)})


def pacing_bound(connections: int, capacity: int) -> float:
    """Most tasks/s the P3 pacing lets ``connections`` no-op Workers take."""
    return connections * PACE_CLAIMS_PER_S * min(capacity, CLAIM_BATCH)


async def orbit_burndown(
    bdb,
    *,
    tasks: int,
    connections: int,
    capacity: int,
    submit_concurrency: int,
    profile: bool,
    app_name: str = "s1",
    pace: int | None = None,
    seed_sql: bool = False,
    handler_ms: int = 0,
) -> dict[str, Any]:
    """Pre-submit ``tasks`` over HTTP (or, with ``seed_sql``, write them with SQL), then drain
    them with SDK Workers; tasks/s of the drain.

    ``pace`` overrides the node's claims per connection per scan cycle (diagnostics only).
    """
    app = await make_app(bdb.db, app_name)
    async with node_process(bdb.dsn, claims_per_connection_per_cycle=pace, task_clock=True) as node:
        submit_started = time.perf_counter()
        async with count_statements(bdb.db) as submit_statements:
            if seed_sql:
                await seed_tasks(bdb.db, app, tasks)
                submit_lat: list[float] = []
            else:
                # Bulk: the drain is what S1 measures (single submits: `python -m bench http`).
                submit_lat = await submit_bulk(
                    node.url, app.token, app.queue_id, tasks, batch=BULK_BATCH, clients=BULK_CLIENTS
                )
        submit_s = time.perf_counter() - submit_started
        progress: list[tuple[float, int]] = []
        stats_before = node.last_stats()
        async with count_statements(bdb.db) as drain_statements:
            async with measured_phase(node.pid, profile=profile) as phase:
                start = time.perf_counter()
                async with worker_fleet(
                    node.url, connection_plan(app, connections), capacity=capacity, handler_s=handler_ms / 1000
                ) as fleet:

                    async def sample():
                        while True:
                            progress.append((time.perf_counter() - start, fleet.completed))
                            await trio.sleep(0.25)

                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(sample)
                        finished = await wait_until(lambda: fleet.completed >= tasks, timeout_s=max(120.0, tasks / 20))
                        nursery.cancel_scope.cancel()
                    seconds = time.perf_counter() - start
                    done = fleet.completed
        stats = node.last_stats()
    claims = sum(
        stats.get(k, 0) - stats_before.get(k, 0) for k in ("claims_with_tasks", "claims_empty", "claims_failed")
    )
    succeeded = await count_tasks(bdb.db, "application_id = %s AND state = 'succeeded'", (app.application_id,))
    progress.append((seconds, done))
    return {
        "tasks": done,
        "succeeded_in_db": succeeded,
        "seconds": seconds,
        "tasks_per_s": done / seconds,
        "complete": finished,
        "connections": connections,
        "capacity": capacity,
        "handler_ms": handler_ms,
        "pacing_bound_tasks_per_s": pacing_bound(connections, capacity),
        "submit": {
            "tasks_per_s": tasks / submit_s,
            "latency_s": summarize(submit_lat),
            "concurrency": BULK_CLIENTS,
            "batch": BULK_BATCH,
            "statements": submit_statements.delta,
            "per_submit": statement_costs(submit_statements.delta, 0 if seed_sql else tasks),
        },
        "claims": claims,
        "statements": drain_statements.delta,
        "per_task": statement_costs(drain_statements.delta, done),
        "per_claim": statement_costs(drain_statements.delta, claims),
        "node_cpu_us_per_task": ratio(phase.cpu["node_cpu_s"] * 1e6, done),
        "cpu": phase.cpu,
        "progress": progress,
        "node_stats": stats,
        # To within one statistics interval at each end of the phase (0.25 s of about 30).
        "node_parts": by_part(stats_before, stats, phase.cpu["node_cpu_s"]),
        "profile": phase.profile,
        "mean_claim_batch": ratio(stats.get("tasks_reserved", 0), stats.get("claims_with_tasks", 0)),
        "setup": f"node process + {connections} SDK Worker connections x capacity {capacity}, "
        f"{'no-op handler' if not handler_ms else f'handler waiting {handler_ms} ms'} (one harness process)",
    }


async def run_peer(
    name: str,
    tasks: int,
    concurrency: int,
    server,
    timeout_s: float,
    ran_at: durability.Durability,
    *,
    mode: str = "burn-down",
    submitters: int = 16,
) -> dict[str, Any]:
    """Run one peer in its own process in ``mode`` (``burn-down``, ``e2e``), bounded by
    ``timeout_s`` of draining (plus set-up), at the durability ``ran_at``: the PostgreSQL
    peers with its ``synchronous_commit``, the Redis peers on a new private Redis with its
    ``appendfsync``."""
    cmd = [
        sys.executable,
        "-m",
        "bench.peers",
        name,
        "--tasks",
        str(tasks),
        "--concurrency",
        str(concurrency),
        "--timeout-s",
        str(timeout_s),
        "--mysql-url",
        server.with_database("mysql").url(),
        "--synchronous-commit",
        ran_at.pg_synchronous_commit,
        "--mode",
        mode,
        "--submitters",
        str(submitters),
    ]
    if name not in REDIS_PEERS:
        return await _peer_process(cmd, server, timeout_s)
    try:
        async with private_redis(ran_at.redis_appendfsync) as url:
            return await _peer_process([*cmd, "--redis-url", url], server, timeout_s)
    except (OSError, RuntimeError, trio.TooSlowError) as exc:
        return {"error": f"Redis did not start: {exc}"}


async def run_peers(
    names: Sequence[str], concurrencies: Sequence[int], tasks: int, server, timeout_s: float, **how: Any
) -> dict[str, dict[int, dict[str, Any]]]:
    """Each peer of ``names`` at each of ``concurrencies``, one run after the other
    (``how``: ``run_peer``'s durability, mode and submitters)."""
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    for name in names:
        runs[name] = {}
        for concurrency in concurrencies:
            result = await run_peer(name, tasks, concurrency, server, timeout_s, **how)
            runs[name][concurrency] = {**result, "concurrency": concurrency}
    return runs


async def _peer_process(cmd: list[str], server, timeout_s: float) -> dict[str, Any]:
    """Run the peer process ``cmd``; its JSON result (its Huey database dropped afterwards)."""
    done = None
    with trio.move_on_after(timeout_s + PEER_SETUP_S):
        try:
            done = await trio.run_process(cmd, cwd=REPO, capture_stdout=True, capture_stderr=True, check=False)
        except OSError as exc:
            return {"error": f"could not start: {exc}"}
    if done is None:
        return {"error": f"did not finish within {timeout_s + PEER_SETUP_S:.0f} s"}
    lines = [line for line in done.stdout.decode().splitlines() if line.startswith("{")]
    if not lines:
        return {"error": f"exit {done.returncode}: {done.stderr.decode(errors='replace')[-400:]}"}
    result = json.loads(lines[-1])
    if result.get("database"):
        with trio.move_on_after(60):
            await admin_sql(server, f"DROP DATABASE IF EXISTS `{result['database']}`")
    if "tasks" in result and result.get("seconds"):
        result["tasks_per_s"] = result["tasks"] / result["seconds"]
    return result


def best_run(runs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The run with the most tasks/s (a run that did not run at all only when every one failed)."""
    measured = [r for r in runs.values() if "tasks_per_s" in r]
    if not measured:
        return next(iter(runs.values()), {"error": "not run"})
    return max(measured, key=lambda r: r["tasks_per_s"])


def shape_r_us(run: dict[str, Any], units: Units) -> float:
    """The R a shape's CPU per task is stated in: the mean of the R measured just before and
    just after it when it was (a judged shape), else the scenario's."""
    beside = run.get("r_beside_us")
    return sum(beside) / len(beside) if beside else units.r_us


def orbit_targets(
    orbit: dict[str, Any],
    floor: dict[str, Any],
    peers: dict[str, dict[str, Any]],
    shapes: Sequence[dict[str, Any]],
    units: Units,
    *,
    against_peers: bool = True,
) -> list[Target]:
    """``orbit``: the best no-op run; ``peers``: each peer's best run (with its
    ``concurrency``); ``shapes``: every Orbit run. ``against_peers``: judge the peer
    ratios (issue 27: at production durability)."""
    targets = []
    if against_peers:
        for name, peer in peers.items():
            if name not in TARGET_VS_PEER:
                continue
            value = ratio(orbit["tasks_per_s"], peer.get("tasks_per_s", math.nan))
            bound = TARGET_VS_PEER[name]
            note = peer.get("error", "")[:80] or f"{name} at its best concurrency, {peer.get('concurrency')}"
            label = f"S1 Orbit >= {name}" if bound == 1.0 else f"S1 Orbit / {name} at its best"
            targets.append(Target.at_least(label, value, bound, unit="x", note=note))
    note = f"pacing bound {orbit['pacing_bound_tasks_per_s']:,.0f} tasks/s"
    targets.append(
        Target.at_least(
            "S1 Orbit / SQL floor", ratio(orbit["tasks_per_s"], floor["tasks_per_s"]), TARGET_VS_FLOOR, note=note
        )
    )
    for capacity, bound in TARGET_NODE_CPU_R.items():
        run = next(
            (
                r
                for r in shapes
                if r["capacity"] == capacity and not r["handler_ms"] and r["connections"] == S1_CONNECTIONS
            ),
            None,
        )
        if run is None:
            continue
        us = run["node_cpu_us_per_task"]
        r_us = shape_r_us(run, units)
        beside = run.get("r_beside_us")
        where = (
            f"R beside the shape {fmt_number(beside[0])} / {fmt_number(beside[1])} us (before / after)"
            if beside
            else "the scenario's R"
        )
        targets.append(
            Target.at_most(
                f"S1 node CPU per executed task, capacity {capacity}",
                ratio(us, r_us),
                bound,
                unit=" R",
                note=f"{fmt_number(us)} us; {where}; {run['connections']} connections, no-op handler",
            )
        )
    return targets


def wanted_peers(args: argparse.Namespace, among: Sequence[str] = PEERS) -> tuple[list[str], list[int]]:
    """The peers of ``--peers`` that are in ``among`` (a name no peer has is an error), and
    ``--peer-concurrency``."""
    names = [p.strip() for p in args.peers.split(",") if p.strip() and p.strip() != "none"]
    unknown = sorted(set(names) - set(PEERS))
    if unknown:
        raise SystemExit(f"--peers: no peer named {', '.join(unknown)} (one of {', '.join(PEERS)}, or none)")
    return [p for p in names if p in among], [int(c) for c in args.peer_concurrency.split(",") if c]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    peers_wanted, peer_concurrency = wanted_peers(args)
    shapes = concurrency_shapes(
        parse_shapes(args.capacities, args.handler_ms, connections=S1_CONNECTIONS), args.orbit_connections
    )
    units: Units = args.units
    ran_at = durability.current()
    async with bench_database() as bdb:
        floor = await measure_floor(bdb, args.floor_tasks)
        runs: list[dict[str, Any]] = []
        for shape in shapes:
            judged = shape.judged and shape.capacity in TARGET_NODE_CPU_R
            # A judged shape's R is measured just before and just after it: R drifts by tens
            # of percent within a scenario on this kind of machine (bench/README.md).
            r_before = (await lowest_r(args, bdb.dsn))[0] if judged else math.nan
            run_ = await orbit_burndown(
                bdb,
                tasks=shape.tasks(args.tasks, args.shape_seconds),
                connections=shape.connections,
                capacity=shape.capacity,
                submit_concurrency=args.submit_concurrency,
                profile=not args.no_profile and judged,
                app_name=f"s1-{shape.capacity}-{shape.handler_ms}-{shape.connections}",
                handler_ms=shape.handler_ms,
            )
            if judged:
                run_["r_beside_us"] = [r_before, (await lowest_r(args, bdb.dsn))[0]]
            runs.append(run_)
        noop = [r for r in runs if not r["handler_ms"]] or runs
        orbit = max(noop, key=lambda r: r["tasks_per_s"])
        connections, capacity = orbit["connections"], orbit["capacity"]
        lifted = None
        if not args.no_diagnose:
            lifted = await orbit_burndown(
                bdb,
                tasks=orbit["tasks"],
                connections=connections,
                capacity=capacity,
                submit_concurrency=args.submit_concurrency,
                profile=False,
                app_name="s1-lifted",
                pace=LIFTED_PACE,
                seed_sql=True,
            )
        peer_runs = await run_peers(
            peers_wanted,
            peer_concurrency,
            args.tasks,
            bdb.dsn,
            args.peer_timeout_s,
            ran_at=ran_at,
            submitters=args.submit_concurrency,
        )
    peers = {name: best_run(runs) for name, runs in peer_runs.items()}
    headline = [
        [
            "Orbit (best no-op shape)",
            orbit["tasks_per_s"],
            1.0,
            orbit["seconds"],
            python_cpu_s(orbit),
            *machine_us_per_task(orbit),
        ]
    ]
    setups = [f"Orbit: {orbit['setup']}"]
    for name, peer in peers.items():
        setups.append(peer_setup(name, peer, args.tasks))
        if "error" in peer:
            headline.append([name, *[math.nan] * 6])
        else:
            headline.append(
                [
                    f"{name} (best)",
                    peer["tasks_per_s"],
                    ratio(orbit["tasks_per_s"], peer["tasks_per_s"]),
                    peer["seconds"],
                    peer["cpu_s"],
                    *machine_us_per_task(peer),
                ]
            )
    if lifted is not None:
        headline.append(
            [
                "Orbit, pacing lifted",
                lifted["tasks_per_s"],
                ratio(orbit["tasks_per_s"], lifted["tasks_per_s"]),
                lifted["seconds"],
                python_cpu_s(lifted),
                *machine_us_per_task(lifted),
            ]
        )
        setups.append(f"Orbit, pacing lifted: diagnostic only, {LIFTED_PACE} claims per connection per cycle, not 4")
    headline.append(
        [
            "SQL floor (S0)",
            floor["tasks_per_s"],
            ratio(orbit["tasks_per_s"], floor["tasks_per_s"]),
            floor["seconds"],
            math.nan,
            math.nan,
            math.nan,
        ]
    )
    setups.append("SQL floor: claim->start->finish SQL, batch 16, 4 loops, no HTTP/WS")
    here = ran_at.name
    headline_grid = grid(
        ["system"],
        ["tasks/s", "Orbit / this", "seconds", "python cpu s", "machine us/task", "outside python us/task"],
        headline,
        here,
        title="burn-down",
    )
    shape_grid = grid(
        ["capacity", "handler", "connections"],
        ["tasks", "tasks/s", "pacing bound", "claim batch", "node us/task", "R us", "R/task", "cpu busy"],
        [
            [
                r["capacity"],
                "no-op" if not r["handler_ms"] else f"{r['handler_ms']} ms",
                r["connections"],
                r["tasks"],
                r["tasks_per_s"],
                r["pacing_bound_tasks_per_s"],
                r["mean_claim_batch"],
                r["node_cpu_us_per_task"],
                shape_r_us(r, units),
                ratio(r["node_cpu_us_per_task"], shape_r_us(r, units)),
                r["cpu"]["machine_utilisation"],
            ]
            for r in runs
        ],
        here,
        title="Orbit's Worker shapes: SDK Worker connections",
    )
    parts_grid = grid(
        ["capacity", "handler", "connections"],
        [*PART_NAMES, "node us/task"],
        [
            [
                r["capacity"],
                "no-op" if not r["handler_ms"] else f"{r['handler_ms']} ms",
                r["connections"],
                *(ratio(r["node_parts"].get(part, math.nan) * 1e6, r["tasks"]) for part in PART_NAMES),
                r["node_cpu_us_per_task"],
            ]
            for r in runs
            if r.get("node_parts")
        ],
        here,
        title="the node's CPU per executed task (us) by its part: time inside the steps of its trio tasks",
    )
    by_concurrency = concurrency_grid(peer_runs, peers, orbit["tasks_per_s"], here)
    statement_rows = [
        ("Orbit burn-down (node)", "task", orbit["per_task"]),
        ("Orbit burn-down (node)", "claim", orbit["per_claim"]),
        ("Orbit bulk submit over HTTP", "task", orbit["submit"]["per_submit"]),
        *floor_statement_rows(floor),
    ]
    failed = [
        f"WARNING: {r['capacity']} x {r['handler_ms']} ms did not finish: {r['tasks']:,} done"
        for r in runs
        if not r["complete"]
    ]
    notes = [
        *failed,
        f"up to {args.tasks:,} no-op tasks per run; each Orbit shape at most its pacing bound x {args.shape_seconds:g} s "
        f"of tasks; each peer at {', '.join(str(c) for c in peer_concurrency)} (its best counts). Orbit's best no-op "
        f"shape: {connections} connections x capacity {capacity}.",
        *setups,
        f"Orbit pre-submit over HTTP in bulk: {orbit['submit']['tasks_per_s']:,.0f} tasks/s "
        f"({BULK_CLIENTS} clients, batches of {BULK_BATCH}, p99 {orbit['submit']['latency_s']['p99'] * 1000:.1f} ms "
        "per batch).",
        f"Orbit's P3 pacing (4 claims per connection per second, <= {CLAIM_BATCH} tasks a claim) bounds "
        f"{connections} connections of capacity {capacity} "
        f"to {orbit['pacing_bound_tasks_per_s']:,.0f} tasks/s; mean claim batch {orbit['mean_claim_batch']:.1f} tasks; "
        f"machine busy {orbit['cpu']['machine_utilisation']:.0%} of both cores, node process "
        f"{orbit['cpu']['node_cpu_s'] / orbit['seconds']:.0%} of one core during the burn-down "
        f"({cost(orbit['node_cpu_us_per_task'], units)} per task).",
        f"Orbit burn-down: {orbit['per_task']['statements']:.2f} statements and {orbit['per_task']['commits']:.3f} "
        f"COMMITs per task ({ratio(1.0, orbit['per_task']['commits']):.1f} tasks per COMMIT), "
        f"{orbit['claims']:,} claims; submit: {orbit['submit']['per_submit']['statements']:.2f} statements per task.",
        "node us/task: the node process's CPU during the burn-down / tasks finished; R/task: the same in R.",
        "the node's parts (bench/steps.py): claims = the claim pool's tasks (each claim's transaction), group "
        "commits = the Start/Finish group transactions, Worker connections = the node's side of each connection "
        "(messages, dispatch), HTTP and WebSocket server = hypercorn and quart (frames, the socket reads); "
        f"'{OUTSIDE}' = the node's CPU that no task step holds (trio's scheduler and I/O polling).",
        STATEMENTS_NOTE,
    ]
    profiles = {
        f"the node, capacity {r['capacity']}, no-op handler": r["profile"]
        for r in runs
        if r.get("profile") and r["profile"].get("samples")
    }
    return {
        "scenario": "s1",
        "server": bdb.server_version,
        "figures": {
            "orbit": orbit,
            "orbit_runs": runs,
            "orbit_pacing_lifted": lifted,
            "peers": peers,
            "peer_runs": peer_runs,
            "floor": floor,
        },
        "grids": [headline_grid, shape_grid, parts_grid, by_concurrency],
        "tables": [statements_table(statement_rows)],
        "targets": orbit_targets(orbit, floor, peers, runs, units, against_peers=ran_at.name == "prod"),
        "notes": notes,
        "profiles": profiles,
    }


def concurrency_grid(
    peer_runs: dict[str, dict[int, dict[str, Any]]], peers: dict[str, dict[str, Any]], orbit_per_s: float, here: str
) -> dict[str, Any]:
    """Every peer run's tasks/s, its best marked, and Orbit's best (``orbit_per_s``) over each peer's best."""
    rows: list[list[Any]] = []
    for name, by_concurrency in peer_runs.items():
        best = peers[name]
        for concurrency, result in by_concurrency.items():
            rows.append(
                [
                    name,
                    concurrency,
                    result.get("tasks_per_s", math.nan),
                    "best" if result is best and "tasks_per_s" in result else "",
                ]
            )
    for name, best in peers.items():
        rows.append([f"Orbit best / {name} best", "", ratio(orbit_per_s, best.get("tasks_per_s", math.nan)), ""])
    return grid(["system", "concurrency"], ["tasks/s", "best"], rows, here, title="peers at each concurrency")


def peer_setup(name: str, peer: dict[str, Any], tasks: int) -> str:
    """A note on how a peer's best run was set up (or why it did not run)."""
    if "error" in peer:
        return f"{name}: DID NOT RUN: {peer['error'][:120]}"
    return f"{name} {peer['version']}: {peer['setup']}{_partial(peer, tasks)}"


def python_cpu_s(run: dict[str, Any]) -> float:
    """CPU seconds of Orbit's own Python processes in a burn-down or e2e row: node and harness."""
    return run["cpu"]["node_cpu_s"] + run["cpu"]["harness_cpu_s"]


def machine_us_per_task(run: dict[str, Any]) -> tuple[float, float]:
    """The whole machine's CPU per task of a burn-down (us), and the part of it outside
    the system's own Python processes: the database server, the kernel, anything else.
    A peer's run carries its process's ``cpu_s`` and the machine's ``machine_cpu_s``."""
    if "cpu" in run:
        machine, python = run["cpu"]["machine_cpu_s"], python_cpu_s(run)
    else:
        machine, python = run.get("machine_cpu_s", math.nan), run.get("cpu_s", math.nan)
    tasks = run.get("tasks") or math.nan
    return machine * 1e6 / tasks, (machine - python) * 1e6 / tasks


def _partial(peer: dict[str, Any], tasks: int) -> str:
    if not peer.get("timed_out"):
        return ""
    return f" [stopped after {peer['seconds']:.0f} s: {peer['tasks']:,} of {tasks:,} done]"


def plot(report: dict[str, Any], outdir, plots) -> list:
    f = report["figures"]
    series = {"Orbit": f["orbit"]["progress"]}
    for name, peer in f["peers"].items():
        if "progress" in peer:
            series[name] = peer["progress"]
    names = ["Orbit", *[n for n, p in f["peers"].items() if "tasks_per_s" in p], "SQL floor"]
    values = [
        f["orbit"]["tasks_per_s"],
        *[p["tasks_per_s"] for p in f["peers"].values() if "tasks_per_s" in p],
        f["floor"]["tasks_per_s"],
    ]
    return [
        plots.lines(
            outdir / "s1-burndown.png",
            series,
            title="S1: tasks finished over time",
            xlabel="seconds since the Workers started",
            ylabel="tasks finished",
        ),
        plots.bar(
            outdir / "s1-throughput.png", names, values, title="S1: burn-down tasks/s (same run)", ylabel="tasks/s"
        ),
    ]
