"""Soak: a node under Worker churn, task churn and an idle phase; RSS, file descriptors and CPU over time.

A real node process (``bench.nodeproc``, production services). Three phases:

1. **churn** (``--soak-seconds``, 600 by default): ``--soak-slots`` Worker slots, each
   in a loop: connect an SDK Worker for 1-6 s and drain it (graceful); or connect one and
   drop it mid-run (the task is cancelled, the socket closed); or open a raw WebSocket,
   say hello and close the TCP connection without a close frame right away, mostly while
   its first claim is in flight (abrupt). Meanwhile a submitter feeds ``--soak-rate``
   tasks/s in bulk batches, so claims, dispatches and finishes never stop.
2. **settle**: every Worker gone; the node's file descriptors are counted again.
3. **idle** (``--soak-idle-s``, 60 by default): ``--soak-idle-workers`` (128) SDK
   Workers connected to an empty queue, heartbeating; the node's CPU is measured.

Every ``--soak-sample-s`` the node's RSS (``VmRSS``), open descriptors (``/proc/<pid>/fd``;
database sessions counted apart, as the pool keeps up to its size open) and CPU share of one
core are sampled. Targets: RSS growth after the warm-up (the
first ``--soak-warmup-s``) at most 10 %, descriptors after the churn back to the
baseline taken before it, idle CPU with 128 idle Workers under 2 % of one core.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import random
import secrets
import time
from pathlib import Path
from typing import Any

import trio

from orbit_node.config import NodeConfig
from orbit_sdk import OrbitClient
from orbit_sdk.worker import Worker, WorkerTask

from . import HANDLER
from .accounting import cpu_seconds
from .clients import submit_request
from .database import bench_database, make_app
from .processes import node_process
from .report import Target, format_table

TARGET_RSS_GROWTH_PCT = 10.0
TARGET_IDLE_CPU_PCT = 2.0
# Tasks per bulk submit of the task churn.
SUBMIT_BATCH = 100
# The node's database pool size (NodeConfig's default, which bench.nodeproc keeps).
DB_POOL_SIZE = NodeConfig.__attrs_attrs__.db_pool_size.default
# How long the node gets to close what the churn left before descriptors are counted again.
SETTLE_S = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--soak-seconds", type=float, default=600.0, help="length of the churn phase (default 600)")
    parser.add_argument("--soak-warmup-s", type=float, default=60.0, help="churn before the RSS reference (60)")
    parser.add_argument("--soak-idle-s", type=float, default=60.0, help="length of the idle phase (default 60)")
    parser.add_argument("--soak-idle-workers", type=int, default=128, help="idle Workers of the idle phase (128)")
    parser.add_argument("--soak-slots", type=int, default=12, help="concurrent churning Worker slots (default 12)")
    parser.add_argument("--soak-rate", type=float, default=200.0, help="tasks/s submitted during churn (200)")
    parser.add_argument("--soak-sample-s", type=float, default=5.0, help="sampling interval (default 5)")


# -- the node process, from outside --------------------------------------------------


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def open_fds(pid: int, db_port: int | None) -> tuple[int, int]:
    """(descriptors other than database sessions, database sessions) of process ``pid``.

    The database pool opens sessions on demand up to its size and keeps them, so they are
    counted apart (bounded by ``ORBIT_DB_POOL_SIZE``); everything else must come back to
    its baseline once the Workers are gone."""
    db_inodes: set[str] = set()
    if db_port is not None:
        for table in ("tcp", "tcp6"):
            try:
                lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                fields = line.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == db_port:
                    db_inodes.add(fields[9])
    total = db = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        total += 1
        if target.startswith("socket:[") and target[8:-1] in db_inodes:
            db += 1
    return total - db, db


class Sampler:
    """RSS, descriptors and CPU share of the node process, every ``interval_s``."""

    def __init__(self, pid: int, interval_s: float, db_port: int | None):
        self.pid, self.interval_s, self.db_port = pid, interval_s, db_port
        self.samples: list[dict[str, Any]] = []
        self.phase = "start"
        self._began = time.perf_counter()

    def take(self, cpu_pct: float) -> dict[str, Any]:
        fds, db_sessions = open_fds(self.pid, self.db_port)
        sample = {
            "t_s": round(time.perf_counter() - self._began, 1),
            "phase": self.phase,
            "rss_mb": rss_bytes(self.pid) / 2**20,
            "fds": fds,
            "db_sessions": db_sessions,
            "cpu_pct": cpu_pct,
        }
        self.samples.append(sample)
        return sample

    async def run(self) -> None:
        last_cpu, last_t = cpu_seconds(self.pid), time.perf_counter()
        while True:
            await trio.sleep(self.interval_s)
            cpu, now = cpu_seconds(self.pid), time.perf_counter()
            self.take(100 * (cpu - last_cpu) / (now - last_t))
            last_cpu, last_t = cpu, now


# -- churn -----------------------------------------------------------------------------


async def noop(task: WorkerTask) -> None:
    return None


def sdk_worker(url: str, token: str, queue_id: str, capacity: int) -> Worker:
    worker = Worker(url=url, token=token, queues=[queue_id], capacity=capacity, client_name="orbit-soak")
    worker.register(*HANDLER, noop)
    return worker


async def graceful(url: str, token: str, queue_id: str, rng: random.Random) -> None:
    """An SDK Worker that runs for a while and drains."""
    worker = sdk_worker(url, token, queue_id, rng.choice((1, 4, 16)))
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(rng.uniform(1.0, 6.0))
        with trio.move_on_after(20):
            await worker.drain()
        nursery.cancel_scope.cancel()


async def dropped(url: str, token: str, queue_id: str, rng: random.Random) -> None:
    """An SDK Worker cancelled mid-run: its handlers and socket go without a drain."""
    worker = sdk_worker(url, token, queue_id, rng.choice((4, 16)))
    with trio.move_on_after(rng.uniform(0.2, 4.0)):
        await worker.run()


async def abrupt(url: str, token: str, queue_id: str, rng: random.Random) -> None:
    """A raw WebSocket: handshake, hello, then the TCP connection closed without a close
    frame, most often while its first claim is in flight."""
    host, _, port = url.removeprefix("http://").rpartition(":")
    stream = await trio.open_tcp_stream(host, int(port))
    try:
        key = base64.b64encode(secrets.token_bytes(16)).decode()
        await stream.send_all(
            (
                "GET /v1/workers/connect HTTP/1.1\r\n"
                f"Host: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                f"Authorization: Bearer {token}\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            data = await stream.receive_some(4096)
            if not data:
                return
            head += data
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            return
        hello = {
            "type": "hello",
            "queues": [queue_id],
            "capabilities": [{"handler": HANDLER[0], "handler_version": HANDLER[1], "payload_version": HANDLER[2]}],
            "capacity": rng.choice((1, 16, 64)),
            "resource_keys": False,
        }
        await stream.send_all(text_frame(json.dumps(hello).encode()))
        await trio.sleep(rng.choice((0.0, 0.0, 0.005, 0.05, 0.5)))
    finally:
        await stream.aclose()


def text_frame(payload: bytes) -> bytes:
    """One masked WebSocket text frame (a client's frames are masked)."""
    mask = secrets.token_bytes(4)
    n = len(payload)
    if n < 126:
        header = bytes((0x81, 0x80 | n))
    elif n < 2**16:
        header = bytes((0x81, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        header = bytes((0x81, 0x80 | 127)) + n.to_bytes(8, "big")
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


BEHAVIOURS = (graceful, graceful, dropped, abrupt)


async def churn_slot(url: str, token: str, queue_id: str, seed: int, until: float, counts: dict[str, int]) -> None:
    rng = random.Random(seed)
    while time.perf_counter() < until:
        behaviour = rng.choice(BEHAVIOURS)
        try:
            await behaviour(url, token, queue_id, rng)
            counts[behaviour.__name__] += 1
        except Exception:  # a refused handshake (node full) or a reset: part of churn
            counts["errors"] += 1
        await trio.sleep(rng.uniform(0.0, 1.0))


async def feed(url: str, token: str, queue_id: str, rate: float, until: float, submitted: list[int]) -> None:
    """``rate`` tasks/s in bulk batches until ``until``."""
    async with OrbitClient(url, token) as client:
        interval = SUBMIT_BATCH / rate
        while time.perf_counter() < until:
            started = time.perf_counter()
            results = await client.submit_many(
                (f"s-{secrets.token_hex(8)}", submit_request(queue_id)) for _ in range(SUBMIT_BATCH)
            )
            submitted[0] += sum(1 for r in results if r.error is None)
            await trio.sleep(max(0.0, interval - (time.perf_counter() - started)))


async def idle_fleet(url: str, token: str, queue_id: str, count: int, seconds: float, sampler: Sampler) -> float:
    """``count`` idle SDK Workers for ``seconds``; the node's CPU share over that time."""
    workers = [sdk_worker(url, token, queue_id, 1) for _ in range(count)]
    sampler.phase = "idle-start"
    async with trio.open_nursery() as nursery:
        for worker in workers:
            await nursery.start(worker.run)
        await trio.sleep(5.0)  # hellos answered and first (empty) claims done
        sampler.phase = "idle"
        cpu, began = cpu_seconds(sampler.pid), time.perf_counter()
        await trio.sleep(seconds)
        share = 100 * (cpu_seconds(sampler.pid) - cpu) / (time.perf_counter() - began)
        sampler.phase = "idle-end"
        with trio.move_on_after(30):
            async with trio.open_nursery() as draining:
                for worker in workers:
                    draining.start_soon(worker.drain)
        nursery.cancel_scope.cancel()
    return share


async def run(args: argparse.Namespace) -> dict[str, Any]:
    counts = {b.__name__: 0 for b in BEHAVIOURS} | {"errors": 0}
    submitted = [0]
    async with bench_database() as bdb:
        app = await make_app(bdb.db, "soak", queues=2)
        busy_queue, idle_queue = app.queue_ids
        async with node_process(bdb.dsn, stats_interval_s=args.soak_sample_s) as node:
            sampler = Sampler(node.pid, args.soak_sample_s, None if bdb.dsn.unix_socket else bdb.dsn.port)
            await trio.sleep(1.0)
            baseline = sampler.take(0.0)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sampler.run)
                sampler.phase = "warm-up"
                began = time.perf_counter()
                until = began + args.soak_seconds
                async with trio.open_nursery() as churn:
                    churn.start_soon(feed, node.url, app.token, busy_queue, args.soak_rate, until, submitted)
                    for slot in range(args.soak_slots):
                        churn.start_soon(churn_slot, node.url, app.token, busy_queue, slot, until, counts)
                    await trio.sleep(args.soak_warmup_s)
                    sampler.phase = "churn"
                    reference = sampler.take(sampler.samples[-1]["cpu_pct"] if sampler.samples else 0.0)
                sampler.phase = "settle"
                await trio.sleep(SETTLE_S)
                settled = sampler.take(sampler.samples[-1]["cpu_pct"])
                idle_cpu = await idle_fleet(
                    node.url, app.token, idle_queue, args.soak_idle_workers, args.soak_idle_s, sampler
                )
                sampler.phase = "end"
                await trio.sleep(SETTLE_S)
                end = sampler.take(sampler.samples[-1]["cpu_pct"])
                nursery.cancel_scope.cancel()
            stats = node.last_stats()
        done = await bdb.db.run(lambda tx: tx.fetchall_raw("SELECT state, COUNT(*) AS n FROM tasks GROUP BY state"))
    # The growth under churn: from the end of the warm-up to the end of the churn (the idle
    # phase holds 128 connections at once, a different load; its RSS is shown apart).
    after_warmup = [s for s in sampler.samples if s["t_s"] >= reference["t_s"] and s["phase"] in ("churn", "settle")]
    peak_rss = max(s["rss_mb"] for s in after_warmup)
    idle_rss = max((s["rss_mb"] for s in sampler.samples if s["phase"] in ("idle", "idle-end")), default=math.nan)
    growth_pct = 100 * (peak_rss - reference["rss_mb"]) / reference["rss_mb"]
    samples_table = format_table(
        ["t s", "phase", "RSS MB", "fds (no db)", "db sessions", "node CPU % of a core"],
        [[s["t_s"], s["phase"], s["rss_mb"], s["fds"], s["db_sessions"], s["cpu_pct"]] for s in sampler.samples],
        align="rlrrrr",
    )
    summary_table = format_table(
        ["figure", "value"],
        [
            [
                "RSS at start / after warm-up / churn peak / with the idle Workers / end, MB",
                f"{baseline['rss_mb']:.1f} / {reference['rss_mb']:.1f} / {peak_rss:.1f} / {idle_rss:.1f} / "
                f"{end['rss_mb']:.1f}",
            ],
            [
                "fds other than database sessions: before churn / after churn / after idle phase",
                f"{baseline['fds']} / {settled['fds']} / {end['fds']}",
            ],
            [
                "database sessions: most seen / pool size",
                f"{max(x['db_sessions'] for x in sampler.samples)} / {DB_POOL_SIZE}",
            ],
            [
                "Worker sessions: graceful / dropped / abrupt / errors",
                f"{counts['graceful']} / {counts['dropped']} / {counts['abrupt']} / {counts['errors']}",
            ],
            [
                "tasks submitted / by state",
                f"{submitted[0]} / " + ", ".join(f"{_text(r['state'])} {r['n']}" for r in done),
            ],
            ["node dispatched (total)", stats.get("dispatched", "?")],
        ],
        align="lr",
    )
    targets = [
        Target.at_most("RSS growth under churn after warm-up", growth_pct, TARGET_RSS_GROWTH_PCT, unit=" %"),
        Target.at_most("fds after churn over baseline (no db)", settled["fds"] - baseline["fds"], 0),
        Target.at_most("fds after the idle phase over baseline (no db)", end["fds"] - baseline["fds"], 0),
        Target.at_most(
            "database sessions over the pool size", max(s["db_sessions"] for s in sampler.samples) - DB_POOL_SIZE, 0
        ),
        Target.at_most(
            f"idle node CPU, {args.soak_idle_workers} idle Workers", idle_cpu, TARGET_IDLE_CPU_PCT, unit=" %"
        ),
    ]
    return {
        "scenario": "soak",
        "server": bdb.server_version,
        "samples": sampler.samples,
        "counts": counts,
        "submitted": submitted[0],
        "rss_growth_pct": growth_pct,
        "idle_cpu_pct": idle_cpu,
        "tables": [samples_table, summary_table],
        "targets": targets,
        "notes": [
            "RSS = VmRSS of the node process; fds = entries of /proc/<pid>/fd (database pool, listeners and "
            "every open WebSocket included; database sessions counted apart); CPU = user + system of the node process over each interval",
        ],
    }


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def plot(report: dict[str, Any], outdir, plots) -> list:
    samples = report["samples"]
    series = {
        name: [(s["t_s"], s[key]) for s in samples]
        for name, key in (("RSS MB", "rss_mb"), ("open fds", "fds"), ("CPU % of a core", "cpu_pct"))
    }
    return [plots.lines(outdir / "soak.png", series, title="Soak: the node over time", xlabel="s", ylabel="")]
