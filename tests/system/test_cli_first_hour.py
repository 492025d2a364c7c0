"""The command line a newcomer meets first: settings, typos, usage errors, pipes, ids."""

from __future__ import annotations

import logging
import os
import re
import subprocess

import pytest
import trio

from orbit_node.cli.node import NODE_SETTINGS
from orbit_node.config import NodeConfig
from orbit_node.domain.errors import ConfigError

from ..helpers import BIN, REPO, cli
from ..nodeutil import run_node

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def test_tool_variables_are_accepted_and_typos_still_caught():
    env = {"ORBIT_MYSQL_DSN": "mysql://u@h/d", "ORBIT_DEV_DB_PORT": "3999", "ORBIT_BENCH_MYSQL_DSN": "mysql://u@h/b"}
    assert NodeConfig.from_env(env).http_port == 8080
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_env({**env, "ORBIT_DEV_DB_PORTT": "1"})
    assert info.value.field == "ORBIT_DEV_DB_PORTT"


def test_a_bad_number_names_the_variable():
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_env({"ORBIT_MYSQL_DSN": "mysql://u@h/d", "ORBIT_DB_POOL_SIZE": "0"})
    assert info.value.field == "ORBIT_DB_POOL_SIZE"
    assert info.value.message == "ORBIT_DB_POOL_SIZE must be positive, got 0"


def test_orbit_help_lists_every_node_setting_and_usage_errors_exit_2():
    result = cli("orbit", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    table = (REPO / "README.md").read_text().split("## Configuration (environment)")[1].split("\n## ")[0]
    rows = [line for line in table.splitlines() if line.startswith("| `ORBIT_")]
    documented = set(re.findall(r"`(ORBIT_[A-Z_]+)`", "\n".join(row.split(" | ")[0] for row in rows)))
    assert documented == set(NODE_SETTINGS)
    for name in NODE_SETTINGS:
        assert name in text, name
    assert "ORBIT_CREDENTIALS_FILE" not in text
    bad = cli("orbit", "--bogus")
    assert bad.returncode == 2 and bad.stderr.startswith("error: orbit: unrecognized arguments")
    bad = cli("orbit-migrate", "sideways")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_orbit_settles_the_collector_before_it_serves():
    """``orbit`` freezes what start-up made and raises the young threshold before serving
    (``settle_collector``); the interpreter's defaults are 700 and no frozen object."""
    probe = (
        "import gc, sys\n"
        "import orbit_node.cli.node as cli_node\n"
        "cli_node.serve = lambda node: print(gc.get_threshold()[0], gc.get_freeze_count() > 10_000)\n"
        "cli_node.main([])\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env["ORBIT_MYSQL_DSN"] = "mysql://u@127.0.0.1:1/d"  # never reached: serve is replaced
    result = subprocess.run(
        [str(BIN / "python"), "-c", probe], capture_output=True, text=True, env=env, timeout=60, check=True
    )
    assert result.stdout.split() == ["10000", "True"]


async def test_admin_and_migrate_catch_orbit_typos(dsn):
    for command in (("orbit-admin", "queue", "list"), ("orbit-migrate", "status")):
        result = cli(*command, dsn=dsn, env={"ORBIT_MYSQL_DNS": "x", "ORBIT_DEV_DB_PORT": "3999"})
        assert result.returncode == 2, result.stderr
        assert result.stderr == "error: ORBIT_MYSQL_DNS: unknown setting (did you mean ORBIT_MYSQL_DSN?)\n"
    # Nothing close: still refused, as a possible typo.
    result = cli("orbit-migrate", "status", dsn=dsn, env={"ORBIT_ZZZ": "x"})
    assert result.stderr == "error: ORBIT_ZZZ: unknown setting (a typo?)\n"


def test_the_sdk_says_which_variable_it_found_instead_of_the_credentials_file():
    from orbit_sdk import ConfigError, credentials_from_env

    with pytest.raises(ConfigError) as missing:
        credentials_from_env({"ORBIT_CREDENTIAL_FILE": "/tmp/dev.json"})
    assert missing.value.message == (
        "ORBIT_CREDENTIALS_FILE is not set (ORBIT_CREDENTIAL_FILE is set: a typo of ORBIT_CREDENTIALS_FILE?)"
    )
    with pytest.raises(ConfigError) as plain:
        credentials_from_env({"ORBIT_URL": "http://x"})
    assert plain.value.message == "ORBIT_CREDENTIALS_FILE is not set"


async def test_migrate_status_is_rfc3339_and_survives_a_closed_pipe(dsn):
    result = cli("orbit-migrate", "status", dsn=dsn)
    assert result.returncode == 0
    for line in result.stdout.splitlines():
        assert RFC3339.match(line.split()[-1]), line
    read, write = os.pipe()
    os.close(read)  # like `| head -1` that has already exited
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env["ORBIT_MYSQL_DSN"] = dsn.url()
    closed = subprocess.run(
        [str(BIN / "orbit-migrate"), "status"], stdout=write, stderr=subprocess.PIPE, text=True, env=env, timeout=60
    )
    os.close(write)
    assert closed.returncode == 141 and closed.stderr == ""


async def test_application_create_makes_the_documented_metrics_credential_work(dsn):
    missing = cli(
        "orbit-admin", "credential", "create", "--application", "ops", "--namespace", "default", "--scope",
        "metrics:read", dsn=dsn,
    )  # fmt: skip
    assert missing.returncode == 1 and "ops" in missing.stderr
    for _ in range(2):  # idempotent
        created = cli("orbit-admin", "application", "create", "ops", dsn=dsn)
        assert created.returncode == 0, created.stderr
        assert created.stdout == "application ops: namespace default (production) ready\n"
    credential = cli(
        "orbit-admin", "credential", "create", "--application", "ops", "--namespace", "default", "--scope",
        "metrics:read", dsn=dsn,
    )  # fmt: skip
    assert credential.returncode == 0, credential.stderr
    assert "token (shown once, store it now): orb_" in credential.stdout
    bad = cli("orbit-admin", "application", "create", "-ops", dsn=dsn)
    assert bad.returncode == 2
    bad = cli("orbit-admin", "application", "create", "o p s", dsn=dsn)
    assert bad.returncode == 2 and "APPLICATION" in bad.stderr


async def test_credential_create_without_scope_is_a_usage_error(dsn):
    result = cli("orbit-admin", "credential", "create", "--application", "a", "--namespace", "n", dsn=dsn)
    assert result.returncode == 2 and "--scope" in result.stderr


@pytest.mark.parametrize("command", [("task", "show"), ("explain",)])
async def test_a_malformed_task_id_is_an_invalid_id_not_not_found(dsn, command):
    result = cli("orbit-admin", *command, "0123", dsn=dsn)
    assert result.returncode == 2
    assert result.stderr == "error: TASK_ID: '0123' is not a task id (32 lowercase hex characters)\n"


async def test_make_run_prints_the_credentials_path_once(dsn, tmp_path):
    make = subprocess.run(["make", "-n", "run"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert make.returncode == 0 and "credentials:" not in make.stdout
    boot = cli(
        "orbit-admin", "bootstrap", "--application", "dev", "--namespace", "default", "--environment", "test",
        "--queue", "initial", "--output", str(tmp_path / "c.json"), dsn=dsn,
    )  # fmt: skip
    assert boot.returncode == 0 and boot.stdout.count(str(tmp_path / "c.json")) == 1


async def test_a_log_line_says_when_the_drain_ended(node_config, caplog):
    caplog.set_level(logging.INFO, logger="orbit.node")
    with trio.fail_after(30):
        async with run_node(node_config):
            pass
    lines = [r.getMessage() for r in caplog.records if r.name == "orbit.node"]
    assert any(line.startswith("drain ended") for line in lines), lines
