"""The programs under examples/, each run exactly as the README tells a user to.

Each test bootstraps an application on a scratch database (as ``make run`` does),
starts a node with every service (plan trigger and recovery included), runs the example
as a separate process with ``ORBIT_CREDENTIALS_FILE`` and ``ORBIT_URL``, and checks what
it prints to the letter (times only where the example says they are approximate).
"""

from __future__ import annotations

import os
import re
import sys

import pytest
import trio

from orbit_node.services import default_services

from ..helpers import REPO, bootstrap
from ..nodeutil import run_node

EXAMPLES = ("priority", "retries", "plan", "fanout", "resource_keys", "album")
# What an example may take on a busy 2-core machine (each bounds itself below this).
EXAMPLE_TIMEOUT_S = 150


@pytest.fixture
async def full_node(node_config):
    async with run_node(node_config, services=default_services()) as running:
        yield running


@pytest.fixture
async def credentials(dsn, tmp_path):
    """The credentials file of a development application, as ``make run`` writes it."""
    return await bootstrap(dsn, tmp_path / "dev.credentials.json")


async def run_example(name: str, credentials, url: str) -> tuple[int, str, str]:
    """Run examples/<name>/main.py from the repository root; its status, stdout and stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env.update(ORBIT_URL=url, ORBIT_CREDENTIALS_FILE=str(credentials))
    with trio.fail_after(EXAMPLE_TIMEOUT_S):
        result = await trio.run_process(
            [sys.executable, f"examples/{name}/main.py"],
            cwd=REPO,
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def test_priority_example_runs_higher_priorities_first(full_node, credentials):
    for _ in range(2):  # each run makes its own queue and handler; history is kept
        status, out, err = await run_example("priority", credentials, full_node.base_url)
        assert status == 0, err
        assert out == (
            "submitted_priorities=0,9,4 executed_priorities=9,4,0\ncompleted=3 attempts_per_task=1 worker_drained=true\n"
        )


async def test_retries_example_retries_twice_then_succeeds_and_fails_a_permanent_error_at_once(full_node, credentials):
    status, out, err = await run_example("retries", credentials, full_node.base_url)
    assert status == 0, err
    flaky, permanent, waits, *rest = out.splitlines()
    assert flaky == 'flaky: outcomes=retry,retry,ok attempts=3 state=succeeded result={"charged": 42}'
    assert permanent == (
        'permanent: outcomes=permanent attempts=1 state=failed error="PermanentError: card declined" code=CARD_DECLINED'
    )
    # Approximate; the example itself fails when a retry came sooner than its backoff allows.
    assert re.fullmatch(r"retry_waits_s~\d+\.\d,\d+\.\d", waits), waits
    assert rest == []


async def test_plan_example_fires_three_times_into_its_queue(full_node, credentials):
    status, out, err = await run_example("plan", credentials, full_node.base_url)
    assert status == 0, err
    assert out == (
        "plan: interval_s=1 fires=3 fire_offsets_s=0,1,2 next_fire_at=none\n"
        "tasks: states=succeeded,succeeded,succeeded ran_in_fire_order=true\n"
    )


@pytest.mark.time_cap(EXAMPLE_TIMEOUT_S + 30)
async def test_fanout_example_submits_a_thousand_in_one_batch_and_waits_for_all(full_node, credentials):
    status, out, err = await run_example("fanout", credentials, full_node.base_url)
    assert status == 0, err
    counts, finished, times, *rest = out.splitlines()
    assert counts == "submitted=1000 created=1000 resubmitted_created=0"
    assert finished == "succeeded=1000 worker_completed=1000 worker_failed=0"
    assert re.fullmatch(r"submit_s~\d+\.\d run_s~\d+\.\d", times), times
    assert rest == []


async def test_resource_keys_example_never_runs_two_tasks_of_one_key_at_once(full_node, credentials):
    status, out, err = await run_example("resource_keys", credentials, full_node.base_url)
    assert status == 0, err
    assert out == "tasks=12 keys=3 completed=12\nmax_running_per_key=account-a:1,account-b:1,account-c:1\n"


@pytest.mark.time_cap(EXAMPLE_TIMEOUT_S + 30)
async def test_album_example_builds_the_album_from_every_resize_after_all_of_them(full_node, credentials):
    status, out, err = await run_example("album", credentials, full_node.base_url)
    assert status == 0, err
    assert out == (
        "submitted=101 created=101 resubmitted_created=0 album_state_at_submit=waiting\n"
        "album: images=100 width_sum=25000 height_sum=16395 pixels=4098750 parents_read=100\n"
        "album_ran_after_every_resize=true\n"
    )


@pytest.mark.parametrize("name", EXAMPLES)
async def test_an_example_without_a_node_fails_with_one_line(name, credentials):
    status, out, err = await run_example(name, credentials, "http://127.0.0.1:9")
    assert status != 0
    assert out == ""
    assert err.startswith("error: TransportError: ") and err.count("\n") == 1, err


def test_every_example_is_tested_and_documented():
    assert sorted(p.parent.name for p in REPO.glob("examples/*/main.py")) == sorted(EXAMPLES)
    readme, sdk = (REPO / "README.md").read_text(), (REPO / "docs" / "sdk.md").read_text()
    for name in EXAMPLES:
        assert f"examples/{name}/" in readme and f"examples/{name}/" in sdk, name
