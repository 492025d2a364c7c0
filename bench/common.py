"""What every scenario shares: its own database, tenants, seeding, a node process, Workers.

Everything talks to 127.0.0.1 only. A scenario creates ``orbit_bench_<random>`` on the
private server of its durability setting (``bench/durability.py``; with ``--durability
server``, on the server of ``ORBIT_BENCH_MYSQL_DSN``, default ``scripts/devdb.sh dsn``),
migrates it, and drops it at the end, whatever happened.
"""

from __future__ import annotations

import json
import math
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from orbit_node.db import Database, migrate
from orbit_node.dsn import Dsn
from orbit_node.sdk.client import OrbitClient, SubmitTaskRequest
from orbit_node.sdk.worker import Worker, WorkerTask
from orbit_node.store.tenancy import SCOPES, TenancyStore

from . import durability
from .report import STATUS_COUNTERS, profile_summary, status_delta

REPO = Path(__file__).resolve().parent.parent
# The no-op handler every scenario uses.
HANDLER = ("bench.noop", "v1", "v1")
# Bound on a node process start (migrations are done before it starts).
NODE_START_TIMEOUT_S = 30
# Bound on a node process stop (graceful drain is 2 s in nodeproc).
NODE_STOP_TIMEOUT_S = 15
# Rows per INSERT ... SELECT when seeding (keeps each statement's undo log modest).
SEED_CHUNK = 100_000


def bench_dsn() -> Dsn:
    """The MariaDB server the benchmarks create their databases on: the running scenario's
    private server of its durability setting (bench/durability.py), else ``env_dsn()``."""
    found = durability.active()
    if found is not None and found.dsn is not None:
        return found.dsn
    return env_dsn()


def env_dsn() -> Dsn:
    """The server of ``ORBIT_BENCH_MYSQL_DSN`` (default ``scripts/devdb.sh dsn``)."""
    text = os.environ.get("ORBIT_BENCH_MYSQL_DSN")
    if not text:
        text = subprocess.run(
            [str(REPO / "scripts" / "devdb.sh"), "dsn"], check=True, capture_output=True, text=True
        ).stdout.strip()
    dsn = Dsn.parse(text)
    if dsn.unix_socket is None and dsn.host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"benchmarks only talk to this machine; ORBIT_BENCH_MYSQL_DSN names {dsn.host}")
    return dsn


async def admin_sql(server: Dsn, sql: str) -> None:
    admin = Database(server, size=1)
    try:
        await admin.run(lambda tx: tx.execute_raw(sql))
    finally:
        await admin.aclose()


@attrs.frozen
class BenchDb:
    dsn: Dsn
    db: Database
    server_version: str


@asynccontextmanager
async def bench_database(*, pool_size: int = 8) -> AsyncIterator[BenchDb]:
    """A new migrated database, dropped on exit."""
    server = bench_dsn()
    name = "orbit_bench_" + secrets.token_hex(4)
    await admin_sql(server, f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    dsn = server.with_database(name)
    db = Database(dsn, size=pool_size)
    try:
        await migrate.up(db)
        version = (await db.run(lambda tx: tx.fetchall_raw("SELECT VERSION() AS v")))[0]["v"]
        yield BenchDb(dsn, db, version)
    finally:
        with trio.CancelScope(shield=True):
            await db.aclose()
            with trio.move_on_after(60):
                await admin_sql(server, f"DROP DATABASE IF EXISTS `{name}`")


async def server_status(db: Database, counters: Sequence[str] = STATUS_COUNTERS) -> dict[str, int]:
    """MariaDB's global status ``counters`` (server-wide: every client counts)."""
    names = ", ".join(f"'{name}'" for name in counters)
    rows = await db.run(lambda tx: tx.fetchall_raw(f"SHOW GLOBAL STATUS WHERE Variable_name IN ({names})"))
    return {_text(r["Variable_name"]): int(_text(r["Value"])) for r in rows}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@attrs.define(eq=False)
class Statements:
    """What ``count_statements`` found: the counters' change over the block."""

    delta: dict[str, int] = attrs.field(factory=dict)


@asynccontextmanager
async def count_statements(db: Database) -> AsyncIterator[Statements]:
    """The server's statement counters before and after the block (``Statements.delta``)."""
    result = Statements()
    before = await server_status(db)
    yield result
    result.delta = status_delta(before, await server_status(db))


# -- tenants ---------------------------------------------------------------------------


@attrs.frozen
class App:
    """An application with one namespace, its queues and a token with every scope."""

    name: str
    application_id: str
    namespace_id: str
    queue_ids: tuple[str, ...]
    token: str

    @property
    def queue_id(self) -> str:
        return self.queue_ids[0]


async def make_app(db: Database, name: str, *, queues: int = 1) -> App:
    tenancy = TenancyStore(db)
    app = await tenancy.ensure_application(name)
    ns = await tenancy.ensure_namespace(app["application_id"], "bench", "test")
    queue_ids = []
    for index in range(queues):
        queue, _ = await tenancy.create_queue(ns["namespace_id"], app["application_id"], f"q{index}", exist_ok=True)
        queue_ids.append(queue.queue_id)
    _, token = await tenancy.create_credential(ns["namespace_id"], "bench", {scope: "*" for scope in SCOPES})
    return App(name, app["application_id"], ns["namespace_id"], tuple(queue_ids), token)


# -- seeding -----------------------------------------------------------------------------


def _digits_table(count: int) -> tuple[str, str]:
    digits = max(1, len(str(max(count - 1, 1))))
    tables = ", ".join(
        "(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL "
        f"SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) d{i}"
        for i in range(digits)
    )
    number = " + ".join(f"d{i}.d * {10**i}" for i in range(digits))
    return number, tables


async def seed_tasks(
    db: Database,
    app: App,
    count: int,
    *,
    queue_id: str | None = None,
    available_s: str = "-1",
    priority: str = "0",
    state: str = "queued",
    handler: tuple[str, str, str] = HANDLER,
    resource_key: str = "NULL",
) -> None:
    """``count`` task rows through INSERT ... SELECT over a cross join of digits.

    ``available_s``, ``priority`` and ``resource_key`` are SQL expressions of the row
    number ``n`` (seconds relative to ``NOW(6)``; e.g. ``"-600 * RAND()"``,
    ``"CONCAT('k', MOD(n, 100))"``; the statement carries parameters, so
    ``%`` is written ``MOD()``). ``state='succeeded'`` (or ``'cancelled'``) writes
    finished history rows; ``handler`` is (handler, handler_version, payload_version),
    the no-op handler by default. Chunks of ``SEED_CHUNK`` rows, one statement each.
    """
    queue_id = queue_id or app.queue_id
    finished = state != "queued"
    for offset in range(0, count, SEED_CHUNK):
        size = min(SEED_CHUNK, count - offset)
        number, tables = _digits_table(size)
        prefix = secrets.token_hex(4)
        extra_cols = ", state, attempts, reserved_at, started_at, finished_at, result" if finished else ""
        extra_vals = (
            ", %s, 1, NOW(6) - INTERVAL 1 HOUR, NOW(6) - INTERVAL 1 HOUR, NOW(6) - INTERVAL 1 HOUR, 'null'"
            if finished
            else ""
        )
        sql = (
            "INSERT INTO tasks (task_id, application_id, namespace_id, queue_id, handler, handler_version, "
            f"payload_version, payload, available_at, priority, resource_key{extra_cols}) "
            f"SELECT CONCAT(%s, LPAD(LOWER(HEX(n)), 24, '0')), %s, %s, %s, %s, %s, %s, '{{}}', "
            f"NOW(6) + INTERVAL ROUND(({available_s}) * 1000000) MICROSECOND, {priority}, {resource_key}{extra_vals} "
            f"FROM (SELECT {number} AS n FROM {tables}) seq WHERE n < %s"
        )
        params: list[Any] = [prefix, app.application_id, app.namespace_id, queue_id, *handler]
        if finished:
            params.append(state)
        params.append(size)
        await db.run(lambda tx: tx.execute_raw(sql, params))  # noqa: B023 - awaited within the iteration


async def count_tasks(db: Database, where: str = "1", params: Sequence[Any] = ()) -> int:
    rows = await db.run(lambda tx: tx.fetchall_raw(f"SELECT COUNT(*) AS n FROM tasks WHERE {where}", params))
    return int(rows[0]["n"])


async def task_times(db: Database, where: str = "state = 'succeeded'", params: Sequence[Any] = ()) -> list[dict]:
    """Per task (database clock): waits available->reserve (dispatch) and available->start, in seconds."""
    sql = (
        "SELECT application_id, queue_id, priority, UNIX_TIMESTAMP(available_at) AS available, "
        "TIMESTAMPDIFF(MICROSECOND, available_at, reserved_at) / 1e6 AS to_dispatch, "
        "TIMESTAMPDIFF(MICROSECOND, available_at, started_at) / 1e6 AS to_start, "
        "UNIX_TIMESTAMP(reserved_at) AS reserved, UNIX_TIMESTAMP(finished_at) AS finished, "
        "TIMESTAMPDIFF(MICROSECOND, created_at, available_at) / 1e6 AS dated_ahead "
        f"FROM tasks WHERE {where} ORDER BY reserved_at, dispatch_at, available_at, task_id"
    )
    rows = await db.run(lambda tx: tx.fetchall_raw(sql, params))
    return [
        {
            k: (float(v) if k not in ("application_id", "queue_id", "priority") and v is not None else v)
            for k, v in r.items()
        }
        for r in rows
    ]


# -- processes ---------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (from /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return math.nan


def self_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot (/proc/stat), for load checks."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        values = [int(v) for v in first]
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return math.nan


@attrs.define(eq=False)
class CpuMeter:
    """CPU used during a phase: this process, extra processes by pid, and the whole machine."""

    pids: dict[str, int] = attrs.field(factory=dict)
    _start: dict[str, float] = attrs.field(factory=dict)
    _wall: float = 0.0

    def start(self) -> None:
        self._wall = time.perf_counter()
        self._start = {"harness": self_cpu_seconds(), "machine": machine_busy_seconds()}
        self._start.update({name: cpu_seconds(pid) for name, pid in self.pids.items()})

    def stop(self) -> dict[str, float]:
        wall = time.perf_counter() - self._wall
        now = {"harness": self_cpu_seconds(), "machine": machine_busy_seconds()}
        now.update({name: cpu_seconds(pid) for name, pid in self.pids.items()})
        used = {f"{name}_cpu_s": round(now[name] - self._start[name], 2) for name in now}
        used["wall_s"] = round(wall, 3)
        used["machine_utilisation"] = (
            round(used["machine_cpu_s"] / (wall * (os.cpu_count() or 1)), 3) if wall else math.nan
        )
        return used


@attrs.define(eq=False)
class Profiler:
    """py-spy sampling a process (on-CPU samples only); ``stop()`` returns a summary."""

    pid: int
    rate: int = 200
    _proc: Any = None
    _out: Path | None = None

    @staticmethod
    def available() -> bool:
        return (
            shutil.which("py-spy", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
            is not None
        )

    def start(self) -> None:
        exe = shutil.which(
            "py-spy", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        )
        if exe is None:
            return
        self._out = Path(tempfile.mkstemp(prefix="orbit-pyspy-", suffix=".txt")[1])
        self._proc = subprocess.Popen(
            [
                exe,
                "record",
                "--pid",
                str(self.pid),
                "--rate",
                str(self.rate),
                "--nonblocking",
                "--nolineno",
                "--format",
                "raw",
                "--output",
                str(self._out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def stop(self) -> dict[str, Any]:
        if self._proc is None or self._out is None:
            return {"samples": 0, "self": [], "inclusive": [], "error": "py-spy not available"}
        self._proc.send_signal(signal.SIGINT)
        try:
            _, err = self._proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            _, err = self._proc.communicate()
        try:
            text = self._out.read_text()
        except OSError:
            text = ""
        finally:
            self._out.unlink(missing_ok=True)
        summary = profile_summary(text)
        if not summary["samples"]:
            summary["error"] = (err or b"").decode(errors="replace")[-300:]
        return summary


@attrs.define(eq=False)
class Measured:
    """What ``measured_phase`` found: CPU use and, when asked, the node's profile summary."""

    cpu: dict[str, float] = attrs.field(factory=dict)
    profile: dict[str, Any] | None = None


@contextmanager
def measured_phase(node_pid: int, *, profile: bool) -> Iterator[Measured]:
    """CPU accounting of the phase (node, harness, machine) and, with ``profile``, py-spy on the node."""
    meter = CpuMeter({"node": node_pid})
    profiler = Profiler(node_pid) if profile else None
    result = Measured()
    meter.start()
    if profiler:
        profiler.start()
    try:
        yield result
    finally:
        result.cpu = meter.stop()
        if profiler:
            result.profile = profiler.stop()


@attrs.define(eq=False)
class NodeProcess:
    url: str
    pid: int
    stats_path: Path

    def stats(self) -> list[dict[str, Any]]:
        """Every statistics line the node wrote so far (wall-clock ``t``)."""
        try:
            lines = self.stats_path.read_text().splitlines()
        except OSError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def last_stats(self) -> dict[str, Any]:
        stats = self.stats()
        return stats[-1] if stats else {}


@asynccontextmanager
async def ready_process(
    cmd: Sequence[str],
    ready: Path,
    *,
    name: str,
    start_timeout_s: float,
    stop_timeout_s: float,
    cwd: Path = REPO,
) -> AsyncIterator[tuple[subprocess.Popen, dict[str, Any]]]:
    """Run ``cmd`` (from ``cwd``, the repository root by default) until it writes JSON to
    ``ready``; yield the process and that JSON; SIGTERM it on exit (SIGKILL after
    ``stop_timeout_s``)."""
    proc = subprocess.Popen(list(cmd), cwd=cwd, stdin=subprocess.DEVNULL)
    try:
        with trio.fail_after(start_timeout_s):
            while not ready.exists():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} process exited with status {proc.returncode}")
                await trio.sleep(0.05)
        yield proc, json.loads(ready.read_text())
    finally:
        with trio.CancelScope(shield=True):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                with trio.move_on_after(stop_timeout_s):
                    while proc.poll() is None:
                        await trio.sleep(0.05)
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


@asynccontextmanager
async def node_process(
    dsn: Dsn,
    *,
    claims_per_connection_per_cycle: int | None = None,
    claim_batch_size: int | None = None,
    stats_interval_s: float | None = None,
    run_lease_s: float | None = None,
    shards: str = "",
    tree: Path | None = None,
) -> AsyncIterator[NodeProcess]:
    """Start ``python -m bench.nodeproc`` on a free port of 127.0.0.1; SIGTERM it on exit.

    ``shards``: the node's ORBIT_SHARDS (none: every application on ``dsn``). ``tree``: a
    source tree of another commit (``git worktree add`` or ``git archive``) whose node to
    run, for a before/after pair in one run; its ``bench/nodeproc.py`` and ``orbit_node``
    are imported from there (``python -m`` puts the working directory first)."""
    workdir = Path(tempfile.mkdtemp(prefix="orbit-bench-node-"))
    ready = workdir / "ready.json"
    stats = workdir / "stats.jsonl"
    cmd = [sys.executable, "-m", "bench.nodeproc", "--dsn", dsn.url(), "--ready", str(ready), "--stats", str(stats)]
    if claims_per_connection_per_cycle is not None:
        cmd += ["--claims-per-connection-per-cycle", str(claims_per_connection_per_cycle)]
    if claim_batch_size is not None:
        cmd += ["--claim-batch-size", str(claim_batch_size)]
    if stats_interval_s is not None:
        cmd += ["--stats-interval-s", str(stats_interval_s)]
    if run_lease_s is not None:
        cmd += ["--run-lease-s", str(run_lease_s)]
    if shards:
        cmd += ["--shards", shards]
    try:
        async with ready_process(
            cmd,
            ready,
            name="node",
            start_timeout_s=NODE_START_TIMEOUT_S,
            stop_timeout_s=NODE_STOP_TIMEOUT_S,
            cwd=REPO if tree is None else tree,
        ) as (proc, info):
            yield NodeProcess(info["url"], proc.pid, stats)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# -- Orbit clients: submitters and Workers ----------------------------------------------


def submit_request(queue_id: str, *, priority: int = 0, delay_s: float | None = None) -> SubmitTaskRequest:
    return SubmitTaskRequest(
        queue_id=queue_id,
        handler=HANDLER[0],
        handler_version=HANDLER[1],
        payload_version=HANDLER[2],
        payload={},
        priority=priority,
        delay_s=delay_s,
    )


async def submit_closed_loop(
    url: str,
    token: str,
    queue_id: str,
    count: int,
    *,
    concurrency: int = 16,
    priority: Callable[[int], int] = lambda i: 0,
    stop: Callable[[], bool] = lambda: False,
) -> list[float]:
    """Submit ``count`` tasks with ``concurrency`` clients back to back; per-request seconds."""
    latencies: list[float] = []
    counter = iter(range(count))

    async def client_loop(client: OrbitClient) -> None:
        for i in counter:
            if stop():
                return
            started = time.perf_counter()
            await client.submit_task(f"b-{secrets.token_hex(8)}-{i}", submit_request(queue_id, priority=priority(i)))
            latencies.append(time.perf_counter() - started)

    clients = [OrbitClient(url, token) for _ in range(concurrency)]
    try:
        async with trio.open_nursery() as nursery:
            for client in clients:
                nursery.start_soon(client_loop, client)
    finally:
        with trio.CancelScope(shield=True):
            for client in clients:
                await client.aclose()
    return latencies


async def submit_open_loop(
    url: str,
    token: str,
    queue_id: str,
    *,
    rate: float,
    duration_s: float,
    max_in_flight: int = 64,
    delay_s: Callable[[int], float | None] = lambda i: None,
    seed: int = 1,
) -> dict[str, Any]:
    """Poisson arrivals at ``rate``/s for ``duration_s``: each arrival is submitted when due,
    whatever earlier submissions are doing (up to ``max_in_flight`` at once; beyond that an
    arrival is counted as ``dropped``, so the load stays open-loop)."""
    rng = random.Random(seed)
    limiter = trio.CapacityLimiter(max_in_flight)
    clients = [OrbitClient(url, token) for _ in range(min(max_in_flight, 32))]
    latencies: list[float] = []
    late: list[float] = []
    dropped = 0
    errors = 0
    submitted = 0

    async def one(i: int, due: float) -> None:
        nonlocal errors, submitted
        async with limiter:
            started = time.perf_counter()
            late.append(started - due)
            try:
                await clients[i % len(clients)].submit_task(
                    f"o-{secrets.token_hex(8)}-{i}", submit_request(queue_id, delay_s=delay_s(i))
                )
                submitted += 1
            except Exception:
                errors += 1
                return
            latencies.append(time.perf_counter() - started)

    begin = time.perf_counter() + 0.05
    try:
        async with trio.open_nursery() as nursery:
            t = 0.0
            i = 0
            while True:
                t += rng.expovariate(rate)
                if t >= duration_s:
                    break
                due = begin + t
                await trio.sleep(max(0.0, due - time.perf_counter()))
                if limiter.borrowed_tokens >= max_in_flight:
                    dropped += 1
                else:
                    nursery.start_soon(one, i, due)
                i += 1
    finally:
        with trio.CancelScope(shield=True):
            for client in clients:
                await client.aclose()
    return {
        "submitted": submitted,
        "dropped": dropped,
        "errors": errors,
        "submit_latencies": latencies,
        "start_lateness": late,
    }


@attrs.define(eq=False)
class Fleet:
    """SDK Workers (one WebSocket connection each) with a no-op handler."""

    workers: list[Worker]
    done_times: list[float]

    @property
    def completed(self) -> int:
        return sum(w.completed for w in self.workers)


@asynccontextmanager
async def worker_fleet(
    url: str,
    plan: Sequence[tuple[str, Sequence[str]]],
    *,
    capacity: int,
    record_times: bool = False,
    handler_s: float = 0.0,
) -> AsyncIterator[Fleet]:
    """One SDK Worker per ``(token, queues)`` of ``plan``, each of ``capacity``; drained on exit.

    ``handler_s``: each task's handler waits that long (``trio.sleep``: a handler waiting on
    I/O) before it returns; 0 is the no-op handler."""
    done_times: list[float] = []
    workers = []
    for token, queues in plan:
        worker = Worker(url=url, token=token, queues=list(queues), capacity=capacity, client_name="orbit-bench")

        async def noop(task: WorkerTask) -> None:
            if handler_s:
                await trio.sleep(handler_s)
            if record_times:
                done_times.append(time.time())
            return None

        worker.register(*HANDLER, noop)
        workers.append(worker)
    fleet = Fleet(workers, done_times)
    async with trio.open_nursery() as nursery:
        async with trio.open_nursery() as starting:
            for worker in workers:
                starting.start_soon(nursery.start, worker.run)
        try:
            yield fleet
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(20):
                async with trio.open_nursery() as draining:
                    for worker in workers:
                        draining.start_soon(worker.drain)
            nursery.cancel_scope.cancel()


async def wait_until(predicate: Callable[[], Any], *, timeout_s: float, poll_s: float = 0.02) -> bool:
    """Poll ``predicate`` until true or ``timeout_s``; returns whether it became true."""
    with trio.move_on_after(timeout_s):
        while not await _maybe_await(predicate()):
            await trio.sleep(poll_s)
        return True
    return False


async def _maybe_await(value: Any) -> Any:
    if hasattr(value, "__await__"):
        return await value
    return value


def connection_plan(app: App, connections: int) -> list[tuple[str, Sequence[str]]]:
    """``connections`` Workers of ``app`` spread round-robin over its queues (one queue each)."""
    return [(app.token, [app.queue_ids[i % len(app.queue_ids)]]) for i in range(connections)]
