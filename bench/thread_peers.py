"""The peers whose workers are threads of one process, on one driver: Huey, Celery, Dramatiq.

Each peer is a ``ThreadedPeer``: ``enqueue`` one no-op task, ``start`` and ``stop`` its
workers (threads of this process), and a task counts as finished when the peer has
acknowledged it (``Completions.finished``): Huey's ``SIGNAL_COMPLETE``, Celery's late ack,
Dramatiq's ``after_ack``. ``drive`` runs it in one of two modes:

* ``burn-down``: the tasks are enqueued first (``submitters`` threads back to back), then
  the workers start; the drain is measured from their start to the last acknowledgement.
* ``e2e``: the workers start first; then the tasks are enqueued one by one from
  ``submitters`` threads while they run, each carrying its submit time (``time.time()``,
  taken just before the enqueue call), which its handler turns into submit -> start;
  measured from the first submit to the last acknowledgement.

Either way the process's own CPU and the whole machine's are read around the measured
phase, as ``bench/peers.py``'s PostgreSQL peers read them.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from .accounting import machine_busy_seconds, self_cpu_seconds
from .report import summarize

# Progress sampling period of the burn-down curves.
SAMPLE_S = 0.25
# The queue every peer's tasks go to.
QUEUE = "bench"
# Celery's reservations per worker thread: its default. With late acks no multiplier loses
# a task (a message leaves the broker's unacked set only once its task ran); a larger one
# only holds more messages behind a worker that dies, until the visibility timeout. 4
# drained up to 1.5x faster than 1 in paired runs (docs/benchmarks/throughput.md).
CELERY_PREFETCH_MULTIPLIER = 4
# Redis connections a Dramatiq process may open beyond one per worker and submitter
# thread (its consumer, its heartbeat): redis-py's default pool stops at 100, which 128
# threads acking at once exceed.
DRAMATIQ_SPARE_CONNECTIONS = 8
# Bound on a burn-down's pre-submit, within the set-up time the harness allows a peer
# process beyond its drain (bench/s1.py, PEER_SETUP_S).
PRESUBMIT_TIMEOUT_S = 150.0


class ThreadedPeer(Protocol):
    def enqueue(self, submitted: float | None) -> None:
        """Enqueue one no-op task; ``submitted`` (e2e) is handed to its handler."""

    def start(self) -> None:
        """Start the workers (threads of this process)."""

    def stop(self) -> None:
        """Stop the workers."""


class Completions:
    """What a threaded peer's workers finished, counted from their threads: acknowledged
    tasks, and each handler's submit -> start (e2e)."""

    def __init__(self, tasks: int) -> None:
        self.tasks = tasks
        self.done = 0
        self.start_latencies: list[float] = []
        self._lock = threading.Lock()
        self._all_done = threading.Event()

    def started(self, submitted: float | None) -> None:
        """A handler's first line: records submit -> start when it was given its submit time."""
        if submitted is not None:
            latency = time.time() - submitted
            with self._lock:
                self.start_latencies.append(latency)

    def finished(self) -> None:
        """The peer acknowledged a task."""
        with self._lock:
            self.done += 1
            if self.done >= self.tasks:
                self._all_done.set()

    def measure(self, begin: Callable[[], None], timeout_s: float) -> dict[str, Any]:
        """Call ``begin`` and sample progress until every task is acknowledged or
        ``timeout_s`` has passed; what the phase took and cost."""
        progress: list[tuple[float, int]] = []
        cpu0, machine0 = self_cpu_seconds(), machine_busy_seconds()
        start = time.perf_counter()
        begin()
        deadline = start + timeout_s
        while not self._all_done.wait(SAMPLE_S) and time.perf_counter() < deadline:
            progress.append((time.perf_counter() - start, self.done))
        seconds = time.perf_counter() - start
        cpu, machine = self_cpu_seconds() - cpu0, machine_busy_seconds() - machine0
        finished = self.done
        return {
            "tasks": finished,
            "seconds": seconds,
            "cpu_s": cpu,
            "machine_cpu_s": machine,
            "timed_out": finished < self.tasks,
            "progress": progress + [(seconds, finished)],
        }


class Submitters:
    """``count`` tasks enqueued by ``threads`` threads back to back (the first error of any
    stops them all and is raised by ``join``)."""

    def __init__(self, enqueue: Callable[[float | None], None], count: int, threads: int, *, timed: bool) -> None:
        self._enqueue = enqueue
        self._timed = timed
        # Shared by the threads: a range iterator hands each number out once.
        self._numbers: Iterator[int] = iter(range(count))
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(max(1, threads))]
        self._errors: list[BaseException] = []
        self._began = 0.0
        self.seconds = 0.0

    def _loop(self) -> None:
        try:
            for _ in self._numbers:
                if self._errors:
                    return
                self._enqueue(time.time() if self._timed else None)
        except BaseException as exc:
            self._errors.append(exc)

    def start(self) -> None:
        self._began = time.perf_counter()
        for thread in self._threads:
            thread.start()

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every thread; whether all of them finished
        (``seconds``: from ``start`` to then)."""
        deadline = time.perf_counter() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.perf_counter()))
        self.seconds = time.perf_counter() - self._began
        if self._errors:
            raise self._errors[0]
        return not any(thread.is_alive() for thread in self._threads)


def drive(
    peer: ThreadedPeer,
    completions: Completions,
    *,
    dist: str,
    setup: str,
    mode: str,
    submitters: int,
    timeout_s: float,
) -> dict[str, Any]:
    """Run ``peer`` over ``completions.tasks`` tasks in ``mode`` (``burn-down`` or ``e2e``);
    its figures (tasks, seconds, CPU, progress; e2e: submit -> start and the submit rate),
    the version of its distribution ``dist`` and ``setup``, how it ran."""
    if mode == "burn-down":
        presubmit = Submitters(peer.enqueue, completions.tasks, submitters, timed=False)
        presubmit.start()
        if not presubmit.join(PRESUBMIT_TIMEOUT_S):
            raise TimeoutError(
                f"the pre-submit of {completions.tasks:,} tasks took more than {PRESUBMIT_TIMEOUT_S:g} s"
            )
        result = completions.measure(peer.start, timeout_s)
        result["enqueue_s"] = presubmit.seconds
    else:
        peer.start()
        submit = Submitters(peer.enqueue, completions.tasks, submitters, timed=True)
        result = completions.measure(submit.start, timeout_s)
        # Every submit is in once every task was acknowledged; after a timeout, the rate of
        # submits is unknown.
        submitted = submit.join(0 if result["timed_out"] else timeout_s)
        result["submit_tasks_per_s"] = completions.tasks / submit.seconds if submitted else float("nan")
        result["start_latency_s"] = summarize(completions.start_latencies)
    peer.stop()
    return {**result, "version": dist_version(dist), "setup": setup}


# -- the peers --------------------------------------------------------------------------


def run_huey(
    tasks: int, concurrency: int, timeout_s: float, mysql_url: str, *, mode: str, submitters: int
) -> dict[str, Any]:
    import urllib.parse

    import peewee
    import pymysql
    from huey.contrib.sql_huey import SqlHuey
    from huey.signals import SIGNAL_COMPLETE

    logging.getLogger("huey").setLevel(logging.WARNING)
    url = urllib.parse.urlsplit(mysql_url)
    conn_args = {
        "host": url.hostname or "127.0.0.1",
        "port": url.port or 3306,
        "user": urllib.parse.unquote(url.username or "root"),
        "password": urllib.parse.unquote(url.password or ""),
    }
    name = "orbit_bench_huey_" + secrets.token_hex(4)
    admin = pymysql.connect(**conn_args, autocommit=True)
    admin.cursor().execute(f"CREATE DATABASE `{name}`")
    admin.close()
    database = peewee.MySQLDatabase(name, **conn_args)
    huey = SqlHuey(name="bench", database=database, results=False, utc=True)
    completions = Completions(tasks)

    @huey.task()
    def noop(submitted: float | None = None) -> None:
        completions.started(submitted)

    @huey.signal(SIGNAL_COMPLETE)
    def completed(signal, task, *args, **kwargs) -> None:
        completions.finished()

    consumer = huey.create_consumer(
        workers=concurrency, worker_type="thread", periodic=False, check_worker_health=False, shutdown_timeout=5
    )

    class HueyPeer:
        def enqueue(self, submitted: float | None) -> None:
            noop(submitted)

        def start(self) -> None:
            consumer.start()

        def stop(self) -> None:
            consumer.stop(graceful=True)

    setup = (
        f"Huey SqlStorage (peewee {peewee.__version__} + PyMySQL) on the same MariaDB, "
        f"1 consumer process, {concurrency} threads"
    )
    result = drive(
        HueyPeer(), completions, dist="huey", setup=setup, mode=mode, submitters=submitters, timeout_s=timeout_s
    )
    # The database is dropped by the caller once this process (and its connections) is gone.
    return {**result, "database": name}


def run_celery(
    tasks: int, concurrency: int, timeout_s: float, redis_url: str, *, mode: str, submitters: int
) -> dict[str, Any]:
    from celery import Celery
    from celery.worker.request import Request

    app = Celery("orbit-bench", broker=redis_url, set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        worker_prefetch_multiplier=CELERY_PREFETCH_MULTIPLIER,
        task_ignore_result=True,
        task_default_queue=QUEUE,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    completions = Completions(tasks)

    class Acknowledged(Request):
        def acknowledge(self) -> None:
            super().acknowledge()
            completions.finished()

    @app.task(name="noop", Request=Acknowledged)
    def noop(submitted: float | None = None) -> None:
        completions.started(submitted)

    worker = app.WorkController(
        pool="threads",
        concurrency=concurrency,
        queues=[QUEUE],
        loglevel="WARNING",
        # One worker: no cluster to synchronise with or to tell it is alive.
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
    )
    runner = threading.Thread(target=worker.start, daemon=True)

    class CeleryPeer:
        def enqueue(self, submitted: float | None) -> None:
            noop.apply_async(() if submitted is None else (submitted,))

        def start(self) -> None:
            runner.start()

        def stop(self) -> None:
            worker.stop(in_sighandler=False)
            runner.join(10)

    setup = (
        f"Redis (appendonly, appendfsync {_appendfsync(redis_url)}), 1 worker process, threads pool of "
        f"{concurrency}, task_acks_late, worker_prefetch_multiplier {CELERY_PREFETCH_MULTIPLIER}, no result backend"
    )
    return drive(
        CeleryPeer(), completions, dist="celery", setup=setup, mode=mode, submitters=submitters, timeout_s=timeout_s
    )


def run_dramatiq(
    tasks: int, concurrency: int, timeout_s: float, redis_url: str, *, mode: str, submitters: int
) -> dict[str, Any]:
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.middleware import Middleware

    logging.getLogger("dramatiq").setLevel(logging.WARNING)
    completions = Completions(tasks)

    class Acknowledged(Middleware):
        def after_ack(self, broker, message) -> None:
            completions.finished()

    pool = concurrency + submitters + DRAMATIQ_SPARE_CONNECTIONS
    broker = RedisBroker(url=f"{redis_url}?max_connections={pool}")
    broker.add_middleware(Acknowledged())

    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="noop")
    def noop(submitted: float | None = None) -> None:
        completions.started(submitted)

    worker = dramatiq.Worker(broker, worker_threads=concurrency, queues={QUEUE})

    class DramatiqPeer:
        def enqueue(self, submitted: float | None) -> None:
            noop.send(*(() if submitted is None else (submitted,)))

        def start(self) -> None:
            worker.start()

        def stop(self) -> None:
            worker.stop(timeout=10_000)

    setup = (
        f"Redis (appendonly, appendfsync {_appendfsync(redis_url)}), 1 worker process, {concurrency} worker "
        f"threads (acks after the task), prefetch {worker.queue_prefetch}, redis-py pool of {pool}"
    )
    return drive(
        DramatiqPeer(), completions, dist="dramatiq", setup=setup, mode=mode, submitters=submitters, timeout_s=timeout_s
    )


def _appendfsync(redis_url: str) -> str:
    """The Redis server's ``appendfsync``, as it says."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        return str(client.config_get("appendfsync").get("appendfsync", "?"))
    finally:
        client.close()


def dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)
