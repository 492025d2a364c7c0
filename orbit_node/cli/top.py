"""``orbit-admin top``: a live view of queues, backlog per priority, running per application,
claim turns per application (with each application's fairness weight, its share of the
turns and the share its weight gives it) and Worker connections per application (with its
limit per node), refreshed every second.

Everything comes from the database, so one view covers every node behind a load
balancer: backlogs and running tasks from ``tasks``, claim turns from ``claim_turns``
(each node writes its cumulative counters there about once a second; see
``orbit_node.dispatch.turns.TurnRecorder``). Turns per second are the difference between two
frames. The frame pacing runs on trio's clock (``refresh_loop``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ..api.console.model import weight_of, weight_shares
from ..store.operations import OperationsStore, QueueBacklog

# Priority levels of P3 (0-9), highest first in the view.
PRIORITY_LEVELS = tuple(range(9, -1, -1))


@attrs.frozen(kw_only=True)
class TopSnapshot:
    # trio time the snapshot was taken (rates are computed between two snapshots).
    taken_at: float
    queues: list[QueueBacklog]
    applications: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    # (node_id, application_id) -> cumulative turns of live nodes.
    node_turns: dict[tuple[str, str], int]
    # Fairness weight of every application with turns (listed or not).
    weights: dict[str, int] = attrs.field(factory=dict)

    def turns_by_application(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for (_, application_id), turns in self.node_turns.items():
            totals[application_id] = totals.get(application_id, 0) + turns
        return totals

    def shares(self) -> dict[str, tuple[float, float | None]]:
        """Per application with claim turns on live nodes (shown or not): its share of their
        turns and the share its weight gives it among them (weight over the sum of their weights)."""
        totals = {app: n for app, n in self.turns_by_application().items() if n > 0}
        grand = sum(totals.values())
        given = weight_shares({app: self.weights.get(app, 1) for app in totals}, node_wide=True)
        return {app: (n / grand, given[app]) for app, n in totals.items()}

    def turn_rates(self, previous: TopSnapshot | None) -> dict[str, float] | None:
        """Turns per second per application since ``previous`` (None for the first frame).

        Only counters present in both frames count: a node that started or stopped in
        between contributes nothing rather than a jump."""
        if previous is None or self.taken_at <= previous.taken_at:
            return None
        elapsed = self.taken_at - previous.taken_at
        rates: dict[str, float] = {}
        for key, turns in self.node_turns.items():
            before = previous.node_turns.get(key)
            if before is not None:
                rates[key[1]] = rates.get(key[1], 0.0) + max(turns - before, 0) / elapsed
        return rates

    def as_json(self, previous: TopSnapshot | None = None) -> dict[str, Any]:
        totals = self.turns_by_application()
        rates = self.turn_rates(previous) or {}
        shares = self.shares()
        return {
            "queues": [q.as_json() for q in self.queues],
            "applications": [
                {
                    **app,
                    "claim_turns": totals.get(app["application_id"], 0),
                    "claim_turns_per_s": round(rates[app["application_id"]], 3)
                    if app["application_id"] in rates
                    else None,
                    "claim_turn_share": _rounded(shares, app["application_id"], 0),
                    "weight_share": _rounded(shares, app["application_id"], 1),
                }
                for app in self.applications
            ],
            "nodes": self.nodes,
        }


async def take_snapshot(
    store: OperationsStore, *, application: str | None = None, namespace: str | None = None
) -> TopSnapshot:
    queues = await store.queue_backlogs(application=application, namespace=namespace)
    applications = await store.applications(application)
    turns = await store.live_turns()
    nodes = await store.live_nodes()
    return TopSnapshot(
        taken_at=trio.current_time(),
        queues=queues,
        applications=applications,
        nodes=nodes,
        node_turns={(r["node_id"], r["application_id"]): int(r["turns"]) for r in turns},
        weights={r["application_id"]: weight_of(r) for r in turns},
    )


def _rounded(shares: dict[str, tuple[float, float | None]], application_id: str, which: int) -> float | None:
    share = shares.get(application_id, (None, None))[which]
    return None if share is None else round(share, 4)


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f} %"


def render(snapshot: TopSnapshot, previous: TopSnapshot | None = None) -> Group:
    """The frame: applications, queues with backlog per priority, live nodes."""
    totals = snapshot.turns_by_application()
    rates = snapshot.turn_rates(previous)
    shares = snapshot.shares()

    apps = Table(title="applications", title_justify="left", expand=False)
    for column in (
        "application",
        "state",
        "quota conc/starts",
        "queued",
        "reserved",
        "running",
        "weight",
        "claim turns",
        "turns/s",
        "turn share",
        "weight's share",
        "submits/s",
        "workers",
        "max workers/node",
    ):
        apps.add_column(column, justify="left" if column in ("application", "state") else "right")
    for app in snapshot.applications:
        rate = "-" if rates is None else f"{rates.get(app['application_id'], 0.0):.1f}"
        share, given = shares.get(app["application_id"], (None, None))
        apps.add_row(
            app["application"],
            Text("suspended", style="bold red") if app["suspended"] else Text("active"),
            f"{_limit(app['max_concurrent_executions'])}/{_limit(app['max_starts_per_second'])}",
            str(app["queued"]),
            str(app["reserved"]),
            str(app["running"]),
            str(app["fairness_weight"]),
            str(totals.get(app["application_id"], 0)),
            rate,
            _percent(share),
            _percent(given),
            _limit(app["submits_per_second"]),
            str(app["worker_connections"]),
            _limit(app["max_worker_connections"]),
        )

    queues = Table(title="queues (queued backlog per priority level)", title_justify="left", expand=False)
    for column in ("application", "namespace", "queue", "due", "later", "reserved", "running"):
        queues.add_column(column, justify="left" if column in ("application", "namespace", "queue") else "right")
    for level in PRIORITY_LEVELS:
        queues.add_column(f"p{level}", justify="right")
    for q in snapshot.queues:
        name = Text(q.name + (" (paused)" if q.paused else ""), style="yellow" if q.paused else "")
        queues.add_row(
            q.application,
            q.namespace,
            name,
            str(q.due),
            str(q.queued - q.due),
            str(q.reserved),
            str(q.running),
            *(str(q.queued_by_priority.get(level, "")) for level in PRIORITY_LEVELS),
        )

    nodes = Table(title="live nodes", title_justify="left", expand=False)
    for column in ("node", "host", "address", "version", "connections", "heartbeat age s"):
        nodes.add_column(column, justify="right" if column in ("connections", "heartbeat age s") else "left")
    for node in snapshot.nodes:
        nodes.add_row(
            node["node_id"][:12],
            node["hostname"],
            node["http_addr"],
            node["version"],
            str(node["connections"]),
            f"{node['heartbeat_age_s']:.1f}",
        )
    return Group(apps, queues, nodes)


async def refresh_loop(step: Callable[[], Awaitable[None]], *, interval_s: float, iterations: int | None) -> int:
    """Run ``step`` every ``interval_s`` on trio's clock, ``iterations`` times (None: forever).

    Frames keep their schedule; a step that overruns its interval is followed at once by
    the next one (never a burst of late frames). Returns the number of steps run."""
    done = 0
    next_at = trio.current_time()
    while True:
        await step()
        done += 1
        if iterations is not None and done >= iterations:
            return done
        next_at = max(next_at + interval_s, trio.current_time())
        await trio.sleep_until(next_at)


async def run_top(
    store: OperationsStore,
    console: Console,
    *,
    interval_s: float,
    iterations: int | None,
    as_json: bool,
    application: str | None = None,
    namespace: str | None = None,
    print_line: Callable[[str], None] = print,
) -> int:
    """Refresh the view until ``iterations`` frames were shown (forever when None)."""
    import json

    previous: list[TopSnapshot] = []
    live = None
    if not as_json and console.is_terminal and iterations != 1:
        from rich.live import Live

        live = Live(console=console, auto_refresh=False, screen=False)
        live.start()

    async def step() -> None:
        snapshot = await take_snapshot(store, application=application, namespace=namespace)
        before = previous[-1] if previous else None
        if as_json:
            print_line(json.dumps(snapshot.as_json(before), sort_keys=True, default=str))
        elif live is not None:
            live.update(render(snapshot, before), refresh=True)
        else:
            console.print(render(snapshot, before))
        previous[:] = [snapshot]

    try:
        return await refresh_loop(step, interval_s=interval_s, iterations=iterations)
    finally:
        if live is not None:
            live.stop()
