"""S4 fairness: claim turns where the claim pool is the bottleneck; isolation under a flood.

Phases, each on a fresh node process (so the claim pool's counters start at zero):

* ``alone``: applications B and C (1 queue, 1 connection each) with Poisson arrivals
  over HTTP: their baseline wait.
* ``flood``: application A (10 queues, 40 connections, a large seeded backlog) floods
  while B and C keep their steady load: B's and C's p99 wait relative to ``alone``.
* ``pool-bound``: six busy applications (A as above; B-F with 1 queue and 1-2
  connections), each with a seeded backlog, and the node's claim SQL slowed: a proxy in
  front of MariaDB (``bench/proxy.py``) holds each claim's candidate read (the statement
  that names ``ix_tasks_claim``) for ``--s4-claim-delay-ms``, as a slow candidate read
  would take; the node's other SQL passes at once. More busy applications than claim SQL
  slots, and claims slow enough that the slots, not the per-connection pace, limit
  claiming. Claim turns per application: Jain's index and A's share.
* ``slow-sql`` (issue 24's measurement): every statement of the node slowed by
  ``--s4-sql-delay-ms`` (the proxy without ``--only``), six applications with a backlog,
  every Worker the SDK Worker of capacity 4: A (10 queues, 20 connections), B-F (1 queue,
  2 connections each). A small application's Workers wait for their Start/Finish acks
  with no request waiting, so the rotation must not punish a brief absence.
* ``three-nodes``: the same applications and slowed SQL on three node processes sharing
  the database; A's Workers spread over all three, B-F's on the first only, Workers that
  always have a request waiting (as in ``pool-bound``). Cluster-wide claim turns (every
  node's, summed): B's share against its weight's share.

* ``weights``: six applications of each fairness weight 1, 2 and 4 (set as ``orbit-admin
  application weight`` sets them), one node, the slowed SQL, Workers that always have a
  request waiting: each application's share of the turns against the share its weight
  gives. Six of each, so that the heaviest needs well under one of the 4 SQL slots: one
  claim in flight per application caps any application at one slot, whatever its weight.

* ``isolation``: the small applications' throughput alone and beside A, in the shape
  of ``slow-sql`` (every statement slowed, SDK Workers of capacity 4), for each delay of
  ``--s4-isolation-delays`` and each number of connections per small application of
  ``--s4-isolation-connections``: B-F alone, then the same beside A. Each small
  application should start at least 0.9x what it starts alone, up to its weighted share
  of the node's total beside A. Where a small application's time goes: its claims per
  connection and second, tasks per claim, and the legs reserved -> started -> finished,
  from its tasks' rows.
* ``admission``: B submits one task at a time at ``--s4-admission-rate``/s over HTTP,
  alone, then while A floods single submits with ``--s4-admission-clients`` clients back
  to back: B's submit latency p50/p99 both times, and the 429s each application got.

With ``--s4-baseline DIR`` (a source tree of an older commit: ``git worktree add DIR
2f1cfde``), ``slow-sql``, ``three-nodes``, ``isolation`` and ``admission`` also run with that tree's node, in the same
run, before the current one: a before/after pair.

Claim turns per application come from the node's ``ClaimPool.statistics()``.
"""

from __future__ import annotations

import argparse
import secrets
import subprocess
import time
from contextlib import AsyncExitStack, nullcontext
from pathlib import Path
from typing import Any

import attrs
import trio

from orbit_node.store.operations import OperationsStore
from orbit_sdk.client import OrbitClient
from orbit_sdk.errors import ResourceExhaustedError

from .clients import connection_plan, submit_open_loop, submit_request, worker_fleet
from .database import App, bench_database, make_app, seed_tasks, task_times
from .processes import node_process
from .proxy import delayed_dsn
from .report import Target, fairness, format_table, ms, ratio, summarize
from .s1 import PACE_CLAIMS_PER_S

# Issues 8 and 14: Jain's index on claim turns between busy applications, pool-bound.
TARGET_JAIN = 0.99
# Issue 14: the big application's share of claim turns, pool-bound: at most 1/6 + 2 %.
TARGET_BIG_SHARE = 1 / 6 + 0.02
# Issue 13: B's p99 wait with A flooding over B's p99 alone.
TARGET_FLOOD_P99_RATIO = 1.2
A_QUEUES = 10
A_CONNECTIONS = 40
# The node's claim SQL slots (SchedulerLimits.sql_slots), for the saturation figure.
SQL_SLOTS = 4
# Added to each claim's candidate read in the pool-bound phase: 4 slots then serve about
# 15 claims/s, 2.5 per application of six, under the pace of 4 per connection.
CLAIM_DELAY_MS = 250.0
# The statement the delay applies to: the claim's candidate read names this index.
SLOW_STATEMENT = "ix_tasks_claim"
# Pool-bound phase: the node's claim batch and the Workers' capacity. A connection of
# twice the batch asks again while a batch runs (a request is made once half a batch is
# free), so every application always has a request waiting for its turn.
POOL_CLAIM_BATCH = 16
POOL_CAPACITY = 2 * POOL_CLAIM_BATCH
# Turn counts are plotted per this many seconds.
SERIES_STEP_S = 1.0
# Issue 24: the measurement's shape. Every statement of the node slowed by this much
# (the claim, the transitions, everything: the pool's 4 slots are the bottleneck), SDK
# Workers of capacity 4 (a connection asks again once 2 are free), A with 10 queues and
# 20 connections, B-F with 1 queue and 2 connections each.
SQL_DELAY_MS = 20.0
# The three-nodes phase's delay. At 20 ms the first node claimed 44-47 times a second on
# the 2-core machine, more than B-F's pace lets them take (5 x 2 connections x 4 claims/s):
# B-F sat at their pace and A had the rest, so the phase measured the pace, not the
# sharing across nodes. At 30 ms the first node claims about 36 times a second.
SPREAD_DELAY_MS = 30.0
SLOW_CAPACITY = 4
SLOW_A_CONNECTIONS = 20
SLOW_SMALL_CONNECTIONS = 2
SMALL = "BCDEF"
# The slowed phases measure after this long: every connection has said hello, and every
# node has written its turns and read the others' at least twice (once a second).
SLOW_WARM_UP_S = 3.0
# Issue 24's targets: one node, A over the mean of B-F and Jain on claim turns; three
# nodes, B's cluster-wide share of the turns over the share its weight gives it.
TARGET_A_OVER_SMALL = 1.1
TARGET_SLOW_JAIN = 0.99
TARGET_SPREAD_SHARE = 0.8
NODES = 3


@attrs.frozen
class AppSpec:
    """One application of a phase; ``backlog`` 0 means steady arrivals over HTTP instead.
    Its connections go round-robin to the phase's nodes named in ``nodes``."""

    key: str
    queues: int
    connections: int
    backlog: int
    nodes: tuple[int, ...] = (0,)
    weight: int = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--s4-seconds", type=float, default=20.0, help="S4: measured window per phase (default 20)")
    parser.add_argument("--s4-backlog", type=int, default=30_000, help="S4: A's backlog, flood phase (default 30000)")
    parser.add_argument("--s4-rate", type=float, default=20.0, help="S4: B's and C's arrivals/s each (default 20)")
    parser.add_argument(
        "--s4-claim-delay-ms",
        type=float,
        default=CLAIM_DELAY_MS,
        help=f"S4: delay added to each claim's candidate read, pool-bound phase (default {CLAIM_DELAY_MS:g})",
    )
    parser.add_argument(
        "--s4-pool-backlog",
        type=int,
        default=6_000,
        help="S4: seeded backlog of each application, pool-bound phase (default 6000)",
    )
    parser.add_argument(
        "--s4-sql-delay-ms",
        type=float,
        default=SQL_DELAY_MS,
        help=f"S4: delay added to every statement, slow-sql and weights phases (default {SQL_DELAY_MS:g})",
    )
    parser.add_argument(
        "--s4-spread-delay-ms",
        type=float,
        default=SPREAD_DELAY_MS,
        help=f"S4: delay added to every statement, three-nodes phase (default {SPREAD_DELAY_MS:g}: B-F under their pace)",
    )
    parser.add_argument(
        "--s4-slow-backlog",
        type=int,
        default=4_000,
        help="S4: seeded backlog of each application, slow-sql and three-nodes phases (default 4000)",
    )
    parser.add_argument(
        "--s4-isolation-delays",
        default=",".join(f"{d:g}" for d in ISOLATION_DELAYS_MS),
        help="S4: isolation phase, the delays added to every statement, ms (default 20,40)",
    )
    parser.add_argument(
        "--s4-isolation-connections",
        default=",".join(map(str, ISOLATION_CONNECTIONS)),
        help="S4: isolation phase, connections per small application (default 1,2)",
    )
    parser.add_argument(
        "--s4-admission-rate",
        type=float,
        default=ADMISSION_RATE,
        help=f"S4: admission phase, B's submits/s (default {ADMISSION_RATE:g})",
    )
    parser.add_argument(
        "--s4-admission-clients",
        type=int,
        default=ADMISSION_CLIENTS,
        help=f"S4: admission phase, A's flooding clients (default {ADMISSION_CLIENTS})",
    )
    parser.add_argument(
        "--s4-phases",
        default=",".join(PHASES),
        help=f"S4: the phases to run, comma-separated (default: all, {','.join(PHASES)})",
    )
    parser.add_argument(
        "--s4-baseline",
        type=Path,
        default=None,
        help="S4: a source tree of an older commit (git worktree add DIR 2f1cfde): slow-sql and three-nodes "
        "also run with its node, in the same run",
    )


PHASES = ("alone", "flood", "pool-bound", "slow-sql", "three-nodes", "weights", "isolation", "admission")
# Issue 38: the isolation phase's shapes and target. A small application beside A starts
# at least this much of what it starts alone, up to its weighted share of the node.
ISOLATION_DELAYS_MS = (20.0, 40.0)
ISOLATION_CONNECTIONS = (1, 2)
TARGET_ISOLATION = 0.9
# Issue 38: the admission phase. A floods single submits with this many clients back to
# back; B submits one at a time at this rate. B's p99 under the flood within this factor
# of its p99 alone, plus ADMISSION_SLACK_S.
ADMISSION_CLIENTS = 32
ADMISSION_RATE = 10.0
TARGET_ADMISSION_P99 = 3.0
ADMISSION_SLACK_S = 0.020
# The weights phase: six applications of each weight. So many that the heaviest one's
# share of the turns (4/42) needs well under one SQL slot: one claim in flight per
# application caps any application at one slot of four, whatever its weight.
WEIGHTS = (1, 2, 4)
WEIGHTED_COPIES = 6
# Issue 24: with weights 1:2:4, each application's share within 10 % of its weight's.
TARGET_WEIGHT_SHARE_ERROR = 0.10
# The diagnostic beside slow-sql (skipped with --no-diagnose).
SMALL_ALONE = "slow-sql, B-F alone"


def slow_apps(
    backlog: int, *, nodes: int = 1, big: bool = True, small_connections: int = SLOW_SMALL_CONNECTIONS
) -> list[AppSpec]:
    """A: 10 queues, 20 connections over every node (a backlog for each); B-F: 1 queue,
    ``small_connections`` connections, on the first node. Without ``big``, B-F alone."""
    small = [AppSpec(key, 1, small_connections, backlog) for key in SMALL]
    if not big:
        return small
    return [AppSpec("A", A_QUEUES, SLOW_A_CONNECTIONS, backlog * nodes, nodes=tuple(range(nodes))), *small]


def weighted_apps(backlog: int) -> list[AppSpec]:
    """W1a, W1b, ... (weight 1), W2a, ... (2), W4a, ... (4): 1 queue and 2 connections each."""
    return [
        AppSpec(f"W{weight}{copy}", 1, SLOW_SMALL_CONNECTIONS, backlog, weight=weight)
        for weight in WEIGHTS
        for copy in "abcdefgh"[:WEIGHTED_COPIES]
    ]


def weight_figures(p: dict[str, Any]) -> dict[str, Any]:
    """Per application, its share of the turns over the share its weight gives (weight over
    the sum of the phase's weights); Jain's index over turns per unit of weight."""
    weights = {spec["key"]: spec["weight"] for spec in p["apps"]}
    total = sum(p["turns"].values())
    over = {
        key: ratio(ratio(p["turns"].get(key, 0), total), weight / sum(weights.values()))
        for key, weight in weights.items()
    }
    return {
        "share_over_weight": over,
        "worst_error": max(abs(v - 1) for v in over.values()),
        "weighted_jain": fairness({key: p["turns"].get(key, 0) / w for key, w in weights.items()})["jain"],
    }


def pool_bound_apps(backlog: int) -> list[AppSpec]:
    """A: 10 queues, 40 connections; B-F: 1 queue and 1 or 2 connections."""
    small = [AppSpec(key, 1, connections, backlog) for key, connections in zip("BCDEF", (1, 2, 1, 2, 1), strict=True)]
    return [AppSpec("A", A_QUEUES, A_CONNECTIONS, backlog), *small]


async def _phase(
    bdb,
    name: str,
    specs: list[AppSpec],
    *,
    seconds: float,
    rate: float,
    capacity: int,
    claim_delay_ms: float = 0.0,
    delay_only: str | None = SLOW_STATEMENT,
    claim_batch_size: int | None = None,
    nodes: int = 1,
    warm_up_s: float = 1.0,
    tree: Path | None = None,
    code: str = "",
) -> dict[str, Any]:
    """One phase on ``nodes`` fresh node processes sharing the database (``tree``'s node
    when given, labelled ``code``); claim turns are summed over the nodes."""
    apps: dict[str, App] = {}
    label = name if not code else f"{name} @{code}"
    for spec in specs:
        app = await make_app(bdb.db, f"{spec.key}-{label}", queues=spec.queues)
        for queue_id in app.queue_ids:
            if spec.backlog:
                await seed_tasks(bdb.db, app, max(1, spec.backlog // spec.queues), queue_id=queue_id)
        apps[spec.key] = app
        if spec.weight != 1:
            # What `orbit-admin application weight` does; each node applies it within a second.
            await OperationsStore(bdb.db).set_weight(app.name, spec.weight)
    steady = [spec.key for spec in specs if not spec.backlog]
    plans: list[list[tuple[str, Any]]] = [[] for _ in range(nodes)]
    for spec in specs:
        for i, connection in enumerate(connection_plan(apps[spec.key], spec.connections)):
            plans[spec.nodes[i % len(spec.nodes)]].append(connection)
    async with AsyncExitStack() as stack:
        node_dsn = await stack.enter_async_context(_node_dsn(bdb.dsn, claim_delay_ms, delay_only))
        procs = [
            await stack.enter_async_context(node_process(node_dsn, claim_batch_size=claim_batch_size, tree=tree))
            for _ in range(nodes)
        ]
        async with AsyncExitStack() as fleets:
            for node, plan in zip(procs, plans, strict=True):
                if plan:
                    await fleets.enter_async_context(worker_fleet(node.url, plan, capacity=capacity))
            await trio.sleep(warm_up_s)  # every connection has said hello and made its first claim
            before = [node.last_stats() for node in procs]
            t0 = time.time()
            if not steady:
                await trio.sleep(seconds)
            else:
                async with trio.open_nursery() as nursery:
                    for index, key in enumerate(steady):
                        nursery.start_soon(
                            lambda s=apps[key], i=index: submit_open_loop(
                                procs[0].url, s.token, s.queue_id, rate=rate, duration_s=seconds, seed=11 + i
                            )
                        )
            t1 = time.time()
            await trio.sleep(0.5)
            after = [node.last_stats() for node in procs]
            stats = [node.stats() for node in procs]
    names = {app.application_id: key for key, app in apps.items()}
    if any("turns_by_application" not in line for line in after):
        raise RuntimeError(f"S4 {label}: a node wrote no statistics during the window (did it stop?)")
    turns_by_node = [
        {
            key: a.get("turns_by_application", {}).get(app.application_id, 0)
            - b.get("turns_by_application", {}).get(app.application_id, 0)
            for key, app in apps.items()
        }
        for a, b in zip(after, before, strict=True)
    ]
    turns = {key: sum(node[key] for node in turns_by_node) for key in apps}
    windows = [[line for line in node if t0 <= line["t"] <= t1] for node in stats]
    finished, waits = {}, {}
    for key, app in apps.items():
        rows = await task_times(bdb.db, "application_id = %s AND state = 'succeeded'", (app.application_id,))
        finished[key] = sum(1 for r in rows if r["finished"] is not None and t0 <= r["finished"] <= t1)
        if key in steady:
            waits[key] = summarize(r["to_start"] for r in rows)
    series = [_turn_series(node, names, t0, t1) for node in stats]
    cycles = {key: await cycle_figures(bdb.db, app.application_id, t0, t1) for key, app in apps.items()}
    return {
        "name": label,
        "phase": name,
        "code": code,
        "nodes": nodes,
        "apps": [attrs.asdict(s) for s in specs],
        "window_s": t1 - t0,
        "turns": turns,
        "turns_by_node": turns_by_node,
        "turn_fairness": fairness(turns),
        "throughput": {k: v / (t1 - t0) for k, v in finished.items()},
        "throughput_fairness": fairness(finished),
        "cycles": cycles,
        "waits_s": waits,
        "series": {key: _sum_series([s[key] for s in series]) for key in names.values()},
        "claim_delay_ms": claim_delay_ms,
        "delay_only": delay_only,
        "mean_in_flight": _mean(line.get("in_flight", 0) for line in windows[0]),
        "mean_pending": _mean(line.get("pending", 0) for line in windows[0]),
    }


async def _flood_client(client: OrbitClient, queue_id: str, done: trio.Event, counts: dict[str, int]) -> None:
    """Single submits back to back until ``done``; a 429 is tried again at once (a flood
    that does not honour Retry-After: the node's worst case)."""
    i = 0
    while not done.is_set():
        i += 1
        try:
            await client.submit_task(f"f-{secrets.token_hex(8)}-{i}", submit_request(queue_id))
            counts["accepted"] += 1
        except ResourceExhaustedError:
            counts["refused"] += 1
        except Exception:
            counts["errors"] += 1


async def _admission_phase(bdb, args: argparse.Namespace, *, tree: Path | None, code: str) -> dict[str, Any]:
    """B's single submits at a steady rate, alone and then under A's flood of single
    submits back to back, on one fresh node: B's latencies, the 429s of each."""
    label = "admission" if not code else f"admission @{code}"
    a = await make_app(bdb.db, f"A-{label}", queues=1)
    b = await make_app(bdb.db, f"B-{label}", queues=1)
    out: dict[str, Any] = {"name": label, "phase": "admission", "code": code, "apps": [], "admission": {}}
    async with node_process(bdb.dsn, tree=tree) as node:
        for flooding in (False, True):
            flood = {"accepted": 0, "refused": 0, "errors": 0}
            done = trio.Event()
            clients = [OrbitClient(node.url, a.token) for _ in range(args.s4_admission_clients if flooding else 0)]
            t0 = time.perf_counter()
            try:
                async with trio.open_nursery() as nursery:
                    for client in clients:
                        nursery.start_soon(_flood_client, client, a.queue_id, done, flood)
                    if flooding:
                        await trio.sleep(1.0)  # the flood is under way before B is measured
                    got = await submit_open_loop(
                        node.url, b.token, b.queue_id, rate=args.s4_admission_rate, duration_s=args.s4_seconds, seed=5
                    )
                    done.set()
            finally:
                with trio.CancelScope(shield=True):
                    for client in clients:
                        await client.aclose()
            seconds = time.perf_counter() - t0
            out["admission"]["flood" if flooding else "alone"] = {
                "b": summarize(got["submit_latencies"]),
                "b_refused": got["refused"],
                "b_errors": got["errors"],
                "a_accepted_s": flood["accepted"] / seconds,
                "a_refused": flood["refused"],
                "a_errors": flood["errors"],
            }
    return out


async def cycle_figures(db, application_id: str, t0: float, t1: float) -> dict[str, float]:
    """Where an application's time goes in a window, from its tasks reserved in it: claims
    per connection and second (a claim's tasks share one reserved_at), tasks per claim,
    and the mean legs reserved -> started (the Start) and started -> finished (handler and
    Finish), in seconds."""
    sql = (
        "SELECT connection_id, COUNT(*) AS tasks, COUNT(DISTINCT reserved_at) AS claims, "
        "AVG(TIMESTAMPDIFF(MICROSECOND, reserved_at, started_at)) / 1e6 AS to_start, "
        "AVG(TIMESTAMPDIFF(MICROSECOND, started_at, finished_at)) / 1e6 AS to_finish "
        "FROM tasks WHERE application_id = %s AND reserved_at >= FROM_UNIXTIME(%s) "
        "AND reserved_at < FROM_UNIXTIME(%s) AND state = 'succeeded' GROUP BY connection_id"
    )
    rows = await db.run(lambda tx: tx.fetchall_raw(sql, (application_id, t0, t1)))
    if not rows:
        return {}
    tasks = sum(int(r["tasks"]) for r in rows)
    claims = sum(int(r["claims"]) for r in rows)
    return {
        "connections": len(rows),
        "claims_per_connection_s": claims / len(rows) / (t1 - t0),
        "tasks_per_claim": tasks / claims,
        "to_start_s": sum(float(r["to_start"]) * int(r["tasks"]) for r in rows) / tasks,
        "to_finish_s": sum(float(r["to_finish"]) * int(r["tasks"]) for r in rows) / tasks,
    }


def isolation_figures(alone: dict[str, Any], beside: dict[str, Any]) -> dict[str, Any]:
    """Per small application: tasks/s alone, beside A, and beside A over the most it can
    be promised (what it starts alone, up to its weighted share of the node's total
    beside A)."""
    total = sum(beside["throughput"].values())
    weights = {spec["key"]: spec["weight"] for spec in beside["apps"]}
    rows = {}
    for key in SMALL:
        got_alone, got = alone["throughput"].get(key, 0.0), beside["throughput"].get(key, 0.0)
        share = total * weights[key] / sum(weights.values())
        bound = min(got_alone, share)
        rows[key] = {"alone": got_alone, "beside": got, "share": share, "bound": bound, "ratio": ratio(got, bound)}
    return {"apps": rows, "total": total, "worst": min(r["ratio"] for r in rows.values())}


def isolation_report(isolations: list[dict[str, Any]]) -> tuple[list[str], list[Target]]:
    """The isolation phases' tables (per small application; where its time goes) and a
    target per shape run with this tree's node."""
    pairs: dict[tuple[str, float, int], dict[bool, dict[str, Any]]] = {}
    for p in isolations:
        pairs.setdefault((p["code"], p["delay_ms"], p["small_connections"]), {})[p["big"]] = p
    rows, cycle_rows, targets = [], [], []
    for (code, delay, small), pair in pairs.items():
        if False not in pair or True not in pair:
            continue
        figures = isolation_figures(pair[False], pair[True])
        shape = f"{delay:g} ms, {small} conn" + ("s" if small > 1 else "")
        for key, row in figures["apps"].items():
            rows.append(
                [
                    code or "this tree",
                    shape,
                    key,
                    row["alone"],
                    row["beside"],
                    figures["total"],
                    row["share"],
                    row["ratio"],
                ]
            )
        for big, p in sorted(pair.items()):
            cycles = [p["cycles"][key] for key in SMALL if p["cycles"].get(key)]
            cycle_rows.append(
                [
                    code or "this tree",
                    shape,
                    "beside A" if big else "alone",
                    _mean(c["claims_per_connection_s"] for c in cycles),
                    _mean(c["tasks_per_claim"] for c in cycles),
                    ms(_mean(c["to_start_s"] for c in cycles)),
                    ms(_mean(c["to_finish_s"] for c in cycles)),
                    p["cycles"].get("A", {}).get("claims_per_connection_s", "-"),
                    f"{p['mean_in_flight']:.2f} / {SQL_SLOTS}",
                ]
            )
        if not code:
            targets.append(
                Target.at_least(
                    f"S4 isolation {shape}: worst small app, beside A / min(alone, share)",
                    figures["worst"],
                    TARGET_ISOLATION,
                    note=f"every statement +{delay:g} ms, B-F {small} x capacity {SLOW_CAPACITY}, A 10 x 20",
                )
            )
    tables = [
        format_table(
            [
                "isolation: node code",
                "shape",
                "app",
                "tasks/s alone",
                "beside A",
                "node total beside A",
                "weighted share of it",
                "beside / min(alone, share)",
            ],
            rows,
            align="lllrrrrr",
        ),
        format_table(
            [
                "where B-F's time goes: node code",
                "shape",
                "B-F",
                "claims / connection / s",
                "tasks / claim",
                "reserved -> started ms",
                "started -> finished ms",
                "A's claims / connection / s",
                "claims in flight",
            ],
            cycle_rows,
            align="lllrrrrrr",
        ),
    ]
    return tables, targets


def admission_report(admissions: list[dict[str, Any]]) -> tuple[str, list[Target]]:
    """The admission phases' table and, for this tree's node, B's p99 target and no 429 for B."""
    rows, targets = [], []
    for p in admissions:
        alone, flood = p["admission"]["alone"], p["admission"]["flood"]
        rows.append(
            [
                p["code"] or "this tree",
                ms(alone["b"].get("p50", float("nan"))),
                ms(alone["b"].get("p99", float("nan"))),
                ms(flood["b"].get("p50", float("nan"))),
                ms(flood["b"].get("p99", float("nan"))),
                ratio(flood["b"].get("p99"), alone["b"].get("p99")),
                flood["a_accepted_s"],
                flood["a_refused"],
                alone["b_refused"] + flood["b_refused"],
                alone["b_errors"] + flood["b_errors"] + flood["a_errors"],
            ]
        )
        if not p["code"]:
            bound = TARGET_ADMISSION_P99 * alone["b"].get("p99", float("nan")) + ADMISSION_SLACK_S
            targets += [
                Target.at_most(
                    "S4 admission: B's submit p99 under A's flood",
                    ms(flood["b"].get("p99", float("nan"))),
                    ms(bound),
                    unit=" ms",
                    note=f"{TARGET_ADMISSION_P99:g}x B's p99 alone + {ms(ADMISSION_SLACK_S):g} ms",
                ),
                Target.at_most("S4 admission: B's 429s", alone["b_refused"] + flood["b_refused"], 0),
            ]
    table = format_table(
        [
            "admission: node code",
            "B alone p50 ms",
            "p99 ms",
            "B under A's flood p50 ms",
            "p99 ms",
            "p99 flood / alone",
            "A accepted / s",
            "A's 429s",
            "B's 429s",
            "other errors",
        ],
        rows,
        align="lrrrrrrrrr",
    )
    return table, targets


def _node_dsn(dsn, delay_ms: float, only: str | None):
    """The DSN the nodes get: through the delay proxy when ``delay_ms`` is set (every
    statement, or with ``only`` those whose text contains it)."""
    return delayed_dsn(dsn, delay_ms, only=only) if delay_ms > 0 else nullcontext(dsn)


def _sum_series(series: list[list[tuple[float, int]]]) -> list[tuple[float, int]]:
    """Several nodes' series of one application, added step by step (the first node's times)."""
    steps = min(len(s) for s in series)
    return [(series[0][i][0], sum(s[i][1] for s in series)) for i in range(steps)]


def _mean(values) -> float:
    data = list(values)
    return sum(data) / len(data) if data else float("nan")


def _turn_series(stats: list[dict[str, Any]], names: dict[str, str], t0: float, t1: float) -> dict[str, list]:
    """Claim turns per application per ``SERIES_STEP_S``, from the node's cumulative counters."""
    series: dict[str, list] = {name: [] for name in names.values()}
    previous: dict[str, int] | None = None
    next_t = t0
    for line in stats:
        if line["t"] < next_t:
            continue
        current = {names[a]: n for a, n in line.get("turns_by_application", {}).items() if a in names}
        if previous is not None:
            for name in series:
                series[name].append((round(line["t"] - t0, 2), current.get(name, 0) - previous.get(name, 0)))
        previous = current
        next_t = line["t"] + SERIES_STEP_S
        if line["t"] > t1:
            break
    return series


def _tree_code(tree: Path) -> str:
    """The short commit of a source tree (a git worktree), else its directory name."""
    try:
        return subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return tree.name


def spread_figures(p: dict[str, Any]) -> dict[str, float]:
    """A slowed phase's fairness figures: A over the mean of B-F, and B's cluster-wide share
    over the share its weight gives it, beside the most B could have had without idling a
    node: the first node's turns, all of them to B-F, split evenly, but no more than the
    pace lets B's connections claim in the window (a node that claims faster than B-F's
    pace gives the rest to A: the rotation is work-conserving)."""
    turns = p["turns"]
    total = sum(turns.values())
    weights = {spec["key"]: spec["weight"] for spec in p["apps"]}
    small_mean = sum(turns.get(k, 0) for k in SMALL) / len(SMALL)
    weight_share = weights["B"] / sum(weights.values())
    b_share = ratio(turns.get("B", 0), total)
    first_node = sum(p["turns_by_node"][0].values())
    b_connections = next(spec["connections"] for spec in p["apps"] if spec["key"] == "B")
    b_pace = PACE_CLAIMS_PER_S * b_connections * p["window_s"]
    return {
        "a_over_small": ratio(turns.get("A", 0), small_mean),
        "b_share": b_share,
        "b_over_weight": ratio(b_share, weight_share),
        "b_ceiling_over_weight": ratio(ratio(min(first_node / len(SMALL), b_pace), total), weight_share),
        "b_over_pace": ratio(turns.get("B", 0), b_pace),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    wanted = [name.strip() for name in args.s4_phases.split(",") if name.strip()]
    unknown = set(wanted) - set(PHASES)
    if unknown:
        raise SystemExit(f"--s4-phases: unknown {', '.join(sorted(unknown))} (phases: {', '.join(PHASES)})")
    common = {"seconds": args.s4_seconds, "rate": args.s4_rate}
    steady = [AppSpec("B", 1, 1, 0), AppSpec("C", 1, 1, 0)]
    slow = {
        **common,
        "capacity": SLOW_CAPACITY,
        "claim_delay_ms": args.s4_sql_delay_ms,
        "delay_only": None,
        "warm_up_s": SLOW_WARM_UP_S,
    }
    trees: list[tuple[Path | None, str]] = [(None, "")]
    if args.s4_baseline is not None:
        trees.insert(0, (args.s4_baseline.resolve(), _tree_code(args.s4_baseline)))
    phases = []
    async with AsyncExitStack() as databases:
        bdb = await databases.enter_async_context(bench_database())
        # The baseline's node runs on a database its own migrations made (a node refuses a
        # schema newer than its own); the harness's rows are written the same way on both.
        dbs = {None: bdb}
        if args.s4_baseline is not None:
            dbs[trees[0][0]] = await databases.enter_async_context(bench_database(migrations_of=trees[0][0]))
        if "alone" in wanted:
            phases.append(await _phase(bdb, "alone", steady, capacity=args.capacity, **common))
        if "flood" in wanted:
            flood = [AppSpec("A", A_QUEUES, A_CONNECTIONS, args.s4_backlog), *steady]
            phases.append(await _phase(bdb, "flood", flood, capacity=args.capacity, **common))
        if "pool-bound" in wanted:
            phases.append(
                await _phase(
                    bdb,
                    "pool-bound",
                    pool_bound_apps(args.s4_pool_backlog),
                    capacity=POOL_CAPACITY,
                    claim_delay_ms=args.s4_claim_delay_ms,
                    claim_batch_size=POOL_CLAIM_BATCH,
                    **common,
                )
            )
        if "slow-sql" in wanted:
            for tree, code in trees:
                specs = slow_apps(args.s4_slow_backlog)
                phases.append(await _phase(dbs[tree], "slow-sql", specs, tree=tree, code=code, **slow))
            if not args.no_diagnose:
                # B-F without A: the most their Workers take at all (each connection waits for
                # its Start and Finish acks before it asks again), to set beside the fair share.
                specs = slow_apps(args.s4_slow_backlog, big=False)
                phases.append(await _phase(bdb, SMALL_ALONE, specs, **slow))
        if "three-nodes" in wanted:
            for tree, code in trees:
                specs = slow_apps(args.s4_slow_backlog, nodes=NODES)
                phases.append(
                    await _phase(
                        dbs[tree],
                        "three-nodes",
                        specs,
                        nodes=NODES,
                        tree=tree,
                        code=code,
                        **{**slow, "capacity": POOL_CAPACITY, "claim_delay_ms": args.s4_spread_delay_ms},
                        claim_batch_size=POOL_CLAIM_BATCH,
                    )
                )
        if "isolation" in wanted:
            delays = [float(d) for d in args.s4_isolation_delays.split(",") if d.strip()]
            connections = [int(c) for c in args.s4_isolation_connections.split(",") if c.strip()]
            for tree, code in trees:
                for delay in delays:
                    for small in connections:
                        shape = {**slow, "claim_delay_ms": delay, "tree": tree, "code": code}
                        for big in (False, True):
                            specs = slow_apps(args.s4_slow_backlog, big=big, small_connections=small)
                            name = f"isolation {delay:g} ms x{small}, " + ("beside A" if big else "B-F alone")
                            phase = await _phase(dbs[tree], name, specs, **shape)
                            phase |= {"phase": "isolation", "delay_ms": delay, "small_connections": small, "big": big}
                            phases.append(phase)
        if "admission" in wanted:
            for tree, code in trees:
                phases.append(await _admission_phase(dbs[tree], args, tree=tree, code=code))
        if "weights" in wanted:
            phases.append(
                await _phase(
                    bdb,
                    "weights",
                    weighted_apps(args.s4_slow_backlog),
                    **{**slow, "capacity": POOL_CAPACITY},
                    claim_batch_size=POOL_CLAIM_BATCH,
                )
            )
    by = {p["name"]: p for p in phases}
    admissions = [p for p in phases if p["phase"] == "admission"]
    isolations = [p for p in phases if p["phase"] == "isolation"]
    phases_with_turns = [p for p in phases if p["phase"] != "admission"]
    turn_rows = []
    for p in phases_with_turns:
        if p["phase"] == "isolation":
            continue  # its own table below
        tf, hf = p["turn_fairness"], p["throughput_fairness"]
        weights = {spec["key"]: spec["weight"] for spec in p["apps"]}
        for spec in p["apps"]:
            key = spec["key"]
            weight_share = spec["weight"] / sum(weights.values())
            turn_rows.append(
                [
                    p["name"],
                    key,
                    f"{spec['queues']} x {spec['connections']}"
                    + (f" on {len(spec['nodes'])} nodes" if len(spec["nodes"]) > 1 else ""),
                    p["turns"].get(key, 0) / p["window_s"],
                    f"{tf['shares'].get(key, 0):.1%}",
                    f"{weight_share:.1%}",
                    ratio(tf["shares"].get(key, 0), weight_share),
                    p["throughput"].get(key, 0),
                    f"{hf['shares'].get(key, 0):.1%}",
                ]
            )
    turn_table = format_table(
        [
            "phase",
            "app",
            "queues x conns",
            "turns/s",
            "turn share",
            "weight's share",
            "share / weight's",
            "tasks/s",
            "task share",
        ],
        turn_rows,
        align="lllrrrrrr",
    )
    phase_rows = [
        [
            p["name"],
            len(p["apps"]),
            f"{p['claim_delay_ms']:g}" + ("" if p["delay_only"] else " (all)"),
            sum(p["turns"].values()) / p["window_s"],
            p["turn_fairness"]["jain"],
            p["turn_fairness"]["min_over_max"],
            p["throughput_fairness"]["jain"],
            f"{p['mean_in_flight']:.2f} / {SQL_SLOTS}",
            p["mean_pending"],
            ms(ratio(p["mean_in_flight"], sum(p["turns_by_node"][0].values()) / p["window_s"])),
        ]
        for p in phases_with_turns
    ]
    phase_table = format_table(
        [
            "phase",
            "apps",
            "delay ms",
            "turns/s",
            "turns Jain",
            "min/max",
            "tasks Jain",
            "claims in flight",
            "requests waiting",
            "claim ms",
        ],
        phase_rows,
    )
    tables = [phase_table, turn_table]
    slow_phases = [p for p in phases if p["phase"] in ("slow-sql", "three-nodes")]
    if slow_phases:
        slow_rows = []
        for p in slow_phases:
            f = spread_figures(p)
            slow_rows.append(
                [
                    p["phase"],
                    p["code"] or "this tree",
                    p["nodes"],
                    " / ".join(f"{sum(n.values()) / p['window_s']:.1f}" for n in p["turns_by_node"]),
                    p["turn_fairness"]["jain"],
                    f["a_over_small"],
                    f"{f['b_share']:.1%}",
                    f["b_over_weight"],
                    f["b_ceiling_over_weight"] if p["nodes"] > 1 else "-",
                ]
            )
        tables.append(
            format_table(
                [
                    "phase",
                    "node code",
                    "nodes",
                    "turns/s per node",
                    "Jain",
                    "A / mean(B..F)",
                    "B's share",
                    "B / weight's share",
                    "B's ceiling / weight's",
                ],
                slow_rows,
                align="llrrrrrrr",
            )
        )
    if SMALL_ALONE in by and "slow-sql" in by:
        alone, one = by[SMALL_ALONE], by["slow-sql"]
        can = sum(alone["turns"].values()) / len(SMALL) / alone["window_s"]
        fair = sum(one["turns"].values()) / len(one["turns"]) / one["window_s"]
        got = sum(one["turns"][k] for k in SMALL) / len(SMALL) / one["window_s"]
        tables.append(
            format_table(
                [
                    "slow-sql, per small application",
                    "turns/s B-F alone (their Workers' most)",
                    "fair share with A",
                    "most / fair",
                    "turns/s with A",
                    "with A / fair",
                ],
                [["mean of B-F", can, fair, ratio(can, fair), got, ratio(got, fair)]],
            )
        )
    if "weights" in by:
        figures = weight_figures(by["weights"])
        tables.append(
            format_table(
                ["weights phase", "Jain on turns / weight", "worst |share / weight's - 1|"],
                [
                    [
                        f"{len(WEIGHTS) * WEIGHTED_COPIES} apps, weights {', '.join(map(str, WEIGHTS))} "
                        f"({WEIGHTED_COPIES} each)",
                        figures["weighted_jain"],
                        f"{figures['worst_error']:.1%}",
                    ]
                ],
            )
        )
    targets = []
    if isolations:
        iso_tables, iso_targets = isolation_report(isolations)
        tables += iso_tables
        targets += iso_targets
    if admissions:
        adm_table, adm_targets = admission_report(admissions)
        tables.append(adm_table)
        targets += adm_targets
    if "alone" in by and "flood" in by:
        wait_rows = []
        for key in ("B", "C"):
            alone, flood = by["alone"]["waits_s"].get(key, {}), by["flood"]["waits_s"].get(key, {})
            wait_rows.append(
                [
                    key,
                    ms(alone.get("p50", float("nan"))),
                    ms(alone.get("p99", float("nan"))),
                    ms(flood.get("p50", float("nan"))),
                    ms(flood.get("p99", float("nan"))),
                    ratio(flood.get("p99"), alone.get("p99")),
                ]
            )
        tables.append(
            format_table(
                ["app", "alone p50 ms", "alone p99 ms", "with A flooding p50 ms", "p99 ms", "p99 flood/alone"],
                wait_rows,
            )
        )
        b_alone, b_flood = by["alone"]["waits_s"].get("B", {}), by["flood"]["waits_s"].get("B", {})
        targets.append(
            Target.at_most(
                "S4 B's p99 wait, A flooding / alone",
                ratio(b_flood.get("p99"), b_alone.get("p99")),
                TARGET_FLOOD_P99_RATIO,
                unit="x",
                note="available -> start, database clock",
            )
        )
    if "pool-bound" in by:
        pool = by["pool-bound"]
        targets += [
            Target.at_least(
                "S4 Jain on claim turns, pool-bound",
                pool["turn_fairness"]["jain"],
                TARGET_JAIN,
                note=f"6 busy apps, candidate read +{args.s4_claim_delay_ms:g} ms",
            ),
            Target.at_most(
                "S4 A's share of claim turns, pool-bound",
                100 * pool["turn_fairness"]["shares"].get("A", float("nan")),
                100 * TARGET_BIG_SHARE,
                unit="%",
                note=f"A: {A_QUEUES} queues, {A_CONNECTIONS} connections",
            ),
        ]
    if "slow-sql" in by:
        one = by["slow-sql"]
        targets += [
            Target.at_most(
                "S4 A / mean(B..F) claim turns, slow-sql",
                spread_figures(one)["a_over_small"],
                TARGET_A_OVER_SMALL,
                unit="x",
                note=f"every statement +{args.s4_sql_delay_ms:g} ms, SDK Workers of capacity {SLOW_CAPACITY}",
            ),
            Target.at_least(
                "S4 Jain on claim turns, slow-sql", one["turn_fairness"]["jain"], TARGET_SLOW_JAIN, note="6 apps"
            ),
        ]
    if "three-nodes" in by:
        figures = spread_figures(by["three-nodes"])
        targets.append(
            Target.at_least(
                "S4 B's cluster-wide share / its weight's, three nodes",
                figures["b_over_weight"],
                TARGET_SPREAD_SHARE,
                note=f"A on {NODES} nodes, B-F on one; the most without idling a node or passing B's pace: "
                f"{figures['b_ceiling_over_weight']:.2f}; B at {figures['b_over_pace']:.0%} of its pace",
            )
        )
    if "weights" in by:
        targets.append(
            Target.at_most(
                "S4 weights 1:2:4, worst share / weight's share - 1",
                100 * weight_figures(by["weights"])["worst_error"],
                100 * TARGET_WEIGHT_SHARE_ERROR,
                unit="%",
                note=f"{len(WEIGHTS) * WEIGHTED_COPIES} apps, one node, every statement +{args.s4_sql_delay_ms:g} ms",
            )
        )
    notes = [
        f"alone / flood: A has {A_QUEUES} queues x {A_CONNECTIONS // A_QUEUES} connections and a backlog of "
        f"{args.s4_backlog:,}; B, C: 1 queue, 1 connection, {args.s4_rate:g} arrivals/s each over HTTP; capacity "
        f"{args.capacity}. Waits: available -> start, database clock.",
        f"pool-bound: A as above, B-F 1 queue with 1, 2, 1, 2, 1 connections; every application a seeded backlog "
        f"of {args.s4_pool_backlog:,}; node claim batch {POOL_CLAIM_BATCH}, Worker capacity {POOL_CAPACITY} (a "
        "connection asks again while a batch runs: every application always waits for a turn); the node reaches "
        f"MariaDB through a proxy that holds each claim's candidate read (the statement naming {SLOW_STATEMENT}) for "
        f"{args.s4_claim_delay_ms:g} ms; its other SQL passes at once.",
        f"slow-sql: A {A_QUEUES} queues x {SLOW_A_CONNECTIONS} connections, B-F 1 queue x "
        f"{SLOW_SMALL_CONNECTIONS} connections, a seeded backlog of {args.s4_slow_backlog:,} each; SDK Workers of "
        f"capacity {SLOW_CAPACITY}, the node's default claim batch; the node reaches MariaDB through a proxy that "
        f"holds every statement {args.s4_sql_delay_ms:g} ms. '{SMALL_ALONE}': the same without A (diagnostic: "
        "what B-F's Workers take at all).",
        f"three-nodes: the same applications, the proxy holding every statement {args.s4_spread_delay_ms:g} ms, "
        f"{NODES} node processes on the database, A's connections "
        f"round-robin over them, B-F's on the first; Workers of capacity {POOL_CAPACITY} and claim batch "
        f"{POOL_CLAIM_BATCH} (as pool-bound: every application always has a request waiting, so the nodes' "
        "rotations, not the Workers, share the turns); turns summed over the nodes. B's ceiling: the first node's "
        "turns all to B-F, evenly (nodes 2 and 3 serve only A: the share across nodes never idles them), but no "
        f"more than B's pace ({PACE_CLAIMS_PER_S:g} claims/s per connection): a first node faster than that gives "
        "A the rest. "
        f"The slowed phases measure after {SLOW_WARM_UP_S:g} s of warm-up.",
        f"weights: {WEIGHTED_COPIES} applications of each weight {', '.join(map(str, WEIGHTS))} (set in the "
        f"database, as orbit-admin application weight does), 1 queue x {SLOW_SMALL_CONNECTIONS} connections and a "
        f"backlog of {args.s4_slow_backlog:,} each, one node, the proxy holding every statement {args.s4_sql_delay_ms:g} ms, the Workers of three-nodes. Weight's "
        "share = the application's weight / the sum of the phase's weights.",
        f"the claim pool is the bottleneck when its {SQL_SLOTS} slots stay busy (claims in flight near "
        f"{SQL_SLOTS}, requests waiting) and turns per application stay under the pace of "
        f"{PACE_CLAIMS_PER_S:g} claims/s per connection; claim ms = claims in flight / turns per second of the "
        "first node (Little's law).",
        f"{args.s4_seconds:g} s windows; claim turns from the nodes' ClaimPool.statistics().turns_by_application.",
    ]
    if isolations:
        notes.append(
            "isolation: B-F (1 queue, 1 or 2 connections each) alone, then beside A (10 queues x "
            f"{SLOW_A_CONNECTIONS} connections), all with a seeded backlog of {args.s4_slow_backlog:,}, SDK Workers "
            f"of capacity {SLOW_CAPACITY}, every statement of the node slowed by the delay; tasks/s = tasks "
            "finished in the window. The promise: each small application beside A starts at least "
            f"{TARGET_ISOLATION:g}x the lesser of what it starts alone and its weighted share of the node's total "
            "beside A. A claim's tasks share one reserved_at; the legs are means over the tasks reserved in "
            "the window."
        )
    if admissions:
        notes.append(
            f"admission: B submits one task at a time, Poisson at {args.s4_admission_rate:g}/s for "
            f"{args.s4_seconds:g} s, alone, then while A floods single submits with {args.s4_admission_clients} "
            "clients back to back that retry a 429 at once (the node's worst case); no Workers."
        )
    if args.s4_baseline is not None:
        notes.append(f"phases marked @{trees[0][1]} ran that commit's node ({trees[0][0]}), the others this tree's.")
    return {
        "scenario": "s4",
        "server": bdb.server_version,
        "figures": {"phases": phases},
        "tables": tables,
        "targets": targets,
        "notes": notes,
    }


def plot(report: dict[str, Any], outdir, plots) -> list:
    out = []
    for phase in report["figures"]["phases"]:
        if "series" not in phase:
            continue
        out.append(
            plots.lines(
                outdir / f"s4-turns-{phase['name'].replace(' @', '-')}.png",
                phase["series"],
                title=f"S4 {phase['name']}: claim turns per application per second",
                xlabel="seconds into the window",
                ylabel="claim turns / s",
            )
        )
    return out
