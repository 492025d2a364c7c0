"""How a Worker reaches a node: the URLs it rotates through, the pause between attempts,
its queues' ids, and what a failed attempt or a refusal says.

``Rotation`` is the rule (docs/sdk.md, "Several nodes"): the URLs are tried in the
order given, starting with the first; every failed attempt and every lost connection
moves to the next URL (after the last comes the first again), after a jittered pause
that doubles with each consecutive failure from ``RECONNECT_INITIAL_S`` to
``RECONNECT_MAX_S``; a welcome resets the pause. A Worker stays on a node as long as
the node serves it.
"""

from __future__ import annotations

import errno
import json
import random
import socket
import ssl
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import urlsplit

import attrs
import httpx
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, ConnectionTimeout, DisconnectionTimeout, HandshakeError

from orbit_protocol import __version__
from orbit_protocol.messages import Capability, Hello, TaskRef

from .client import OrbitClient
from .encoding import is_id
from .errors import ConfigError, OrbitClientError, PermissionDeniedError, UnauthenticatedError
from .messages import Error, NodeMessage

# Reconnect backoff: first pause and cap.
RECONNECT_INITIAL_S = 0.1
RECONNECT_MAX_S = 5.0
# Bound on the WebSocket closing handshake: a node that cannot be reached (packets
# dropped, no RST) must not hold a reconnect for trio-websocket's 60 s.
DISCONNECT_TIMEOUT_S = 2.0


class NodeSilent(Exception):
    """Nothing came from the node within a bound (the welcome timeout after the hello, its
    announced heartbeat timeout afterwards): the connection is dead."""


class WorkerRejected(OrbitClientError):
    """The node refused the Worker: at the HTTP handshake (bad or revoked credential,
    missing ``workers:connect``), when the Worker looked its queue names up (bad or
    revoked credential), or its ``hello`` (queue not found, no ``workers:consume``,
    invalid value). Retrying cannot help, so ``Worker.run`` raises it.

    ``status`` is the HTTP status of the refusal, or None when the hello was refused;
    ``code``, ``field`` and ``message`` are the node's error.
    """

    def __init__(self, message: str, *, status: int | None, code: str, field: str | None):
        super().__init__(message, field=field)
        self.status = status
        self.code = code


def os_failure(exc: OSError, host: str, target: str) -> str:
    """Why a connection attempt failed, from the socket error(s): trio's "all attempts to
    connect failed" carries each address's own error as its cause."""
    group = exc.__cause__
    errors = [e for e in group.exceptions if isinstance(e, OSError)] if isinstance(group, BaseExceptionGroup) else []
    reasons: list[str] = []
    for error in errors or [exc]:
        if error.errno == errno.ECONNREFUSED:
            reason = f"connection refused to {target}"
        elif isinstance(error, socket.gaierror):
            reason = f"cannot resolve {host}: {error.strerror}"
        elif error.strerror:
            reason = f"cannot connect to {target}: {error.strerror}"
        else:
            reason = str(error) or f"cannot connect to {target}: {type(error).__name__}"
        if reason not in reasons:
            reasons.append(reason)
    return "; ".join(reasons)


def refusal(status: int | None, body: bytes) -> WorkerRejected:
    """A ``WorkerRejected`` from a handshake refusal's error envelope (or its raw body)."""
    try:
        document = json.loads(body)
        error = document["error"]
        code, message, field = str(error["code"]), str(error["message"]), error.get("field")
    except (ValueError, KeyError, TypeError):
        text = body[:300].decode(errors="replace") or "no body"
        return WorkerRejected(
            f"the node refused the connection (HTTP {status}): {text}", status=status, code="UNKNOWN", field=None
        )
    return WorkerRejected(
        f"the node refused the connection (HTTP {status} {code}): {message}", status=status, code=code, field=field
    )


def hello_message(
    queue_ids: Sequence[str],
    handlers: Iterable[tuple[str, str, str]],
    resource_keys: bool,
    capacity: int,
    client_name: str,
    tasks: Iterable[TaskRef] = (),
) -> Hello:
    """The Worker's hello: its queues, its capability set (handler, handler and payload
    versions), resource-key support, capacity, client, and the running tasks of its earlier
    connection to re-attach."""
    return Hello(
        queues=tuple(queue_ids),
        capabilities=frozenset(Capability(*handler) for handler in handlers),
        capacity=capacity,
        resource_keys=resource_keys,
        client_name=client_name,
        client_version=__version__,
        tasks=tuple(tasks),
    )


def hello_refused(message: NodeMessage) -> WorkerRejected:
    """A ``WorkerRejected`` for the node's answer to a hello that is not a welcome."""
    if not isinstance(message, Error):
        return WorkerRejected(
            f"the node answered the hello with {message.type!r}, expected 'welcome'",
            status=None,
            code="PROTOCOL",
            field=None,
        )
    field = message.field
    text = f"the node refused the Worker's hello ({message.code}"
    text += f" at {field}): " if field is not None else "): "
    text += message.message
    if field is not None and field.startswith("queues"):
        text += " (a queue is its 32-hex queue_id, or a name resolved by Worker.from_env / queue_names)"
    return WorkerRejected(text, status=None, code=message.code, field=field)


def ws_url(url: str) -> str:
    """The Worker endpoint of a node's ``http(s)://`` address (``ws(s)://`` kept as is)."""
    base = url.rstrip("/")
    if base.startswith("https://"):
        base = "wss://" + base[len("https://") :]
    elif base.startswith("http://"):
        base = "ws://" + base[len("http://") :]
    return base + "/v1/workers/connect"


def node_urls(url: str | Sequence[str]) -> tuple[str, ...]:
    """The node URLs of a Worker: one, or several in the order they are tried."""
    urls = (url,) if isinstance(url, str) else tuple(url)
    if not urls:
        raise ValueError("url: name at least one node URL")
    for index, value in enumerate(urls):
        where = "url" if isinstance(url, str) else f"url[{index}]"
        try:
            parts = urlsplit(value) if isinstance(value, str) else None
            host = parts.hostname if parts is not None else None
        except ValueError as exc:
            raise ValueError(f"{where}: not a node URL ({exc}): {value!r}") from None
        if parts is None or parts.scheme not in ("http", "https", "ws", "wss"):
            raise ValueError(f"{where}: expected an http:// or https:// node URL, got {value!r}")
        if not host:
            raise ValueError(f"{where}: no host in {value!r}")
    return urls


@attrs.define
class Rotation:
    """Which node URL the next attempt goes to, and the pause before it (the module's rule)."""

    urls: tuple[str, ...]
    index: int = 0
    backoff_s: float = RECONNECT_INITIAL_S

    @property
    def current(self) -> str:
        return self.urls[self.index]

    def failed(self) -> float:
        """The attempt on ``current`` failed, or its connection was lost: move to the next
        URL; returns the pause before trying it."""
        pause = self.backoff_s * random.uniform(0.5, 1.0)
        self.backoff_s = min(self.backoff_s * 2, RECONNECT_MAX_S)
        self.index = (self.index + 1) % len(self.urls)
        return pause

    def welcomed(self) -> None:
        """A node welcomed the Worker: the next failure pauses briefly again."""
        self.backoff_s = RECONNECT_INITIAL_S


def describe_failure(exc: BaseException, url: str, connect_timeout_s: float, *, looking_up: bool) -> str:
    """Why a connection to ``url`` failed or ended, in words, naming the node's address;
    ``looking_up`` says the attempt failed while it looked the queue names up."""
    parts = urlsplit(ws_url(url))
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "wss" else 80)
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if isinstance(exc, ConnectionTimeout):
        return f"no connection to {target} within {connect_timeout_s:g} s"
    if isinstance(exc, DisconnectionTimeout):
        return f"no closing handshake from {target} within {DISCONNECT_TIMEOUT_S:g} s"
    if isinstance(exc, ConnectionRejected):
        return str(refusal(exc.status_code, exc.body or b""))
    if isinstance(exc, HandshakeError) and isinstance(exc.__cause__, OSError):
        return os_failure(exc.__cause__, host, target)
    if isinstance(exc, OSError):
        return os_failure(exc, host, target)
    if isinstance(exc, ConnectionClosed):
        reason = exc.reason
        if reason is None:
            return f"the connection to {target} closed"
        said = f": {reason.reason}" if reason.reason else ""
        return f"the connection to {target} closed ({reason.code} {reason.name}{said})"
    if isinstance(exc, trio.BrokenResourceError):
        cause = exc.__cause__ or exc.__context__
        why = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        return f"the connection to {target} broke{why}"
    if isinstance(exc, OrbitClientError):
        return f"looking up queue names at {url}: {exc}" if looking_up else f"{target}: {exc}"
    return str(exc) or type(exc).__name__


async def resolve_queues(
    queues: Sequence[str], names: Mapping[str, str], url: str, token: str, ssl_context: ssl.SSLContext | None
) -> list[str]:
    """Queue ids for ``queues``: the names map first, then 32-hex ids, then a lookup on
    the node at ``url`` (which may fail like a connection: ``TransportError``, ...)."""
    resolved = [names.get(value) or (value if is_id(value) else None) for value in queues]
    if all(queue_id is not None for queue_id in resolved):
        return [q for q in resolved if q is not None]
    by_name = await _list_queue_names(url, token, ssl_context)
    ids: list[str] = []
    for index, (value, queue_id) in enumerate(zip(queues, resolved, strict=True)):
        if queue_id is None:
            if value not in by_name:
                raise ConfigError(
                    f"queues[{index}]: no queue named {value!r} in this credential's namespace "
                    f"(known: {', '.join(sorted(by_name)) or 'none'})",
                    field=f"queues[{index}]",
                )
            queue_id = by_name[value]
        ids.append(queue_id)
    return ids


async def _list_queue_names(url: str, token: str, ssl_context: ssl.SSLContext | None) -> dict[str, str]:
    verify: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
    names: dict[str, str] = {}
    async with OrbitClient(url, token, transport=httpx.AsyncHTTPTransport(verify=verify)) as client:
        cursor: str | None = None
        while True:
            try:
                page = await client.list_queues(limit=100, cursor=cursor)
            except UnauthenticatedError as exc:
                # The same refusal the handshake would give this credential.
                raise WorkerRejected(
                    f"the node refused the credential (HTTP {exc.status} {exc.code}) looking up queue names: "
                    f"{exc.message}",
                    status=exc.status,
                    code=exc.code,
                    field=exc.field,
                ) from None
            except PermissionDeniedError:
                raise ConfigError(
                    "queues: a queue name needs the credentials file's queues map or a credential that may "
                    "list queues (tasks:read or queues:manage); pass queue ids instead",
                    field="queues",
                ) from None
            names.update((queue.name, queue.queue_id) for queue in page.items)
            if page.next_cursor is None:
                return names
            cursor = page.next_cursor
