"""The automatic Worker: connect, receive reservations, run handlers, report.

    worker = Worker(url=..., token=..., queues=[queue_id], capacity=4)

    @worker.handler("object.prepare", "v1", "v1")
    async def prepare(task: WorkerTask):
        return {"echo": task.payload}

    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        ...
        await worker.drain()          # finish what runs, disconnect; worker.drained is True

* Start is sent before a handler runs, Finish after it. Both are batched: every Start
  and every Finish that is ready within one scheduler tick, or while the previous
  message of its kind waits for its ack, goes in one message (at most
  ``MAX_TASKS_PER_MESSAGE`` tasks), so a busy Worker sends one message per batch,
  not one per task.
* Leases of running tasks are renewed in one batched ``renew`` every third of the
  run lease; a task the node no longer confirms is cancelled locally.
* A handler's return value is the result (any JSON value). ``PermanentError`` fails
  the task without retry; any other exception fails the attempt as retryable.
* A lost connection is re-established with jittered exponential backoff; a node that
  answers nothing (heartbeats included) for its announced heartbeat timeout counts as
  lost, even if the network never reset the connection. Handlers
  that were running are cancelled (their tasks come back after the lease expires),
  since their Finish could not be accepted by another connection anyway.
* The handler receives the frozen task, ``task.priority`` included (0 when absent).
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio
from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

from .. import __version__

log = logging.getLogger("orbit.sdk.worker")

# Reconnect backoff: first pause and cap.
RECONNECT_INITIAL_S = 0.1
RECONNECT_MAX_S = 5.0
# Bound on the WebSocket closing handshake: a node that cannot be reached (packets
# dropped, no RST) must not hold a reconnect for trio-websocket's 60 s.
DISCONNECT_TIMEOUT_S = 2.0


# The protocol's bound on the tasks of one start/renew/finish/release message.
MAX_TASKS_PER_MESSAGE = 1000


class NodeSilent(Exception):
    """Nothing came from the node for its announced heartbeat timeout: the connection is dead."""


class PermanentError(Exception):
    """Raise from a handler to fail the task without retry."""

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(message)
        self.code = code


class WorkerRejected(Exception):
    """The node refused the connection at the handshake (bad credential, no capacity, ...)."""

    def __init__(self, status: int, body: bytes):
        super().__init__(f"connection refused with HTTP {status}: {body[:300].decode(errors='replace')}")
        self.status = status
        self.body = body


@attrs.frozen
class WorkerTask:
    """What a handler sees: the task as accepted, frozen."""

    task_id: str
    queue_id: str
    handler: str
    handler_version: str
    payload_version: str
    payload: Any
    attempt: int
    max_attempts: int
    priority: int = 0
    deadline: str | None = None
    resource_key: str | None = None


Handler = Callable[[WorkerTask], Awaitable[Any]]


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


@attrs.define(eq=False)
class Worker:
    url: str
    token: str = attrs.field(repr=False)
    queues: list[str]
    capacity: int = 1
    resource_keys: bool = False
    client_name: str = "orbit-python"
    ssl_context: ssl.SSLContext | None = None
    # Bound on opening a connection (TCP, TLS and the WebSocket handshake) to the node.
    connect_timeout_s: float = 10.0
    _handlers: dict[tuple[str, str, str], Handler] = attrs.field(factory=dict)
    _draining: bool = False
    drained: bool = False
    _drain_requested: trio.Event = attrs.field(factory=trio.Event)
    _stopped: trio.Event = attrs.field(factory=trio.Event)
    completed: int = 0
    failed: int = 0
    connections: int = 0
    # Start and finish messages sent, by kind (each carries every task ready in its batch).
    messages_sent: dict[str, int] = attrs.field(factory=lambda: {"start": 0, "finish": 0})
    _progress: trio.Event = attrs.field(factory=trio.Event)

    @property
    def worker_drained(self) -> bool:
        return self.drained

    def handler(self, name: str, handler_version: str, payload_version: str) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            self.register(name, handler_version, payload_version, fn)
            return fn

        return register

    def register(self, name: str, handler_version: str, payload_version: str, fn: Handler) -> None:
        self._handlers[(name, handler_version, payload_version)] = fn

    def _ws_url(self) -> str:
        base = self.url.rstrip("/")
        if base.startswith("https://"):
            base = "wss://" + base[len("https://") :]
        elif base.startswith("http://"):
            base = "ws://" + base[len("http://") :]
        return base + "/v1/workers/connect"

    async def wait_completed(self, count: int) -> None:
        """Wait until ``count`` tasks finished successfully through this Worker."""
        while self.completed < count:
            await self._progress.wait()

    def _finished(self, succeeded: bool) -> None:
        if succeeded:
            self.completed += 1
        else:
            self.failed += 1
        self._progress.set()
        self._progress = trio.Event()

    async def drain(self) -> None:
        """Stop taking tasks, let running handlers finish, disconnect; sets ``drained``."""
        self._draining = True
        self._drain_requested.set()
        await self._stopped.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until drained (reconnecting as needed). Reports started after the first welcome."""
        if not self._handlers:
            raise ValueError("register at least one handler before running the Worker")
        backoff = RECONNECT_INITIAL_S
        # Reported once, by the first session that got a welcome (a later one must not
        # report again, whether or not the first ended cleanly).
        status = [task_status]
        try:
            while not self._draining:
                try:
                    try:
                        await self._session(status)
                    except BaseExceptionGroup as group:
                        # Nurseries wrap what ended the session; act on the exception itself.
                        raise _leaf(group) from None
                    backoff = RECONNECT_INITIAL_S
                except WorkerRejected:
                    raise
                except (OSError, ConnectionClosed, HandshakeError, trio.BrokenResourceError, NodeSilent) as exc:
                    if self._draining:
                        break
                    log.warning("worker connection lost (%s); reconnecting in %.1f s", exc, backoff)
                    await trio.sleep(backoff * random.uniform(0.5, 1.0))
                    backoff = min(backoff * 2, RECONNECT_MAX_S)
            self.drained = self._draining
        finally:
            self._stopped.set()

    async def _session(self, status: list[trio.TaskStatus[None]]) -> None:
        headers = [(b"authorization", f"Bearer {self.token}".encode())]
        try:
            async with open_websocket_url(
                self._ws_url(),
                self.ssl_context,
                extra_headers=headers,
                connect_timeout=self.connect_timeout_s,
                disconnect_timeout=DISCONNECT_TIMEOUT_S,
            ) as ws:
                await ws.send_message(
                    json.dumps(
                        {
                            "type": "hello",
                            "queues": self.queues,
                            "capabilities": [
                                {"handler": h, "handler_version": hv, "payload_version": pv}
                                for h, hv, pv in self._handlers
                            ],
                            "resource_keys": self.resource_keys,
                            "capacity": self.capacity,
                            "client": {"name": self.client_name, "version": __version__},
                        }
                    )
                )
                welcome = json.loads(await ws.get_message())
                if welcome.get("type") != "welcome":
                    raise WorkerRejected(0, json.dumps(welcome).encode())
                self.connections += 1
                session = _Session(ws, welcome, sent=self.messages_sent)
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
            if code in (401, 403):
                raise WorkerRejected(code, getattr(exc, "body", b"") or b"") from None
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
                    running = session.running.get(item["task_id"])
                    if running is not None:
                        running[1].cancel()
            elif kind == "drain":
                # The node is shutting down: finish what runs, then reconnect (or stop if draining).
                nursery.start_soon(self._finish_then_close, session)
            elif kind == "error":
                log.warning("node refused a message: %s %s", message.get("code"), message.get("message"))

    async def _start_and_run(self, session: _Session, tasks: list[dict[str, Any]]) -> None:
        refs = [{"task_id": t["task_id"], "token": t["token"]} for t in tasks]
        session.enter()
        try:
            if self._draining:
                await session.request("release", refs)
                return
            results = await session.starts.submit(refs)
            async with trio.open_nursery() as nursery:
                for t, result in zip(tasks, results, strict=False):
                    if result is not None and result.get("ok"):
                        nursery.start_soon(self._run_one, session, t)
        finally:
            session.leave()

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
        fn = self._handlers[(task.handler, task.handler_version, task.payload_version)]
        report: dict[str, Any] = {"task_id": task.task_id, "token": raw["token"]}
        with trio.CancelScope() as scope:
            session.running[task.task_id] = (raw["token"], scope)
            try:
                result = await fn(task)
                json.dumps(result)  # must be JSON: a failure here is the handler's
                report.update(outcome="succeeded", result=result)
            except PermanentError as exc:
                report.update(
                    outcome="failed",
                    retryable=False,
                    error={"message": str(exc), **({"code": exc.code} if exc.code else {})},
                )
            except Exception as exc:
                report.update(
                    outcome="failed", retryable=True, error={"message": f"{type(exc).__name__}: {exc}"[:4096]}
                )
        if scope.cancelled_caught:
            report.update(
                outcome="failed", retryable=False, error={"message": "cancelled by the node", "code": "CANCELLED"}
            )
        try:
            (result,) = await session.finishes.submit([report])
        finally:
            session.running.pop(task.task_id, None)
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
                if not result["ok"]:
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
