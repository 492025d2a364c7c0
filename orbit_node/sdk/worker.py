"""The automatic Worker: connect, receive reservations, run handlers, report.

    from orbit_node.sdk import PermanentError, Worker, WorkerTask

    worker = Worker.from_env(queues=["initial"], capacity=4)   # ORBIT_CREDENTIALS_FILE, ORBIT_URL

    @worker.handler("object.prepare", "v1", "v1")
    async def prepare(task: WorkerTask):
        return {"echo": task.payload}

    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)   # returns once the node welcomed the Worker
        ...
        await worker.drain()              # finish what runs, disconnect; worker.drained is True

The user's guide is ``docs/sdk.md``. In short:

* Start is sent before a handler runs, Finish after it. Both are batched: every Start
  and every Finish that is ready within one scheduler tick, or while the previous
  message of its kind waits for its ack, goes in one message (at most
  ``MAX_TASKS_PER_MESSAGE`` tasks), so a busy Worker sends one message per batch,
  not one per task.
* Leases of running tasks are renewed in one batched ``renew`` every third of the
  run lease; a task the node no longer confirms is cancelled locally.
* A Start or Finish the node could not decide (``UNAVAILABLE``: its database out of
  reach; ``RESOURCE_EXHAUSTED``) is sent again, with a growing pause, until the node
  decides it; an undecided renew is simply tried again at the next renewal.
* A handler's return value is the result (any JSON value). ``PermanentError`` fails
  the task without retry; any other exception fails the attempt as retryable. Either
  way the stored error message starts with the exception's type name.
* ``async def`` handlers run in the Worker's trio nursery; plain ``def`` handlers run
  in a worker thread (``trio.to_thread.run_sync``), at most ``capacity`` at once.
* A cancel from the node (cancellation requested, deadline passed) cancels the
  handler's scope: an async handler sees ``trio.Cancelled`` at its next checkpoint.
* A lost connection is re-established with jittered exponential backoff; a node that
  answers nothing (heartbeats included) for its announced heartbeat timeout counts as
  lost, even if the network never reset the connection, and so does one that sends no
  welcome within ``welcome_timeout_s`` of the connection. Handlers
  that were running are cancelled (their tasks come back after the lease expires),
  since their Finish could not be accepted by another connection anyway.
"""

from __future__ import annotations

import errno
import inspect
import itertools
import json
import logging
import random
import socket
import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import attrs
import httpx
import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    ConnectionTimeout,
    DisconnectionTimeout,
    HandshakeError,
    open_websocket_url,
)

from .. import __version__
from ..errors import ConfigError
from ..ids import is_hex32
from .client import Credentials, OrbitClient, PermissionDeniedError, credentials_from_env

log = logging.getLogger("orbit.sdk.worker")

# Reconnect backoff: first pause and cap.
RECONNECT_INITIAL_S = 0.1
RECONNECT_MAX_S = 5.0
# Bound on the WebSocket closing handshake: a node that cannot be reached (packets
# dropped, no RST) must not hold a reconnect for trio-websocket's 60 s.
DISCONNECT_TIMEOUT_S = 2.0


# The protocol's bound on the tasks of one start/renew/finish/release message.
MAX_TASKS_PER_MESSAGE = 1000
# Ack codes of a transition the node could not decide (its database out of reach, its
# queue of transitions full): nothing changed, the connection still holds the task, and
# the same transition is sent again.
UNDECIDED = frozenset({"UNAVAILABLE", "RESOURCE_EXHAUSTED"})
# Pause before an undecided Start or Finish is sent again: first, and cap (doubling).
UNDECIDED_RETRY_INITIAL_S = 0.25
UNDECIDED_RETRY_MAX_S = 2.0
# The protocol's bound on a Finish error message.
MAX_ERROR_MESSAGE = 4096


class NodeSilent(Exception):
    """Nothing came from the node within a bound (the welcome timeout after the hello, its
    announced heartbeat timeout afterwards): the connection is dead."""


class PermanentError(Exception):
    """Raise from a handler to fail the task at once, without retry.

    The stored error is ``{"message": "<TypeName>: <message>", "code": code}`` (the
    type name is the raised class, so a subclass names itself; an exception chained
    with ``raise ... from exc`` is appended as ``(caused by <TypeName>: <message>)``).
    ``code`` is optional, at most 128 characters.
    """

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(message)
        self.code = code


class WorkerRejected(Exception):
    """The node refused the Worker: at the HTTP handshake (bad or revoked credential,
    missing ``workers:connect``) or its ``hello`` (queue not found, no
    ``workers:consume``, invalid value). Retrying cannot help, so ``Worker.run`` raises it.

    ``status`` is the handshake's HTTP status, or None when the hello was refused;
    ``code``, ``field`` and ``message`` are the node's error.
    """

    def __init__(self, message: str, *, status: int | None, code: str, field: str | None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.field = field


@attrs.frozen
class WorkerTask:
    """What a handler receives: one attempt of a task, as accepted, frozen."""

    #: The task's 32-hex id.
    task_id: str
    #: The 32-hex id of the queue it was submitted to.
    queue_id: str
    #: The (handler, handler_version, payload_version) the handler was registered for.
    handler: str
    handler_version: str
    payload_version: str
    #: The submitted payload (any JSON value; integers of any size are exact).
    payload: Any
    #: This attempt's number, from 1; ``max_attempts`` is the task's limit.
    attempt: int
    max_attempts: int
    #: 0 (default) to 9.
    priority: int = 0
    #: RFC 3339 UTC time after which the task no longer runs, or None.
    deadline: str | None = None
    #: The task's resource key (at most one task per key runs at a time), or None.
    resource_key: str | None = None


#: A handler: ``async def`` or plain ``def``, taking a ``WorkerTask``, returning the result.
Handler = Callable[[WorkerTask], Any]
H = TypeVar("H", bound=Handler)


def _is_async(fn: Callable[..., Any]) -> bool:
    """An ``async def`` function, a partial of one, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def _describe(exc: BaseException) -> str:
    """``TypeName: message`` (and its cause), cut to the protocol's bound."""
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__
    if cause is not None:
        text += f" (caused by {type(cause).__name__}: {cause})"
    return text[:MAX_ERROR_MESSAGE]


def _leaf(group: BaseExceptionGroup) -> BaseException:
    """The first exception of a group that is not a cancellation (or the first at all)."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    for leaf in leaves:
        if not isinstance(leaf, trio.Cancelled):
            return leaf
    return leaves[0]


def _os_failure(exc: OSError, host: str, target: str) -> str:
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


def _refusal(status: int | None, body: bytes) -> WorkerRejected:
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


def _hello_refused(message: Mapping[str, Any]) -> WorkerRejected:
    """A ``WorkerRejected`` for the node's answer to a hello that is not a welcome."""
    if message.get("type") != "error":
        return WorkerRejected(
            f"the node answered the hello with {message.get('type')!r}, expected 'welcome'",
            status=None,
            code="PROTOCOL",
            field=None,
        )
    code, field = str(message.get("code")), message.get("field")
    text = f"the node refused the Worker's hello ({code}"
    text += f" at {field}): " if isinstance(field, str) else "): "
    text += str(message.get("message"))
    if isinstance(field, str) and field.startswith("queues"):
        text += " (a queue is its 32-hex queue_id, or a name resolved by Worker.from_env / queue_names)"
    return WorkerRejected(text, status=None, code=code, field=field if isinstance(field, str) else None)


@attrs.define(eq=False)
class _Session:
    """One live connection: sending, and matching acks to requests by message id."""

    ws: Any
    welcome: dict[str, Any]
    # trio time of the last message from the node (heartbeat answers included).
    last_heard: float = attrs.field(factory=trio.current_time)
    _ids: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))
    _waiting: dict[str, trio.MemorySendChannel[list[dict[str, Any]]]] = attrs.field(factory=dict)
    running: dict[str, tuple[str, trio.CancelScope]] = attrs.field(factory=dict)
    # Why the node asked to stop a task (``cancel_requested`` or ``deadline``), by task id:
    # set by a ``cancel`` (or a refused renew), read when the handler's report is built.
    # A cancel for a task whose handler has not begun yet waits here and stops it at once.
    cancels: dict[str, str] = attrs.field(factory=dict)
    # Handlers started or about to start (between the start ack and the handler).
    busy: int = 0
    idle: trio.Event = attrs.field(factory=trio.Event)
    # Start and finish messages sent, by kind (the Worker's counters).
    sent: dict[str, int] = attrs.field(factory=lambda: {"start": 0, "finish": 0})
    starts: _Batcher = attrs.field(init=False)
    finishes: _Batcher = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.starts = _Batcher(self, "start", self.sent)
        self.finishes = _Batcher(self, "finish", self.sent)

    def enter(self) -> None:
        self.busy += 1
        self.idle = trio.Event()

    def leave(self) -> None:
        self.busy -= 1
        if self.busy == 0:
            self.idle.set()

    async def send(self, message: dict[str, Any]) -> None:
        await self.ws.send_message(json.dumps(message, separators=(",", ":")))

    async def request(self, kind: str, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Send a start/renew/finish/release and wait for its ack's results."""
        message_id = f"m{next(self._ids)}"
        send, recv = trio.open_memory_channel[list[dict[str, Any]]](1)
        self._waiting[message_id] = send
        try:
            await self.send({"type": kind, "id": message_id, "tasks": tasks})
            return await recv.receive()
        finally:
            self._waiting.pop(message_id, None)

    def resolve(self, ack: dict[str, Any]) -> None:
        message_id = ack.get("id")
        send = self._waiting.pop(message_id, None) if isinstance(message_id, str) else None
        if send is not None:
            send.send_nowait(ack["results"])


@attrs.define(eq=False)
class _Batcher:
    """Coalesces the start (or finish) items of many tasks into one message.

    ``submit`` queues items and waits for their own results. ``run`` sends what is queued
    once the tick in which it was queued is over, waits for the ack, and meanwhile lets
    new items queue up for the next message (so one message is in flight per kind)."""

    session: _Session
    kind: str
    # Messages sent per kind, shared with the Worker (a figure for tests and benchmarks).
    sent: dict[str, int]
    _queued: list[tuple[dict[str, Any], trio.MemorySendChannel[dict[str, Any] | None]]] = attrs.field(factory=list)
    _wake: trio.Event = attrs.field(factory=trio.Event)

    async def submit(self, items: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
        """Queue ``items``; returns each one's result (None if the ack did not name it)."""
        waits = []
        for item in items:
            send, recv = trio.open_memory_channel[dict[str, Any] | None](1)
            self._queued.append((item, send))
            waits.append(recv)
        self._wake.set()
        return [await recv.receive() for recv in waits]

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            # Whatever else is ready to run in this tick queues its items first.
            await trio.lowlevel.checkpoint()
            batch, self._queued = self._queued[:MAX_TASKS_PER_MESSAGE], self._queued[MAX_TASKS_PER_MESSAGE:]
            if not self._queued:
                self._wake = trio.Event()
            self.sent[self.kind] += 1
            results = await self.session.request(self.kind, [item for item, _ in batch])
            by_id = {r.get("task_id"): r for r in results}
            for item, send in batch:
                send.send_nowait(by_id.get(item["task_id"]))


async def _until_decided(batcher: _Batcher, items: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """Submit ``items``; the ones the node answers ``UNDECIDED`` are submitted again after a
    pause (doubling up to ``UNDECIDED_RETRY_MAX_S``) until each has an answer that decides
    it. The session's end (the connection lost) stops the retries."""
    results: list[dict[str, Any] | None] = [None] * len(items)
    waiting = list(range(len(items)))
    pause = UNDECIDED_RETRY_INITIAL_S
    while True:
        answers = await batcher.submit([items[i] for i in waiting])
        again = []
        for index, answer in zip(waiting, answers, strict=True):
            results[index] = answer
            if answer is not None and not answer.get("ok") and answer.get("code") in UNDECIDED:
                again.append(index)
        if not again:
            return results
        waiting = again
        await trio.sleep(pause)
        pause = min(pause * 2, UNDECIDED_RETRY_MAX_S)


class Worker:
    """An automatic Worker: one WebSocket connection to a node, serving registered handlers.

    ``url`` is the node's ``http(s)://`` address, ``token`` a credential with
    ``workers:connect`` and ``workers:consume`` for each queue. ``queues`` names the
    queues served, each by its 32-hex ``queue_id`` or by name: a name is looked up in
    ``queue_names`` (the credentials file's ``queues`` map; ``from_env`` and
    ``from_credentials`` pass it), else among the namespace's queues (``GET
    /v1/queues``, which needs ``tasks:read`` or ``queues:manage``) when ``run`` starts.
    ``capacity`` is how many tasks run at once (the node never sends more).
    ``resource_keys`` says whether the Worker accepts tasks that carry a resource key.
    ``ssl_context`` verifies a ``https://`` node (default: the system's trust store).
    ``connect_timeout_s`` bounds opening one connection (TCP, TLS, handshake);
    ``welcome_timeout_s`` bounds the wait for the node's welcome after the hello (a node
    that accepts the connection and never answers is then a lost connection, retried).

    Counters for callers: ``completed`` and ``failed`` (tasks this Worker finished and
    the node accepted), ``connections`` (sessions welcomed), ``messages_sent``
    (``start`` / ``finish`` messages), and ``drained`` (``run`` ended by ``drain()``).
    """

    def __init__(
        self,
        url: str,
        token: str,
        queues: Sequence[str],
        *,
        capacity: int = 1,
        resource_keys: bool = False,
        queue_names: Mapping[str, str] | None = None,
        client_name: str = "orbit-python",
        ssl_context: ssl.SSLContext | None = None,
        connect_timeout_s: float = 10.0,
        welcome_timeout_s: float = 10.0,
    ) -> None:
        if isinstance(queues, str):
            raise TypeError("queues: expected a list of queue ids or names, not one string")
        if not queues:
            raise ValueError("queues: name at least one queue")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity: expected an integer of at least 1, got {capacity!r}")
        for name, seconds in (("connect_timeout_s", connect_timeout_s), ("welcome_timeout_s", welcome_timeout_s)):
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
                raise ValueError(f"{name}: expected a positive number of seconds, got {seconds!r}")
        self.url = url
        self._token = token
        self.queues = list(queues)
        self.capacity = capacity
        self.resource_keys = resource_keys
        self.client_name = client_name
        self.ssl_context = ssl_context
        self.connect_timeout_s = connect_timeout_s
        self.welcome_timeout_s = welcome_timeout_s
        self._queue_names = dict(queue_names or {})
        self._queue_ids: list[str] | None = None
        self._handlers: dict[tuple[str, str, str], Handler] = {}
        self._sync: set[tuple[str, str, str]] = set()
        self._threads: trio.CapacityLimiter | None = None
        self._draining = False
        self._drained = False
        self._drain_requested = trio.Event()
        self._stopped = trio.Event()
        self._completed = 0
        self._failed = 0
        self._connections = 0
        self._messages_sent = {"start": 0, "finish": 0}
        self._progress = trio.Event()

    def __repr__(self) -> str:
        return f"Worker(url={self.url!r}, queues={self.queues!r}, capacity={self.capacity})"

    # -- construction from a credentials file

    @classmethod
    def from_credentials(
        cls, credentials: Credentials, queues: Sequence[str], *, url: str | None = None, **kwargs: Any
    ) -> Worker:
        """A Worker with the file's token and url (``url`` overrides it); queue names
        resolve through the file's ``queues`` map."""
        return cls(url or credentials.url, credentials.token, queues, queue_names=credentials.queues, **kwargs)

    @classmethod
    def from_env(cls, queues: Sequence[str], *, env: Mapping[str, str] | None = None, **kwargs: Any) -> Worker:
        """Like ``OrbitClient.from_env``: ORBIT_CREDENTIALS_FILE (required) and ORBIT_URL
        (overrides the file's url). ``kwargs`` are the constructor's (``capacity``, ...)."""
        credentials, url = credentials_from_env(env)
        return cls.from_credentials(credentials, queues, url=url, **kwargs)

    # -- counters

    @property
    def completed(self) -> int:
        """Tasks this Worker finished as succeeded (the node accepted the Finish)."""
        return self._completed

    @property
    def failed(self) -> int:
        """Tasks this Worker finished as failed or cancelled (the node accepted the Finish)."""
        return self._failed

    @property
    def connections(self) -> int:
        """Sessions the node welcomed (1 + reconnects)."""
        return self._connections

    @property
    def messages_sent(self) -> Mapping[str, int]:
        """``start`` and ``finish`` messages sent (each carries every task ready in its batch)."""
        return self._messages_sent

    @property
    def drained(self) -> bool:
        """True once ``run`` ended because of ``drain()``."""
        return self._drained

    @property
    def worker_drained(self) -> bool:
        """The same as ``drained``."""
        return self._drained

    # -- handlers

    def handler(self, name: str, handler_version: str, payload_version: str) -> Callable[[H], H]:
        """Decorator form of ``register``; returns the function unchanged."""

        def register(fn: H) -> H:
            self.register(name, handler_version, payload_version, fn)
            return fn

        return register

    def register(self, name: str, handler_version: str, payload_version: str, fn: Handler) -> None:
        """Serve tasks of (``name``, ``handler_version``, ``payload_version``) with ``fn``.

        ``fn(task)`` is ``async def`` (run in the Worker's nursery) or plain ``def``
        (run in a worker thread, at most ``capacity`` at once; it cannot be interrupted
        by a cancel). Its return value is the task's result. Registering the same triple
        again replaces the handler. Register before ``run``: the node learns the
        capability set from the Worker's hello.
        """
        for field, value in (
            ("name", name),
            ("handler_version", handler_version),
            ("payload_version", payload_version),
        ):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{field}: expected a non-empty string, got {value!r}")
        if not callable(fn):
            raise TypeError(f"handler for {name!r}: expected a function, got {type(fn).__name__}")
        key = (name, handler_version, payload_version)
        self._handlers[key] = fn
        if _is_async(fn):
            self._sync.discard(key)
        else:
            self._sync.add(key)

    # -- waiting

    async def wait_completed(self, count: int) -> None:
        """Wait until ``count`` tasks finished successfully through this Worker."""
        while self._completed < count:
            await self._progress.wait()

    async def wait_finished(self, count: int) -> None:
        """Wait until ``count`` tasks finished through this Worker, succeeded or not."""
        while self._completed + self._failed < count:
            await self._progress.wait()

    def _finished(self, succeeded: bool) -> None:
        if succeeded:
            self._completed += 1
        else:
            self._failed += 1
        self._progress.set()
        self._progress = trio.Event()

    # -- life

    async def drain(self) -> None:
        """Stop taking tasks, let running handlers finish, disconnect; sets ``drained``.

        Returns once ``run`` has ended. Bound it with ``trio.move_on_after`` if handlers
        may run long; cancelling ``run`` afterwards abandons them (their tasks come back
        when their lease expires)."""
        self._draining = True
        self._drain_requested.set()
        await self._stopped.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until drained, reconnecting with backoff when the connection is lost.

        With ``nursery.start(worker.run)``, returns once the first session is welcomed.
        Raises ``WorkerRejected`` when the node refuses the credential or the hello,
        ``ConfigError`` when a queue name cannot be resolved, ``ValueError`` without
        handlers."""
        if not self._handlers:
            raise ValueError("register at least one handler before running the Worker")
        backoff = RECONNECT_INITIAL_S
        # Reported once, by the first session that got a welcome (a later one must not
        # report again, whether or not the first ended cleanly).
        status = [task_status]
        try:
            if self._queue_ids is None:
                self._queue_ids = await self._resolve_queues()
            self._threads = trio.CapacityLimiter(self.capacity)
            while not self._draining:
                welcomed = self._connections
                try:
                    try:
                        await self._session(status)
                    except BaseExceptionGroup as group:
                        # Nurseries wrap what ended the session; act on the exception itself
                        # (keeping its own cause, which may say why).
                        leaf = _leaf(group)
                        raise leaf from leaf.__cause__
                    backoff = RECONNECT_INITIAL_S
                except WorkerRejected:
                    raise
                except (OSError, ConnectionClosed, HandshakeError, trio.BrokenResourceError, NodeSilent) as exc:
                    if self._draining:
                        break
                    pause = backoff * random.uniform(0.5, 1.0)
                    what = "worker connection lost" if self._connections > welcomed else "worker could not connect"
                    log.warning("%s (%s); reconnecting in %.1f s", what, self._failure(exc), pause)
                    await trio.sleep(pause)
                    backoff = min(backoff * 2, RECONNECT_MAX_S)
            self._drained = self._draining
        finally:
            self._stopped.set()

    def _failure(self, exc: BaseException) -> str:
        """Why a connection failed or ended, in words, naming the node's address."""
        parts = urlsplit(self._ws_url())
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "wss" else 80)
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if isinstance(exc, ConnectionTimeout):
            return f"no connection to {target} within {self.connect_timeout_s:g} s"
        if isinstance(exc, DisconnectionTimeout):
            return f"no closing handshake from {target} within {DISCONNECT_TIMEOUT_S:g} s"
        if isinstance(exc, ConnectionRejected):
            return str(_refusal(exc.status_code, exc.body or b""))
        if isinstance(exc, HandshakeError) and isinstance(exc.__cause__, OSError):
            return _os_failure(exc.__cause__, host, target)
        if isinstance(exc, OSError):
            return _os_failure(exc, host, target)
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
        return str(exc) or type(exc).__name__

    async def _resolve_queues(self) -> list[str]:
        """Queue ids for ``queues``: the names map first, then 32-hex ids, then a lookup."""
        resolved: list[str | None] = []
        for value in self.queues:
            if value in self._queue_names:
                resolved.append(self._queue_names[value])
            elif is_hex32(value):
                resolved.append(value)
            else:
                resolved.append(None)
        if all(queue_id is not None for queue_id in resolved):
            return [q for q in resolved if q is not None]
        by_name = await self._list_queue_names()
        ids: list[str] = []
        for index, (value, queue_id) in enumerate(zip(self.queues, resolved, strict=True)):
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

    async def _list_queue_names(self) -> dict[str, str]:
        verify: ssl.SSLContext | bool = self.ssl_context if self.ssl_context is not None else True
        transport = httpx.AsyncHTTPTransport(verify=verify)
        names: dict[str, str] = {}
        async with OrbitClient(self.url, self._token, transport=transport) as client:
            cursor: str | None = None
            while True:
                try:
                    page = await client.list_queues(limit=100, cursor=cursor)
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

    def _ws_url(self) -> str:
        base = self.url.rstrip("/")
        if base.startswith("https://"):
            base = "wss://" + base[len("https://") :]
        elif base.startswith("http://"):
            base = "ws://" + base[len("http://") :]
        return base + "/v1/workers/connect"

    def _hello(self) -> dict[str, Any]:
        return {
            "type": "hello",
            "queues": self._queue_ids,
            "capabilities": [
                {"handler": h, "handler_version": hv, "payload_version": pv} for h, hv, pv in self._handlers
            ],
            "resource_keys": self.resource_keys,
            "capacity": self.capacity,
            "client": {"name": self.client_name, "version": __version__},
        }

    async def _session(self, status: list[trio.TaskStatus[None]]) -> None:
        headers = [(b"authorization", f"Bearer {self._token}".encode())]
        try:
            async with open_websocket_url(
                self._ws_url(),
                self.ssl_context,
                extra_headers=headers,
                connect_timeout=self.connect_timeout_s,
                disconnect_timeout=DISCONNECT_TIMEOUT_S,
            ) as ws:
                # The heartbeat watchdog starts with the session: until then this bound is
                # all that stops a node that accepted the connection and answers nothing.
                with trio.move_on_after(self.welcome_timeout_s) as waited:
                    await ws.send_message(json.dumps(self._hello()))
                    answer = await ws.get_message()
                if waited.cancelled_caught:
                    raise NodeSilent(f"no welcome from the node within {self.welcome_timeout_s:g} s of the hello")
                welcome = json.loads(answer)
                if welcome.get("type") != "welcome":
                    raise _hello_refused(welcome)
                self._connections += 1
                session = _Session(ws, welcome, sent=self._messages_sent)
                if status:
                    status.pop().started()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(session.starts.run)
                    nursery.start_soon(session.finishes.run)
                    nursery.start_soon(self._heartbeats, session)
                    nursery.start_soon(self._renewals, session)
                    nursery.start_soon(self._drain_watch, session, nursery)
                    await self._receive(session, nursery)
                    nursery.cancel_scope.cancel()
        except HandshakeError as exc:
            code = getattr(exc, "status_code", None)
            if code in (400, 401, 403):
                raise _refusal(code, getattr(exc, "body", b"") or b"") from None
            raise

    async def _receive(self, session: _Session, nursery: trio.Nursery) -> None:
        while True:
            try:
                message = json.loads(await session.ws.get_message())
            except ConnectionClosed:
                if self._draining:
                    return
                raise
            session.last_heard = trio.current_time()
            kind = message.get("type")
            if kind == "dispatch":
                nursery.start_soon(self._start_and_run, session, message["tasks"])
            elif kind == "ack":
                session.resolve(message)
            elif kind == "cancel":
                for item in message["tasks"]:
                    self._cancel(session, item["task_id"], item.get("reason", "cancel_requested"))
            elif kind == "drain":
                # The node is shutting down: finish what runs, then reconnect (or stop if draining).
                nursery.start_soon(self._finish_then_close, session)
            elif kind == "error":
                log.warning("node refused a message: %s %s", message.get("code"), message.get("message"))

    @staticmethod
    def _cancel(session: _Session, task_id: str, reason: str) -> None:
        """Stop the handler of ``task_id`` (or, if it has not begun, stop it as it begins)."""
        session.cancels[task_id] = reason
        running = session.running.get(task_id)
        if running is not None:
            running[1].cancel()

    async def _start_and_run(self, session: _Session, tasks: list[dict[str, Any]]) -> None:
        refs = [{"task_id": t["task_id"], "token": t["token"]} for t in tasks]
        session.enter()
        try:
            if self._draining:
                await session.request("release", refs)
                return
            results = await _until_decided(session.starts, refs)
            async with trio.open_nursery() as nursery:
                for t, result in zip(tasks, results, strict=False):
                    if result is not None and result.get("ok"):
                        nursery.start_soon(self._run_one, session, t)
                    else:
                        session.cancels.pop(t["task_id"], None)
        finally:
            session.leave()

    async def _call(self, key: tuple[str, str, str], task: WorkerTask) -> Any:
        fn = self._handlers[key]
        if key in self._sync:
            result = await trio.to_thread.run_sync(fn, task, limiter=self._threads)
        else:
            result = fn(task)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _run_one(self, session: _Session, raw: dict[str, Any]) -> None:
        task = WorkerTask(
            task_id=raw["task_id"],
            queue_id=raw["queue_id"],
            handler=raw["handler"],
            handler_version=raw["handler_version"],
            payload_version=raw["payload_version"],
            payload=raw["payload"],
            attempt=raw["attempt"],
            max_attempts=raw["max_attempts"],
            priority=raw.get("priority", 0),
            deadline=raw.get("deadline"),
            resource_key=raw.get("resource_key"),
        )
        key = (task.handler, task.handler_version, task.payload_version)
        report: dict[str, Any] = {"task_id": task.task_id, "token": raw["token"]}
        with trio.CancelScope() as scope:
            session.running[task.task_id] = (raw["token"], scope)
            if task.task_id in session.cancels:
                scope.cancel()  # the cancel came before the handler began
            try:
                result = await self._call(key, task)
                json.dumps(result)  # must be JSON: a failure here is the handler's
                report.update(outcome="succeeded", result=result)
            except PermanentError as exc:
                report.update(
                    outcome="failed",
                    retryable=False,
                    error={"message": _describe(exc), **({"code": exc.code} if exc.code else {})},
                )
            except Exception as exc:
                report.update(outcome="failed", retryable=True, error={"message": _describe(exc)})
        if scope.cancelled_caught:
            if session.cancels.get(task.task_id) == "deadline":
                # Retryable: the node settles a task past its deadline as expired.
                report.update(
                    outcome="failed",
                    retryable=True,
                    error={"message": "stopped: the task's deadline passed", "code": "DEADLINE_EXCEEDED"},
                )
            else:
                # The node settles a failed attempt of a task whose cancel was requested as cancelled.
                report.update(
                    outcome="failed", retryable=False, error={"message": "cancelled by the node", "code": "CANCELLED"}
                )
        try:
            (result,) = await _until_decided(session.finishes, [report])
        finally:
            session.running.pop(task.task_id, None)
            session.cancels.pop(task.task_id, None)
        if result is not None and result.get("ok"):
            self._finished(report["outcome"] == "succeeded")

    async def _heartbeats(self, session: _Session) -> None:
        """Send a heartbeat every interval; a node silent for its heartbeat timeout is gone
        (the network may drop packets without ever resetting the connection)."""
        timeout = session.welcome["heartbeat_timeout_s"]
        while True:
            await trio.sleep(session.welcome["heartbeat_interval_s"])
            if trio.current_time() - session.last_heard >= timeout:
                raise NodeSilent(f"nothing from the node for {timeout:g} s")
            await session.send({"type": "heartbeat"})

    async def _renewals(self, session: _Session) -> None:
        while True:
            await trio.sleep(session.welcome["run_lease_s"] / 3)
            refs = [{"task_id": task_id, "token": token} for task_id, (token, _) in session.running.items()]
            if not refs:
                continue
            for result in await session.request("renew", refs):
                if not result["ok"] and result.get("code") not in UNDECIDED:
                    running = session.running.get(result["task_id"])
                    if running is not None:
                        running[1].cancel()

    async def _drain_watch(self, session: _Session, nursery: trio.Nursery) -> None:
        await self._drain_requested.wait()
        await session.send({"type": "drain"})
        await self._finish_then_close(session)

    async def _finish_then_close(self, session: _Session) -> None:
        if session.busy:
            await session.idle.wait()
        await session.ws.aclose()
