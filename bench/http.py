"""HTTP: the node's own cost of a trivial request and of a single task submit.

A real node process (``bench.nodeproc``, production services); closed-loop clients on
keep-alive connections send ``GET /healthz`` and single ``POST /v1/tasks`` (a new
Idempotency-Key each, so every submit inserts a task), with 1 and with 16 clients at once.
Per row: requests/s, latency p50/p99, and the node process's CPU time per request (user +
system from /proc/<pid>/stat over the measured phase, background services included), in
microseconds, in R and in H. H is this scenario's own ``GET /healthz`` row with 16
clients (so the generic measurement of H is skipped: ``MEASURES_H``). At each durability
setting by default (a column each).

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

import attrs
import trio

from . import durability
from .accounting import cpu_seconds, measured_phase
from .clients import submit_request
from .database import bench_database, make_app
from .grids import grid
from .processes import NodeProcess, node_process
from .report import Target, ms, ratio, summarize
from .units import H_CLIENTS, Units, cost

# Issue 27's targets, ratios of this run: /healthz's node CPU in R, a single submit's in H,
# and single submits/s over /healthz/s, each with H_CLIENTS clients.
TARGET_HEALTHZ_R = 8.0
TARGET_SUBMIT_H = 1.5
TARGET_SUBMIT_RATE_OF_HEALTHZ = 0.6
# bench/__main__.py: one column per durability setting, both by default; H measured here.
DURABILITY_COLUMNS = True
DURABILITY_DEFAULT = "both"
MEASURES_H = True
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


async def measure_requests(
    node: NodeProcess, token: str, queue_id: str, request: str, clients: int, *, seconds: float, profile: bool = False
) -> dict[str, Any]:
    """``clients`` keep-alive connections send ``request`` (a key of REQUESTS) back to back
    for ``seconds`` after a warm-up: requests/s, latency and the node's CPU per request.
    With ``profile``, a second phase under py-spy says where the node's CPU goes (the
    sampler's own CPU would skew the measured one)."""
    send, expected = REQUESTS[request]
    host, _, port = node.url.removeprefix("http://").rpartition(":")
    connections = [RawClient(host, int(port), token) for _ in range(clients)]
    summary = None
    try:
        await closed_loop(connections, send, expected, queue_id, seconds=30, count=WARMUP_REQUESTS)
        node_cpu = cpu_seconds(node.pid)
        async with measured_phase(node.pid, profile=False) as phase:
            started = time.perf_counter()
            latencies = await closed_loop(connections, send, expected, queue_id, seconds=seconds)
            wall = time.perf_counter() - started
        node_cpu = cpu_seconds(node.pid) - node_cpu
        if profile:
            async with measured_phase(node.pid, profile=True) as profiled:
                await closed_loop(connections, send, expected, queue_id, seconds=seconds)
            summary = profiled.profile
    finally:
        for connection in connections:
            await connection.aclose()
    return {
        "request": request,
        "clients": clients,
        "requests": len(latencies),
        "requests_per_s": len(latencies) / wall,
        "latency_s": summarize(latencies),
        "node_cpu_us_per_request": node_cpu * 1e6 / max(1, len(latencies)),
        "machine_utilisation": phase.cpu.get("machine_utilisation"),
        "profile": summary,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    # /healthz with H_CLIENTS clients is H, the unit submits are judged in.
    counts = sorted({int(c) for c in args.http_clients.split(",")} | {H_CLIENTS})
    rows: list[dict[str, Any]] = []
    profiles: dict[str, Any] = {}
    async with bench_database() as bdb:
        app = await make_app(bdb.db, "http")
        async with node_process(bdb.dsn) as node:
            for name in REQUESTS:
                for n in counts:
                    row = await measure_requests(
                        node,
                        app.token,
                        app.queue_id,
                        name,
                        n,
                        seconds=args.http_seconds,
                        profile=not args.no_profile and n == max(counts),
                    )
                    summary = row.pop("profile")
                    if summary:
                        profiles[f"node, {name}, {n} clients"] = summary
                    rows.append(row)
    healthz = next(r for r in rows if r["request"] == "GET /healthz" and r["clients"] == H_CLIENTS)
    units = attrs.evolve(
        args.units,
        h_us=healthz["node_cpu_us_per_request"],
        healthz_per_s=healthz["requests_per_s"],
        h_requests=healthz["requests"],
        h_clients=H_CLIENTS,
    )
    table = grid(
        ["request", "clients"],
        ["req/s", "p50 ms", "p99 ms", "node us/req", "R/req", "H/req", "cpu busy"],
        [
            [
                r["request"],
                r["clients"],
                r["requests_per_s"],
                ms(r["latency_s"]["p50"]),
                ms(r["latency_s"]["p99"]),
                r["node_cpu_us_per_request"],
                units.r(r["node_cpu_us_per_request"]),
                units.h(r["node_cpu_us_per_request"]),
                r["machine_utilisation"],
            ]
            for r in rows
        ],
        durability.current().name,
    )
    submit = next(r for r in rows if r["request"] == "POST /v1/tasks" and r["clients"] == H_CLIENTS)
    return {
        "scenario": "http",
        "server": bdb.server_version,
        "rows": rows,
        "units": units.to_json(),
        "grids": [table],
        "targets": http_targets(healthz, submit, units),
        "profiles": profiles,
        "notes": [
            "node us/req = user + system CPU of the node process over the phase, divided by the requests "
            "(includes its background services: claim pool, recovery, heartbeat); R and H: the same in units "
            f"(H = this run's GET /healthz row with {H_CLIENTS} clients).",
        ],
    }


def http_targets(healthz: dict[str, Any], submit: dict[str, Any], units: Units) -> list[Target]:
    """Issue 27's targets of the HTTP stack, each a ratio measured in this run."""
    return [
        Target.at_most(
            f"GET /healthz node CPU, {H_CLIENTS} clients",
            units.r(healthz["node_cpu_us_per_request"]),
            TARGET_HEALTHZ_R,
            unit=" R",
            note=cost(healthz["node_cpu_us_per_request"], units),
        ),
        Target.at_most(
            f"single submit node CPU, {H_CLIENTS} clients",
            units.h(submit["node_cpu_us_per_request"]),
            TARGET_SUBMIT_H,
            unit=" H",
            note=cost(submit["node_cpu_us_per_request"], units, in_h=True),
        ),
        Target.at_least(
            f"single submits/s / GET /healthz/s, {H_CLIENTS} clients",
            ratio(submit["requests_per_s"], healthz["requests_per_s"]),
            TARGET_SUBMIT_RATE_OF_HEALTHZ,
            unit="x",
            note=f"{submit['requests_per_s']:,.0f} submits/s, {healthz['requests_per_s']:,.0f} /healthz/s",
        ),
    ]


def plot(report: dict[str, Any], outdir: Any, plots: Any) -> list[Any]:
    return []
