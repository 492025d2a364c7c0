"""The SDK Worker as docs/sdk.md describes it: one import, from_env, queues by name,
plain ``def`` handlers, handshake errors that say what was wrong, PermanentError types."""

from __future__ import annotations

import inspect
import json
import pydoc
import threading
import time
from pathlib import Path

import pytest
import trio

import orbit_node
from orbit_node.services import default_services
from orbit_sdk import (
    ConfigError,
    OrbitClient,
    PermanentError,
    SubmitTaskRequest,
    Worker,
    WorkerRejected,
    WorkerTask,
)

from ..nodeutil import make_tenant, make_token, run_node


@pytest.fixture
async def full_node(node_config):
    async with run_node(node_config, services=default_services()) as running:
        yield running


def request(queue_id: str, payload, **extra) -> SubmitTaskRequest:
    return SubmitTaskRequest(
        queue_id=queue_id, handler="h", handler_version="v1", payload_version="v1", payload=payload, **extra
    )


def write_credentials(path: Path, url: str, token: str, queues: dict[str, str]) -> Path:
    path.write_text(
        json.dumps(
            {
                "url": url,
                "token": token,
                "application": "app",
                "namespace": "default",
                "environment": "test",
                "scopes": ["workers:connect"],
                "queues": queues,
            }
        )
    )
    return path


async def run_until(worker: Worker, finished: int) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await worker.wait_finished(finished)
            await worker.drain()


def test_help_shows_the_public_surface_only():
    assert list(inspect.signature(Worker).parameters) == [
        "url",
        "token",
        "queues",
        "capacity",
        "resource_keys",
        "queue_names",
        "client_name",
        "ssl_context",
        "connect_timeout_s",
        "welcome_timeout_s",
    ]
    text = pydoc.render_doc(Worker, renderer=pydoc.plaintext)
    for internal in ("drain_requested", "_stopped", "_progress", "_draining", "_token", "_handlers"):
        assert internal not in text, internal
    for public in ("from_env", "register", "handler", "drain", "run", "wait_completed", "capacity"):
        assert public in text
    assert "orb_" not in repr(Worker("http://x", "orb_secret", ["q"]))
    assert (Path(orbit_node.__file__).parent / "py.typed").is_file()


def test_constructor_refuses_bad_arguments_at_once():
    with pytest.raises(TypeError, match="queues"):
        Worker("http://x", "t", "q1")
    with pytest.raises(ValueError, match="capacity"):
        Worker("http://x", "t", ["q1"], capacity=0)
    worker = Worker("http://x", "t", ["q1"])
    with pytest.raises(TypeError, match="expected a function"):
        worker.register("h", "v1", "v1", "not callable")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="handler_version"):
        worker.register("h", "", "v1", lambda task: None)


def test_from_env_needs_the_credentials_file(tmp_path):
    with pytest.raises(ConfigError, match="ORBIT_CREDENTIALS_FILE"):
        Worker.from_env(["q1"], env={})
    path = write_credentials(tmp_path / "c.json", "http://file:1", "orb_x", {"q1": "a" * 32})
    worker = Worker.from_env(["q1"], env={"ORBIT_CREDENTIALS_FILE": str(path), "ORBIT_URL": "http://env:2"})
    assert worker.url == "http://env:2"


async def test_from_env_with_queue_names_and_plain_def_handlers_bounded_by_capacity(full_node, db, tmp_path):
    tenant = await make_tenant(db, "usab")
    path = write_credentials(tmp_path / "c.json", full_node.base_url, tenant.token, dict(tenant.queues))
    worker = Worker.from_env(["q1"], env={"ORBIT_CREDENTIALS_FILE": str(path)}, capacity=2)
    lock = threading.Lock()
    running, most, threads = [0], [0], set()

    @worker.handler("h", "v1", "v1")
    def blocking(task: WorkerTask):  # a plain def: runs in a worker thread
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        threads.add(threading.get_ident())
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return {"doubled": task.payload * 2}

    async with OrbitClient(full_node.base_url, tenant.token) as client:
        ids = [(await client.submit_task(f"k{i}", request(tenant.queue_id, i))).task.task_id for i in range(6)]
        await run_until(worker, 6)
        for i, task_id in enumerate(ids):
            task = await client.get_task(task_id)
            assert (task.state, task.attempts, task.result) == ("succeeded", 1, {"doubled": 2 * i})
    assert worker.completed == 6 and worker.failed == 0
    assert most[0] <= 2
    assert threading.get_ident() not in threads


async def test_queue_names_are_looked_up_without_a_credentials_file(full_node, db):
    tenant = await make_tenant(db, "lookup", queues=("alpha", "beta"))
    worker = Worker(full_node.base_url, tenant.token, ["beta"])
    worker.register("h", "v1", "v1", lambda task: "ok")
    async with OrbitClient(full_node.base_url, tenant.token) as client:
        accepted = await client.submit_task("k", request(tenant.queues["beta"], 1))
        await run_until(worker, 1)
        assert (await client.get_task(accepted.task.task_id)).state == "succeeded"

    unknown = Worker(full_node.base_url, tenant.token, ["beta", "gamma"])
    unknown.register("h", "v1", "v1", lambda task: "ok")
    with pytest.raises(ConfigError) as info:
        await unknown.run()
    assert info.value.field == "queues[1]" and "'gamma'" in info.value.message and "alpha, beta" in info.value.message

    worker_only = await make_token(db, tenant, {"workers:connect": "*", "workers:consume": "*"})
    blind = Worker(full_node.base_url, worker_only, ["beta"])
    blind.register("h", "v1", "v1", lambda task: "ok")
    with pytest.raises(ConfigError, match="queues map"):
        await blind.run()


async def test_handshake_refusals_say_what_was_expected(full_node, db):
    tenant = await make_tenant(db, "refuse")
    revoked = Worker(full_node.base_url, "orb_" + "0" * 96, [tenant.queue_id])
    revoked.register("h", "v1", "v1", lambda task: None)
    with trio.fail_after(10), pytest.raises(WorkerRejected) as info:
        await revoked.run()
    assert info.value.status == 401 and info.value.code == "UNAUTHENTICATED"
    assert "HTTP 401 UNAUTHENTICATED" in str(info.value) and "{" not in str(info.value)

    foreign = Worker(full_node.base_url, tenant.token, ["f" * 32])
    foreign.register("h", "v1", "v1", lambda task: None)
    with trio.fail_after(10), pytest.raises(WorkerRejected) as info:
        await foreign.run()
    assert info.value.status is None and info.value.code == "NOT_FOUND" and info.value.field == "queues[0]"
    assert "HTTP" not in str(info.value)
    assert "refused the Worker's hello (NOT_FOUND at queues[0])" in str(info.value)
    assert "32-hex queue_id" in str(info.value)


class OrderRejected(PermanentError):
    pass


async def test_failures_keep_the_exception_type(full_node, db):
    tenant = await make_tenant(db, "types")
    worker = Worker(full_node.base_url, tenant.token, [tenant.queue_id])

    @worker.handler("h", "v1", "v1")
    async def fail(task: WorkerTask):
        if task.payload == "permanent":
            try:
                int("x")
            except ValueError as exc:
                raise OrderRejected("order 7 is closed", code="ORDER_CLOSED") from exc
        if task.payload == "plain":
            raise PermanentError("no such object")
        raise KeyError("missing")

    async with OrbitClient(full_node.base_url, tenant.token) as client:
        ids = {}
        for payload in ("permanent", "plain", "retryable"):
            accepted = await client.submit_task(payload, request(tenant.queue_id, payload, max_attempts=1))
            ids[payload] = accepted.task.task_id
        await run_until(worker, 3)
        errors = {payload: (await client.get_task(task_id)).error for payload, task_id in ids.items()}
    assert errors["permanent"]["code"] == "ORDER_CLOSED"
    assert errors["permanent"]["message"] == (
        "OrderRejected: order 7 is closed (caused by ValueError: invalid literal for int() with base 10: 'x')"
    )
    assert errors["plain"]["message"] == "PermanentError: no such object"
    assert errors["retryable"]["message"] == "KeyError: 'missing'"
