"""The priority example of P3 section 4, run exactly as the README tells a user to."""

from __future__ import annotations

import os
import sys

import pytest
import trio

from orbit_node.services import default_services

from .helpers import REPO, cli
from .nodeutil import run_node

EXPECTED = "submitted_priorities=0,9,4 executed_priorities=9,4,0\ncompleted=3 attempts_per_task=1 worker_drained=true\n"


@pytest.fixture
async def full_node(node_config):
    async with run_node(node_config, services=default_services()) as running:
        yield running


async def test_priority_example_prints_exactly_the_two_lines(full_node, dsn, tmp_path):
    creds = tmp_path / "orbit-priority.credentials.json"
    boot = await trio.to_thread.run_sync(
        lambda: cli(
            "orbit-admin",
            "bootstrap",
            "--application",
            "priority-example",
            "--namespace",
            "default",
            "--environment",
            "test",
            "--queue",
            "initial",
            "--worker-access",
            "--output",
            str(creds),
            dsn=dsn,
        )
    )
    assert boot.returncode == 0, boot.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env.update(ORBIT_URL=full_node.base_url, ORBIT_CREDENTIALS_FILE=str(creds))
    for _ in range(2):  # each run makes its own queue and handler; history is kept
        with trio.fail_after(30):
            result = await trio.run_process(
                [sys.executable, "examples/priority/main.py"],
                cwd=REPO,
                env=env,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        assert result.returncode == 0, result.stderr.decode()
        assert result.stdout.decode() == EXPECTED


async def test_priority_example_fails_cleanly_without_a_node(tmp_path, dsn):
    creds = tmp_path / "c.json"
    boot = await trio.to_thread.run_sync(
        lambda: cli(
            "orbit-admin",
            "bootstrap",
            "--application",
            "a",
            "--namespace",
            "n",
            "--environment",
            "test",
            "--queue",
            "q",
            "--worker-access",
            "--output",
            str(creds),
            dsn=dsn,
        )
    )
    assert boot.returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env.update(ORBIT_URL="http://127.0.0.1:9", ORBIT_CREDENTIALS_FILE=str(creds))
    with trio.fail_after(30):
        result = await trio.run_process(
            [sys.executable, "examples/priority/main.py"],
            cwd=REPO,
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode != 0
    assert result.stdout == b""
    assert result.stderr.decode().startswith("error: ") and result.stderr.decode().count("\n") == 1
