"""Orbit's clients in a scenario: submitters (closed and open loop) and fleets of SDK
Workers with the no-op handler."""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from orbit_sdk.client import OrbitClient
from orbit_sdk.errors import ResourceExhaustedError
from orbit_sdk.models import SubmitTaskRequest
from orbit_sdk.worker import Worker, WorkerTask

from . import HANDLER
from .database import App


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
    arrival is counted as ``dropped``, so the load stays open-loop). ``refused``: submits
    answered 429 (a rate limit or the node's fair admission); ``errors``: any other failure."""
    rng = random.Random(seed)
    limiter = trio.CapacityLimiter(max_in_flight)
    clients = [OrbitClient(url, token) for _ in range(min(max_in_flight, 32))]
    latencies: list[float] = []
    late: list[float] = []
    dropped = 0
    errors = 0
    refused = 0
    submitted = 0

    async def one(i: int, due: float) -> None:
        nonlocal errors, refused, submitted
        async with limiter:
            started = time.perf_counter()
            late.append(started - due)
            try:
                await clients[i % len(clients)].submit_task(
                    f"o-{secrets.token_hex(8)}-{i}", submit_request(queue_id, delay_s=delay_s(i))
                )
                submitted += 1
            except ResourceExhaustedError:
                refused += 1
                return
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
        "refused": refused,
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
