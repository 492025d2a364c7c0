"""A Worker given several node URLs (docs/sdk.md, "Several nodes"): it connects to the next
when one is down, full (503) or shutting down, in the order given and round again, with
backoff; and a drain ends a Worker that is still trying to connect at once."""

from __future__ import annotations

import logging
import socket

import attrs
import pytest
import trio

from orbit_node.services import default_services
from orbit_sdk import OrbitClient, Worker, WorkerTask, connect

from ..helpers import wait_until
from ..nodeutil import make_tenant, run_node, task_request


def reconnect_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "orbit.sdk.worker" and "reconnecting" in r.getMessage()]


def serving(url, token: str, queue_id: str, **kwargs) -> Worker:
    worker = Worker(url, token, [queue_id], **kwargs)

    @worker.handler("h", "v1", "v1")
    async def work(task: WorkerTask):
        return task.payload

    return worker


async def run_one_task(client: OrbitClient, worker: Worker, queue_id: str, key: str) -> None:
    task_id = (await client.submit_task(key, task_request(queue_id, key))).task.task_id
    [task] = await client.wait([task_id], timeout_s=10)
    assert (task.state, task.result) == ("succeeded", key)


async def test_a_node_that_is_down_sends_the_worker_to_the_next(full_node, db, caplog):
    caplog.set_level(logging.INFO, logger="orbit.sdk.worker")
    tenant = await make_tenant(db)
    with socket.socket() as taken:  # bound, not listening: connection refused
        taken.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{taken.getsockname()[1]}"
        worker = serving([down, full_node.base_url], tenant.token, tenant.queue_id)
        assert worker.urls == (down, full_node.base_url) and worker.url == down
        async with OrbitClient(full_node.base_url, tenant.token) as client, trio.open_nursery() as nursery:
            with trio.fail_after(10):
                await nursery.start(worker.run)
            assert worker.url == full_node.base_url and worker.connections == 1
            await run_one_task(client, worker, tenant.queue_id, "a")
            await worker.drain()
    [line] = reconnect_lines(caplog)
    assert line.startswith(f"worker could not connect (connection refused to {down[len('http://') :]}); ")
    assert f"reconnecting to {full_node.base_url} in " in line


async def test_a_full_node_sends_the_worker_to_the_next(node_config, db, caplog):
    """The first node serves one Worker connection at most and has one: it answers 503
    RESOURCE_EXHAUSTED, and the Worker goes on to the second node."""
    caplog.set_level(logging.INFO, logger="orbit.sdk.worker")
    tenant = await make_tenant(db)
    services = default_services()
    async with (
        run_node(attrs.evolve(node_config, max_connections=1), services=services) as full,
        run_node(node_config, services=default_services()) as spare,
        OrbitClient(spare.base_url, tenant.token) as client,
        trio.open_nursery() as nursery,
    ):
        occupant = serving(full.base_url, tenant.token, tenant.queue_id)
        worker = serving([full.base_url, spare.base_url], tenant.token, tenant.queue_id)
        with trio.fail_after(10):
            await nursery.start(occupant.run)
            await nursery.start(worker.run)
        assert worker.url == spare.base_url and worker.connections == 1
        await occupant.drain()
        await run_one_task(client, worker, tenant.queue_id, "b")
        await worker.drain()
    [line] = reconnect_lines(caplog)
    assert "HTTP 503 RESOURCE_EXHAUSTED" in line and f"reconnecting to {spare.base_url} in " in line


async def test_a_node_that_shuts_down_sends_the_worker_to_the_next(node_config, db, caplog):
    caplog.set_level(logging.INFO, logger="orbit.sdk.worker")
    tenant = await make_tenant(db)
    async with (
        run_node(node_config, services=default_services()) as second,
        OrbitClient(second.base_url, tenant.token) as client,
        trio.open_nursery() as nursery,
    ):
        async with run_node(node_config, services=default_services()) as first:
            worker = serving([first.base_url, second.base_url], tenant.token, tenant.queue_id)
            with trio.fail_after(10):
                await nursery.start(worker.run)
            assert worker.url == first.base_url
        # The first node drained the Worker and stopped.
        await wait_until(lambda: worker.connections == 2)
        assert worker.url == second.base_url
        await run_one_task(client, worker, tenant.queue_id, "c")
        await worker.drain()
    assert any(f"reconnecting to {second.base_url}" in line for line in reconnect_lines(caplog))


def test_the_rotation_goes_round_the_urls_with_a_growing_pause(monkeypatch):
    monkeypatch.setattr(connect.random, "uniform", lambda low, high: high)
    rotation = connect.Rotation(("http://a", "http://b", "http://c"))
    seen = []
    for _ in range(8):
        pause = rotation.failed()
        seen.append((rotation.current, round(pause, 3)))
    assert seen == [
        ("http://b", 0.1),
        ("http://c", 0.2),
        ("http://a", 0.4),
        ("http://b", 0.8),
        ("http://c", 1.6),
        ("http://a", 3.2),
        ("http://b", 5.0),
        ("http://c", 5.0),
    ]
    rotation.welcomed()
    assert rotation.failed() == 0.1 and rotation.current == "http://a"


def test_node_urls_are_checked_at_construction():
    for bad, field in (
        ([], "url"),
        (["http://a", "ftp://b"], r"url\[1\]"),
        ("a.example:80", "url"),
        ("http://", "url"),
        ("http://[::1", "url: not a node URL"),
    ):
        with pytest.raises(ValueError, match=field):
            Worker(bad, "t", ["q"])
    assert Worker(("http://a", "https://b"), "t", ["q"]).urls == ("http://a", "https://b")


async def test_a_drain_stops_a_worker_still_trying_to_connect_at_once(autojump_clock):
    """Before, the drain waited out the backoff pause (up to 5 s) or a connection attempt."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        worker = serving(f"http://127.0.0.1:{taken.getsockname()[1]}", "orb_x", "f" * 32)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run)
            await trio.sleep(10)  # of the mock clock: the pause has grown to its cap
            started = trio.current_time()
            await worker.drain()
            assert trio.current_time() - started < 0.01
    assert worker.drained and worker.connections == 0


async def test_a_worker_moved_away_from_a_full_node_reconnects_to_the_next(node_config, db, caplog):
    """The first node serves two Worker connections at most, both of application A: B's
    Worker still connects there (its fair share is one), one of A's is told to drain and
    closed with 4004, and that Worker goes on to the second node."""
    caplog.set_level(logging.INFO, logger="orbit.sdk.worker")
    a = await make_tenant(db, "app-a")
    b = await make_tenant(db, "app-b")
    async with (
        run_node(attrs.evolve(node_config, max_connections=2), services=default_services()) as full,
        run_node(node_config, services=default_services()) as spare,
        OrbitClient(spare.base_url, a.token) as client,
        trio.open_nursery() as nursery,
    ):
        workers_a = [serving([full.base_url, spare.base_url], a.token, a.queue_id) for _ in range(2)]
        worker_b = serving(full.base_url, b.token, b.queue_id)
        with trio.fail_after(10):
            for worker in workers_a:
                await nursery.start(worker.run)
            await nursery.start(worker_b.run)
            await wait_until(lambda: any(w.url == spare.base_url and w.connections == 2 for w in workers_a))
        assert worker_b.url == full.base_url and full.node.state.services.hub.moved == 1
        [moved] = [w for w in workers_a if w.url == spare.base_url]
        await run_one_task(client, moved, a.queue_id, "a")
        for worker in (*workers_a, worker_b):
            await worker.drain()
    [line] = reconnect_lines(caplog)
    # The node's drain (reason moved) moves the Worker before the node closes (4004).
    assert "asked to move" in line and "(moved)" in line, line
    assert f"reconnecting to {spare.base_url} in " in line
