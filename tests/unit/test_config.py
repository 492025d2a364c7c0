"""Configuration is validated at construction; bad values are one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from orbit_node.config import SDK_VARIABLES, SETTING_VARIABLES, NodeConfig, SchedulerLimits, settings, settings_table
from orbit_node.domain.dsn import Dsn
from orbit_node.domain.errors import ConfigError


def test_dsn_url_forms():
    dsn = Dsn.parse("mysql://us%40er:p%3Ass@db.example:3307/orbit")
    assert (dsn.user, dsn.password, dsn.host, dsn.port, dsn.database) == ("us@er", "p:ss", "db.example", 3307, "orbit")
    sock = Dsn.parse("mariadb://root@localhost/orbit?unix_socket=/run/mysqld/mysqld.sock")
    assert sock.unix_socket == "/run/mysqld/mysqld.sock"
    assert Dsn.parse(dsn.url()) == dsn
    assert "p:ss" not in repr(dsn)


@pytest.mark.parametrize(
    "bad",
    [
        "postgres://x@h/db",
        "mysql://root@host",
        "mysql://root@host/a/b",
        "mysql://root@host:99999/db",
        "mysql://h/db?x=1",
    ],
)
def test_bad_dsn_is_a_config_error(bad):
    with pytest.raises(ConfigError) as info:
        Dsn.parse(bad)
    assert info.value.field == "ORBIT_MYSQL_DSN"
    assert "\n" not in info.value.message


def test_from_env_validates_everything():
    config = NodeConfig.from_env({"ORBIT_MYSQL_DSN": "mysql://root@127.0.0.1/orbit", "ORBIT_HTTP_ADDR": "0.0.0.0:9000"})
    assert (config.http_host, config.http_port) == ("0.0.0.0", 9000)
    assert config.scheduler == SchedulerLimits()
    assert (config.scheduler.sql_slots, config.scheduler.max_requests) == (4, 128)
    for env, field in [
        ({}, "ORBIT_MYSQL_DSN"),
        ({"ORBIT_MYSQL_DSN": "mysql://r@h/d", "ORBIT_HTTP_ADDR": "nope"}, "ORBIT_HTTP_ADDR"),
        ({"ORBIT_MYSQL_DSN": "mysql://r@h/d", "ORBIT_TLS_CERT": "/c"}, "ORBIT_TLS_CERT"),
        ({"ORBIT_MYSQL_DSN": "mysql://r@h/d", "ORBIT_RUN_LEASE_S": "-1"}, "ORBIT_RUN_LEASE_S"),
        ({"ORBIT_MYSQL_DSN": "mysql://r@h/d", "ORBIT_RUN_LEASE_S": "x"}, "ORBIT_RUN_LEASE_S"),
        ({"ORBIT_MYSQL_DSN": "mysql://r@h/d", "ORBIT_TYPO": "1"}, "ORBIT_TYPO"),
    ]:
        with pytest.raises(ConfigError) as info:
            NodeConfig.from_env(env)
        assert info.value.field == field


def test_scheduler_limits_reject_nonsense():
    with pytest.raises(ConfigError):
        SchedulerLimits(sql_slots=0)


def test_a_dsn_names_several_hosts_in_order():
    dsn = Dsn.parse("mysql://u:p@h1:3306,h2:3307,[::1]/orbit")
    assert [str(h) for h in dsn.hosts] == ["h1:3306", "h2:3307", "[::1]:3306"]
    assert (dsn.host, dsn.port) == ("h1", 3306)
    assert Dsn.parse(dsn.url()) == dsn
    for bad, words in [
        ("mysql://u@h1,h1/db", "listed twice"),
        ("mysql://u@h1,/db", "empty host"),
        ("mysql://u@h1,h2:99999/db", "Port out of range"),
        ("mysql://u@h1,h2/db?unix_socket=/s", "several hosts"),
    ]:
        with pytest.raises(ConfigError) as info:
            Dsn.parse(bad)
        assert info.value.field == "ORBIT_MYSQL_DSN" and words in info.value.message


def test_orbit_shards_maps_applications_to_databases():
    env = {
        "ORBIT_MYSQL_DSN": "mysql://r@main/orbit",
        "ORBIT_SHARDS": " billing = mysql://r:s%3Bx@db2:3307/orbit ; search=mysql://r@db3/orbit;"
        "mail=mysql://r:s%3Bx@db2:3307/orbit;home=mysql://r@main/orbit;",
    }
    config = NodeConfig.from_env(env)
    assert [(e.application, e.dsn.host, e.dsn.port) for e in config.shards] == [
        ("billing", "db2", 3307),
        ("search", "db3", 3306),
        ("mail", "db2", 3307),
        ("home", "main", 3306),
    ]
    assert config.shards[0].dsn.password == "s;x"
    # Each other database once, in order; an entry naming the node's own database adds none.
    assert [d.host for d in config.shard_dsns] == ["db2", "db3"]
    assert NodeConfig.from_env({"ORBIT_MYSQL_DSN": "mysql://r@main/orbit"}).shards == ()


@pytest.mark.parametrize(
    "text, words",
    [
        ("billing", "entry 1 ('billing'): expected APPLICATION=DSN"),
        ("a=mysql://r@h/d;=mysql://r@h/d", "entry 2: expected APPLICATION=DSN"),
        ("a=mysql://r@h/d;b=", "entry 2 ('b'): expected APPLICATION=DSN"),
        ("a=mysql://r@h/d;a=mysql://r@h2/d", "entry 2 ('a'): application 'a' is listed twice"),
        ("a=postgres://r:secret@h/d", "entry 1 ('a'): scheme must be mysql://"),
        ("a=mysql://r:secret@h", "entry 1 ('a'): the path must name one database"),
        ("x" * 129 + "=mysql://r@h/d", "at most 128 characters"),
        ("a=mysql://r:secret@h2/d;b=mysql://s@h2/d", "entry 2 ('b'): names the database of 'a' with other credentials"),
        ("a=mysql://r:secret@h/d", "'a' names the database of ORBIT_MYSQL_DSN with other credentials"),
    ],
)
def test_a_bad_orbit_shards_entry_is_named(text, words):
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_env({"ORBIT_MYSQL_DSN": "mysql://r@h/d", "ORBIT_SHARDS": text})
    assert info.value.field == "ORBIT_SHARDS"
    assert info.value.message.startswith("ORBIT_SHARDS: ") and words in info.value.message
    assert "secret" not in info.value.message


def test_the_readme_settings_table_is_the_one_the_declarations_give():
    """Each setting is declared once (orbit_node/config.py); the README shows what that says."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    begin = readme.index("<!-- settings:")
    block = readme[readme.index("\n", begin) + 1 : readme.index("<!-- /settings -->")].rstrip("\n")
    assert block == settings_table(), "README's settings table differs: paste `python -m orbit_node.config`"


def test_every_declared_variable_is_known_parsed_and_named_in_its_errors():
    known = {s.env for s in settings()}
    assert known | SDK_VARIABLES == SETTING_VARIABLES
    base = {"ORBIT_MYSQL_DSN": "mysql://r@h/d"}
    numbers = [s.env for s in settings() if s.env.endswith(("_S", "_BYTES", "_SIZE", "_MESSAGES"))]
    assert len(numbers) == 12
    for env in numbers:
        with pytest.raises(ConfigError) as info:
            NodeConfig.from_env({**base, env: "x"})
        assert (info.value.field, info.value.message) == (env, f"{env}: expected a number, got 'x'")
        with pytest.raises(ConfigError) as info:
            NodeConfig.from_env({**base, env: "-1"})
        assert info.value.field == env and info.value.message.startswith(f"{env} must ")
    config = NodeConfig.from_env(
        {
            **base,
            "ORBIT_DB_POOL_SIZE": "20",
            "ORBIT_RUN_LEASE_S": "90.5",
            "ORBIT_CONSOLE": " OFF ",
            "ORBIT_LOG_LEVEL": "DEBUG",
            "ORBIT_METRICS": "open",
            "ORBIT_METRICS_ADDR": "0.0.0.0:9100",
            "ORBIT_TLS_CERT": "",
        }
    )
    assert (config.db_pool_size, config.run_lease_s, config.console, config.log_level) == (20, 90.5, False, "debug")
    assert (config.metrics_host, config.metrics_port, config.tls_cert) == ("0.0.0.0", 9100, None)
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_env({**base, "ORBIT_CONSOLE": "maybe"})
    assert info.value.field == "ORBIT_CONSOLE"
