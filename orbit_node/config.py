"""Validated, frozen configuration of a node, read from the environment.

Units are in the names (``lease_s``, ``scan_cycle_s``). A bad value is rejected at
construction with a ``ConfigError`` whose message is one line.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from typing import Any

import attrs

from .errors import ConfigError

LOG_FORMATS = ("auto", "json", "text")
METRICS_MODES = ("off", "open", "credential")
SWITCHES = {"on": True, "off": False}
# Shortest ORBIT_CONSOLE_SECRET accepted (32 characters: 128 bits and more as hex).
CONSOLE_SECRET_MIN = 32


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

    def __attrs_post_init__(self):
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


# Every ORBIT_* variable a node, orbit-admin, orbit-migrate or the SDK reads.
SETTING_VARIABLES = frozenset(
    {
        "ORBIT_MYSQL_DSN",
        "ORBIT_SHARDS",
        "ORBIT_HTTP_ADDR",
        "ORBIT_TLS_CERT",
        "ORBIT_TLS_KEY",
        "ORBIT_LOG_LEVEL",
        "ORBIT_RESERVATION_LEASE_S",
        "ORBIT_RUN_LEASE_S",
        "ORBIT_MAX_BODY_BYTES",
        "ORBIT_HEARTBEAT_TIMEOUT_S",
        "ORBIT_SHUTDOWN_GRACE_S",
        "ORBIT_DB_POOL_SIZE",
        "ORBIT_CLAIM_BATCH_SIZE",
        "ORBIT_CREDENTIAL_CACHE_S",
        "ORBIT_URL",
        "ORBIT_CREDENTIALS_FILE",
        "ORBIT_LOG_FORMAT",
        "ORBIT_METRICS",
        "ORBIT_METRICS_ADDR",
        "ORBIT_WORKER_SEND_BUFFER_MESSAGES",
        "ORBIT_WORKER_SEND_BUFFER_BYTES",
        "ORBIT_CONSOLE",
        "ORBIT_CONSOLE_SECRET",
        "ORBIT_CONSOLE_SESSION_S",
    }
)
# Read by the SDK (OrbitClient.from_env, Worker.from_env), not by the node.
SDK_VARIABLES = frozenset({"ORBIT_URL", "ORBIT_CREDENTIALS_FILE"})
# Variables of the development tools, accepted so that they can share an environment
# with the node: scripts/devdb.sh (ORBIT_DEV_DB_PORT), make bench (ORBIT_BENCH_*),
# make test (ORBIT_TEST_*).
TOOL_VARIABLES = frozenset({"ORBIT_DEV_DB_PORT", "ORBIT_BENCH_MYSQL_DSN", "ORBIT_BENCH_PG_DSN", "ORBIT_BENCH_COMMIT"})
TOOL_PREFIXES = ("ORBIT_TEST_",)


def check_environment(env: Mapping[str, str]) -> None:
    """Refuse an unknown ``ORBIT_*`` variable: a typo must not fall back to a default."""
    unknown = sorted(
        k
        for k in env
        if k.startswith("ORBIT_")
        and k not in SETTING_VARIABLES
        and k not in TOOL_VARIABLES
        and not k.startswith(TOOL_PREFIXES)
    )
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown setting (a typo?)", field=unknown[0])


def parse_addr(value: str, *, field: str = "ORBIT_HTTP_ADDR") -> tuple[str, int]:
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ConfigError(f"{field}: expected HOST:PORT, got {value!r}", field=field)
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ConfigError(f"{field}: port {port} is out of range", field=field)
    return host.strip("[]"), port


def _positive(instance, attribute, value):
    if value <= 0:
        raise ConfigError(f"{attribute.name} must be positive, got {value!r}", field=attribute.name)


def _non_negative(instance, attribute, value):
    if value < 0:
        raise ConfigError(f"{attribute.name} must not be negative, got {value!r}", field=attribute.name)


@attrs.frozen(kw_only=True)
class SchedulerLimits:
    """The fair claim pool of P3 section 3 (development baseline values)."""

    # At most this many claim SQL operations run at once per node.
    sql_slots: int = attrs.field(default=4, validator=_positive)
    # At most this many in-flight claims per application per node.
    in_flight_per_application: int = attrs.field(default=1, validator=_positive)
    # Pending + in-flight claim requests per node.
    max_requests: int = attrs.field(default=128, validator=_positive)
    # Claims a connection may be granted per scan cycle.
    claims_per_connection_per_cycle: int = attrs.field(default=4, validator=_positive)
    # Length of a scan cycle (also the lifetime of an empty-result cache entry).
    scan_cycle_s: float = attrs.field(default=1.0, validator=_positive)
    # Empty-result cache entries per node.
    empty_cache_entries: int = attrs.field(default=128, validator=_positive)


@attrs.frozen(kw_only=True)
class SignalTiming:
    """Signals between nodes (docs/scheduling.md, "Signals between nodes")."""

    # Between two reads of the signal table while other nodes' signals come.
    fast_interval_s: float = attrs.field(default=0.02, validator=_positive)
    # The longest pause between two reads: a quiet node reads this often (a few a second).
    slow_interval_s: float = attrs.field(default=0.25, validator=_positive)
    # Reads stay at the fast interval this long after the last such signal.
    busy_s: float = attrs.field(default=10.0, validator=_non_negative)
    # Signals read at most per statement (a fuller page is followed by another read at once).
    read_limit: int = attrs.field(default=500, validator=_positive)
    # A node that begins to listen (its first Worker connection) also hears the signals of
    # the last this many seconds: those written while its Workers' first claims ran.
    look_back_s: float = attrs.field(default=2.0, validator=_non_negative)
    # A hole in the ids read (an insert not yet committed) is looked for again this long.
    gap_wait_s: float = attrs.field(default=0.5, validator=_non_negative)
    # Signals not yet written, at most (more are dropped: they cost latency only).
    outbox_limit: int = attrs.field(default=10_000, validator=_positive)
    # Signals are deleted this many seconds after they were written, this often.
    keep_s: int = attrs.field(default=60, validator=_positive)
    prune_interval_s: float = attrs.field(default=10.0, validator=_positive)

    def __attrs_post_init__(self):
        if self.slow_interval_s < self.fast_interval_s:
            raise ConfigError(
                f"slow_interval_s must be at least fast_interval_s, got {self.slow_interval_s!r}",
                field="slow_interval_s",
            )


@attrs.frozen(kw_only=True)
class NodeConfig:
    # The node's database: the directory (nodes, schema) and the shard of every
    # application ORBIT_SHARDS does not name.
    dsn: Dsn
    # ORBIT_SHARDS: applications whose rows live on another database (docs/scaling.md).
    shards: tuple[ShardEntry, ...] = ()
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    tls_cert: str | None = None
    tls_key: str | None = None
    log_level: str = "info"
    # Log lines: "json" (one object per line), "text", or "auto" (text on a terminal, else json).
    log_format: str = "auto"
    # GET /metrics: "off", "open" (no credential, on its own address metrics_host:metrics_port)
    # or "credential" (on the node's HTTP address, bearer credential with scope metrics:read).
    metrics: str = "off"
    metrics_host: str = "127.0.0.1"
    # 9464: the port Prometheus exporters of this kind conventionally take.
    metrics_port: int = 9464
    # Database connections per node: the claim slots (4), twice as many group commits of
    # Worker transitions (8) and room for API and control traffic (4).
    db_pool_size: int = attrs.field(default=16, validator=_positive)
    # Longest use of one database connection (a transaction, lock waits included) before
    # the node gives up on it: no lease is worth a longer wait, and an answer lost in the
    # network must not hold the sweeper, a claim slot or a Worker's transitions forever.
    db_operation_timeout_s: float = attrs.field(default=30.0, validator=_positive)
    # Largest accepted HTTP request body; larger bodies get 413 before they are buffered.
    max_body_bytes: int = attrs.field(default=1024 * 1024, validator=_positive)
    # Time a request body has to arrive in full; a client that stalls half-way through
    # (slowloris) is answered 408 and disconnected instead of holding its connection.
    body_timeout_s: float = attrs.field(default=30.0, validator=_positive)
    # Largest accepted WebSocket message from a Worker.
    max_ws_message_bytes: int = attrs.field(default=1024 * 1024, validator=_positive)
    # Connections a node accepts; the next one is refused at the handshake.
    max_connections: int = attrs.field(default=128, validator=_positive)
    # Frames queued for one Worker connection and not yet written to it. A Worker that
    # lets more pile up than either bound is closed as a slow consumer (close 4003), so
    # a Worker that sends but never reads cannot grow the node's memory. One frame larger
    # than the byte bound is still queued when nothing else waits (a large dispatch).
    worker_send_buffer_messages: int = attrs.field(default=1024, validator=_positive)
    worker_send_buffer_bytes: int = attrs.field(default=16 * 1024 * 1024, validator=_positive)
    # Lease of a reservation not yet started, and of a running attempt (renewed by the Worker).
    reservation_lease_s: float = attrs.field(default=30.0, validator=_positive)
    run_lease_s: float = attrs.field(default=60.0, validator=_positive)
    # Tasks reserved by one claim at most (ORBIT_CLAIM_BATCH_SIZE).
    claim_batch_size: int = attrs.field(default=64, validator=_positive)
    # A Worker connection silent for this long is closed.
    heartbeat_timeout_s: float = attrs.field(default=30.0, validator=_positive)
    # Recovery sweeper period.
    sweep_interval_s: float = attrs.field(default=1.0, validator=_positive)
    # Plan trigger period.
    plan_interval_s: float = attrs.field(default=1.0, validator=_positive)
    # Graceful shutdown: how long running tasks may take to finish after SIGTERM.
    shutdown_grace_s: float = attrs.field(default=10.0, validator=_non_negative)
    # A verified bearer credential is trusted this long before the database is asked again:
    # a revoked or changed credential takes effect within it. 0: every request asks.
    credential_cache_s: float = attrs.field(default=1.0, validator=_non_negative)
    scheduler: SchedulerLimits = attrs.field(factory=SchedulerLimits)
    signals: SignalTiming = attrs.field(factory=SignalTiming)
    # The read-only web console at /console (docs/operations.md).
    console: bool = True
    # Key that signs console session cookies (ORBIT_CONSOLE_SECRET). Nodes behind one load
    # balancer share it; None: a random key per process (sessions end when the process does
    # and are not valid on other nodes).
    console_secret: str | None = attrs.field(default=None, repr=False)
    # A console session ends this long after sign-in.
    console_session_s: float = attrs.field(default=8 * 3600.0, validator=_positive)

    def __attrs_post_init__(self):
        for entry in self.shards:
            if entry.dsn.location == self.dsn.location and entry.dsn != self.dsn:
                raise ConfigError(
                    f"ORBIT_SHARDS: {entry.application!r} names the database of ORBIT_MYSQL_DSN with other "
                    "credentials (one database, one DSN)",
                    field="ORBIT_SHARDS",
                )
        if self.console_secret is not None and len(self.console_secret) < CONSOLE_SECRET_MIN:
            raise ConfigError(
                f"ORBIT_CONSOLE_SECRET: needs at least {CONSOLE_SECRET_MIN} characters "
                "(e.g. the output of `openssl rand -hex 32`)",
                field="ORBIT_CONSOLE_SECRET",
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("ORBIT_TLS_CERT and ORBIT_TLS_KEY must be set together", field="ORBIT_TLS_CERT")
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"ORBIT_LOG_LEVEL: unknown level {self.log_level!r}", field="ORBIT_LOG_LEVEL")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(
                f"ORBIT_LOG_FORMAT: expected one of {', '.join(LOG_FORMATS)}, got {self.log_format!r}",
                field="ORBIT_LOG_FORMAT",
            )
        if self.metrics not in METRICS_MODES:
            raise ConfigError(
                f"ORBIT_METRICS: expected one of {', '.join(METRICS_MODES)}, got {self.metrics!r}",
                field="ORBIT_METRICS",
            )
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(
                f"ORBIT_METRICS_ADDR: port {self.metrics_port} is out of range", field="ORBIT_METRICS_ADDR"
            )
        if (
            self.metrics == "open"
            and self.metrics_port != 0
            and (self.metrics_host, self.metrics_port) == (self.http_host, self.http_port)
        ):
            raise ConfigError(
                "ORBIT_METRICS_ADDR: must differ from ORBIT_HTTP_ADDR (use ORBIT_METRICS=credential to serve "
                "/metrics on the HTTP address)",
                field="ORBIT_METRICS_ADDR",
            )

    @property
    def shard_dsns(self) -> tuple[Dsn, ...]:
        """The databases of ORBIT_SHARDS other than the node's own, each once, in order."""
        found: dict[tuple[Any, ...], Dsn] = {}
        for entry in self.shards:
            found.setdefault(entry.dsn.location, entry.dsn)
        found.pop(self.dsn.location, None)
        return tuple(found.values())

    @property
    def base_url(self) -> str:
        scheme = "https" if self.tls_cert else "http"
        return f"{scheme}://{self.http_host}:{self.http_port}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> NodeConfig:
        env = os.environ if env is None else env
        check_environment(env)
        dsn_text = env.get("ORBIT_MYSQL_DSN")
        if not dsn_text:
            raise ConfigError("ORBIT_MYSQL_DSN is not set", field="ORBIT_MYSQL_DSN")
        host, port = parse_addr(env.get("ORBIT_HTTP_ADDR", "127.0.0.1:8080"))
        # Settings given in the environment; the others keep their defaults (values of several types).
        kwargs: dict[str, Any] = {}
        metrics = env.get("ORBIT_METRICS", "off").strip().lower()
        if "ORBIT_METRICS_ADDR" in env:
            if metrics != "open":
                raise ConfigError("ORBIT_METRICS_ADDR: only used with ORBIT_METRICS=open", field="ORBIT_METRICS_ADDR")
            kwargs["metrics_host"], kwargs["metrics_port"] = parse_addr(
                env["ORBIT_METRICS_ADDR"], field="ORBIT_METRICS_ADDR"
            )
        numbers = (
            ("reservation_lease_s", "ORBIT_RESERVATION_LEASE_S", float),
            ("run_lease_s", "ORBIT_RUN_LEASE_S", float),
            ("max_body_bytes", "ORBIT_MAX_BODY_BYTES", int),
            ("heartbeat_timeout_s", "ORBIT_HEARTBEAT_TIMEOUT_S", float),
            ("shutdown_grace_s", "ORBIT_SHUTDOWN_GRACE_S", float),
            ("db_pool_size", "ORBIT_DB_POOL_SIZE", int),
            ("claim_batch_size", "ORBIT_CLAIM_BATCH_SIZE", int),
            ("credential_cache_s", "ORBIT_CREDENTIAL_CACHE_S", float),
            ("worker_send_buffer_messages", "ORBIT_WORKER_SEND_BUFFER_MESSAGES", int),
            ("worker_send_buffer_bytes", "ORBIT_WORKER_SEND_BUFFER_BYTES", int),
            ("console_session_s", "ORBIT_CONSOLE_SESSION_S", float),
        )
        for name, key, kind in numbers:
            if key in env:
                try:
                    kwargs[name] = kind(env[key])
                except ValueError:
                    raise ConfigError(f"{key}: expected a number, got {env[key]!r}", field=key) from None
        try:
            return cls._from_parsed(env, dsn_text, host, port, metrics, kwargs)
        except ConfigError as exc:
            # A bad value is reported under the variable that set it, not the attribute.
            for name, key, _ in numbers:
                if exc.field == name and key in env:
                    raise ConfigError(exc.message.replace(name, key, 1), field=key) from None
            raise

    @classmethod
    def _from_parsed(
        cls, env: Mapping[str, str], dsn_text: str, host: str, port: int, metrics: str, kwargs: dict[str, Any]
    ) -> NodeConfig:
        console = env.get("ORBIT_CONSOLE", "on").strip().lower()
        if console not in SWITCHES:
            raise ConfigError(f"ORBIT_CONSOLE: expected on or off, got {console!r}", field="ORBIT_CONSOLE")
        return cls(
            dsn=Dsn.parse(dsn_text),
            shards=parse_shards(env.get("ORBIT_SHARDS", "")),
            console=SWITCHES[console],
            console_secret=env.get("ORBIT_CONSOLE_SECRET") or None,
            http_host=host,
            http_port=port,
            tls_cert=env.get("ORBIT_TLS_CERT") or None,
            tls_key=env.get("ORBIT_TLS_KEY") or None,
            log_level=env.get("ORBIT_LOG_LEVEL", "info").lower(),
            log_format=env.get("ORBIT_LOG_FORMAT", "auto").strip().lower(),
            metrics=metrics,
            **kwargs,
        )
