"""The automatic Worker: connect, receive reservations, run handlers, report.

    from orbit_sdk import PermanentError, Worker, WorkerTask

    worker = Worker.from_env(queues=["initial"], capacity=4)   # ORBIT_CREDENTIALS_FILE, ORBIT_URL

    @worker.handler("object.prepare", "v1", "v1")
    async def prepare(task: WorkerTask):
        return {"echo": task.payload}

    sys.exit(trio.run(worker.serve))      # a process of its own (or: orbit-worker module:worker)

    async with trio.open_nursery() as nursery:  # or inside a program of yours
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
* A lost connection is re-established with jittered exponential backoff (on the next
  node URL, given several: ``connect.py``); a node that
  answers nothing (heartbeats included) for its announced heartbeat timeout counts as
  lost, even if the network never reset the connection, and so does one that sends no
  welcome within ``welcome_timeout_s`` of the connection. A node's ``drain`` (it shuts
  down, or gave the slot to another application) moves the Worker the same way, at once.
* Running tasks belong to their fencing tokens, not to a connection: handlers keep
  running across a lost connection or a move, the next connection's hello presents them
  (``tasks``) and the node re-attaches those whose lease still holds; their renewals and
  Finishes go through it. A handler is cancelled only when the node refuses its task, or
  when its lease runs out before any node could be reached (``docs/sdk.md``).
"""

from __future__ import annotations

import inspect
import logging
import math
import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import httpx
import trio
from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

from orbit_protocol.messages import FinishReport, Hello, TaskRef

from . import serving, tracing
from .client import OrbitClient
from .connect import (
    DISCONNECT_TIMEOUT_S,
    NodeSilent,
    Rotation,
    WorkerRejected,
    describe_failure,
    hello_message,
    hello_refused,
    node_urls,
    refusal,
    resolve_queues,
    ws_url,
)
from .counters import WorkerCounters
from .credentials import Credentials, credentials_from_env
from .errors import ConfigError, OrbitClientError, first_error
from .handlers import (
    ENDS,
    FailureLog,
    H,
    Handler,
    PermanentError,
    WorkerTask,
    check_result,
    failed,
    is_async,
    stopped,
    task_of,
)
from .messages import Ack, Cancel, Dispatch, DispatchedTask, Drain, Error, Heartbeat, Unknown, Welcome, parse_message
from .models import Task
from .session import Session, SessionLost, frame, until_decided

__all__ = ["Handler", "PermanentError", "Worker", "WorkerRejected", "WorkerTask"]

log = logging.getLogger("orbit.sdk.worker")
# Parents one attempt reads from the node at once (``WorkerTask.parents``).
PARENT_READS_AT_ONCE = 8


class Moved(Exception):
    """The node asked the Worker to move (its ``drain``): reconnect, re-attach what runs."""


@attrs.define(eq=False)
class Running:
    """A task whose Start the node accepted, until its Finish is decided or it is lost."""

    token: str
    scope: trio.CancelScope
    # trio time until which its lease is known to hold: the last start, renew or attach
    # answer plus the run lease (the node's clock may be ahead; the renewals keep it far off).
    lease_until: float
    # The node refused it (renew, re-attach) or its lease ran out with no node reached:
    # its handler is stopped and nothing is reported.
    lost: bool = False
    # The handler returned: only its Finish is left to report.
    done: bool = False


class Worker(WorkerCounters):
    """An automatic Worker: one WebSocket connection to a node, serving registered handlers.

    ``url`` is the node's ``http(s)://`` address, or several nodes' addresses: the
    Worker connects to one at a time and moves to the next when one is down, full or
    shutting down (``connect.py`` has the rule). ``token`` is a credential with
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

    Counters, each counting Finishes the node accepted from this Worker, by where they
    left the task: ``completed`` (succeeded), ``failed`` (failed for good), ``cancelled``,
    ``expired``, ``finished`` (the four together: tasks that ended here), ``retried``
    (a failed attempt; the task went back to its queue). Also ``connections`` (sessions
    welcomed), ``messages_sent`` (``start`` / ``finish`` messages) and ``drained``
    (``run`` ended by ``drain()``).

    ``serve()`` runs it as a process of its own: SIGINT/SIGTERM drain it, a second
    signal stops it, and it returns the process's exit status (``serving.py``).
    """

    def __init__(
        self,
        url: str | Sequence[str],
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
        self.urls = node_urls(url)
        # The application the credential belongs to, when known (``from_credentials``): an
        # attribute of each attempt's span.
        self.application: str | None = None
        self._rotation = Rotation(self.urls)
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
        # The cancel scope of a connection attempt not yet welcomed (a drain ends it).
        self._connecting: trio.CancelScope | None = None
        self._ends = dict.fromkeys(ENDS, 0)
        # Handler failures logged whole (with their traceback) or counted as repeats.
        self._failures = FailureLog()
        # Tasks started and not yet reported, across connections; the session they are
        # reported through (None while none is live), and an event set at each change of
        # either (a task lost, a session live or gone).
        self._running: dict[str, Running] = {}
        self._cancels: dict[str, str] = {}
        self._live: Session | None = None
        self._changed = trio.Event()
        self._work: trio.Nursery | None = None
        self._connections = 0
        self._messages_sent = {"start": 0, "finish": 0}
        self._progress = trio.Event()
        # The HTTP client that reads tasks' parents (made on first use, closed by ``run``).
        self._reader: OrbitClient | None = None

    def __repr__(self) -> str:
        url = self.url if len(self.urls) == 1 else self.urls
        return f"Worker(url={url!r}, queues={self.queues!r}, capacity={self.capacity})"

    @property
    def url(self) -> str:
        """The node URL connected to, or to be tried next (one of ``urls``)."""
        return self._rotation.current

    # -- construction from a credentials file

    @classmethod
    def from_credentials(
        cls,
        credentials: Credentials,
        queues: Sequence[str],
        *,
        url: str | Sequence[str] | None = None,
        **kwargs: Any,
    ) -> Worker:
        """A Worker with the file's token and url (``url``, one or several, overrides it);
        queue names resolve through the file's ``queues`` map."""
        worker = cls(url or credentials.url, credentials.token, queues, queue_names=credentials.queues, **kwargs)
        worker.application = credentials.application
        return worker

    @classmethod
    def from_env(
        cls,
        queues: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        url: str | Sequence[str] | None = None,
        **kwargs: Any,
    ) -> Worker:
        """Like ``OrbitClient.from_env``: ORBIT_CREDENTIALS_FILE (required) and ORBIT_URL
        (overrides the file's url); ``url`` (one or several) overrides both. ``kwargs``
        are the constructor's (``capacity``, ...)."""
        credentials, env_url = credentials_from_env(env)
        return cls.from_credentials(credentials, queues, url=url or env_url, **kwargs)

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
        if is_async(fn):
            self._sync.discard(key)
        else:
            self._sync.add(key)

    # -- life

    async def drain(self) -> None:
        """Stop taking tasks, let running handlers finish, disconnect; sets ``drained``.

        Returns once ``run`` has ended. Bound it with ``trio.move_on_after`` if handlers
        may run long; cancelling ``run`` afterwards abandons them (their tasks come back
        when their lease expires). A Worker still connecting stops at once."""
        self.request_drain()
        await self._stopped.wait()

    def request_drain(self) -> None:
        """Start a drain without waiting for it (``drain`` waits): what a signal handler calls."""
        self._draining = True
        self._drain_requested.set()
        if self._connecting is not None:
            self._connecting.cancel()

    async def serve(self) -> int:
        """Run as a process of its own until a signal: the first SIGINT/SIGTERM drains
        the Worker, a second one stops it at once. Returns the exit status (each end is
        logged in one line, a failure with its traceback): 0 drained, 1 any unexpected
        failure, 2 bad configuration (``ConfigError``), 3 rejected (``WorkerRejected``),
        128 + the signal's number when a second signal stopped it. Run it as
        ``sys.exit(trio.run(worker.serve))`` in the main thread; ``orbit-worker
        module:worker`` does that."""
        return await serving.serve(self)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until drained, reconnecting with backoff when the connection is lost.

        With ``nursery.start(worker.run)``, returns once the first session is welcomed.
        Raises (itself, never inside an exception group) ``WorkerRejected`` when the node
        refuses the credential or the hello, ``ConfigError`` when a queue name cannot be
        resolved or no handler is registered."""
        if not self._handlers:
            raise ConfigError("handlers: register at least one handler before running the Worker", field="handlers")
        # Reported once, by the first session that got a welcome (a later one must not
        # report again, whether or not the first ended cleanly).
        status = [task_status]
        try:
            self._threads = trio.CapacityLimiter(self.capacity)
            try:
                async with trio.open_nursery() as work:
                    # Handlers run here, outside any one connection's session.
                    self._work = work
                    work.start_soon(self._lease_watch)
                    await self._connect_loop(status)
                    work.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                leaf = first_error(group)
                raise leaf from leaf.__cause__
            self._drained = self._draining
        finally:
            self._work = None
            if self._reader is not None:
                with trio.CancelScope(shield=True):
                    await self._reader.aclose()
                self._reader = None
            self._stopped.set()

    async def _connect_loop(self, status: list[trio.TaskStatus[None]]) -> None:
        """Connections one after another until drained and every started task is reported."""
        while not self._draining or self._running:
            url = self._rotation.current
            welcomed = self._connections
            try:
                try:
                    await self._attempt(url, status)
                except BaseExceptionGroup as group:
                    # Nurseries wrap what ended the session; act on the exception itself
                    # (keeping its own cause, which may say why).
                    leaf = first_error(group)
                    raise leaf from leaf.__cause__
            except (WorkerRejected, ConfigError):
                raise
            except Moved as moved:
                pause = self._rotation.failed()
                where = f" to {self._rotation.current}" if len(self.urls) > 1 else ""
                log.info(
                    "worker asked to move by the node at %s (%s); reconnecting%s in %.1f s", url, moved, where, pause
                )
                await self._pause(pause)
            except (
                OSError,
                ConnectionClosed,
                HandshakeError,
                trio.BrokenResourceError,
                NodeSilent,
                OrbitClientError,
                SessionLost,
            ) as exc:
                if self._draining and not self._running:
                    break
                pause = self._rotation.failed()
                what = "worker connection lost" if self._connections > welcomed else "worker could not connect"
                where = f" to {self._rotation.current}" if len(self.urls) > 1 else ""
                reason = describe_failure(exc, url, self.connect_timeout_s, looking_up=self._queue_ids is None)
                log.warning("%s (%s); reconnecting%s in %.1f s", what, reason, where, pause)
                await self._pause(pause)

    async def _pause(self, seconds: float) -> None:
        """Wait before the next attempt; a drain with nothing running ends the wait."""
        with trio.move_on_after(seconds):
            await self._drain_requested.wait()
            while self._running:
                await self._wait_changed()

    async def _attempt(self, url: str, status: list[trio.TaskStatus[None]]) -> None:
        """One connection to ``url`` (after looking queue names up there, the first time).
        A drain requested before the welcome ends it quietly, unless started tasks are
        still to be reported."""
        with trio.CancelScope() as connecting:
            if not self._running:
                self._connecting = connecting
            try:
                if self._draining and not self._running:
                    return
                if self._queue_ids is None:
                    self._queue_ids = await resolve_queues(
                        self.queues, self._queue_names, url, self._token, self.ssl_context
                    )
                await self._session(url, status)
            finally:
                self._connecting = None

    def _hello(self) -> Hello:
        assert self._queue_ids is not None, "queues are resolved before a session starts"
        running = [TaskRef(task_id, r.token) for task_id, r in self._running.items() if not r.lost]
        return hello_message(
            self._queue_ids, self._handlers, self.resource_keys, self.capacity, self.client_name, running
        )

    async def _session(self, url: str, status: list[trio.TaskStatus[None]]) -> None:
        headers = [(b"authorization", f"Bearer {self._token}".encode())]
        try:
            async with open_websocket_url(
                ws_url(url),
                self.ssl_context,
                extra_headers=headers,
                connect_timeout=self.connect_timeout_s,
                disconnect_timeout=DISCONNECT_TIMEOUT_S,
            ) as ws:
                # The heartbeat watchdog starts with the session: until then this bound is
                # all that stops a node that accepted the connection and answers nothing.
                hello = self._hello()
                with trio.move_on_after(self.welcome_timeout_s) as waited:
                    await ws.send_message(frame(hello))
                    answer = await ws.get_message()
                if waited.cancelled_caught:
                    raise NodeSilent(f"no welcome from the node within {self.welcome_timeout_s:g} s of the hello")
                welcome = parse_message(answer)
                if isinstance(welcome, Error) and welcome.field == "tasks" and hello.tasks:
                    # A node that cannot re-attach (older than this Worker, or the tasks
                    # were more than it takes): those tasks are lost, the next hello is plain.
                    for ref in hello.tasks:
                        self._lose(ref.task_id, f"the node refused to re-attach it ({welcome.message})")
                    raise SessionLost(f"the node refused the hello's tasks: {welcome.message}")
                if not isinstance(welcome, Welcome):
                    raise hello_refused(welcome)
                # Welcomed: a drain now finishes what runs instead of ending the attempt.
                self._connecting = None
                self._rotation.welcomed()
                self._connections += 1
                log.info(
                    "worker connected to %s (node %s, connection %s): queues %s, handlers %s, capacity %d%s",
                    url,
                    welcome.node_id,
                    welcome.connection_id,
                    ", ".join(self.queues),
                    ", ".join(f"{h}@{v}/{p}" for h, v, p in sorted(self._handlers)),
                    self.capacity,
                    f", {len(hello.tasks)} running tasks presented again" if hello.tasks else "",
                )
                session = Session(ws, welcome, sent=self._messages_sent)
                if status:
                    status.pop().started()
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(session.starts.run)
                        nursery.start_soon(session.finishes.run)
                        nursery.start_soon(self._heartbeats, session)
                        nursery.start_soon(self._go_live, session, [ref.task_id for ref in hello.tasks])
                        nursery.start_soon(self._drain_watch, session, nursery)
                        await self._receive(session, nursery)
                        nursery.cancel_scope.cancel()
                finally:
                    session.end()
                    if self._live is session:
                        self._live = None
                    self._signal()
        except HandshakeError as exc:
            code = getattr(exc, "status_code", None)
            if code in (400, 401, 403):
                raise refusal(code, getattr(exc, "body", b"") or b"") from None
            raise

    async def _go_live(self, session: Session, presented: list[str]) -> None:
        """Once the node answered the tasks the hello presented (re-attached or refused),
        the session is the one started tasks report through; then it renews them."""
        if presented:
            await session.attach_answered.wait()
            answers = {r.task_id: r for r in session.attached}
            now = trio.current_time()
            for task_id in presented:
                answer = answers.get(task_id)
                running = self._running.get(task_id)
                if running is None:
                    continue
                if answer is not None and answer.ok:
                    running.lease_until = now + session.welcome.run_lease_s
                elif not running.done:
                    self._lose(task_id, f"the node did not re-attach it ({answer.code if answer else 'no answer'})")
                # A task whose handler returned is reported anyway: a Finish recorded
                # before the connection ended is answered with its recorded outcome.
        if session.ended:
            return
        self._live = session
        self._signal()
        await self._renewals(session)

    def _signal(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _wait_changed(self) -> None:
        await self._changed.wait()

    def _lose(self, task_id: str, why: str) -> None:
        """The task is no longer this Worker's: stop its handler, report nothing."""
        running = self._running.get(task_id)
        if running is None or running.lost:
            return
        running.lost = True
        running.scope.cancel()
        log.warning("task %s: handler stopped: %s", task_id, why)
        self._signal()

    async def _lease_watch(self) -> None:
        """While no session is live, a task whose lease has run out is lost: its handler
        stops (the node's lease recovery gives the task another attempt)."""
        while True:
            now = trio.current_time()
            if self._live is None:
                for task_id, running in list(self._running.items()):
                    if not running.lost and running.lease_until <= now:
                        self._lose(task_id, "its lease ran out before a node could be reached")
            wake = self._changed
            soonest = min((r.lease_until for r in self._running.values() if not r.lost), default=math.inf)
            with trio.move_on_at(soonest if self._live is None else math.inf):
                await wake.wait()

    async def _receive(self, session: Session, nursery: trio.Nursery) -> None:
        while True:
            try:
                message = parse_message(await session.ws.get_message())
            except ConnectionClosed:
                if self._draining and not self._running:
                    return
                raise
            session.last_heard = trio.current_time()
            match message:
                case Dispatch(tasks=tasks):
                    nursery.start_soon(self._start_and_run, session, tasks)
                case Ack():
                    session.resolve(message)
                case Cancel(tasks=tasks):
                    for item in tasks:
                        self._cancel(item.task_id, item.reason)
                case Drain(reason=reason):
                    # The node shuts down (or gave this slot away): move now. What runs
                    # goes on and is re-attached on the next connection.
                    if self._draining and not self._running:
                        return
                    raise Moved(reason or "drain")
                case Error(code=code, message=text):
                    log.warning("node refused a message: %s %s", code, text)
                case Heartbeat() | Welcome() | Unknown():
                    pass  # heard from (last_heard), nothing more: a second welcome, a type unknown here

    def _cancel(self, task_id: str, reason: str) -> None:
        """Stop the handler of ``task_id`` (or, if it has not begun, stop it as it begins)."""
        self._cancels[task_id] = reason
        running = self._running.get(task_id)
        if running is not None:
            running.scope.cancel()

    async def _start_and_run(self, session: Session, tasks: tuple[DispatchedTask, ...]) -> None:
        refs = [TaskRef(t.task_id, t.token) for t in tasks]
        session.enter()
        try:
            if self._draining:
                await session.request("release", refs)
                return
            results = await until_decided(session.starts, refs)
            now = trio.current_time()
            assert self._work is not None
            for t, result in zip(tasks, results, strict=False):
                if result is not None and result.ok:
                    running = Running(t.token, trio.CancelScope(), now + session.welcome.run_lease_s)
                    self._running[t.task_id] = running
                    self._work.start_soon(self._run_one, t, running)
                else:
                    self._cancels.pop(t.task_id, None)
        except SessionLost:
            # Starts not answered: their reservations go back to their queues when the
            # node sees the connection end (a Start it did record ends by lease recovery).
            pass
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

    async def _read_tasks(self, task_ids: Sequence[str]) -> list[Task]:
        """Tasks by id from the node this Worker uses (``WorkerTask.parents``), a few at once."""
        if self._reader is None:
            verify: ssl.SSLContext | bool = self.ssl_context if self.ssl_context is not None else True
            self._reader = OrbitClient(
                self._rotation.current, self._token, transport=httpx.AsyncHTTPTransport(verify=verify)
            )
        reader = self._reader
        found: dict[str, Task] = {}
        limiter = trio.CapacityLimiter(PARENT_READS_AT_ONCE)

        async def read(task_id: str) -> None:
            async with limiter:
                found[task_id] = await reader.get_task(task_id)

        async with trio.open_nursery() as nursery:
            for task_id in dict.fromkeys(task_ids):
                nursery.start_soon(read, task_id)
        return [found[task_id] for task_id in task_ids]

    async def _run_one(self, dispatched: DispatchedTask, running: Running) -> None:
        task, token = task_of(dispatched), dispatched.token
        if task.parent_ids:
            task = attrs.evolve(task, read_tasks=self._read_tasks)
        key = (task.handler, task.handler_version, task.payload_version)
        report: FinishReport | None = None
        try:
            with running.scope, tracing.attempt_span(task, application=self.application) as span:
                if task.task_id in self._cancels:
                    running.scope.cancel()  # the cancel came before the handler began
                try:
                    result = await self._call(key, task)
                    check_result(result)
                    report = FinishReport(task.task_id, token, "succeeded", result)
                except Exception as exc:
                    report = FinishReport(task.task_id, token, **failed(exc))
                    self._log_failure(task, exc)
                    tracing.failed(span, exc)
            if running.scope.cancelled_caught or report is None:
                report = FinishReport(task.task_id, token, **stopped(self._cancels.get(task.task_id)))
            running.done = True
            answer = await self._report(task.task_id, running, report)
        finally:
            self._running.pop(task.task_id, None)
            self._cancels.pop(task.task_id, None)
            self._signal()
        if answer is not None and answer.ok:
            self._finished(report, answer.state, task.attempt, task.max_attempts)

    def _log_failure(self, task: WorkerTask, exc: Exception) -> None:
        """The handler's exception with its traceback, once per kind and minute; the
        repeats in between are summed up in the next whole line of their kind."""
        whole, repeats = self._failures.failure(task.handler, exc, trio.current_time())
        if not whole:
            return
        again = f" (the same failure {repeats} more times since it was last logged)" if repeats else ""
        log.error(
            "task %s: handler %s %s failed on attempt %d of %d%s",
            task.task_id,
            task.handler,
            task.handler_version,
            task.attempt,
            task.max_attempts,
            again,
            exc_info=exc,
        )

    async def _report(self, task_id: str, running: Running, report: FinishReport) -> Any:
        """The Finish through the live session, again through the next one if the
        connection ends first (the node answers a repeated Finish with what it recorded).
        None when the task was lost before the node answered."""
        while not running.lost:
            session = self._live
            if session is None:
                await self._wait_changed()
                continue
            try:
                (answer,) = await until_decided(session.finishes, [report])
            except SessionLost:
                await self._wait_changed()
                continue
            return answer
        return None

    async def _heartbeats(self, session: Session) -> None:
        """Send a heartbeat every interval; a node silent for its heartbeat timeout is gone
        (the network may drop packets without ever resetting the connection)."""
        timeout = session.welcome.heartbeat_timeout_s
        while True:
            await trio.sleep(session.welcome.heartbeat_interval_s)
            if trio.current_time() - session.last_heard >= timeout:
                raise NodeSilent(f"nothing from the node for {timeout:g} s")
            try:
                await session.send(Heartbeat())
            except SessionLost:
                return

    async def _renewals(self, session: Session) -> None:
        """Every third of the run lease, one renew of every started task not reported yet."""
        lease_s = session.welcome.run_lease_s
        while True:
            await trio.sleep(lease_s / 3)
            refs = [TaskRef(task_id, r.token) for task_id, r in self._running.items() if not r.lost]
            if not refs:
                continue
            try:
                answers = await session.request("renew", refs)
            except SessionLost:
                return
            now = trio.current_time()
            for answer in answers:
                running = self._running.get(answer.task_id)
                if running is None:
                    continue
                if answer.ok:
                    running.lease_until = now + lease_s
                elif not answer.undecided:
                    self._lose(answer.task_id, f"the node refused its renewal ({answer.code})")

    async def _drain_watch(self, session: Session, nursery: trio.Nursery) -> None:
        await self._drain_requested.wait()
        await session.send(Drain())
        await self._finish_then_close(session)

    async def _finish_then_close(self, session: Session) -> None:
        if session.busy:
            await session.idle.wait()
        while self._running:
            await self._wait_changed()
        await session.ws.aclose()
