"""Peer task queues, each run in its own process: ``python -m bench.peers NAME ...``.

* ``procrastinate``: Procrastinate on the local PostgreSQL (127.0.0.1:5432, user
  ``postgres``; ``ORBIT_BENCH_PG_DSN`` overrides), one asyncio worker process with
  ``concurrency`` = the total Worker concurrency, a pool of 12 connections (the node's
  pool size), ``synchronous_commit`` of ``--synchronous-commit``: ``on`` at production
  durability (MariaDB's ``innodb_flush_log_at_trx_commit=1``), ``off`` at the development
  setting (``=2``, the same durability class).
* ``pgqueuer``: PgQueuer on the same PostgreSQL (asyncpg pool of 12 connections,
  the same ``synchronous_commit``), its in-process ``QueueManager`` in drain mode with
  ``max_concurrent_tasks`` = the concurrency and the largest batch that allows
  (half of it: PgQueuer requires ``max_concurrent_tasks >= 2 x batch_size``).
* ``huey``: Huey's SQL storage (``huey.contrib.sql_huey.SqlHuey``, peewee + PyMySQL) on
  the same MariaDB server as Orbit, one consumer process with ``concurrency`` threads.
* ``celery``: Celery on the private Redis of ``--redis-url`` (``bench/redisserver.py``:
  append-only file, ``appendfsync always`` at production durability), one worker with a
  threads pool of ``concurrency``, ``task_acks_late``, its default prefetch multiplier (4).
* ``dramatiq``: Dramatiq's Redis broker on such a Redis, one worker with ``concurrency``
  threads (its acks come after the task).

Each creates its own database (a Redis peer: the harness starts a new server for each
run), pre-submits ``--tasks`` no-op tasks, drains them with the workers, drops the
database, and prints one JSON object (tasks/s, progress samples, its own CPU seconds and
the whole machine's during the drain, database server included; for PostgreSQL,
``synchronous_commit`` and ``fsync`` as its session saw them) on stdout. The threaded
peers (Huey, Celery, Dramatiq: ``bench/thread_peers.py``) also run ``--mode e2e``: workers
first, then the tasks submitted one by one from ``--submitters`` threads while they run.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from typing import Any

from .accounting import machine_busy_seconds, self_cpu_seconds
from .thread_peers import SAMPLE_S, dist_version, run_celery, run_dramatiq, run_huey

# Bulk size of procrastinate's batch_defer (one INSERT per batch).
DEFER_BATCH = 1000
# Database connections of the Procrastinate pool: the Orbit node's default pool size.
PG_POOL = 12
# What a PostgreSQL peer's session runs with: its durability, as the server says.
PG_SETTINGS_SQL = "SELECT current_setting('synchronous_commit'), current_setting('fsync')"


def _pg_base() -> str:
    return os.environ.get("ORBIT_BENCH_PG_DSN", "host=127.0.0.1 port=5432 user=postgres")


@contextmanager
def _pg_database(prefix: str) -> Iterator[str]:
    """A new PostgreSQL database named ``prefix<random>``, dropped on exit."""
    import psycopg

    base = _pg_base()
    name = prefix + secrets.token_hex(4)
    with psycopg.connect(f"{base} dbname=postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(f"{base} dbname=postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _pg_setup(settings: dict[str, str]) -> str:
    return f"synchronous_commit={settings['synchronous_commit']} (fsync={settings['fsync']})"


async def _bounded(drain: Awaitable[Any], timeout_s: float) -> bool:
    """Await an asyncio peer's drain for at most ``timeout_s``; whether it timed out."""
    import asyncio

    try:
        await asyncio.wait_for(drain, timeout_s)
    except TimeoutError:
        return True
    return False


def run_procrastinate(tasks: int, concurrency: int, timeout_s: float, synchronous_commit: str) -> dict[str, Any]:
    import asyncio

    import procrastinate
    import psycopg

    async def main(name: str) -> dict[str, Any]:
        conninfo = f"{_pg_base()} dbname={name} options='-c synchronous_commit={synchronous_commit}'"
        app = procrastinate.App(
            connector=procrastinate.PsycopgConnector(conninfo=conninfo, min_size=PG_POOL, max_size=PG_POOL)
        )

        @app.task(name="noop", queue="bench")
        async def noop() -> None:
            return None

        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            begin = time.perf_counter()
            for offset in range(0, tasks, DEFER_BATCH):
                await noop.batch_defer_async(*({} for _ in range(min(DEFER_BATCH, tasks - offset))))
            enqueue_s = time.perf_counter() - begin
            progress: list[tuple[float, int]] = []
            stop = asyncio.Event()

            async def sample(start: float) -> None:
                async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                    while not stop.is_set():
                        cur = await conn.execute("SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")
                        progress.append((time.perf_counter() - start, (await cur.fetchone())[0]))
                        try:
                            await asyncio.wait_for(stop.wait(), SAMPLE_S)
                        except TimeoutError:
                            pass

            cpu0, machine0 = self_cpu_seconds(), machine_busy_seconds()
            start = time.perf_counter()
            sampler = asyncio.create_task(sample(start))
            timed_out = await _bounded(
                app.run_worker_async(
                    concurrency=concurrency,
                    wait=False,
                    install_signal_handlers=False,
                    queues=["bench"],
                    delete_jobs="never",
                ),
                timeout_s,
            )
            seconds = time.perf_counter() - start
            cpu, machine = self_cpu_seconds() - cpu0, machine_busy_seconds() - machine0
            stop.set()
            await sampler
            async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                cur = await conn.execute("SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")
                done = (await cur.fetchone())[0]
                cur = await conn.execute(PG_SETTINGS_SQL)
                settings = dict(zip(("synchronous_commit", "fsync"), await cur.fetchone(), strict=True))
        return {
            "pg_settings": settings,
            "tasks": done,
            "seconds": seconds,
            "enqueue_s": enqueue_s,
            "cpu_s": cpu,
            "machine_cpu_s": machine,
            "timed_out": timed_out,
            "progress": progress + [(seconds, done)],
            "version": dist_version("procrastinate"),
            "setup": f"PostgreSQL, 1 asyncio worker process, concurrency {concurrency}, pool {PG_POOL}, "
            + _pg_setup(settings),
        }

    with _pg_database("orbit_bench_pg_") as name:
        return asyncio.run(main(name))


def _pg_keywords(conninfo: str) -> dict[str, Any]:
    """asyncpg's connect arguments from a libpq ``key=value`` string (no quoting)."""
    names = {"dbname": "database"}
    out: dict[str, Any] = {}
    for part in conninfo.split():
        key, _, value = part.partition("=")
        out[names.get(key, key)] = int(value) if key == "port" else value
    return out


def run_pgqueuer(tasks: int, concurrency: int, timeout_s: float, synchronous_commit: str) -> dict[str, Any]:
    import asyncio

    import asyncpg
    from pgqueuer import AsyncpgPoolDriver, Job, QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    batch = max(1, concurrency // 2)

    async def main(name: str) -> dict[str, Any]:
        pool = await asyncpg.create_pool(
            **_pg_keywords(_pg_base()),
            database=name,
            min_size=PG_POOL,
            max_size=PG_POOL,
            server_settings={"synchronous_commit": synchronous_commit},
        )
        try:
            row = await pool.fetchrow(PG_SETTINGS_SQL)
            settings = {"synchronous_commit": row[0], "fsync": row[1]}
            queries = Queries(AsyncpgPoolDriver(pool))
            await queries.install()
            begin = time.perf_counter()
            for offset in range(0, tasks, DEFER_BATCH):
                size = min(DEFER_BATCH, tasks - offset)
                await queries.enqueue(["noop"] * size, [None] * size, [0] * size)
            enqueue_s = time.perf_counter() - begin
            manager = QueueManager(Queries(AsyncpgPoolDriver(pool)))
            done = 0

            @manager.entrypoint("noop")
            async def noop(job: Job) -> None:
                nonlocal done
                done += 1

            progress: list[tuple[float, int]] = []

            async def sample(start: float) -> None:
                while True:
                    progress.append((time.perf_counter() - start, done))
                    await asyncio.sleep(SAMPLE_S)

            cpu0, machine0 = self_cpu_seconds(), machine_busy_seconds()
            start = time.perf_counter()
            sampler = asyncio.create_task(sample(start))
            timed_out = await _bounded(
                manager.run(
                    batch_size=batch,
                    max_concurrent_tasks=concurrency if concurrency >= 2 else None,
                    mode=QueueExecutionMode.drain,
                ),
                timeout_s,
            )
            seconds = time.perf_counter() - start
            cpu, machine = self_cpu_seconds() - cpu0, machine_busy_seconds() - machine0
            sampler.cancel()
            finished = done
        finally:
            await pool.close()
        return {
            "pg_settings": settings,
            "tasks": finished,
            "seconds": seconds,
            "enqueue_s": enqueue_s,
            "cpu_s": cpu,
            "machine_cpu_s": machine,
            "timed_out": timed_out or finished < tasks,
            "progress": progress + [(seconds, finished)],
            "version": dist_version("pgqueuer"),
            "setup": f"PostgreSQL, 1 QueueManager (drain mode), max_concurrent_tasks {concurrency}, batch {batch}, "
            f"asyncpg pool {PG_POOL}, " + _pg_setup(settings),
        }

    with _pg_database("orbit_bench_pgq_") as name:
        return asyncio.run(main(name))


# Peers with an end-to-end mode (``--mode e2e``): those whose workers are threads of one
# process, on bench/thread_peers.py's driver.
E2E_PEERS = ("huey", "celery", "dramatiq")
# Peers on a Redis the harness starts for each run (``--redis-url``).
REDIS_PEERS = ("celery", "dramatiq")
PEERS = ("procrastinate", "pgqueuer", *E2E_PEERS)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers")
    parser.add_argument("peer", choices=PEERS)
    parser.add_argument("--tasks", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument(
        "--mode",
        choices=("burn-down", "e2e"),
        default="burn-down",
        help="burn-down: pre-submit, then drain; e2e: workers first, then single submits while they run "
        f"({', '.join(E2E_PEERS)})",
    )
    parser.add_argument(
        "--submitters", type=int, default=16, help="threads enqueueing one by one (threaded peers; default 16)"
    )
    parser.add_argument("--mysql-url", default="")
    parser.add_argument("--redis-url", default="", help="the private Redis of celery and dramatiq")
    parser.add_argument(
        "--synchronous-commit", choices=("on", "off"), default="on", help="PostgreSQL peers' durability (default on)"
    )
    args = parser.parse_args(argv)
    threaded = {"mode": args.mode, "submitters": args.submitters}
    try:
        if args.mode != "burn-down" and args.peer not in E2E_PEERS:
            raise ValueError(f"{args.peer} has no {args.mode} mode")
        if args.peer == "procrastinate":
            result = run_procrastinate(args.tasks, args.concurrency, args.timeout_s, args.synchronous_commit)
        elif args.peer == "pgqueuer":
            result = run_pgqueuer(args.tasks, args.concurrency, args.timeout_s, args.synchronous_commit)
        elif args.peer == "huey":
            result = run_huey(args.tasks, args.concurrency, args.timeout_s, args.mysql_url, **threaded)
        elif args.peer == "celery":
            result = run_celery(args.tasks, args.concurrency, args.timeout_s, args.redis_url, **threaded)
        else:
            result = run_dramatiq(args.tasks, args.concurrency, args.timeout_s, args.redis_url, **threaded)
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result), flush=True)
    # Worker threads a peer could not stop must not keep this process alive.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
