"""Settle: Start and Finish batches with the transition statements before and after issue 23.

The dispatch core's own Start and Finish transactions (``LeaseStore.start_many`` /
``finish_many``: lock the rows, decide, write), run on a private ``mariadbd``
(harness/mariadb.py: ``--no-defaults``, ``innodb_flush_log_at_trx_commit=1``), each
phase twice against the same database with batches of the same size: once with the
node's statements (single-table UPDATEs by primary key, ``Writes.apply``) and once with
the previous ones (multi-table UPDATEs driven by JSON_TABLE, which need an internal
temporary table; their SQL is kept here, not in the node, and ``Writes.apply`` is swapped
for them during those phases). Phases alternate which goes first from round to round.
Headline: batches/s after / before, per batch size and kind of batch.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import trio

from harness.mariadb import PrivateMariaDB
from orbit_node.db import Database, Tx, migrate
from orbit_node.domain.claims import ClaimRequest
from orbit_node.domain.ownership import FinishItem, TransitionResult
from orbit_node.store.leases import LeaseStore
from orbit_node.store.transitions import Writes

from .claim import HANDLER
from .database import App, make_app, seed_tasks, server_status
from .report import format_table, ratio

VARIANTS = ("before", "after")
KINDS = ("start", "finish, all succeed", "finish, 1 in 4 retried")
COUNTERS = ("Questions", "Created_tmp_tables", "Created_tmp_disk_tables")

# The statements the transitions wrote with before issue 23 (orbit_node/db/sql/leases.sql
# at 2f1cfde): values as a JSON array read by JSON_TABLE, text hex-encoded.
PREVIOUS_START = """
UPDATE tasks t
  LEFT JOIN task_attempts a
    ON a.task_id = t.task_id
   AND a.fencing_token = t.fencing_token
   SET t.state = 'running',
       t.attempts = t.attempts + 1,
       t.started_at = %(now)s,
       t.lease_expires_at = %(lease_expires_at)s,
       a.started_at = %(now)s
 WHERE t.task_id IN %(task_ids)s
   AND t.state = 'reserved'
"""
PREVIOUS_ATTEMPTS = """
UPDATE JSON_TABLE(%(values)s, '$[*]' COLUMNS (
         task_id CHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.i',
         token VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.t',
         outcome VARCHAR(32) PATH '$.o',
         error_hex LONGTEXT CHARACTER SET ascii PATH '$.x')) v
  STRAIGHT_JOIN task_attempts a ON a.task_id = v.task_id AND a.fencing_token = v.token
   SET a.outcome = v.outcome,
       a.error = CONVERT(UNHEX(v.error_hex) USING utf8mb4),
       a.finished_at = NOW(6)
 WHERE a.outcome IS NULL
"""
# The attempt closed with the row, as both settle statements read and joined it.
_PREVIOUS_ATTEMPT_COLUMNS = """
         token VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.t',
         outcome VARCHAR(32) PATH '$.o',
         attempt_error_hex LONGTEXT CHARACTER SET ascii PATH '$.x')) v
  STRAIGHT_JOIN tasks t ON t.task_id = v.task_id
  LEFT JOIN task_attempts a
    ON a.task_id = v.task_id
   AND a.fencing_token = v.token
   AND a.outcome IS NULL"""
_PREVIOUS_ATTEMPT_SET = """
       a.outcome = v.outcome,
       a.error = CONVERT(UNHEX(v.attempt_error_hex) USING utf8mb4),
       a.finished_at = NOW(6)
"""
PREVIOUS_TERMINAL = f"""
UPDATE JSON_TABLE(%(values)s, '$[*]' COLUMNS (
         task_id CHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.i',
         state VARCHAR(16) PATH '$.s',
         result_hex LONGTEXT CHARACTER SET ascii PATH '$.r',
         error_hex LONGTEXT CHARACTER SET ascii PATH '$.e',{_PREVIOUS_ATTEMPT_COLUMNS}
   SET t.state = v.state,
       t.result = CONVERT(UNHEX(v.result_hex) USING utf8mb4),
       t.error = CONVERT(UNHEX(v.error_hex) USING utf8mb4),
       t.finished_at = NOW(6),
       t.lease_expires_at = NULL,{_PREVIOUS_ATTEMPT_SET}"""
PREVIOUS_REQUEUE = f"""
UPDATE JSON_TABLE(%(values)s, '$[*]' COLUMNS (
         task_id CHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.i',
         available_at VARCHAR(32) CHARACTER SET ascii PATH '$.a',
         error_hex LONGTEXT CHARACTER SET ascii PATH '$.e',{_PREVIOUS_ATTEMPT_COLUMNS}
   SET t.state = 'queued',
       t.available_at = COALESCE(CAST(v.available_at AS DATETIME(6)), t.available_at),
       t.error = COALESCE(CONVERT(UNHEX(v.error_hex) USING utf8mb4), t.error),
       t.owner_node_id = NULL,
       t.connection_id = NULL,
       t.fencing_token = NULL,
       t.lease_expires_at = NULL,{_PREVIOUS_ATTEMPT_SET}"""
# The previous one-letter keys of the JSON objects, by the names Writes uses now.
TERMINAL_KEYS = {"state": "s", "result": "r", "error": "e"}
REQUEUE_KEYS = {"available_at": "a", "error": "e"}
ATTEMPT_KEYS = {"token": "t", "outcome": "o", "error": "x"}
HEX = {"r", "e", "x"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--settle-batches", default="16,256", help="tasks per batch (default 16,256)")
    parser.add_argument(
        "--settle-rounds", type=int, default=20, help="rounds per batch size; each runs every phase (default 20)"
    )
    parser.add_argument(
        "--settle-loops", type=int, default=4, help="batches committed concurrently in a phase (default 4)"
    )
    parser.add_argument("--settle-result-bytes", type=int, default=200, help="size of each result JSON (default 200)")


def _previous_value(key: str, value: Any) -> str:
    if key == "a":
        return value.isoformat(sep=" ", timespec="microseconds")
    return value.encode("utf-8").hex() if key in HEX else value


def _previous_json(
    rows: dict[str, dict[str, Any]], keys: dict[str, str], attempts: dict[str, dict[str, str]] | None = None
) -> str:
    """A ``values`` array of the previous statements from Writes' rows (and their attempts)."""
    out = []
    for task_id, values in rows.items():
        item: dict[str, Any] = {"i": task_id}
        source: dict[str, Any]
        for source, names in ((values, keys), ((attempts or {}).get(task_id, {}), ATTEMPT_KEYS)):
            for name, value in source.items():
                if value is None:
                    continue
                key = names[name]
                item[key] = _previous_value(key, value)
        out.append(item)
    return json.dumps(out)


async def previous_apply(writes: Writes, tx: Tx) -> None:
    """``Writes.apply`` as it was before issue 23."""
    if writes.started:
        params = {"task_ids": tuple(writes.started), "now": writes.start_now, "lease_expires_at": writes.start_lease}
        await tx.execute_raw(PREVIOUS_START, params)
    for lease, renewed in writes.renewals.items():
        await tx.execute("renew_tasks", {"task_ids": tuple(renewed), "lease_expires_at": lease})
    alone = {t: v for t, v in writes.attempts.items() if t not in writes.terminal and t not in writes.requeue}
    if alone:
        await tx.execute_raw(PREVIOUS_ATTEMPTS, {"values": _previous_json(alone, ATTEMPT_KEYS)})
    if writes.keys:
        await tx.execute(
            "settle_release_keys",
            {"keys": tuple(sorted(set(writes.keys.values()))), "task_ids": tuple(writes.keys)},
        )
    if writes.terminal:
        values = _previous_json(writes.terminal, TERMINAL_KEYS, writes.attempts)
        await tx.execute_raw(PREVIOUS_TERMINAL, {"values": values})
    if writes.requeue:
        values = _previous_json(writes.requeue, REQUEUE_KEYS, writes.attempts)
        await tx.execute_raw(PREVIOUS_REQUEUE, {"values": values})


@contextmanager
def statements(variant: str) -> Iterator[None]:
    """The node's statements ("after"), or the previous ones ("before") for the block."""
    if variant == "after":
        yield
        return
    node_apply = Writes.apply
    Writes.apply = previous_apply  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        Writes.apply = node_apply  # type: ignore[method-assign]


@attrs.define(eq=False)
class Tally:
    """Per (batch size, kind, variant): batches, seconds and server counters; and the
    outcomes of every item per variant (the two must match)."""

    cells: dict[tuple[int, str, str], dict[str, float]] = attrs.field(factory=dict)
    outcomes: dict[str, dict[str, int]] = attrs.field(factory=lambda: {v: {} for v in VARIANTS})

    def add(self, key: tuple[int, str, str], batches: int, seconds: float, counters: dict[str, int]) -> None:
        cell = self.cells.setdefault(key, {"batches": 0, "seconds": 0.0, **{c: 0 for c in COUNTERS}})
        cell["batches"] += batches
        cell["seconds"] += seconds
        for name, value in counters.items():
            cell[name] += value

    def record(self, variant: str, results: list[TransitionResult]) -> None:
        for r in results:
            self.outcomes[variant][r.outcome.value] = self.outcomes[variant].get(r.outcome.value, 0) + 1


@attrs.define(eq=False)
class Bench:
    """The phases of one run against one database."""

    db: Database
    store: LeaseStore
    app: App
    loops: int
    result_json: str
    tally: Tally = attrs.field(factory=Tally)
    # What reading the counters adds to them (the read itself): taken off every phase.
    reading: dict[str, int] = attrs.field(factory=dict)

    async def calibrate(self) -> None:
        first = await server_status(self.db, COUNTERS)
        second = await server_status(self.db, COUNTERS)
        self.reading = {c: second[c] - first[c] for c in COUNTERS}

    async def claim(self, size: int) -> list[tuple[str, str]]:
        """``size`` reserved tasks: (task id, token)."""
        got: list[tuple[str, str]] = []
        while len(got) < size:
            request = ClaimRequest(
                namespace_id=self.app.namespace_id,
                application_id=self.app.application_id,
                queue_ids=(self.app.queue_id,),
                capabilities=frozenset({HANDLER}),
                resource_key_support=False,
                limit=size - len(got),
                node_id="b" * 32,
                connection_id="bench-settle",
            )
            reservations = await self.store.claim(request)
            if not reservations:
                raise RuntimeError("the seeded tasks ran out")
            got += [(r.task_id, r.fencing_token) for r in reservations]
        return got

    async def phase(self, key: tuple[int, str, str], lanes: list[Callable[[], Awaitable[int]]]) -> None:
        """Run the lanes concurrently (each returns the batches it committed); time them."""
        before = await server_status(self.db, COUNTERS)
        batches = 0

        async def run(lane: Callable[[], Awaitable[int]]) -> None:
            nonlocal batches
            committed = await lane()  # awaited first: `batches += await ...` would read it before
            batches += committed

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for lane in lanes:
                nursery.start_soon(run, lane)
        seconds = time.perf_counter() - started
        after = await server_status(self.db, COUNTERS)
        self.tally.add(key, batches, seconds, {c: after[c] - before[c] - self.reading[c] for c in COUNTERS})

    def starts(self, variant: str, *batches: list[tuple[str, str]]) -> Callable[[], Awaitable[int]]:
        async def lane() -> int:
            for batch in batches:
                self.tally.record(variant, await self.store.start_many(batch))
            return len(batches)

        return lane

    def finishes(self, variant: str, batch: list[tuple[str, str]], *, retried: bool) -> Callable[[], Awaitable[int]]:
        items = [
            FinishItem(task_id, token, error={"code": "BUSY"}, retryable=True)
            if retried and i % 4 == 3
            else FinishItem(task_id, token, result_json=self.result_json)
            for i, (task_id, token) in enumerate(batch)
        ]

        async def lane() -> int:
            self.tally.record(variant, await self.store.finish_many(items))
            return 1

        return lane

    async def round(self, size: int, variant: str) -> None:
        """Claim (not measured), then start and finish ``loops`` x 2 batches with ``variant``."""
        succeed = [await self.claim(size) for _ in range(self.loops)]
        retried = [await self.claim(size) for _ in range(self.loops)]
        with statements(variant):
            await self.phase(
                (size, KINDS[0], variant), [self.starts(variant, a, b) for a, b in zip(succeed, retried, strict=True)]
            )
            await self.phase((size, KINDS[1], variant), [self.finishes(variant, b, retried=False) for b in succeed])
            await self.phase((size, KINDS[2], variant), [self.finishes(variant, b, retried=True) for b in retried])


async def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = [int(b) for b in args.settle_batches.split(",")]
    loops, rounds = args.settle_loops, args.settle_rounds
    server = PrivateMariaDB()
    try:
        await server.start()
        db = Database(server.dsn(), size=loops + 2)
        try:
            await migrate.up(db)
            version = (await db.run(lambda tx: tx.fetchall_raw("SELECT VERSION() AS v")))[0]["v"]
            app = await make_app(db, "settle")
            # Per variant and round, `loops` batches to finish with successes and as many
            # with 1 in 4 retried.
            await seed_tasks(db, app, sum(rounds * len(VARIANTS) * 2 * loops * size for size in sizes))
            # A retried task waits an hour: it never comes back into this run's claims.
            await db.run(lambda tx: tx.execute_raw("UPDATE tasks SET backoff_initial_ms = 3600000"))
            bench = Bench(
                db,
                LeaseStore(db, reservation_lease_s=300, run_lease_s=300, batch_size=max(sizes)),
                app,
                loops,
                json.dumps({"bench": "x" * max(0, args.settle_result_bytes - 13)}),
            )
            await bench.calibrate()
            for size in sizes:
                for number in range(rounds):
                    for variant in VARIANTS if number % 2 == 0 else VARIANTS[::-1]:
                        await bench.round(size, variant)
        finally:
            await db.aclose()
    finally:
        with trio.CancelScope(shield=True):
            await server.stop()
            server.remove()
    return report(args, bench.tally, version)


def report(args: argparse.Namespace, tally: Tally, version: str) -> dict[str, Any]:
    outcomes = tally.outcomes
    rows = []
    figures: dict[str, Any] = {}
    for (size, kind, variant), cell in sorted(tally.cells.items()):
        if variant != "after":
            continue
        before = tally.cells[(size, kind, "before")]
        rate = {v: c["batches"] / c["seconds"] for v, c in (("before", before), ("after", cell))}
        per_batch = {
            v: {name: c[name] / c["batches"] for name in COUNTERS} for v, c in (("before", before), ("after", cell))
        }
        figures[f"{size} {kind}"] = {"batches_per_s": rate, "per_batch": per_batch, "batches": cell["batches"]}
        rows.append(
            [
                f"batch {size}, {kind}",
                rate["before"],
                rate["after"],
                ratio(rate["after"], rate["before"]),
                f"{per_batch['before']['Questions']:.1f} / {per_batch['after']['Questions']:.1f}",
                f"{per_batch['before']['Created_tmp_tables']:.1f} ({per_batch['before']['Created_tmp_disk_tables']:.1f})"
                f" / {per_batch['after']['Created_tmp_tables']:.1f} ({per_batch['after']['Created_tmp_disk_tables']:.1f})",
            ]
        )
    table = format_table(
        ["batches", "before /s", "after /s", "after / before", "statements", "tmp tables (on disk)"],
        rows,
        align="lrrrrr",
    )
    same = outcomes["before"] == outcomes["after"]
    return {
        "scenario": "settle",
        "server": version,
        "figures": {"phases": figures, "outcomes": outcomes},
        "tables": [table],
        "notes": [
            f"Private mariadbd, innodb_flush_log_at_trx_commit=1, 64 MB buffer pool; {args.settle_loops} batches "
            f"committed at once per phase, {args.settle_rounds} rounds per batch size, results of "
            f"{args.settle_result_bytes} bytes; a start phase starts two batches per lane.",
            "statements and tmp tables: the server's Questions, Created_tmp_tables (Created_tmp_disk_tables) per "
            "batch, before / after (less what reading them adds); statements count the transaction's BEGIN and "
            "COMMIT and its row lock.",
            "outcomes of every batch item, before: "
            + ", ".join(f"{k} {v}" for k, v in sorted(outcomes["before"].items()))
            + "; after: "
            + ", ".join(f"{k} {v}" for k, v in sorted(outcomes["after"].items()))
            + ("" if same else "  -- DIFFERENT: the comparison is void"),
        ],
        "profiles": {},
    }


def plot(report: dict[str, Any], outdir, plots) -> list:
    phases = report["figures"]["phases"]
    labels = [f"{name}\n{v}" for name in phases for v in VARIANTS]
    values = [phases[name]["batches_per_s"][v] for name in phases for v in VARIANTS]
    return [
        plots.bar(
            outdir / "settle-batches.png",
            labels,
            values,
            title="Settle: batches/s, previous statements vs single-table UPDATEs",
            ylabel="batches/s",
        )
    ]
