"""Retention sizing: the bytes one finished task takes, in each table and in the binary log.

Per size of payload + result (half each), on a fresh database of the scenario's server:
``--retention-sizing-tasks`` tasks accepted through the node's own acceptance code
(``TaskStore.submit_many``, 500 a transaction: the task row and its idempotency record),
then claimed, started and finished through the dispatch core's own transitions
(``LeaseStore``, batches of 64: the attempt row, the result), as a node runs them. Then
``ANALYZE TABLE`` and InnoDB's ``data_length + index_length`` per table, the ``.ibd``
files, and the binary log's growth in each phase; then the tasks are pruned by a real
node (the application's retention set to 1 s, ``ORBIT_PRUNE_INTERVAL_S=1``), and the
binary log of the deletes and the tables after them are read too.
"""

from __future__ import annotations

import argparse
import json
import math
import secrets
import time
from typing import Any

import trio

from orbit_node.db import Database
from orbit_node.domain.acceptance import Submission
from orbit_node.domain.claims import Capability, ClaimRequest
from orbit_node.domain.ownership import FinishItem, Outcome
from orbit_node.domain.rules import NewTask
from orbit_node.store.leases import LeaseStore
from orbit_node.store.tasks import TaskStore

from . import HANDLER, durability
from .database import App, bench_database, count_tasks, make_app
from .footprint import TASK_TABLES, ServerMeter, server_variable, table_sizes
from .lifecycle import padding
from .orbitcmd import known_settings, orbit_process
from .report import format_table

# Tasks per acceptance transaction (a bulk submit's order of size).
ACCEPT_BATCH = 500
# The node's default claim batch.
CLAIM_BATCH = 64
# Concurrent claim -> start -> finish loops (the node's claim SQL slots).
LOOPS = 4
# How long the pruner may take for one size's tasks before the part gives up waiting.
PRUNE_TIMEOUT_S = 600.0
# binlog_row_image values the part can measure (``--retention-binlog-images``).
ROW_IMAGES = ("full", "noblob", "minimal")


def parse_sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


async def accept(db: Database, app: App, tasks: int, payload_bytes: int) -> None:
    """``tasks`` tasks through the acceptance transaction, ``ACCEPT_BATCH`` at a time."""
    store = TaskStore(db)
    run = secrets.token_hex(4)
    for start in range(0, tasks, ACCEPT_BATCH):
        submissions = [
            Submission(
                f"size-{run}-{i}",
                NewTask(
                    queue_id=app.queue_id,
                    handler=HANDLER[0],
                    handler_version=HANDLER[1],
                    payload_version=HANDLER[2],
                    payload={"pad": padding(payload_bytes)},
                ),
            )
            for i in range(start, min(start + ACCEPT_BATCH, tasks))
        ]
        outcomes = await store.submit_many(app.namespace_id, submissions)
        refused = [o for o in outcomes if isinstance(o, Exception)]
        if refused:
            raise RuntimeError(f"acceptance refused {len(refused)} tasks: {refused[0]}")


async def run_all(db: Database, app: App, tasks: int, result_bytes: int) -> int:
    """Claim, start and finish every task of ``app`` with a result of ``result_bytes``; how many succeeded."""
    store = LeaseStore(db, reservation_lease_s=30, run_lease_s=60, batch_size=CLAIM_BATCH)
    done = 0

    async def loop(index: int) -> None:
        nonlocal done
        request = ClaimRequest(
            namespace_id=app.namespace_id,
            application_id=app.application_id,
            queue_ids=(app.queue_id,),
            capabilities=frozenset({Capability(*HANDLER)}),
            resource_key_support=False,
            limit=CLAIM_BATCH,
            node_id="b" * 32,
            connection_id=f"sizing-{index}",
        )
        empty = 0
        while done < tasks and empty < 20:
            reservations = await store.claim(request)
            if not reservations:
                empty += 1
                await trio.sleep(0.05)
                continue
            started = await store.start_many([(r.task_id, r.fencing_token) for r in reservations])
            finished = await store.finish_many(
                FinishItem(r.task_id, r.fencing_token, json.dumps({"pad": padding(result_bytes)}))
                for r, s in zip(reservations, started, strict=True)
                if s.outcome is Outcome.STARTED
            )
            done += sum(1 for f in finished if f.outcome is Outcome.SUCCEEDED)

    async with trio.open_nursery() as nursery:
        for index in range(LOOPS):
            nursery.start_soon(loop, index)
    return done


async def prune(bdb: Any, app: App, meter: ServerMeter) -> dict[str, Any]:
    """The application's finished tasks deleted by a real node's pruner: seconds, server CPU, binary log."""
    if "ORBIT_PRUNE_INTERVAL_S" not in known_settings():
        return {"skipped": "this node has no pruner (no ORBIT_PRUNE_INTERVAL_S)"}
    await bdb.db.run(
        lambda tx: tx.execute_raw(
            "UPDATE applications SET retain_succeeded_s = 1, retain_failed_s = 1 WHERE application_id = %s",
            (app.application_id,),
        )
    )
    await trio.sleep(1.5)  # every task is now past its retention
    # From before the node starts: its pruner may begin before it answers /readyz.
    await meter.start()
    began = time.perf_counter()
    async with orbit_process(bdb.dsn, settings={"ORBIT_PRUNE_INTERVAL_S": "1"}) as node:
        left = -1
        with trio.move_on_after(PRUNE_TIMEOUT_S):
            while (left := await count_tasks(bdb.db, "application_id = %s", (app.application_id,))) > 0:
                await trio.sleep(0.5)
        seconds = time.perf_counter() - began
        used = await meter.stop()
        log = node.log_tail(800)
    return {"seconds": seconds, "left": left, **used, "node_log_tail": log if left else ""}


async def measure_size(args: argparse.Namespace, size: int, image: str) -> dict[str, Any]:
    """One size at one binlog_row_image: per-table bytes and binary log bytes per task."""
    tasks = args.retention_sizing_tasks
    payload_bytes, result_bytes = size // 2, size - size // 2
    async with bench_database() as bdb:
        app = await make_app(bdb.db, f"size{size}")
        meter = await ServerMeter.of(bdb.db)
        empty = await table_sizes(bdb.db)
        await meter.start()
        began = time.perf_counter()
        await accept(bdb.db, app, tasks, payload_bytes)
        accepted = await meter.stop()
        accept_s = time.perf_counter() - began
        await meter.start()
        began = time.perf_counter()
        db = Database(bdb.dsn, size=LOOPS + 1)
        try:
            done = await run_all(db, app, tasks, result_bytes)
        finally:
            await db.aclose()
        ran = await meter.stop()
        run_s = time.perf_counter() - began
        full = await table_sizes(bdb.db)
        pruned = await prune(bdb, app, meter)
        after = await table_sizes(bdb.db) if "skipped" not in pruned else {}
    per_table = {}
    for table in TASK_TABLES:
        grown = full[table]["bytes"] - empty[table]["bytes"]
        ibd = full[table]["ibd_bytes"]
        per_table[table] = {
            "rows": full[table]["rows"],
            "bytes_per_task": grown / done if done else math.nan,
            "data_per_task": (full[table]["data_length"] - empty[table]["data_length"]) / done if done else math.nan,
            "index_per_task": (full[table]["index_length"] - empty[table]["index_length"]) / done if done else math.nan,
            "ibd_per_task": (ibd - empty[table]["ibd_bytes"]) / done if done and ibd is not None else math.nan,
            "empty": empty[table],
            "full": full[table],
            "after_prune": after.get(table),
        }
    binlog = {
        "accept": accepted["binlog_bytes"],
        "run": ran["binlog_bytes"],
        "prune": pruned.get("binlog_bytes"),
    }
    per_task = {k: (v / done if v is not None and done else math.nan) for k, v in binlog.items()}
    return {
        "size": size,
        "binlog_row_image": image,
        "payload_bytes": payload_bytes,
        "result_bytes": result_bytes,
        "tasks": done,
        "accept_s": accept_s,
        "run_s": run_s,
        "tables": per_table,
        "binlog_bytes": binlog,
        "binlog_per_task": per_task,
        "server_cpu_us_per_task": {
            "accept": accepted["server_cpu_s"] * 1e6 / done if done else math.nan,
            "run": ran["server_cpu_s"] * 1e6 / done if done else math.nan,
            "prune": pruned.get("server_cpu_s", math.nan) * 1e6 / done if done else math.nan,
        },
        "prune": pruned,
    }


async def run_part(args: argparse.Namespace, bdb_db: Database) -> dict[str, Any]:
    images = [i.strip().lower() for i in args.retention_binlog_images.split(",") if i.strip()]
    unknown = [i for i in images if i not in ROW_IMAGES]
    if unknown:
        raise SystemExit(f"--retention-binlog-images: unknown {unknown}; one of {', '.join(ROW_IMAGES)}")
    private = durability.current().private
    original = await server_variable(bdb_db, "binlog_row_image")
    results = []
    notes = []
    for image in images:
        if image != original.lower():
            if not private:
                notes.append(f"binlog_row_image={image} skipped: the server is not the bench's own")
                continue
            # Sessions opened from here on take it (the part opens new ones per size).
            await bdb_db.run(lambda tx: tx.execute_raw(f"SET GLOBAL binlog_row_image = '{image.upper()}'"))  # noqa: B023
        try:
            for size in parse_sizes(args.retention_sizes):
                results.append(await measure_size(args, size, image))
        finally:
            await bdb_db.run(lambda tx: tx.execute_raw(f"SET GLOBAL binlog_row_image = '{original}'"))
    return {"runs": results, "notes": notes, "tables": sizing_tables(results)}


def sizing_tables(runs: list[dict[str, Any]]) -> list[str]:
    rows = []
    for r in runs:
        t = r["tables"]
        total = sum(t[name]["bytes_per_task"] for name in TASK_TABLES)
        ibd = sum(t[name]["ibd_per_task"] for name in TASK_TABLES)
        b = r["binlog_per_task"]
        rows.append(
            [
                r["size"],
                r["binlog_row_image"],
                r["tasks"],
                *(t[name]["bytes_per_task"] for name in TASK_TABLES),
                total,
                ibd,
                b["accept"],
                b["run"],
                b["prune"],
                sum(v for v in b.values() if v == v),
            ]
        )
    bytes_table = format_table(
        [
            "payload+result B",
            "binlog_row_image",
            "tasks",
            "tasks B/task",
            "task_attempts B/task",
            "idempotency_records B/task",
            "tables B/task",
            ".ibd B/task",
            "binlog accept",
            "binlog claim+start+finish",
            "binlog prune",
            "binlog B/task",
        ],
        rows,
        align="rl" + "r" * 10,
    )
    cpu_rows = [
        [
            r["size"],
            r["binlog_row_image"],
            r["tasks"] / r["accept_s"] if r["accept_s"] else math.nan,
            r["tasks"] / r["run_s"] if r["run_s"] else math.nan,
            r["prune"].get("seconds", math.nan),
            r["tasks"] / r["prune"]["seconds"] if r["prune"].get("seconds") else math.nan,
            r["server_cpu_us_per_task"]["accept"],
            r["server_cpu_us_per_task"]["run"],
            r["server_cpu_us_per_task"]["prune"],
        ]
        for r in runs
    ]
    cpu_table = format_table(
        [
            "payload+result B",
            "binlog_row_image",
            "accepted/s",
            "run/s",
            "prune s",
            "pruned/s",
            "mariadbd us/task accept",
            "run",
            "prune",
        ],
        cpu_rows,
        align="rl" + "r" * 7,
    )
    return [bytes_table, cpu_table]
