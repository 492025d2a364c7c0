"""A Worker as a process of its own (docs/sdk.md, "A Worker process"): ``orbit-worker
module:worker`` runs ``Worker.serve()`` in a real subprocess; the first SIGTERM/SIGINT
drains it (the running handler finishes and reports, nothing new is taken), a second
stops it at once (its task comes back through lease recovery), and the exit status
says how it ended, without a ``KeyboardInterrupt`` traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import attrs
import trio

from orbit_node.services import default_services
from orbit_sdk import Backoff, OrbitClient
from orbit_sdk.serving import EXIT_CONFIG, EXIT_DRAINED, EXIT_FAILED, EXIT_REJECTED

from ..helpers import BIN, wait_until
from ..nodeutil import make_tenant, run_node, task_request

# What the test module of each Worker process holds: a Worker of the credentials file's
# queue q1 whose handler says on stdout that it started, and for the payload "wait"
# returns the next line of stdin.
SERVICE = """
    import sys

    import trio

    from orbit_sdk import Worker, WorkerTask

    worker = Worker.from_env(queues=["q1"], capacity=2)


    @worker.handler("h", "v1", "v1")
    async def work(task: WorkerTask):
        print(f"started {task.payload}", flush=True)
        if task.payload == "wait":
            line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
            return line.strip()
        return task.payload
"""
# A bound on one Worker process's life in these tests.
PROCESS_S = 30


class Process:
    """An ``orbit-worker`` subprocess: its stdout lines as they come, its stderr kept."""

    def __init__(self, process: trio.Process):
        self.process = process
        self.stdout: list[str] = []
        self.stderr = ""
        # Both streams read to their end.
        self.read = trio.Event()

    async def collect(self) -> None:
        async def read(stream, on_text) -> None:
            pending = b""
            async for chunk in stream:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                on_text([line.decode() for line in lines])

        def stderr_text(lines: list[str]) -> None:
            self.stderr += "".join(line + "\n" for line in lines)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read, self.process.stdout, self.stdout.extend)
            nursery.start_soon(read, self.process.stderr, stderr_text)
        self.read.set()

    async def line(self, text: str) -> None:
        await wait_until(lambda: text in self.stdout, timeout_s=PROCESS_S)

    async def logged(self, text: str) -> None:
        await wait_until(lambda: text in self.stderr, timeout_s=PROCESS_S)

    async def exit_status(self) -> int:
        """The exit status, once everything the process wrote was read."""
        with trio.fail_after(PROCESS_S):
            status = await self.process.wait()
            await self.read.wait()
        return status


def credentials(path: Path, url: str, token: str, queues: dict[str, str]) -> Path:
    document = {
        "url": url,
        "token": token,
        "application": "app",
        "namespace": "default",
        "environment": "test",
        "scopes": [],
        "queues": queues,
    }
    path.write_text(json.dumps(document))
    return path


async def run_worker(nursery: trio.Nursery, tmp_path: Path, target: str, credentials_file: Path | None) -> Process:
    (tmp_path / "service.py").write_text(textwrap.dedent(SERVICE))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    if credentials_file is not None:
        env["ORBIT_CREDENTIALS_FILE"] = str(credentials_file)
    process = await trio.lowlevel.open_process(
        [str(BIN / "orbit-worker"), target, "--log-format", "text"],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    running = Process(process)
    nursery.start_soon(running.collect)
    return running


async def test_sigterm_drains_the_running_handler_then_exits_0(full_node, db, tmp_path):
    tenant = await make_tenant(db)
    path = credentials(tmp_path / "c.json", full_node.base_url, tenant.token, dict(tenant.queues))
    async with OrbitClient(full_node.base_url, tenant.token) as client, trio.open_nursery() as nursery:
        worker = await run_worker(nursery, tmp_path, "service:worker", path)
        running = (await client.submit_task("wait", task_request(tenant.queue_id, "wait"))).task.task_id
        await worker.line("started wait")
        worker.process.send_signal(signal.SIGTERM)
        await worker.logged("SIGTERM: draining")
        # Taken by nobody while the Worker drains (released unstarted if it was sent one).
        late = (await client.submit_task("late", task_request(tenant.queue_id, "late"))).task.task_id
        await worker.process.stdin.send_all(b"finished\n")
        status = await worker.exit_status()
        done = await client.get_task(running)

        async def queued_unattempted() -> bool:
            task = await client.get_task(late)
            return (task.state, task.attempts) == ("queued", 0)

        await wait_until(queued_unattempted, timeout_s=5)
    assert status == EXIT_DRAINED, worker.stderr
    assert (done.state, done.result, done.attempts) == ("succeeded", "finished", 1)
    assert "started late" not in worker.stdout
    assert "worker drained: 1 tasks finished" in worker.stderr
    assert "Traceback" not in worker.stderr and "KeyboardInterrupt" not in worker.stderr


async def test_a_second_signal_stops_at_once_and_the_task_comes_back(node_config, db, tmp_path):
    """Run lease 2 s: the abandoned attempt is recovered soon after the Worker is gone."""
    tenant = await make_tenant(db)
    config = attrs.evolve(node_config, run_lease_s=2.0)
    async with (
        run_node(config, services=default_services()) as node,
        OrbitClient(node.base_url, tenant.token) as client,
        trio.open_nursery() as nursery,
    ):
        path = credentials(tmp_path / "c.json", node.base_url, tenant.token, dict(tenant.queues))
        worker = await run_worker(nursery, tmp_path, "service:worker", path)
        request = task_request(tenant.queue_id, "wait", backoff=Backoff(initial_ms=60_000))
        task_id = (await client.submit_task("wait", request)).task.task_id
        await worker.line("started wait")
        worker.process.send_signal(signal.SIGINT)
        await worker.logged("SIGINT: draining")
        worker.process.send_signal(signal.SIGINT)
        status = await worker.exit_status()
        assert status == 128 + signal.SIGINT, worker.stderr
        assert "SIGINT: stopping at once" in worker.stderr
        assert "Traceback" not in worker.stderr and "KeyboardInterrupt" not in worker.stderr

        async def back_in_queue() -> bool:
            task = await client.get_task(task_id)
            return task.state == "queued" and task.attempts == 1

        await wait_until(back_in_queue, timeout_s=20)


async def test_exit_statuses_say_how_it_ended(full_node, db, tmp_path):
    tenant = await make_tenant(db)
    good = credentials(tmp_path / "good.json", full_node.base_url, tenant.token, dict(tenant.queues))
    bad_token = credentials(tmp_path / "bad.json", full_node.base_url, "orb_" + "0" * 96, dict(tenant.queues))
    other = await make_tenant(db, "other", queues=("q2",))
    no_queue = credentials(tmp_path / "none.json", full_node.base_url, other.token, {})
    (tmp_path / "broken.py").write_text(
        textwrap.dedent(
            """
            from orbit_sdk import Worker

            class Broken(Worker):
                async def run(self, **kwargs):
                    raise RuntimeError("boom")

            def make():
                worker = Broken("http://127.0.0.1:1", "t", ["f" * 32])
                worker.register("h", "v1", "v1", lambda task: None)
                return worker
            """
        )
    )
    cases = [
        # (target, credentials, status, a line of stderr)
        ("service:worker", bad_token, EXIT_REJECTED, "worker rejected: the node refused the connection (HTTP 401"),
        ("service:worker", no_queue, EXIT_CONFIG, "queues[0]: no queue named 'q1' in this credential's namespace"),
        ("service:worker", None, EXIT_CONFIG, "error: ORBIT_CREDENTIALS_FILE is not set"),
        ("nosuch:worker", good, EXIT_CONFIG, "error: 'nosuch:worker': no module named 'nosuch'"),
        ("service:nothing", good, EXIT_CONFIG, "has no attribute 'nothing'"),
        ("service", good, EXIT_CONFIG, "expected MODULE:ATTRIBUTE"),
        ("service:sys", good, EXIT_CONFIG, "expected a Worker (or a function returning one), got module"),
        ("broken:make", good, EXIT_FAILED, "RuntimeError: boom"),
    ]
    for target, path, expected, words in cases:
        async with trio.open_nursery() as nursery:
            worker = await run_worker(nursery, tmp_path, target, path)
            status = await worker.exit_status()
        assert (status, words in worker.stderr) == (expected, True), (target, worker.stderr)
        if expected != EXIT_FAILED:
            assert "Traceback" not in worker.stderr, (target, worker.stderr)
