"""HTTP: the node's own cost of a trivial request and of a single task submit.

A real node process (``bench.nodeproc``, production services); closed-loop clients on
keep-alive connections send ``GET /healthz`` and single ``POST /v1/tasks`` (a new
Idempotency-Key each, so every submit inserts a task), with 1 and with 16 clients at once.
Per row: requests/s, latency p50/p99, and the node process's CPU time per request (user +
system from /proc/<pid>/stat over the measured phase, background services included).

The clients are a minimal HTTP/1.1 writer/reader on trio sockets, not the SDK: on a small
machine the harness shares the cores with the node, and httpx's own CPU would cap the
rates measured here before the node does.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
from typing import Any

import trio

from .common import bench_database, cpu_seconds, make_app, measured_phase, node_process, submit_request
from .report import Target, format_table, ms, summarize

# Issue 13's targets for a single HTTP submit.
TARGET_SUBMIT_CPU_MS = 1.0
TARGET_SUBMIT_RATE_16 = 600.0
# Requests run before each measured phase (connections opened, code paths warm).
WARMUP_REQUESTS = 50


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--http-seconds", type=float, default=5.0, help="length of each measured phase (default 5)")
    parser.add_argument("--http-clients", default="1,16", help="concurrent client counts (default 1,16)")


class RawClient:
    """One keep-alive HTTP/1.1 connection; ``call`` sends one request and reads the whole answer."""

    def __init__(self, host: str, port: int, token: str):
        self.host, self.port, self.token = host, port, token
        self.stream: trio.SocketStream | None = None
        self.buffer = b""

    async def call(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> int:
        if self.stream is None:
            self.stream = await trio.open_tcp_stream(self.host, self.port)
            self.buffer = b""
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}", f"Authorization: Bearer {self.token}"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if body:
            head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        await self.stream.send_all(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        while b"\r\n\r\n" not in self.buffer:
            await self._read()
        header_bytes, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = header_bytes.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(fields.get("content-length", "0"))
        while len(self.buffer) < length:
            await self._read()
        self.buffer = self.buffer[length:]
        if fields.get("connection", "").lower() == "close":
            await self.aclose()
        return status

    async def _read(self) -> None:
        assert self.stream is not None
        data = await self.stream.receive_some(65536)
        if not data:
            raise ConnectionError("the node closed the connection")
        self.buffer += data

    async def aclose(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()
            self.stream = None


def healthz(client: RawClient, queue_id: str) -> Any:
    return client.call("GET", "/healthz")


def submit(client: RawClient, queue_id: str) -> Any:
    body = json.dumps(submit_request(queue_id).to_json(), separators=(",", ":")).encode()
    return client.call("POST", "/v1/tasks", body, {"Idempotency-Key": f"h-{secrets.token_hex(12)}"})


# What each row sends and the status it expects.
REQUESTS = {"GET /healthz": (healthz, 200), "POST /v1/tasks": (submit, 201)}


async def closed_loop(
    clients: list[RawClient], send: Any, expected: int, queue_id: str, *, seconds: float, count: int | None = None
) -> list[float]:
    """Each client sends back to back for ``seconds`` (or ``count`` requests in all); per-request seconds."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    left = [count if count is not None else -1]

    async def loop(client: RawClient) -> None:
        while time.perf_counter() < deadline and left[0] != 0:
            left[0] -= 1
            started = time.perf_counter()
            status = await send(client, queue_id)
            if status != expected:
                raise RuntimeError(f"expected HTTP {expected}, got {status}")
            latencies.append(time.perf_counter() - started)

    async with trio.open_nursery() as nursery:
        for client in clients:
            nursery.start_soon(loop, client)
    return latencies


async def run(args: argparse.Namespace) -> dict[str, Any]:
    counts = [int(c) for c in args.http_clients.split(",")]
    rows: list[dict[str, Any]] = []
    profiles: dict[str, Any] = {}
    async with bench_database() as bdb:
        app = await make_app(bdb.db, "http")
        async with node_process(bdb.dsn) as node:
            host, _, port = node.url.removeprefix("http://").rpartition(":")
            for name, (send, expected) in REQUESTS.items():
                for n in counts:
                    clients = [RawClient(host, int(port), app.token) for _ in range(n)]
                    try:
                        await closed_loop(clients, send, expected, app.queue_id, seconds=30, count=WARMUP_REQUESTS)
                        node_cpu = cpu_seconds(node.pid)
                        with measured_phase(node.pid, profile=False) as phase:
                            started = time.perf_counter()
                            latencies = await closed_loop(
                                clients, send, expected, app.queue_id, seconds=args.http_seconds
                            )
                            wall = time.perf_counter() - started
                        node_cpu = cpu_seconds(node.pid) - node_cpu
                        if not args.no_profile and n == max(counts):
                            # A separate phase under py-spy (the sampler's own CPU would skew
                            # the measured one): where the node's CPU goes.
                            with measured_phase(node.pid, profile=True) as profiled:
                                await closed_loop(clients, send, expected, app.queue_id, seconds=args.http_seconds)
                            profiles[f"node, {name}, {n} clients"] = profiled.profile
                    finally:
                        for client in clients:
                            await client.aclose()
                    rows.append(
                        {
                            "request": name,
                            "clients": n,
                            "requests": len(latencies),
                            "requests_per_s": len(latencies) / wall,
                            "latency_s": summarize(latencies),
                            "node_cpu_ms_per_request": node_cpu * 1000 / max(1, len(latencies)),
                            "machine_utilisation": phase.cpu.get("machine_utilisation"),
                        }
                    )
    table = format_table(
        ["request", "clients", "req/s", "p50 ms", "p99 ms", "node cpu ms/req", "cpu busy"],
        [
            [
                r["request"],
                r["clients"],
                r["requests_per_s"],
                ms(r["latency_s"]["p50"]),
                ms(r["latency_s"]["p99"]),
                r["node_cpu_ms_per_request"],
                r["machine_utilisation"],
            ]
            for r in rows
        ],
        align="lrrrrrr",
    )
    submits = {r["clients"]: r for r in rows if r["request"] == "POST /v1/tasks"}
    busiest = submits[max(submits)]
    targets = [
        Target.at_most(
            f"node CPU per submit, {busiest['clients']} clients",
            busiest["node_cpu_ms_per_request"],
            TARGET_SUBMIT_CPU_MS,
            unit=" ms",
        )
    ]
    if 16 in submits:
        targets.append(
            Target.at_least(
                "single submits, 16 clients", submits[16]["requests_per_s"], TARGET_SUBMIT_RATE_16, unit="/s"
            )
        )
    return {
        "scenario": "http",
        "server": bdb.server_version,
        "rows": rows,
        "tables": [table],
        "targets": targets,
        "profiles": profiles,
        "notes": [
            "node cpu = user + system CPU of the node process over the phase, divided by the requests "
            "(includes its background services: claim pool, recovery, heartbeat).",
        ],
    }


def plot(report: dict[str, Any], outdir: Any, plots: Any) -> list[Any]:
    return []
