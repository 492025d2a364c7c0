"""Validated, frozen configuration of a node, read from the environment.

Every ``ORBIT_*`` setting of the node is declared once, on the ``NodeConfig`` field it
sets (``setting(...)``: the variable, how its text is parsed, its default as the docs
show it, and its doc); the parser (``NodeConfig.from_env``), the set of known variables
(``SETTING_VARIABLES``) and the README's table of settings (``settings_table``; a test
fails when the README differs) all come from there. Units are in the names
(``lease_s``, ``scan_cycle_s``). A bad value is rejected at construction with a
``ConfigError`` whose message is one line and names the variable.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .domain.dsn import Dsn, ShardEntry, parse_shards
from .domain.errors import ConfigError, InvalidArgument
from .domain.retention import DEFAULT_AUDIT_S, DEFAULT_FAILED_S, DEFAULT_SUCCEEDED_S, format_duration, parse_duration

LOG_FORMATS = ("auto", "json", "text")
# ORBIT_ACCESS_LOG: every request, the failed and slow ones only, or none.
ACCESS_LOG_MODES = ("all", "errors", "off")
LOG_LEVELS = ("debug", "info", "warning", "error")
METRICS_MODES = ("off", "open", "credential")
SWITCHES = {"on": True, "off": False}
# Shortest ORBIT_CONSOLE_SECRET accepted (32 characters: 128 bits and more as hex).
CONSOLE_SECRET_MIN = 32
# The metadata key of a field's ``Setting``.
SETTING = "orbit.setting"


@attrs.frozen
class Setting:
    """An ``ORBIT_*`` variable and the ``NodeConfig`` field(s) it sets."""

    env: str
    doc: str
    # (text, variable) -> the field's value; raises ConfigError naming the variable.
    parse: Callable[[str, str], Any]
    # The default as the docs show it.
    default_doc: str
    # A value that sets several fields (HOST:PORT): their names, in the parsed tuple's order.
    sets: tuple[str, ...] = ()


def setting(
    default: Any,
    *,
    env: str,
    doc: str,
    parse: Callable[[str, str], Any],
    default_doc: str | None = None,
    sets: tuple[str, ...] = (),
    validator: Any = None,
    **kwargs: Any,
) -> Any:
    """A ``NodeConfig`` field that the variable ``env`` sets."""
    shown = default_doc if default_doc is not None else _shown(default)
    return attrs.field(
        default=default,
        validator=validator,
        metadata={SETTING: Setting(env, doc, parse, shown, sets)},
        **kwargs,
    )


def _shown(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"`{value}`" if isinstance(value, str) else str(value)


def _number(kind: type) -> Callable[[str, str], Any]:
    def parse(text: str, env: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            raise ConfigError(f"{env}: expected a number, got {text!r}", field=env) from None

    return parse


def _text_or_none(text: str, env: str) -> str | None:
    return text or None


def _word(text: str, env: str) -> str:
    return text.strip().lower()


def _switch(text: str, env: str) -> bool:
    word = text.strip().lower()
    if word not in SWITCHES:
        raise ConfigError(f"{env}: expected on or off, got {word!r}", field=env)
    return SWITCHES[word]


def _dsn(text: str, env: str) -> Dsn:
    return Dsn.parse(text)


def _shards(text: str, env: str) -> tuple[ShardEntry, ...]:
    return parse_shards(text)


def _duration(text: str, env: str) -> int:
    try:
        return parse_duration(text, env)
    except InvalidArgument as exc:
        raise ConfigError(exc.message, field=env) from None


def _addr(text: str, env: str) -> tuple[str, int]:
    return parse_addr(text, field=env)


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
        known = sorted(SETTING_VARIABLES | TOOL_VARIABLES)
        near = difflib.get_close_matches(unknown[0], known, n=1, cutoff=0.75)
        hint = f"did you mean {near[0]}?" if near else "a typo?"
        raise ConfigError(f"{unknown[0]}: unknown setting ({hint})", field=unknown[0])


def parse_addr(value: str, *, field: str = "ORBIT_HTTP_ADDR") -> tuple[str, int]:
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ConfigError(f"{field}: expected HOST:PORT, got {value!r}", field=field)
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ConfigError(f"{field}: port {port} is out of range", field=field)
    return host.strip("[]"), port


def _label(attribute) -> str:
    """How an error names a field: its variable, when a variable sets it."""
    found = attribute.metadata.get(SETTING)
    return found.env if found is not None else attribute.name


def _positive(instance, attribute, value):
    if value <= 0:
        raise ConfigError(f"{_label(attribute)} must be positive, got {value!r}", field=_label(attribute))


def _non_negative(instance, attribute, value):
    if value < 0:
        raise ConfigError(f"{_label(attribute)} must not be negative, got {value!r}", field=_label(attribute))


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
class AdmissionLimits:
    """Fair admission of HTTP requests between applications (``orbit_node/admission/fair.py``,
    docs/operations.md, "Fair admission of requests")."""

    # Route handlers (body, validation, transaction) in progress per node. Submits
    # group-commit (one transaction for the submits in progress), so the slots bound the
    # groups' size, and a request that waits for a slot costs a wake-up: 8 slots made a
    # single application's 16 back-to-back clients pay 1.35-1.5x the node CPU per submit
    # of no admission at all, 16 slots (2 of the 16 waiting) about 1.2x (docs/benchmarks/fairness.md,
    # issue 38).
    slots: int = attrs.field(default=32, validator=_positive)
    # Handlers in progress per application per node while another application waits: one
    # application's flood leaves the other slots to the others.
    per_application: int = attrs.field(default=16, validator=_positive)
    # Slots an application alone (nobody else waiting) leaves free beyond its
    # per_application: it may hold up to max(per_application, slots - reserve), and a
    # request of another application that arrives then runs at once.
    reserve: int = attrs.field(default=2, validator=_non_negative)
    # Requests waiting for their turn per node; beyond it, an application over its weighted
    # share of this bound (plus the slots) is refused 429 at once.
    max_waiting: int = attrs.field(default=256, validator=_positive)


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
    # A node whose requests wait for a task to finish writes a watch of it at most this
    # often; the other nodes keep a watch they heard ``watch_keep_s`` (longer than a wait
    # and a repeat together), and the tasks that finished on them ``finished_recent_s``
    # (a watch heard just after its task finished still gets its answer). At most
    # ``watch_limit`` of each are kept (dispatch/signal_core.py, ``Watches``).
    watch_repeat_s: float = attrs.field(default=20.0, validator=_positive)
    watch_keep_s: float = attrs.field(default=60.0, validator=_positive)
    finished_recent_s: float = attrs.field(default=5.0, validator=_non_negative)
    watch_limit: int = attrs.field(default=100_000, validator=_positive)

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
    dsn: Dsn = setting(
        attrs.NOTHING,
        env="ORBIT_MYSQL_DSN",
        parse=_dsn,
        default_doc="required",
        doc="`mysql://user:password@host:port/database` (percent-encoded parts; `?unix_socket=/path`; "
        "`mariadb://` accepted); several hosts `mysql://u:p@h1:3306,h2:3306,h3:3306/db` name the servers of "
        "one Galera cluster in order: a node writes to the first it reaches, the next when that one is lost, "
        "an earlier one only when `orbit-admin database writer --host` says so (`docs/operations.md`)",
    )
    shards: tuple[ShardEntry, ...] = setting(
        (),
        env="ORBIT_SHARDS",
        parse=_shards,
        default_doc="none: one database",
        doc="applications whose rows live on another database: `APPLICATION=DSN;APPLICATION=DSN` (each DSN as "
        "`ORBIT_MYSQL_DSN`); every other application, and the node registry, stay on `ORBIT_MYSQL_DSN`. The same "
        'on every node, `orbit-migrate` and `orbit-admin` (`docs/scaling.md`, "Running two shards")',
    )
    http_host: str = setting(
        "127.0.0.1",
        env="ORBIT_HTTP_ADDR",
        parse=_addr,
        sets=("http_host", "http_port"),
        default_doc="`127.0.0.1:8080`",
        doc="`HOST:PORT` of HTTP and WebSocket",
    )
    http_port: int = 8080
    tls_cert: str | None = setting(
        None, env="ORBIT_TLS_CERT", parse=_text_or_none, default_doc="off", doc="certificate file: serve HTTPS / WSS"
    )
    tls_key: str | None = setting(
        None, env="ORBIT_TLS_KEY", parse=_text_or_none, default_doc="off", doc="its private key (set both or neither)"
    )
    log_level: str = setting("info", env="ORBIT_LOG_LEVEL", parse=_word, doc="`debug`, `info`, `warning`, `error`")
    log_format: str = setting(
        "auto",
        env="ORBIT_LOG_FORMAT",
        parse=_word,
        doc="`json` (one object per line), `text`, or `auto` (text on a terminal, else JSON)",
    )
    access_log: str = setting(
        "errors",
        env="ORBIT_ACCESS_LOG",
        parse=_word,
        doc="the access log (logger `orbit.access`): `all` (a line per request at info; health, readiness and "
        "metrics probes at debug), `errors` (a line at info for a request answered 4xx/5xx or slower than "
        "`ORBIT_ACCESS_LOG_SLOW_MS`, the others at debug), or `off`",
    )
    access_log_slow_ms: float = setting(
        1000.0,
        env="ORBIT_ACCESS_LOG_SLOW_MS",
        parse=_number(float),
        validator=_non_negative,
        doc="with `ORBIT_ACCESS_LOG=errors`, a request that takes longer than this (milliseconds) is logged too",
    )
    metrics: str = setting(
        "off",
        env="ORBIT_METRICS",
        parse=_word,
        doc="`GET /metrics`: `off`, `open` (no credential, on `ORBIT_METRICS_ADDR`) or `credential` (on "
        "`ORBIT_HTTP_ADDR`, scope `metrics:read`)",
    )
    metrics_host: str = setting(
        "127.0.0.1",
        env="ORBIT_METRICS_ADDR",
        parse=_addr,
        sets=("metrics_host", "metrics_port"),
        # 9464: the port Prometheus exporters of this kind conventionally take.
        default_doc="`127.0.0.1:9464`",
        doc="`HOST:PORT` of the metrics server; only with `ORBIT_METRICS=open`",
    )
    metrics_port: int = 9464
    reservation_lease_s: float = setting(
        30.0,
        env="ORBIT_RESERVATION_LEASE_S",
        parse=_number(float),
        validator=_positive,
        doc="lease of a reservation not yet started (seconds)",
    )
    run_lease_s: float = setting(
        60.0,
        env="ORBIT_RUN_LEASE_S",
        parse=_number(float),
        validator=_positive,
        doc="lease of a running attempt, renewed by the Worker (seconds)",
    )
    # Larger bodies get 413 before they are buffered.
    max_body_bytes: int = setting(
        1024 * 1024,
        env="ORBIT_MAX_BODY_BYTES",
        parse=_number(int),
        validator=_positive,
        doc="largest HTTP request body (413 beyond)",
    )
    heartbeat_timeout_s: float = setting(
        30.0,
        env="ORBIT_HEARTBEAT_TIMEOUT_S",
        parse=_number(float),
        validator=_positive,
        doc="a silent Worker connection is closed after this (seconds)",
    )
    shutdown_grace_s: float = setting(
        10.0,
        env="ORBIT_SHUTDOWN_GRACE_S",
        parse=_number(float),
        validator=_non_negative,
        doc="drain time after SIGTERM: how long running tasks may take to finish (seconds)",
    )
    db_pool_size: int = setting(
        16,
        env="ORBIT_DB_POOL_SIZE",
        parse=_number(int),
        validator=_positive,
        doc="database connections per node: the claim slots (4), twice as many group commits of Worker "
        "transitions (8) and room for API and control traffic",
    )
    claim_batch_size: int = setting(
        64,
        env="ORBIT_CLAIM_BATCH_SIZE",
        parse=_number(int),
        validator=_positive,
        doc="tasks one claim reserves at most (a Worker connection asks when it is idle or half of "
        "`min(capacity, this)` is free, and takes up to its free capacity)",
    )
    credential_cache_s: float = setting(
        1.0,
        env="ORBIT_CREDENTIAL_CACHE_S",
        parse=_number(float),
        validator=_non_negative,
        doc="a verified bearer credential is trusted this long before the database is asked again: a revoked "
        "or changed credential takes effect on every node within it; `0` asks on every request",
    )
    console: bool = setting(
        True,
        env="ORBIT_CONSOLE",
        parse=_switch,
        default_doc="`on`",
        doc="the web console at `/console`: `on` or `off`",
    )
    # None: a random key per process.
    console_secret: str | None = setting(
        None,
        env="ORBIT_CONSOLE_SECRET",
        parse=_text_or_none,
        default_doc="random",
        repr=False,
        doc="key (32+ characters) that signs console session cookies; give every node the same one. Unset: a "
        "random key per process, so sessions end when it stops and are not valid on other nodes",
    )
    console_session_s: float = setting(
        8 * 3600.0,
        env="ORBIT_CONSOLE_SESSION_S",
        parse=_number(float),
        validator=_positive,
        doc="a console session ends this long after sign-in, in seconds (a revoked credential ends it at its "
        "next request)",
    )
    # A Worker that lets more pile up than either bound is closed as a slow consumer (close
    # 4003), so a Worker that sends but never reads cannot grow the node's memory. One frame
    # larger than the byte bound is still queued when nothing else waits (a large dispatch).
    worker_send_buffer_messages: int = setting(
        1024,
        env="ORBIT_WORKER_SEND_BUFFER_MESSAGES",
        parse=_number(int),
        validator=_positive,
        doc="frames the node queues for one Worker connection that it has not read yet; a Worker that leaves "
        "more unread is closed with 4003 (slow consumer, see `docs/worker-protocol.md`)",
    )
    worker_send_buffer_bytes: int = setting(
        16 * 1024 * 1024,
        env="ORBIT_WORKER_SEND_BUFFER_BYTES",
        parse=_number(int),
        validator=_positive,
        doc="bytes the node queues for one Worker connection that it has not read yet (as the frames above)",
    )
    # Retention (docs/operations.md, "Retention"): the defaults of applications that set
    # none, and the pruner's pace. Every node prunes; give every node the same values.
    retain_succeeded_s: int = setting(
        DEFAULT_SUCCEEDED_S,
        env="ORBIT_RETAIN_SUCCEEDED",
        parse=_duration,
        default_doc=f"`{format_duration(DEFAULT_SUCCEEDED_S)}`",
        doc="how long a succeeded task is kept after it finished, for applications that set no retention of "
        "their own (`orbit-admin application retention`): `90s`, `15m`, `12h`, `7d` or seconds, at least 1 s",
    )
    retain_failed_s: int = setting(
        DEFAULT_FAILED_S,
        env="ORBIT_RETAIN_FAILED",
        parse=_duration,
        default_doc=f"`{format_duration(DEFAULT_FAILED_S)}`",
        doc="how long a failed, cancelled or expired task is kept after it finished (as above)",
    )
    retain_audit_s: int = setting(
        DEFAULT_AUDIT_S,
        env="ORBIT_RETAIN_AUDIT",
        parse=_duration,
        default_doc=f"`{format_duration(DEFAULT_AUDIT_S)}`",
        doc="how long an audit record (the console's writes) is kept",
    )
    prune_interval_s: float = setting(
        30.0,
        env="ORBIT_PRUNE_INTERVAL_S",
        parse=_number(float),
        validator=_positive,
        doc="seconds between two rounds of the node's pruner (each round deletes what has expired, then waits)",
    )
    prune_rate: int = setting(
        1000,
        env="ORBIT_PRUNE_RATE",
        parse=_number(int),
        validator=_positive,
        doc="finished tasks one node's pruner deletes per second at most (with their attempts and records): "
        "the pace of catching up after an outage",
    )
    # Longest use of one database connection (a transaction, lock waits included) before
    # the node gives up on it: no lease is worth a longer wait, and an answer lost in the
    # network must not hold the sweeper, a claim slot or a Worker's transitions forever.
    db_operation_timeout_s: float = attrs.field(default=30.0, validator=_positive)
    # Time a request body has to arrive in full; a client that stalls half-way through
    # (slowloris) is answered 408 and disconnected instead of holding its connection.
    body_timeout_s: float = attrs.field(default=30.0, validator=_positive)
    # Largest accepted WebSocket message from a Worker.
    max_ws_message_bytes: int = attrs.field(default=1024 * 1024, validator=_positive)
    # Connections a node accepts; the next one is refused at the handshake.
    max_connections: int = attrs.field(default=128, validator=_positive)
    # Recovery sweeper period.
    sweep_interval_s: float = attrs.field(default=1.0, validator=_positive)
    # Plan trigger period.
    plan_interval_s: float = attrs.field(default=1.0, validator=_positive)
    scheduler: SchedulerLimits = attrs.field(factory=SchedulerLimits)
    admission: AdmissionLimits = attrs.field(factory=AdmissionLimits)
    signals: SignalTiming = attrs.field(factory=SignalTiming)

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
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"ORBIT_LOG_LEVEL: unknown level {self.log_level!r}", field="ORBIT_LOG_LEVEL")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(
                f"ORBIT_LOG_FORMAT: expected one of {', '.join(LOG_FORMATS)}, got {self.log_format!r}",
                field="ORBIT_LOG_FORMAT",
            )
        if self.access_log not in ACCESS_LOG_MODES:
            raise ConfigError(
                f"ORBIT_ACCESS_LOG: expected one of {', '.join(ACCESS_LOG_MODES)}, got {self.access_log!r}",
                field="ORBIT_ACCESS_LOG",
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
        """The configuration the ``ORBIT_*`` variables of ``env`` (default: the process's) give;
        every variable not set keeps its field's default."""
        env = os.environ if env is None else env
        check_environment(env)
        if not env.get("ORBIT_MYSQL_DSN"):
            raise ConfigError("ORBIT_MYSQL_DSN is not set", field="ORBIT_MYSQL_DSN")
        kwargs: dict[str, Any] = {}
        for field in attrs.fields(cls):
            found = field.metadata.get(SETTING)
            if found is None or found.env not in env:
                continue
            value = found.parse(env[found.env], found.env)
            if found.sets:
                kwargs.update(zip(found.sets, value, strict=True))
            else:
                kwargs[field.name] = value
        if "ORBIT_METRICS_ADDR" in env and kwargs.get("metrics", "off") != "open":
            raise ConfigError("ORBIT_METRICS_ADDR: only used with ORBIT_METRICS=open", field="ORBIT_METRICS_ADDR")
        return cls(**kwargs)


def settings() -> list[Setting]:
    """Every node setting, in declaration order."""
    return [f.metadata[SETTING] for f in attrs.fields(NodeConfig) if SETTING in f.metadata]


# Read by the SDK (OrbitClient.from_env, Worker.from_env), not by the node.
SDK_VARIABLES = frozenset({"ORBIT_URL", "ORBIT_CREDENTIALS_FILE"})
# Every ORBIT_* variable a node, orbit-admin, orbit-migrate or the SDK reads.
SETTING_VARIABLES = frozenset(s.env for s in settings()) | SDK_VARIABLES


def settings_table() -> str:
    """The README's table of node settings (between its ``settings`` markers)."""
    lines = ["| variable | meaning | default |", "| --- | --- | --- |"]
    lines += [f"| `{s.env}` | {s.doc} | {s.default_doc} |" for s in settings()]
    return "\n".join(lines)


if __name__ == "__main__":
    print(settings_table())
