"""A chaos run: three node processes, SDK Workers on each, a submitting client and a fault
schedule; afterwards the history checker (``history.check``) judges what happened.

    result = await run_chaos(ChaosPlan(seconds=40), workdir)
    print(result.text())          # fault counts, figures and the verdict
    assert result.verdict.ok

Everything runs on loopback against a private ``mariadbd`` (``PrivateMariaDB``); each node
reaches it through its own ``FaultProxy``, so one node's database connection can be stalled
or dropped while the others' work. The faults, one at a time with a pause between them:

* ``node_kill``: SIGKILL a node, start it again a moment later (a new process, new node id);
* ``node_stop``: SIGSTOP a node for up to ``stop_max_s`` (past its leases and its Workers'
  heartbeat timeout), then SIGCONT;
* ``db_restart``: the database server killed (``kill -9``, crash recovery at start) or
  stopped (SIGTERM), then started again;
* ``db_stall``: one node's (or every node's) database proxy holds all bytes for a while;
* ``db_drop``: one node's database connections reset at once, or black-holed for a while
  (answers lost) and then reset;
* ``worker_cut``: a Worker with handlers running is cancelled mid-task (its run ends, its
  connection closes, its tasks come back after their leases); a new one takes its place;
* ``conn_cut``: the Worker connections of one node are reset (RST) by the proxy in front
  of it while their handlers run; the Workers reconnect and re-attach what runs;
* ``node_drain``: a rolling restart of one node: SIGTERM (it drains and tells its Workers
  to move), then a new process a moment later.

Workers reach the nodes through a proxy per node (``conn_cut``'s), and each knows every
node: its own node first, then the others, as a Worker given several URLs moves on.

The client submits tasks with priorities, some with resource keys, each under an
idempotency key, to the nodes in turn; a submit that fails (transport error, 5xx) is
retried with the same key and body on the next node until it is answered 2xx. Every
handler run is logged as an ``Execution`` (task, attempt, start, end; the fencing token is
its attempt row's); a watcher reads task states during the run for ``terminal_stable``.
A task run more than once is charged to the fault whose window (start to end, plus
``RERUN_WINDOW_S``) holds the end of its earlier run (``ChaosResult.reruns``): a cut or a
drain must re-run nothing.
"""

from __future__ import annotations

import functools
import itertools
import json
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from orbit_node.db import Database, Tx, migrate
from orbit_node.domain.errors import OrbitError
from orbit_sdk.worker import Worker, WorkerRejected, WorkerTask

from .history import TERMINAL, Attempt, Execution, History, Observation, Task, Verdict, check, epoch
from .mariadb import PrivateMariaDB
from .nodeproc import NodeProcess
from .proxy import Direction, FaultProxy, open_fault_proxy
from .tenants import make_tenant

FAULTS = ("node_kill", "node_stop", "db_restart", "db_stall", "db_drop", "worker_cut", "conn_cut", "node_drain")
# Faults after which no task may run again: running work outlives a connection and a drain.
NO_RERUN_FAULTS = ("conn_cut", "node_drain")
# A handler stopped by a fault ends within this long after the fault's own end.
RERUN_WINDOW_S = 1.0
# Leases short enough that work lost to a fault comes back within seconds; a Worker whose
# node answers nothing for the heartbeat timeout gives its connection up.
NODE_ENV = {
    "ORBIT_RESERVATION_LEASE_S": "4",
    "ORBIT_RUN_LEASE_S": "6",
    "ORBIT_HEARTBEAT_TIMEOUT_S": "6",
    "ORBIT_DB_POOL_SIZE": "6",
}
HANDLER = ("chaos", "v1", "v1")
# Every task may be lost many times before it would fail for good; retries come back fast.
MAX_ATTEMPTS = 50
# Submits that name parents among the last RECENT_PARENTS acknowledged tasks.
DEPENDENT_SHARE = 0.25
RECENT_PARENTS = 30
BACKOFF = {"initial_ms": 200, "max_ms": 2000}
RESOURCE_KEYS = tuple(f"rk{i}" for i in range(8))
# Bound on one submit request (a stopped node answers nothing).
SUBMIT_TIMEOUT_S = 5.0
# Pause before a submit is retried (on the next node).
SUBMIT_RETRY_S = 0.2
# How often the watcher reads task states, and how far back it reads each time (a
# transaction's timestamps are its statements' start, which can be long before its commit).
WATCH_INTERVAL_S = 1.0
WATCH_MARGIN_S = 40.0


@attrs.frozen
class ChaosPlan:
    # Length of the faulted phase (load and faults); longer when the fault in progress
    # ends later, or, rotating, until every kind of fault happened once.
    seconds: float = 40.0
    submits_per_s: float = 8.0
    nodes: int = 3
    workers_per_node: int = 2
    capacity: int = 4
    # Pause between two faults, drawn from this range.
    gap_s: tuple[float, float] = (1.0, 3.0)
    stop_max_s: float = 9.0
    # Up to past the run lease: a stalled node cannot renew, its Workers' handlers run on.
    stall_max_s: float = 10.0
    # Bound on every acknowledged task settling once the faults stop.
    settle_s: float = 90.0
    seed: int = 0
    # Faults in this order, round and round (each kind as often as the others), or drawn at random.
    rotate: bool = True
    # The kinds of fault this run draws from.
    faults: tuple[str, ...] = FAULTS


@attrs.define(eq=False)
class ExecutionLog:
    """Every handler run, in memory and as one JSON line each in ``path``."""

    path: Path
    entries: list[Execution] = attrs.field(factory=list)

    def append(self, execution: Execution) -> None:
        self.entries.append(execution)
        with self.path.open("a") as out:
            out.write(json.dumps(attrs.asdict(execution)) + "\n")

    @staticmethod
    def read(path: Path) -> list[Execution]:
        return [Execution(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


@attrs.define(eq=False)
class Slot:
    """One Worker place of a node: its current Worker, and how many handlers it runs."""

    name: str
    node: NodeProcess
    # Every node's Worker URL, this slot's node first.
    urls: list[str] = attrs.field(factory=list)
    scope: trio.CancelScope | None = None
    worker: Worker | None = None
    busy: int = 0
    workers: int = 0
    # When a handler of this slot last began (0: never).
    last_start: float = 0.0


@attrs.define(eq=False)
class Load:
    """Submits under idempotency keys; a failed submit is retried with the same key and body."""

    nodes: Sequence[NodeProcess]
    queue_id: str
    token: str
    rng: random.Random
    observations: list[Observation]
    acknowledged: dict[str, str] = attrs.field(factory=dict)
    submitted: int = 0
    retries: int = 0
    # Submits answered 4xx: never acknowledged, never retried (none is expected).
    refused: list[str] = attrs.field(factory=list)
    in_flight: int = 0
    # Task ids acknowledged lately, newest last: the parents later submits may name.
    recent: list[str] = attrs.field(factory=list)

    def body(self, key: str) -> dict[str, Any]:
        roll = self.rng.random()
        run_s = self.rng.uniform(0.02, 0.3) if roll < 0.7 else self.rng.uniform(0.5, 2.0)
        if roll > 0.95:
            run_s = self.rng.uniform(3.0, 8.0)  # longer than the run lease: renewed while it runs
        body: dict[str, Any] = {
            "queue_id": self.queue_id,
            "handler": HANDLER[0],
            "handler_version": HANDLER[1],
            "payload_version": HANDLER[2],
            "payload": {"k": key, "run_s": round(run_s, 3)},
            "priority": self.rng.randint(0, 9),
            "max_attempts": MAX_ATTEMPTS,
            "backoff": BACKOFF,
        }
        if self.rng.random() < 0.15:
            body["resource_key"] = self.rng.choice(RESOURCE_KEYS)
        if self.recent and self.rng.random() < DEPENDENT_SHARE:
            # A child of up to 3 recent tasks: released by the Finish of the last of them.
            pool = self.recent[-RECENT_PARENTS:]
            body["depends_on"] = self.rng.sample(pool, min(len(pool), self.rng.randint(1, 3)))
        return body

    async def submit(self, http: httpx.AsyncClient, key: str, body: dict[str, Any], turn: int) -> None:
        headers = {"Authorization": f"Bearer {self.token}", "Idempotency-Key": key}
        try:
            for attempt in itertools.count(turn):
                node = self.nodes[attempt % len(self.nodes)]
                try:
                    response = await http.post(node.base_url + "/v1/tasks", json=body, headers=headers)
                except httpx.TransportError:
                    response = None
                if response is not None and response.status_code in (200, 201):
                    data = response.json()["data"]
                    self.acknowledged[key] = data["task_id"]
                    self.recent.append(data["task_id"])
                    if data["state"] in TERMINAL:
                        # A repeated submit answers the task as it was before the answer came.
                        finished = data["finished_at"]
                        self.observations.append(
                            Observation(data["task_id"], data["state"], _rfc3339(finished), time.time())
                        )
                    return
                if response is not None and response.status_code < 500:
                    self.refused.append(f"{key}: HTTP {response.status_code} {response.text[:300]}")
                    return
                self.retries += 1
                await trio.sleep(SUBMIT_RETRY_S)
        finally:
            self.in_flight -= 1

    async def run(self, http: httpx.AsyncClient, nursery: trio.Nursery, rate: float, stop: trio.Event) -> None:
        """Start ``rate`` submits a second in ``nursery`` until ``stop`` (the submits go on retrying)."""
        for n in itertools.count():
            key = f"k{n}"
            self.submitted += 1
            self.in_flight += 1
            nursery.start_soon(self.submit, http, key, self.body(key), n)
            with trio.move_on_after(1 / rate):
                await stop.wait()
            if stop.is_set():
                return


def _rfc3339(value: str | None) -> float | None:
    return None if value is None else datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@attrs.define(eq=False)
class ChaosResult:
    plan: ChaosPlan
    faults: Counter[str]
    verdict: Verdict
    seconds: float
    settled: bool
    # From the end of the faults until every task was terminal (or the bound ran out).
    settle_seconds: float
    submitted: int
    submit_retries: int
    refused: list[str]
    worker_sessions: int
    worker_rejections: list[str]
    handlers_cut: int
    workdir: Path
    server_version: str
    # Handlers running in the Workers on a node when its Worker connections were cut or it
    # drained.
    handlers_through: Counter[str] = attrs.field(factory=Counter)
    # Tasks run again, by the fault during which the earlier run ended ("none": no fault).
    reruns: Counter[str] = attrs.field(factory=Counter)

    def text(self) -> str:
        f = self.verdict.figures
        lines = [
            f"chaos: {self.plan.nodes} nodes x {self.plan.workers_per_node} Workers (capacity {self.plan.capacity}), "
            f"{self.plan.seconds:g} s of faults, {self.seconds:.0f} s in all; logs in {self.workdir}",
            "faults: " + ", ".join(f"{name} {self.faults[name]}" for name in FAULTS),
            f"handlers cut off mid-task: {self.handlers_cut}; Worker sessions: {self.worker_sessions}",
            "handlers running through: "
            + ", ".join(f"{name} {self.handlers_through[name]}" for name in NO_RERUN_FAULTS),
            "tasks run again, by the fault their earlier run ended in: "
            + (", ".join(f"{name} {n}" for name, n in sorted(self.reruns.items())) or "none"),
            f"submits: {self.submitted} ({self.submit_retries} retried requests, {len(self.refused)} refused); "
            f"settled: {f'in {self.settle_seconds:.1f} s' if self.settled else f'NO, not in {self.plan.settle_s:g} s'}",
            "history: " + ", ".join(f"{k} {v}" for k, v in f.items()),
            self.verdict.text(),
            f"tasks failed although no handler fails: {self.failed_tasks}",
            f"verdict: {'OK' if self.ok else 'FAILED'}",
        ]
        lines.extend(f"refused submit: {r}" for r in self.refused[:10])
        lines.extend(f"Worker rejected: {r}" for r in self.worker_rejections[:10])
        return "\n".join(lines)

    @property
    def failed_tasks(self) -> int:
        """Tasks that ended failed: the handlers never fail and MAX_ATTEMPTS is far more than
        the faults lose, so each one is a failure no handler reported."""
        return self.verdict.figures.get("tasks_failed", 0)

    @property
    def ok(self) -> bool:
        return (
            self.verdict.ok
            and self.settled
            and not self.refused
            and not self.worker_rejections
            and not self.failed_tasks
        )


@attrs.define(eq=False)
class Chaos:
    plan: ChaosPlan
    workdir: Path
    server: PrivateMariaDB
    proxies: list[FaultProxy]
    nodes: list[NodeProcess]
    token: str
    queue_id: str
    rng: random.Random
    log: ExecutionLog
    faults: Counter[str] = attrs.field(factory=Counter)
    slots: list[Slot] = attrs.field(factory=list)
    observations: list[Observation] = attrs.field(factory=list)
    worker_rejections: list[str] = attrs.field(factory=list)
    handlers_cut: int = 0
    worker_sessions: int = 0
    # The proxies in front of each node's Worker port (``conn_cut``).
    worker_proxies: list[FaultProxy] = attrs.field(factory=list)
    handlers_through: Counter[str] = attrs.field(factory=Counter)
    # (kind, start, end) of every fault, wall clock.
    windows: list[tuple[str, float, float]] = attrs.field(factory=list)

    # -- Workers

    def worker(self, slot: Slot) -> Worker:
        worker = Worker(
            url=slot.urls or slot.node.base_url,
            token=self.token,
            queues=[self.queue_id],
            capacity=self.plan.capacity,
            resource_keys=True,
            client_name=slot.name,
        )

        async def handle(task: WorkerTask) -> Any:
            start = slot.last_start = time.time()
            slot.busy += 1
            try:
                await trio.sleep(task.payload["run_s"])
            finally:
                slot.busy -= 1
                self.log.append(Execution(task.task_id, task.attempt, start, time.time(), slot.name, task.resource_key))
            return {"k": task.payload["k"]}

        worker.register(*HANDLER, handle)
        return worker

    async def serve(self, slot: Slot) -> None:
        """Keep a Worker running in ``slot``; a cut one is replaced at once."""
        while True:
            worker = slot.worker = self.worker(slot)
            slot.workers += 1
            try:
                with trio.CancelScope() as slot.scope:
                    try:
                        await worker.run()
                    except WorkerRejected as exc:
                        # The node refused a valid credential or hello: a finding of its own.
                        self.worker_rejections.append(f"{slot.name}: {exc}")
                        await trio.sleep(1.0)
            finally:
                self.worker_sessions += worker.connections

    # -- faults

    # Each fault returns what it did, for the fault log.

    async def node_kill(self) -> str:
        node = self.rng.choice(self.nodes)
        await node.kill()
        down = self.rng.uniform(0.5, 3.0)
        await trio.sleep(down)
        await node.start()
        return f"node{self.nodes.index(node)} down {down:.1f} s"

    async def node_stop(self) -> str:
        node = self.rng.choice(self.nodes)
        stopped = self.rng.uniform(2.0, self.plan.stop_max_s)
        node.pause()
        try:
            await trio.sleep(stopped)
        finally:
            node.resume()
        return f"node{self.nodes.index(node)} stopped {stopped:.1f} s"

    async def db_restart(self) -> str:
        crash = self.faults["db_restart"] % 2 == 0
        if crash:
            await self.server.kill9()
        else:
            await self.server.stop()
        await trio.sleep(self.rng.uniform(0.0, 1.5))
        await self.server.start()
        return "kill -9" if crash else "SIGTERM"

    async def db_stall(self) -> str:
        stalled = self.proxies if self.rng.random() < 0.3 else [self.rng.choice(self.proxies)]
        held = self.rng.uniform(1.0, self.plan.stall_max_s)
        for proxy in stalled:
            proxy.stall()
        try:
            await trio.sleep(held)
        finally:
            for proxy in stalled:
                proxy.heal()
        return f"{'+'.join(f'node{self.proxies.index(p)}' for p in stalled)} held {held:.1f} s"

    async def db_drop(self) -> str:
        proxy = self.rng.choice(self.proxies)
        black = 0.0
        if self.faults["db_drop"] % 2 == 1:
            black = self.rng.uniform(1.0, 3.0)
            proxy.blackhole(Direction.BOTH)
            await trio.sleep(black)
        reset = proxy.reset()
        proxy.heal()
        return f"node{self.proxies.index(proxy)} black-holed {black:.1f} s, {reset} connections reset"

    async def worker_cut(self) -> str:
        busy = [s for s in self.slots if s.busy and s.scope is not None]
        slot = self.rng.choice(busy or self.slots)
        self.handlers_cut += slot.busy
        if slot.scope is not None:
            slot.scope.cancel()
        return f"{slot.name} with {slot.busy} handlers running"

    @property
    def worker_urls(self) -> list[str]:
        """Each node's URL as its Workers reach it: through its proxy."""
        return [f"http://127.0.0.1:{p.port}" for p in self.worker_proxies]

    async def conn_cut(self) -> str:
        """Reset every Worker connection of one node (its handlers run on)."""
        urls = self.worker_urls
        busy = [urls.index(s.worker.url) for s in self.slots if s.busy and s.worker is not None]
        index = self.rng.choice(busy) if busy else self.rng.randrange(len(self.nodes))
        running = self._running_on(urls[index])
        self.handlers_through["conn_cut"] += running
        reset = self.worker_proxies[index].reset()
        return f"node{index}: {reset} Worker connections reset, {running} handlers running"

    async def node_drain(self) -> str:
        """A rolling restart of one node: SIGTERM, then a new process."""
        node = self.rng.choice([n for n in self.nodes if n.running] or self.nodes)
        index = self.nodes.index(node)
        running = self._running_on(self.worker_urls[index])
        self.handlers_through["node_drain"] += running
        code = await node.terminate()
        down = self.rng.uniform(0.2, 2.0)
        await trio.sleep(down)
        await node.start()
        return f"node{index} drained (exit {code}), down {down:.1f} s, {running} handlers of its Workers running"

    def _running_on(self, url: str) -> int:
        """Handlers running in the Workers connected to (or about to try) ``url``."""
        return sum(s.busy for s in self.slots if s.worker is not None and s.worker.url == url)

    def reruns(self) -> Counter[str]:
        """Tasks run more than once, by the fault whose window holds the end of the earlier
        run ("none" when no fault's does)."""
        runs: dict[str, list[Execution]] = {}
        for execution in ExecutionLog.read(self.log.path):
            runs.setdefault(execution.task_id, []).append(execution)
        found: Counter[str] = Counter()
        for executions in runs.values():
            executions.sort(key=lambda e: e.start)
            for earlier in executions[:-1]:
                kinds = [k for k, start, end in self.windows if start <= earlier.end <= end + RERUN_WINDOW_S]
                found[kinds[-1] if kinds else "none"] += 1
        return found

    async def schedule(self, until: float) -> None:
        """Faults one at a time until ``until`` (trio time); rotating, at least one of each kind."""
        order = list(self.plan.faults)
        self.rng.shuffle(order)
        for n in itertools.count():
            gap = self.rng.uniform(*self.plan.gap_s)
            rotated = not self.plan.rotate or n >= len(order)
            if rotated and trio.current_time() + gap >= until:
                await trio.sleep_until(until)
                return
            await trio.sleep(gap)
            kind = order[n % len(order)] if self.plan.rotate else self.rng.choice(self.plan.faults)
            began = time.time()
            what = await getattr(self, kind)()
            self.faults[kind] += 1
            self.windows.append((kind, began, time.time()))
            with (self.workdir / "faults.jsonl").open("a") as out:
                out.write(json.dumps({"fault": kind, "what": what, "start": began, "end": time.time()}) + "\n")

    # -- the watcher

    async def watch(self, db: Database) -> None:
        """Record each task's state whenever it is seen to change."""
        last: dict[str, tuple[str, float | None]] = {}
        since = datetime(2000, 1, 1)
        while True:
            # Before the read: what it returns is the database's state at this moment or later.
            seen_at = time.time()
            try:
                found = await db.run(functools.partial(_changed_since, since))
            except OrbitError:
                found = None  # the server is down or restarting: read again next time
            if found:
                for row in found:
                    value = (row["state"], epoch(row["finished_at"]))
                    if last.get(row["task_id"]) != value:
                        last[row["task_id"]] = value
                        self.observations.append(Observation(row["task_id"], *value, seen_at))
                since = max(r["now"] for r in found) - timedelta(seconds=WATCH_MARGIN_S)
            await trio.sleep(WATCH_INTERVAL_S)

    # -- the end

    async def settle(self, db: Database, load: Load) -> bool:
        """Wait until every submit is answered and every task is terminal (bounded)."""
        deadline = trio.current_time() + self.plan.settle_s
        while trio.current_time() < deadline:
            if load.in_flight == 0:
                try:
                    found = await db.run(
                        lambda tx: tx.fetchall_raw(
                            "SELECT COUNT(*) AS n FROM tasks WHERE state NOT IN %s", (tuple(TERMINAL),)
                        )
                    )
                    if found[0]["n"] == 0:
                        return True
                except OrbitError:
                    pass
            await trio.sleep(0.5)
        return False

    async def post_mortem(self, db: Database, http: httpx.AsyncClient) -> Path:
        """What the nodes, the Workers and the database say about the tasks that did not settle."""
        stuck = await db.run(
            lambda tx: tx.fetchall_raw(
                "SELECT task_id, state, priority, resource_key, attempts, available_at, dispatch_at, reserved_at,"
                " lease_expires_at, owner_node_id, connection_id, NOW(6) AS now FROM tasks WHERE state NOT IN %s"
                " ORDER BY dispatch_at LIMIT 50",
                (tuple(TERMINAL),),
            )
        )
        states = await db.run(lambda tx: tx.fetchall_raw("SELECT state, COUNT(*) AS n FROM tasks GROUP BY state"))
        keys = await db.run(lambda tx: tx.fetchall_raw("SELECT * FROM resource_keys WHERE holder_task_id IS NOT NULL"))
        registry = await db.run(lambda tx: tx.fetchall_raw("SELECT * FROM worker_connections"))
        explained = {}
        for row in stuck[:5]:
            for node in self.nodes:
                try:
                    response = await http.get(
                        f"{node.base_url}/v1/tasks/{row['task_id']}/explain",
                        headers={"Authorization": f"Bearer {self.token}"},
                    )
                    explained[f"{row['task_id']} via {node.base_url}"] = response.json()
                except (httpx.TransportError, ValueError) as exc:
                    explained[f"{row['task_id']} via {node.base_url}"] = repr(exc)
        slots = [
            {
                "slot": s.name,
                "node": s.node.base_url,
                "node_running": s.node.running,
                "workers": s.workers,
                "sessions_of_current": s.worker.connections if s.worker else None,
                "busy": s.busy,
                "last_start_s_ago": time.time() - s.last_start if s.last_start else None,
            }
            for s in self.slots
        ]
        path = self.workdir / "unsettled.json"
        document = {"states": states, "slots": slots, "stuck": stuck, "held_keys": keys, "connections": registry}
        path.write_text(json.dumps({**document, "explain": explained}, indent=2, default=str))
        return path

    async def history(self, db: Database, acknowledged: dict[str, str]) -> History:
        tasks = await db.run(
            lambda tx: tx.fetchall_raw("SELECT task_id, state, finished_at, resource_key, payload FROM tasks")
        )
        edges = await db.run(lambda tx: tx.fetchall_raw("SELECT child_task_id, parent_task_id FROM task_parents"))
        parents: dict[str, list[str]] = {}
        for edge in edges:
            parents.setdefault(edge["child_task_id"], []).append(edge["parent_task_id"])
        attempts = await db.run(
            lambda tx: tx.fetchall_raw(
                "SELECT task_id, attempt, fencing_token, reserved_at, started_at, finished_at, outcome"
                " FROM task_attempts"
            )
        )
        return History(
            acknowledged=dict(acknowledged),
            executions=ExecutionLog.read(self.log.path),
            observations=list(self.observations),
            tasks=[
                Task(
                    t["task_id"],
                    json.loads(t["payload"])["k"],
                    t["state"],
                    epoch(t["finished_at"]),
                    t["resource_key"],
                    tuple(sorted(parents.get(t["task_id"], ()))),
                )
                for t in tasks
            ],
            reservation_lease_s=float(NODE_ENV["ORBIT_RESERVATION_LEASE_S"]),
            run_lease_s=float(NODE_ENV["ORBIT_RUN_LEASE_S"]),
            attempts=[
                Attempt(
                    a["task_id"],
                    a["attempt"],
                    a["fencing_token"],
                    epoch(a["reserved_at"]) or 0.0,
                    epoch(a["started_at"]),
                    epoch(a["finished_at"]),
                    a["outcome"],
                )
                for a in attempts
            ],
        )


async def run_chaos(plan: ChaosPlan, workdir: Path) -> ChaosResult:
    """Run ``plan`` with its files (server datadir, node logs, the execution log) under ``workdir``."""
    started = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    server = PrivateMariaDB()
    await server.start()
    db = Database(server.dsn(), size=3, connect_timeout_s=2, operation_timeout_s=20)
    try:
        await migrate.up(db)
        version = (await db.run(lambda tx: tx.fetchall_raw("SELECT VERSION() AS v")))[0]["v"]
        tenant = await make_tenant(db, "chaos")
        async with AsyncExitStack() as stack:
            proxies = await stack.enter_async_context(_proxies([server.port] * plan.nodes))
            nodes = [
                NodeProcess(proxy.dsn_for(server.dsn()), workdir / f"node{i}.log", env=NODE_ENV)
                for i, proxy in enumerate(proxies)
            ]
            worker_proxies = await stack.enter_async_context(_proxies([node.port for node in nodes]))
            chaos = Chaos(
                plan,
                workdir,
                server,
                proxies,
                nodes,
                tenant.token,
                tenant.queue_id,
                random.Random(plan.seed),
                ExecutionLog(workdir / "executions.jsonl"),
                worker_proxies=worker_proxies,
            )
            try:
                for node in nodes:
                    await node.start()
                load = Load(nodes, tenant.queue_id, tenant.token, random.Random(plan.seed + 1), chaos.observations)
                settled, settle_seconds = await _run(chaos, load, db)
                history = await chaos.history(db, load.acknowledged)
            finally:
                for node in nodes:
                    with trio.CancelScope(shield=True):
                        await node.aclose()
        return ChaosResult(
            plan=plan,
            faults=chaos.faults,
            verdict=check(history),
            seconds=time.monotonic() - started,
            settled=settled,
            settle_seconds=settle_seconds,
            submitted=load.submitted,
            submit_retries=load.retries,
            refused=load.refused,
            worker_sessions=chaos.worker_sessions,
            worker_rejections=chaos.worker_rejections,
            handlers_cut=chaos.handlers_cut,
            workdir=workdir,
            server_version=version,
            handlers_through=chaos.handlers_through,
            reruns=chaos.reruns(),
        )
    finally:
        with trio.CancelScope(shield=True):
            await db.aclose()
            await server.stop()
        server.remove()


async def _run(chaos: Chaos, load: Load, db: Database) -> tuple[bool, float]:
    plan = chaos.plan
    stop = trio.Event()
    async with httpx.AsyncClient(timeout=SUBMIT_TIMEOUT_S) as http, trio.open_nursery() as nursery:
        nursery.start_soon(chaos.watch, db)
        urls = chaos.worker_urls
        for index, node in enumerate(chaos.nodes):
            for i in range(plan.workers_per_node):
                slot = Slot(f"node{index}-w{i}", node, urls[index:] + urls[:index])
                chaos.slots.append(slot)
                nursery.start_soon(chaos.serve, slot)
        async with trio.open_nursery() as faulted:
            faulted.start_soon(load.run, http, nursery, plan.submits_per_s, stop)
            # The last fault ends (and heals) before the schedule returns.
            await chaos.schedule(trio.current_time() + plan.seconds)
            stop.set()
        calm = trio.current_time()
        settled = await chaos.settle(db, load)
        if not settled:
            await chaos.post_mortem(db, http)
        nursery.cancel_scope.cancel()
    return settled, trio.current_time() - calm


async def _changed_since(since: datetime, tx: Tx) -> list[dict[str, Any]]:
    return await tx.fetchall_raw(
        "SELECT task_id, state, finished_at, NOW(6) AS now FROM tasks WHERE updated_at >= %s", (since,)
    )


@asynccontextmanager
async def _proxies(ports: Sequence[int]) -> AsyncIterator[list[FaultProxy]]:
    """A fault proxy to each of 127.0.0.1's ``ports``."""
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(open_fault_proxy("127.0.0.1", port)) for port in ports]
