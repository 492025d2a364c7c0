"""The SDK is a distribution of its own: ``pip install`` of ``protocol/`` and ``sdk/`` into
a fresh virtual environment gives a Worker and a client that run against a node, with none
of the node's dependencies (no HTTP server, no database driver) installed there. And where
the node is installed, code written against ``orbit_node.sdk`` keeps working."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from orbit_node.services import default_services

from ..helpers import REPO
from ..nodeutil import make_tenant, run_node

# A producer and a Worker in one process of the SDK's own environment: one task submitted,
# run by the Worker's handler, its result waited for and printed.
SCRIPT = """
    import sys

    import trio

    from orbit_sdk import OrbitClient, SubmitTaskRequest, Worker, WorkerTask

    url, token, queue_id = sys.argv[1:4]


    async def double(task: WorkerTask):
        return {"twice": task.payload["n"] * 2}


    async def main():
        worker = Worker(url, token, [queue_id], capacity=4)
        worker.register("double", "v1", "v1", double)
        async with trio.open_nursery() as nursery, OrbitClient(url, token) as client:
            await nursery.start(worker.run)
            request = SubmitTaskRequest(
                queue_id=queue_id, handler="double", handler_version="v1", payload_version="v1", payload={"n": 21}
            )
            submitted = await client.submit_task("sdk-alone-1", request)
            [task] = await client.wait([submitted.task.task_id], timeout_s=30)
            print(task.state, task.result["twice"], flush=True)
            await worker.drain()


    trio.run(main)
"""
# Distributions of the node's that must not come with the SDK.
NODE_ONLY = ("hypercorn", "quart", "quart_trio", "trio_mysql", "croniter", "prometheus_client", "orbit_node")


def run(*cmd: str | Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """``cmd`` from the filesystem's root: never from this checkout, whose packages
    ``python -c`` would find in its working directory."""
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, check=False, cwd="/")


@pytest.fixture(scope="module")
def sdk_venv(tmp_path_factory) -> Path:
    """A fresh virtual environment with orbit-protocol and orbit-sdk installed from this tree."""
    venv = tmp_path_factory.mktemp("sdk-alone") / "venv"
    made = run(sys.executable, "-m", "venv", venv, timeout=120)
    assert made.returncode == 0, made.stderr
    installed = run(
        venv / "bin" / "python",
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        REPO / "protocol",
        REPO / "sdk",
        timeout=600,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return venv


def test_the_sdk_installs_without_the_nodes_dependencies(sdk_venv):
    probe = "import importlib.util, sys; print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m)))"
    found = run(sdk_venv / "bin" / "python", "-c", probe, *NODE_ONLY, timeout=60)
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == [], f"the SDK's environment has the node's {found.stdout.split()}"
    typed = run(sdk_venv / "bin" / "python", "-c", "import orbit_sdk, pathlib; print(orbit_sdk.__file__)", timeout=60)
    assert (Path(typed.stdout.strip()).parent / "py.typed").exists(), "orbit_sdk ships py.typed"
    version = run(
        sdk_venv / "bin" / "python", "-c", "import orbit_protocol; print(orbit_protocol.__version__)", timeout=60
    )
    import orbit_node

    assert version.stdout.strip() == orbit_node.__version__
    helped = run(sdk_venv / "bin" / "orbit-worker", "--help", timeout=60)
    assert helped.returncode == 0 and "MODULE:ATTRIBUTE" in helped.stdout, helped.stderr


@pytest.mark.time_cap(120)
async def test_a_worker_of_the_sdk_alone_runs_a_task_against_a_node(sdk_venv, node_config, db, tmp_path):
    tenant = await make_tenant(db, "sdk-alone")
    script = tmp_path / "alone.py"
    script.write_text(textwrap.dedent(SCRIPT))
    async with run_node(node_config, services=default_services()) as running:
        done = await trio.run_process(
            [str(sdk_venv / "bin" / "python"), str(script), running.base_url, tenant.token, tenant.queues["q1"]],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=tmp_path,
        )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert done.stdout.decode().split() == ["succeeded", "42"]


def readme_quick_start() -> str:
    """The README's Python quick start: the first python block under "## In Python"."""
    section = (REPO / "README.md").read_text().split("## In Python", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found, "README.md: no python block under 'In Python'"
    return found.group(1)


@pytest.mark.time_cap(120)
async def test_the_readmes_quick_start_runs_with_the_sdk_alone(sdk_venv, node_config, db, tmp_path):
    tenant = await make_tenant(db, "readme", queues=["initial"])
    script = tmp_path / "quick_start.py"
    script.write_text(readme_quick_start())
    async with run_node(node_config, services=default_services()) as running:
        credentials = tmp_path / "dev.credentials.json"
        document = {
            "url": running.base_url,
            "token": tenant.token,
            "application": "readme",
            "namespace": "default",
            "environment": "test",
            "scopes": ["tasks:submit", "tasks:read", "workers:connect"],
            "queues": {"initial": tenant.queues["initial"]},
        }
        credentials.write_text(json.dumps(document))
        done = await trio.run_process(
            [str(sdk_venv / "bin" / "python"), str(script)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={"ORBIT_CREDENTIALS_FILE": str(credentials), "PATH": "/usr/bin:/bin"},
            cwd=tmp_path,
        )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert done.stdout.decode().strip() == "succeeded {'greeting': 'hello, Ada'}"


def test_code_written_against_orbit_node_sdk_keeps_working():
    import orbit_node.sdk.worker
    import orbit_sdk
    import orbit_sdk.client
    import orbit_sdk.worker
    from orbit_node.sdk import OrbitClient, Worker
    from orbit_node.sdk.client import OrbitClient as ClientOfModule
    from orbit_node.sdk.serving import EXIT_DRAINED
    from orbit_node.sdk.worker import WorkerTask

    assert orbit_node.sdk.worker is orbit_sdk.worker
    assert OrbitClient is ClientOfModule is orbit_sdk.client.OrbitClient
    assert Worker is orbit_sdk.Worker and WorkerTask is orbit_sdk.WorkerTask
    assert EXIT_DRAINED == 0
