"""Retention (issue 37): bytes per finished task, a lifecycle soak, a backlog catch-up, and mariadbd CPU per task.

Parts (``--retention-parts``, ``sizing,soak,catchup`` by default; ``cpu`` on request):

* **sizing** (``bench/retention_sizing.py``): per payload + result size, the bytes a
  finished task takes in ``tasks``, ``task_attempts`` and ``idempotency_records`` and in
  the binary log (accepted, run, pruned).
* **soak**: a node (the ``orbit`` command, ``ORBIT_PRUNE_INTERVAL_S`` small) and one
  application whose retention is ``--retention-period-s`` for both outcomes, under a
  steady rate of single submits run by SDK Workers (a few percent failing) for
  ``--retention-seconds``. Every ``--retention-sample-s``: rows and bytes of the three
  tables, the node's retention metrics, and the database-clock waits of the tasks
  finished since. Targets: rows and bytes flat (every sample of the last 75 % of the run
  within 10 % of their median), and the p99 of submit, dispatch and Finish in the last
  window within 1.2x of the early window (``early_window``).
* **catchup**: ``--retention-backlog`` finished tasks of one application, days past their
  retention (with their attempts and idempotency records), beside the live traffic of
  another: how long the node's pruner at its defaults takes to delete them, and the live
  application's dispatch p99 and tasks/s during it against the same traffic before the
  backlog was written (``--retention-baseline-s``).
* **cpu** (``bench/retention_cpu.py``): mariadbd CPU per durable task, this tree against
  ``--retention-before DIR``, paired runs.
"""

from __future__ import annotations

import argparse
import math
import secrets
import time
from functools import partial
from pathlib import Path
from typing import Any

import trio

from orbit_node.db import Database

from . import HANDLER, retention_cpu, retention_sizing
from .accounting import cpu_seconds, self_cpu_seconds
from .database import App, BenchDb, bench_database, make_app
from .footprint import TASK_TABLES, server_pid, table_sizes
from .lifecycle import (
    COMMIT_MARGIN_S,
    FINISHED_STATES,
    DatabaseWaits,
    Live,
    Timeline,
    Traffic,
    finished_ranges,
    flat_within,
    live_traffic,
    padding,
    trend,
    wait_settled,
    window,
)
from .orbitcmd import OrbitProcess, known_settings, orbit_process
from .report import Target, format_table, ratio
from .soak import rss_bytes

PARTS = ("sizing", "soak", "catchup", "cpu")
DEFAULT_PARTS = "sizing,soak,catchup"
# Issue 37's targets.
TARGET_FLAT = 0.10
TARGET_LATENCY_RATIO = 1.2
TARGET_CATCHUP_RATIO = 1.5
# The soak judges flatness over the run after this share of it (the last 15 of 20 minutes).
FLAT_FROM = 0.25
# The soak's latency windows: 5 minutes, or a quarter of a shorter run.
LATENCY_WINDOW_S = 300.0
# Each catch-up phase's first seconds (connections, first claims) are left out of its figures.
PHASE_WARMUP_S = 30.0
# Backlog rows per INSERT ... SELECT (each statement's undo log stays modest).
SEED_CHUNK = 100_000
# The backlog's tasks finished this long ago and after (past both node defaults: 1 d, 7 d).
BACKLOG_AGE = "8 DAY"
# Every n-th backlog task failed (the others succeeded).
BACKLOG_FAIL_EVERY = 20
# Below this many backlog rows left, the catch-up looks for the end every second.
CLOSE_TO_DONE = 20_000
# bench/__main__.py: one server at production durability; no figure here is in H.
DURABILITY_COLUMNS = False
DURABILITY_DEFAULT = "prod"
MEASURES_H = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("retention (python -m bench retention)")
    group.add_argument(
        "--retention-parts", default=DEFAULT_PARTS, help=f"of {','.join(PARTS)} (default {DEFAULT_PARTS})"
    )
    group.add_argument("--retention-sizing-tasks", type=int, default=20_000, help="tasks per size (20000)")
    group.add_argument("--retention-sizes", default="200,2000,20000", help="payload+result bytes (200,2000,20000)")
    group.add_argument(
        "--retention-binlog-images",
        default="full",
        help="binlog_row_image values sizing runs at, of full,noblob,minimal (default full: the server's default)",
    )
    group.add_argument("--retention-seconds", type=float, default=1200.0, help="soak length (1200)")
    group.add_argument("--retention-rate", type=float, default=50.0, help="live submits per second (50)")
    group.add_argument("--retention-period-s", type=int, default=60, help="soak application's retention (60)")
    group.add_argument(
        "--retention-prune-interval-s", type=int, default=5, help="soak node's ORBIT_PRUNE_INTERVAL_S (5)"
    )
    group.add_argument("--retention-sample-s", type=float, default=10.0, help="sampling interval (10)")
    group.add_argument("--retention-clients", type=int, default=4, help="submitting HTTP clients (4)")
    group.add_argument("--retention-workers", type=int, default=2, help="SDK Worker connections (2)")
    group.add_argument("--retention-capacity", type=int, default=16, help="capacity of each Worker (16)")
    group.add_argument("--retention-fail-every", type=int, default=33, help="every n-th live task fails (33: 3 %%)")
    group.add_argument("--retention-backlog", type=int, default=1_000_000, help="catch-up backlog tasks (1000000)")
    group.add_argument("--retention-baseline-s", type=float, default=300.0, help="catch-up baseline length (300)")
    group.add_argument(
        "--retention-catchup-timeout-s", type=float, default=3600.0, help="longest catch-up waited for (3600)"
    )
    group.add_argument("--retention-cpu-tasks", type=int, default=20_000, help="cpu: tasks per burn-down (20000)")
    group.add_argument("--retention-cpu-rounds", type=int, default=3, help="cpu: paired rounds (3: ABABAB)")
    group.add_argument(
        "--retention-before",
        type=Path,
        default=None,
        help="cpu: source tree of the commit before retention (git archive 15723f5 | tar -x -C DIR)",
    )
    group.add_argument(
        "--retention-after",
        type=Path,
        default=None,
        help="cpu: source tree of the commit with retention (default: this one)",
    )


def traffic_of(args: argparse.Namespace) -> Traffic:
    return Traffic(
        rate=args.retention_rate,
        clients=args.retention_clients,
        workers=args.retention_workers,
        capacity=args.retention_capacity,
        fail_every=args.retention_fail_every,
    )


def pruner_settings(**settings: str) -> tuple[dict[str, str], list[str]]:
    """The ``ORBIT_*`` pruner settings this node knows, and a note for each it does not."""
    known = known_settings()
    return (
        {k: v for k, v in settings.items() if k in known},
        [f"{k} is not a setting of this node: left out" for k in settings if k not in known],
    )


async def set_retention(db: Database, app: App, seconds: int) -> None:
    """The application's retention, both outcomes (as ``orbit-admin application retention`` sets it)."""
    await db.run(
        lambda tx: tx.execute_raw(
            "UPDATE applications SET retain_succeeded_s = %s, retain_failed_s = %s WHERE application_id = %s",
            (seconds, seconds, app.application_id),
        )
    )


# -- sampling --------------------------------------------------------------------------


async def retention_metrics(node: OrbitProcess) -> dict[str, float]:
    """The node's ``orbit_retention_*`` samples (empty when it has none)."""
    try:
        samples = await node.metrics()
    except Exception:  # a metrics read must never end the run
        return {}
    return {k: v for k, v in samples.items() if k.startswith("orbit_retention")}


async def sample_loop(
    bdb: BenchDb,
    node: OrbitProcess,
    live: Live,
    waits: DatabaseWaits,
    interval_s: float,
    samples: list[dict[str, Any]],
    *,
    backlog: App | None = None,
    sizes: bool = True,
) -> None:
    """Every ``interval_s``: table rows and bytes (``sizes``), the backlog left, the node's
    retention metrics, CPU shares, the live tasks' database waits, and window latencies."""
    server = await server_pid(bdb.db)
    last = (
        time.perf_counter(),
        cpu_seconds(node.pid),
        cpu_seconds(server) if server else math.nan,
        self_cpu_seconds(),
    )
    last_t = 0.0
    while True:
        await trio.sleep(interval_s)
        timeline = live.timeline
        t = timeline.now()
        read = await waits.read()
        sample: dict[str, Any] = {"t_s": round(t, 1), "finished_read": read}
        if sizes:
            sample["tables"] = await table_sizes(bdb.db)
        if backlog is not None:
            sample["backlog_left"] = await backlog_left(bdb.db, backlog)
        sample["metrics"] = await retention_metrics(node)
        now = (
            time.perf_counter(),
            cpu_seconds(node.pid),
            cpu_seconds(server) if server else math.nan,
            self_cpu_seconds(),
        )
        sample["node_cpu_pct"] = 100 * (now[1] - last[1]) / (now[0] - last[0])
        sample["server_cpu_pct"] = 100 * (now[2] - last[2]) / (now[0] - last[0])
        # The harness runs the Workers that time the Finish acks: its own CPU, and the
        # node's memory, say whether a latency that grows is theirs.
        sample["harness_cpu_pct"] = 100 * (now[3] - last[3]) / (now[0] - last[0])
        sample["node_rss_mb"] = rss_bytes(node.pid) / 2**20
        last = now
        for name, events in (
            ("submit", timeline.submits),
            ("dispatch", timeline.dispatch),
            ("to_handler", timeline.to_handler),
            ("finish", timeline.finish_acks),
        ):
            # Database-clock waits are read up to COMMIT_MARGIN_S behind.
            shift = COMMIT_MARGIN_S if name == "dispatch" else 0.0
            sample[f"{name}_p99_ms"] = window(events, last_t - shift, t - shift)["p99"]
        sample["submitted"] = timeline.submitted
        sample["finished"] = timeline.finished
        last_t = t
        samples.append(sample)


# -- soak ------------------------------------------------------------------------------


def early_window(seconds: float, period_s: float) -> tuple[float, float, float]:
    """(early start, early end, late start) of the soak's latency windows.

    The early window starts at twice the retention period (120 s by default: the first
    tasks have been past their retention for a whole period, so the pruner deletes every
    round) and lasts ``LATENCY_WINDOW_S`` (a quarter of a shorter run); the late window
    is the run's last as long."""
    length = min(LATENCY_WINDOW_S, seconds / 4)
    start = max(0.0, min(2 * period_s, seconds - 2 * length))
    return start, start + length, seconds - length


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    seconds = args.retention_seconds
    settings, notes = pruner_settings(ORBIT_PRUNE_INTERVAL_S=str(args.retention_prune_interval_s))
    samples: list[dict[str, Any]] = []
    async with bench_database() as bdb:
        app = await make_app(bdb.db, "soak")
        await set_retention(bdb.db, app, args.retention_period_s)
        async with orbit_process(bdb.dsn, settings=settings, metrics=True) as node:
            async with live_traffic(node.url, app.token, app.queue_id, traffic_of(args)) as live:
                waits = DatabaseWaits(bdb.db, app.application_id, live.timeline)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(sample_loop, bdb, node, live, waits, args.retention_sample_s, samples)
                    await trio.sleep(seconds)
                    nursery.cancel_scope.cancel()
                live.stop_submitting()
                settled = await wait_settled(live, 30.0)
            timeline = live.timeline
            final_metrics = await retention_metrics(node)
            log = node.log_tail(1500)
    return soak_report(args, timeline, samples, final_metrics, settled, notes, log)


def soak_report(
    args: argparse.Namespace,
    timeline: Timeline,
    samples: list[dict[str, Any]],
    final_metrics: dict[str, float],
    settled: bool,
    notes: list[str],
    log: str,
) -> dict[str, Any]:
    seconds = args.retention_seconds
    judged = [s for s in samples if s["t_s"] >= FLAT_FROM * seconds]
    targets = []
    flat_rows = []
    for table in TASK_TABLES:
        for key, label in (("rows", "rows"), ("bytes", "data+index bytes")):
            series = [(s["t_s"], float(s["tables"][table][key])) for s in judged]
            spread = flat_within([v for _, v in series])
            flat_rows.append(
                [
                    table,
                    label,
                    min((v for _, v in series), default=math.nan),
                    max((v for _, v in series), default=math.nan),
                    100 * spread,
                    100 * trend(series),
                ]
            )
            targets.append(Target.at_most(f"soak: {table} {label} flat", 100 * spread, 100 * TARGET_FLAT, unit=" %"))
        ibd = [s["tables"][table]["ibd_bytes"] for s in judged if s["tables"][table]["ibd_bytes"] is not None]
        if ibd:
            flat_rows.append([table, ".ibd bytes", min(ibd), max(ibd), 100 * flat_within(ibd), math.nan])
    early_lo, early_hi, late_lo = early_window(seconds, args.retention_period_s)
    latency_rows = []
    for name, events, label in (
        ("submit", timeline.submits, "submit (HTTP)"),
        ("dispatch", timeline.dispatch, "dispatch: available -> reserved (db clock)"),
        ("start", timeline.start_db, "reserved -> started (db clock)"),
        ("to_handler", timeline.to_handler, "submit sent -> handler began"),
        ("finish", timeline.finish_acks, "handler ended -> Finish acknowledged"),
    ):
        early, late = window(events, early_lo, early_hi), window(events, late_lo, seconds)
        latency_rows.append(
            [
                label,
                early["count"],
                early["p50"],
                early["p99"],
                late["count"],
                late["p50"],
                late["p99"],
                ratio(late["p99"], early["p99"]),
            ]
        )
        if name in ("submit", "dispatch", "finish"):
            targets.append(
                Target.at_most(
                    f"soak: {label} p99, last / early window",
                    ratio(late["p99"], early["p99"]),
                    TARGET_LATENCY_RATIO,
                    note=f"{early['p99']:.1f} -> {late['p99']:.1f} ms",
                )
            )
    flat_table = format_table(
        ["table", "figure", f"min (t >= {FLAT_FROM * seconds:.0f} s)", "max", "max off median %", "trend %/h"],
        flat_rows,
        align="llrrrr",
    )
    latency_table = format_table(
        [
            "latency (ms)",
            f"n {early_lo:.0f}-{early_hi:.0f} s",
            "p50",
            "p99",
            f"n {late_lo:.0f}-{seconds:.0f} s",
            "p50",
            "p99",
            "p99 last / early",
        ],
        latency_rows,
        align="l" + "r" * 7,
    )
    samples_table = format_table(
        [
            "t s",
            *(f"{t} rows" for t in TASK_TABLES),
            *(f"{t} MB" for t in TASK_TABLES),
            "pruned tasks",
            "lag s",
            "node %",
            "node RSS MB",
            "mariadbd %",
            "harness %",
            "submit p99",
            "dispatch p99",
            "finish p99",
        ],
        [
            [
                s["t_s"],
                *(s["tables"][t]["rows"] for t in TASK_TABLES),
                *(s["tables"][t]["bytes"] / 2**20 for t in TASK_TABLES),
                metric(s["metrics"], "orbit_retention_pruned_rows_total", "tasks"),
                metric(s["metrics"], "orbit_retention_lag_seconds"),
                s["node_cpu_pct"],
                s["node_rss_mb"],
                s["server_cpu_pct"],
                s["harness_cpu_pct"],
                s["submit_p99_ms"],
                s["dispatch_p99_ms"],
                s["finish_p99_ms"],
            ]
            for s in samples
        ],
    )
    pruned = {k: v for k, v in final_metrics.items() if k.startswith("orbit_retention_pruned_rows_total")}
    return {
        "samples": samples,
        "timeline_counts": {
            "submitted": timeline.submitted,
            "submit_errors": timeline.submit_errors,
            "dropped": timeline.dropped,
            "finished": timeline.finished,
            "failed": timeline.failed,
            "settled": settled,
        },
        "windows": {"early": [early_lo, early_hi], "late": [late_lo, seconds]},
        "final_metrics": final_metrics,
        "tables": [samples_table, flat_table, latency_table],
        "targets": targets,
        "notes": [
            *notes,
            f"soak: {timeline.submitted} submitted ({timeline.dropped} dropped, {timeline.submit_errors} refused), "
            f"{timeline.finished} finished ({timeline.failed} failed) at {args.retention_rate:g}/s for {seconds:g} s; "
            f"retention {args.retention_period_s} s; pruned rows (node metrics): "
            + (", ".join(f"{k} {v:,.0f}" for k, v in pruned.items()) or "no metrics"),
            f"soak: flat = every sample at t >= {FLAT_FROM * seconds:.0f} s within {100 * TARGET_FLAT:g} % of their "
            "median (bytes: data_length + index_length after ANALYZE TABLE, 16 KiB pages); trend = least-squares "
            "slope per hour over those samples; the .ibd files never shrink, so flat files mean reused pages",
            f"soak: latency windows {early_lo:.0f}-{early_hi:.0f} s (from twice the retention period: pruning "
            f"active) and the last {seconds - late_lo:.0f} s; dispatch from the database clock of tasks read before "
            "they were pruned; Finish = handler return -> the node's acknowledgement at the Worker",
            *([f"node log tail: {log}"] if log.strip() else []),
        ],
    }


def metric(samples: dict[str, float], name: str, table: str | None = None) -> float:
    """One sample of ``name`` (with ``table=`` label ``table``), NaN when absent."""
    for key, value in samples.items():
        if key == name or (key.startswith(name + "{") and (table is None or f'table="{table}"' in key)):
            return value
    return math.nan


# -- catch-up ----------------------------------------------------------------------------


async def seed_backlog(bdb: BenchDb, app: App, count: int) -> float:
    """``count`` finished tasks of ``app``, ``BACKLOG_AGE`` old and older (every
    ``BACKLOG_FAIL_EVERY``-th failed), each with its attempt and idempotency record;
    written without binary logging (setup, not measured). Returns the seconds it took."""
    began = time.perf_counter()
    db = Database(bdb.dsn, size=1)
    payload = '{"i":0,"pad":"' + padding(90) + '"}'
    result = '{"pad":"' + padding(90) + '"}'
    try:
        await db.run(lambda tx: tx.execute_raw("SET SESSION sql_log_bin = 0"))
        for offset in range(0, count, SEED_CHUNK):
            size = min(SEED_CHUNK, count - offset)
            prefix = secrets.token_hex(4)
            finished = (
                f"NOW(6) - INTERVAL {BACKLOG_AGE} - INTERVAL ({offset} + seq) * 500000 MICROSECOND"  # oldest first
            )
            failed = f"MOD(seq, {BACKLOG_FAIL_EVERY}) = 0"
            tasks_sql = (
                "INSERT INTO tasks (task_id, application_id, namespace_id, queue_id, handler, handler_version, "
                "payload_version, payload, state, available_at, attempts, max_attempts, reserved_at, started_at, "
                "finished_at, result, error, created_at, updated_at) "
                "SELECT CONCAT(%s, LPAD(LOWER(HEX(seq)), 24, '0')), %s, %s, %s, %s, %s, %s, %s, "
                f"IF({failed}, 'failed', 'succeeded'), f - INTERVAL 2 SECOND, 1, 1, f - INTERVAL 1 SECOND, "
                f"f - INTERVAL 500000 MICROSECOND, f, IF({failed}, NULL, %s), "
                f'IF({failed}, \'{{"code":null,"message":"PermanentError: bench"}}\', NULL), '
                "f - INTERVAL 2 SECOND, f "
                f"FROM (SELECT seq, {finished} AS f FROM seq_0_to_{size - 1}) s"
            )
            params = (prefix, app.application_id, app.namespace_id, app.queue_id, *HANDLER, payload, result)
            like = prefix + "%"
            attempts_sql = (
                "INSERT INTO task_attempts (task_id, attempt, fencing_token, owner_node_id, connection_id, "
                "reserved_at, started_at, finished_at, outcome, error) "
                "SELECT task_id, 1, CONCAT('1-', SUBSTR(task_id, 9, 16)), %s, 'bench-seed', reserved_at, started_at, "
                "finished_at, state, error FROM tasks WHERE task_id LIKE %s"
            )
            records_sql = (
                "INSERT INTO idempotency_records (namespace_id, kind, idempotency_key, request_digest, task_id, "
                "created_at) SELECT namespace_id, 'request', CONCAT('seed-', task_id), SHA2(task_id, 256), task_id, "
                "created_at FROM tasks WHERE task_id LIKE %s"
            )
            await db.run(lambda tx: tx.execute_raw(tasks_sql, params))  # noqa: B023 - awaited here
            await db.run(lambda tx: tx.execute_raw(attempts_sql, ("b" * 32, like)))  # noqa: B023
            await db.run(lambda tx: tx.execute_raw(records_sql, (like,)))  # noqa: B023
    finally:
        await db.aclose()
    return time.perf_counter() - began


async def backlog_left(db: Database, app: App) -> int:
    """The application's finished tasks."""
    sql = "SELECT " + " + ".join(f"({one})" for one in finished_ranges("SELECT COUNT(*)")) + " AS n"
    rows = await db.run(lambda tx: tx.fetchall_raw(sql, (app.application_id,) * len(FINISHED_STATES)))
    return int(rows[0]["n"])


async def backlog_any(db: Database, app: App) -> bool:
    sql = "SELECT " + " OR ".join(f"EXISTS ({one})" for one in finished_ranges("SELECT 1")) + " AS e"
    rows = await db.run(lambda tx: tx.fetchall_raw(sql, (app.application_id,) * len(FINISHED_STATES)))
    return bool(rows[0]["e"])


async def live_phase(
    bdb: BenchDb, app: App, args: argparse.Namespace, *, seconds: float, backlog: App | None = None
) -> dict[str, Any]:
    """A node at its defaults with the live traffic of ``app``: for ``seconds``, or (with
    ``backlog``) until no backlog row is left (at most ``--retention-catchup-timeout-s``)."""
    samples: list[dict[str, Any]] = []
    done_s = math.nan
    began = time.perf_counter()
    async with orbit_process(bdb.dsn, metrics=True) as node:
        ready_s = time.perf_counter() - began
        async with live_traffic(node.url, app.token, app.queue_id, traffic_of(args)) as live:
            waits = DatabaseWaits(bdb.db, app.application_id, live.timeline)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    partial(sample_loop, backlog=backlog, sizes=False),
                    bdb,
                    node,
                    live,
                    waits,
                    args.retention_sample_s,
                    samples,
                )
                if backlog is None:
                    await trio.sleep(seconds)
                else:
                    with trio.move_on_after(seconds):
                        while not samples or samples[-1]["backlog_left"] > CLOSE_TO_DONE:
                            await trio.sleep(1.0)
                        while await backlog_any(bdb.db, backlog):
                            await trio.sleep(1.0)
                        done_s = time.perf_counter() - began
                end = live.timeline.now()
                nursery.cancel_scope.cancel()
            live.stop_submitting()
            settled = await wait_settled(live, 30.0)
            await trio.sleep(2.0)
            await waits.read()
        final_metrics = await retention_metrics(node)
    timeline = live.timeline
    lo = min(PHASE_WARMUP_S, end / 4)
    figures = {
        name: window(events, lo, end)
        for name, events in (
            ("submit", timeline.submits),
            ("dispatch", timeline.dispatch),
            ("start", timeline.start_db),
            ("to_handler", timeline.to_handler),
            ("finish", timeline.finish_acks),
        )
    }
    return {
        "seconds": end,
        "measured_from_s": lo,
        "ready_s": ready_s,
        "prune_s": done_s,
        "finished_per_s": ratio(len([1 for t, _ in timeline.dispatch if lo <= t < end]), end - lo),
        "submitted": timeline.submitted,
        "dropped": timeline.dropped,
        "finished": timeline.finished,
        "settled": settled,
        "latency_ms": figures,
        "samples": samples,
        "final_metrics": final_metrics,
    }


async def catchup(args: argparse.Namespace) -> dict[str, Any]:
    async with bench_database() as bdb:
        live_app = await make_app(bdb.db, "live")
        backlog_app = await make_app(bdb.db, "backlog")
        baseline = await live_phase(bdb, live_app, args, seconds=args.retention_baseline_s)
        seed_s = await seed_backlog(bdb, backlog_app, args.retention_backlog)
        before = await table_sizes(bdb.db, count=False)
        seeded = await backlog_left(bdb.db, backlog_app)
        caught = await live_phase(bdb, live_app, args, seconds=args.retention_catchup_timeout_s, backlog=backlog_app)
        left = await backlog_left(bdb.db, backlog_app)
        after = await table_sizes(bdb.db)
    rows = []
    targets = []
    for name, label in (
        ("submit", "submit (HTTP) ms"),
        ("dispatch", "dispatch: available -> reserved ms (db clock)"),
        ("start", "reserved -> started ms (db clock)"),
        ("to_handler", "submit sent -> handler began ms"),
        ("finish", "Finish acknowledged ms"),
    ):
        b, c = baseline["latency_ms"][name], caught["latency_ms"][name]
        rows.append([label, b["p50"], b["p99"], c["p50"], c["p99"], ratio(c["p99"], b["p99"])])
    rows.append(
        [
            "live tasks finished/s",
            baseline["finished_per_s"],
            "",
            caught["finished_per_s"],
            "",
            ratio(caught["finished_per_s"], baseline["finished_per_s"]),
        ]
    )
    targets.append(
        Target.at_most(
            "catch-up: live dispatch p99, during / without the backlog",
            ratio(caught["latency_ms"]["dispatch"]["p99"], baseline["latency_ms"]["dispatch"]["p99"]),
            TARGET_CATCHUP_RATIO,
        )
    )
    targets.append(
        Target.at_least(
            "catch-up: live tasks/s, during / without the backlog",
            ratio(caught["finished_per_s"], baseline["finished_per_s"]),
            1 / TARGET_CATCHUP_RATIO,
        )
    )
    prune_s = caught["prune_s"]
    compare = format_table(
        ["live application", "baseline p50", "baseline p99", "catch-up p50", "catch-up p99", "p99 catch-up / baseline"],
        rows,
        align="lrrrrr",
    )
    progress = format_table(
        ["t s", "backlog left", "pruned tasks (metrics)", "lag s", "node %", "mariadbd %", "dispatch p99 ms"],
        [
            [
                s["t_s"],
                s["backlog_left"],
                metric(s["metrics"], "orbit_retention_pruned_rows_total", "tasks"),
                metric(s["metrics"], "orbit_retention_lag_seconds"),
                s["node_cpu_pct"],
                s["server_cpu_pct"],
                s["dispatch_p99_ms"],
            ]
            for s in caught["samples"]
        ],
    )
    summary = format_table(
        ["catch-up", "value"],
        [
            ["backlog tasks written (with attempts and idempotency records)", seeded],
            ["seconds to write them (no binary log)", seed_s],
            ["seconds from the node's start until none was left", prune_s],
            ["backlog tasks pruned per second", ratio(seeded, prune_s)],
            ["backlog tasks left at the end", left],
            *[
                [f"{t} rows before / after", f"{before[t]['rows']:,} (estimate) / {after[t]['rows']:,}"]
                for t in TASK_TABLES
            ],
        ],
        align="lr",
    )
    return {
        "baseline": baseline,
        "catchup": caught,
        "seeded": seeded,
        "seed_s": seed_s,
        "prune_s": prune_s,
        "left": left,
        "tables_before": before,
        "tables_after": after,
        "tables": [summary, progress, compare],
        "targets": targets,
        "notes": [
            f"catch-up: {seeded:,} tasks of one application finished {BACKLOG_AGE.lower()}s ago and older (every "
            f"{BACKLOG_FAIL_EVERY}th failed), past the node's default retention; live traffic of another application "
            f"at {args.retention_rate:g}/s (retention: the node's default) in both phases; the baseline ran "
            f"{args.retention_baseline_s:g} s before the backlog was written; each phase's first {PHASE_WARMUP_S:g} s "
            "are left out; the node at its default ORBIT_PRUNE_INTERVAL_S and ORBIT_PRUNE_RATE; the end is found "
            "within about a second (backlog counted every sample, looked for every second near the end)",
        ],
    }


# -- the scenario ------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    parts = [p.strip() for p in args.retention_parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise SystemExit(f"--retention-parts: unknown {', '.join(unknown)}; of {', '.join(PARTS)}")
    report: dict[str, Any] = {"scenario": "retention", "parts": parts, "tables": [], "targets": [], "notes": []}
    async with bench_database() as bdb:
        report["server"] = bdb.server_version
        admin = bdb.db
        for part in parts:
            if part == "sizing":
                result = await retention_sizing.run_part(args, admin)
            elif part == "soak":
                result = await soak(args)
            elif part == "catchup":
                result = await catchup(args)
            else:
                result = await retention_cpu.run_part(args)
            report["tables"] += [f"-- {part} --\n{t}" for t in result.pop("tables")]
            report["targets"] += result.pop("targets", [])
            report["notes"] += result.pop("notes", [])
            report[part] = result
    return report


def plot(report: dict[str, Any], outdir, plots) -> list:
    paths = []
    soak_result = report.get("soak")
    if soak_result and soak_result.get("samples"):
        samples = soak_result["samples"]
        paths.append(
            plots.lines(
                outdir / "retention-soak-rows.png",
                {t: [(s["t_s"], s["tables"][t]["rows"]) for s in samples] for t in TASK_TABLES},
                title="Retention soak: rows",
                xlabel="s",
                ylabel="rows",
            )
        )
        paths.append(
            plots.lines(
                outdir / "retention-soak-bytes.png",
                {t: [(s["t_s"], s["tables"][t]["bytes"] / 2**20) for s in samples] for t in TASK_TABLES},
                title="Retention soak: data + index",
                xlabel="s",
                ylabel="MiB",
            )
        )
        paths.append(
            plots.lines(
                outdir / "retention-soak-latency.png",
                {
                    name: [(s["t_s"], s[f"{name}_p99_ms"]) for s in samples if s[f"{name}_p99_ms"] is not None]
                    for name in ("submit", "dispatch", "finish")
                },
                title="Retention soak: p99 per sample interval",
                xlabel="s",
                ylabel="ms",
            )
        )
    caught = report.get("catchup")
    if caught and caught.get("catchup", {}).get("samples"):
        samples = caught["catchup"]["samples"]
        paths.append(
            plots.lines(
                outdir / "retention-catchup.png",
                {"backlog left": [(s["t_s"], s["backlog_left"]) for s in samples]},
                title="Retention catch-up: backlog left",
                xlabel="s",
                ylabel="tasks",
            )
        )
    return paths
