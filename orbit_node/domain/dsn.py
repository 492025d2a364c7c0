"""Where the node's data lives: DSNs (``ORBIT_MYSQL_DSN``, a Galera cluster's servers)
and the shard map (``ORBIT_SHARDS``), parsed and validated."""

from __future__ import annotations

import urllib.parse
from typing import Any

import attrs

from .errors import ConfigError


@attrs.frozen
class DsnHost:
    """One server of a DSN: ``host:port``."""

    host: str
    port: int = 3306

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def _dsn_error(message: str) -> ConfigError:
    return ConfigError(f"ORBIT_MYSQL_DSN: {message}", field="ORBIT_MYSQL_DSN")


def _parse_host(text: str) -> DsnHost:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` (urllib's own rules for one host)."""
    try:
        parts = urllib.parse.urlsplit(f"mysql://{text}")
        port = parts.port
    except ValueError as exc:
        raise _dsn_error(f"not a valid URL ({exc})") from None
    if not parts.hostname:
        raise _dsn_error(f"empty host in {text!r}")
    return DsnHost(parts.hostname, port or 3306)


@attrs.frozen(kw_only=True)
class Dsn:
    """A parsed ``mysql://user:password@host:port/database`` URL.

    ``mysql://u:p@h1:3306,h2:3306,h3:3306/db`` names the servers of one cluster (MariaDB
    Galera) in order of preference: ``host``/``port`` are the first, ``failover_hosts``
    the others (see ``db/pool.py`` for how a node moves between them)."""

    user: str
    password: str = attrs.field(repr=False)
    host: str = "127.0.0.1"
    port: int = 3306
    database: str
    unix_socket: str | None = None
    failover_hosts: tuple[DsnHost, ...] = ()

    def __attrs_post_init__(self) -> None:
        if self.failover_hosts and self.unix_socket:
            raise _dsn_error("?unix_socket= names one server; it cannot be used with several hosts")
        if len(set(self.hosts)) != len(self.hosts):
            raise _dsn_error("a host is listed twice")

    @property
    def hosts(self) -> tuple[DsnHost, ...]:
        """Every server, in order of preference."""
        return (DsnHost(self.host, self.port), *self.failover_hosts)

    @classmethod
    def parse(cls, url: str) -> Dsn:
        try:
            parts = urllib.parse.urlsplit(url)
        except ValueError as exc:
            raise _dsn_error(f"not a valid URL ({exc})") from None
        if parts.scheme not in ("mysql", "mariadb"):
            raise _dsn_error("scheme must be mysql:// or mariadb://")
        database = urllib.parse.unquote(parts.path.lstrip("/"))
        if not database or "/" in database:
            raise _dsn_error("the path must name one database")
        query = urllib.parse.parse_qs(parts.query, strict_parsing=False)
        unknown = set(query) - {"unix_socket"}
        if unknown:
            raise _dsn_error(f"unknown option {sorted(unknown)[0]!r}")
        unix_socket = query.get("unix_socket", [None])[0]
        userinfo, _, host_list = parts.netloc.rpartition("@")
        user, _, password = userinfo.partition(":")
        hosts = [_parse_host(text) for text in host_list.split(",")] if host_list else []
        if not hosts and not unix_socket:
            raise _dsn_error("a host or ?unix_socket= is required")
        first = hosts[0] if hosts else DsnHost("localhost")
        return cls(
            user=urllib.parse.unquote(user or "root"),
            password=urllib.parse.unquote(password),
            host=first.host,
            port=first.port,
            database=database,
            unix_socket=unix_socket,
            failover_hosts=tuple(hosts[1:]),
        )

    @property
    def location(self) -> tuple[tuple[DsnHost, ...], str, str | None]:
        """Which database this is, whatever the credentials: its servers, name and socket."""
        return (self.hosts, self.database, self.unix_socket)

    def with_database(self, database: str) -> Dsn:
        return attrs.evolve(self, database=database)

    def url(self) -> str:
        user = urllib.parse.quote(self.user, safe="")
        auth = user + (":" + urllib.parse.quote(self.password, safe="") if self.password else "")
        query = "?unix_socket=" + urllib.parse.quote(self.unix_socket) if self.unix_socket else ""
        hosts = ",".join(str(h) for h in self.hosts)
        return f"mysql://{auth}@{hosts}/{urllib.parse.quote(self.database)}{query}"


# Longest application name (the applications table's column).
APPLICATION_NAME_MAX = 128


@attrs.frozen
class ShardEntry:
    """One entry of ``ORBIT_SHARDS``: the database that holds an application's rows."""

    application: str
    dsn: Dsn


def parse_shards(text: str) -> tuple[ShardEntry, ...]:
    """``ORBIT_SHARDS``: ``APPLICATION=DSN;APPLICATION=DSN...`` (docs/scaling.md).

    Each DSN has the form of ``ORBIT_MYSQL_DSN`` (a Galera shard lists its servers). Empty
    entries (a trailing ``;``) are ignored; an application named twice is an error. Errors
    name the entry by its position and application, never by its DSN (it holds a password)."""
    entries: list[ShardEntry] = []
    seen: set[str] = set()
    # Database location -> the first entry naming it.
    places: dict[tuple[Any, ...], ShardEntry] = {}
    for position, raw in enumerate(text.split(";"), start=1):
        item = raw.strip()
        if not item:
            continue
        name, sep, dsn_text = item.partition("=")
        name, dsn_text = name.strip(), dsn_text.strip()
        where = f"entry {position}" + (f" ({name!r})" if name else "")
        if not sep or not name or not dsn_text:
            raise ConfigError(f"ORBIT_SHARDS: {where}: expected APPLICATION=DSN", field="ORBIT_SHARDS")
        if len(name) > APPLICATION_NAME_MAX:
            raise ConfigError(
                f"ORBIT_SHARDS: {where}: an application name has at most {APPLICATION_NAME_MAX} characters",
                field="ORBIT_SHARDS",
            )
        if name in seen:
            raise ConfigError(f"ORBIT_SHARDS: {where}: application {name!r} is listed twice", field="ORBIT_SHARDS")
        seen.add(name)
        try:
            dsn = Dsn.parse(dsn_text)
        except ConfigError as exc:
            reason = exc.message.removeprefix("ORBIT_MYSQL_DSN: ")
            raise ConfigError(f"ORBIT_SHARDS: {where}: {reason}", field="ORBIT_SHARDS") from None
        first = places.setdefault(dsn.location, ShardEntry(name, dsn))
        if first.dsn != dsn:
            raise ConfigError(
                f"ORBIT_SHARDS: {where}: names the database of {first.application!r} with other credentials "
                "(one database, one DSN)",
                field="ORBIT_SHARDS",
            )
        entries.append(ShardEntry(name, dsn))
    return tuple(entries)
