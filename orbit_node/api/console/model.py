"""What the console's panels show, computed from repository rows: pure, no I/O.

Visibility is decided here from the principal's grants, the same way the API decides it:
``tasks:read`` for a queue shows that queue's backlog, tasks, plans and the Workers serving
it; ``metrics:read`` (node-wide) shows every application's claim turns, as ``/metrics`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import attrs

from ...domain.task_query import TaskFilter
from ...workers.slots import fair_shares

# Priority levels of P3, highest first (the order claims take them in).
PRIORITY_LEVELS = tuple(range(9, -1, -1))
# Height in pixels of the tallest bar of a queue's priority chart.
BAR_HEIGHT = 40


@attrs.frozen
class Bar:
    """One priority level of a queue's queued backlog."""

    level: int
    count: int
    # 0..BAR_HEIGHT, relative to the queue's largest level (a level with tasks is at least 1).
    height: int


def priority_bars(queued_by_priority: Mapping[int, int]) -> list[Bar]:
    """Bars for levels 9..0; the tallest level fills BAR_HEIGHT."""
    top = max(queued_by_priority.values(), default=0)
    bars = []
    for level in PRIORITY_LEVELS:
        count = int(queued_by_priority.get(level, 0))
        height = 0 if top == 0 or count == 0 else max(1, round(BAR_HEIGHT * count / top))
        bars.append(Bar(level, count, height))
    return bars


def duration(seconds: float | None) -> str:
    """A short human duration: ``850 ms``, ``42 s``, ``3 min 5 s``, ``2 h 10 min``, ``3 d 4 h``."""
    if seconds is None:
        return "-"
    if seconds < 0:
        return "-" + duration(-seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def limit(value: int | None) -> str:
    return "unlimited" if value is None else str(value)


def weight_of(row: Mapping[str, Any]) -> int:
    """The fairness weight of a row's application (1 when the application row is gone)."""
    return int(row.get("fairness_weight") or 1)


def weight_shares(weights: Mapping[str, int], *, node_wide: bool) -> dict[str, float | None]:
    """The share of the turns each application's weight gives it among ``weights``' applications
    (weight / the sum of their weights): what its share of the turns is while every one of them
    asks all the time. None for each when other applications are hidden."""
    total = sum(weights.values())
    return {app: (weight / total if total else 0.0) if node_wide else None for app, weight in weights.items()}


@attrs.frozen(kw_only=True)
class ApplicationTurns:
    application_id: str
    application: str
    # Cumulative claim turns over the live nodes that record them.
    turns: int
    nodes: int
    # Share of all visible turns (None when other applications are hidden).
    share: float | None
    # The application's fairness weight (applications.fairness_weight, as set now).
    weight: int = 1
    # The share of the turns its weight gives it among the applications listed (None when
    # other applications are hidden).
    weight_share: float | None = None


# Minutes of claim-turn history the fairness panel draws.
HISTORY_MINUTES = 15
# The history chart's drawing area inside its 640 x 220 viewBox.
CHART_LEFT, CHART_RIGHT, CHART_TOP, CHART_BOTTOM = 44.0, 630.0, 12.0, 190.0
# Distinct line colours (console.css colours data-colour 0..7).
COLOURS = 8


@attrs.frozen(kw_only=True)
class TurnSeries:
    """One application's claim turns per minute, as an SVG polyline."""

    application_id: str
    application: str
    colour: int
    # "x,y x,y ..." in the chart's viewBox, oldest minute first.
    points: str
    # Turns in the window, and the share of all visible turns in it (None: others hidden).
    total: int
    share: float | None
    # Its fairness weight, and the share of the turns that gives it among the applications
    # drawn (None: others hidden).
    weight: int = 1
    weight_share: float | None = None


@attrs.frozen(kw_only=True)
class TurnHistory:
    minutes: int
    # The most turns one application had in one minute (the top of the y axis).
    peak: int
    series: list[TurnSeries]
    # The drawing area inside the chart's viewBox.
    left: float = CHART_LEFT
    right: float = CHART_RIGHT
    top: float = CHART_TOP
    bottom: float = CHART_BOTTOM


def turn_history(
    rows: Iterable[Mapping[str, Any]],
    *,
    own_application_id: str,
    node_wide: bool,
    minutes: int = HISTORY_MINUTES,
) -> TurnHistory:
    """Turns per application and minute (``claim_turn_minutes`` summed over nodes) for the
    last ``minutes`` minutes, the current one included, as chart lines; visibility as in
    ``application_turns``."""
    buckets: dict[str, list[int]] = {}
    names: dict[str, str] = {}
    weights: dict[str, int] = {}
    for row in rows:
        application_id = row["application_id"]
        if not node_wide and application_id != own_application_id:
            continue
        ago = int((row["current_minute"] - row["minute"]).total_seconds() // 60)
        if not 0 <= ago <= minutes:
            continue
        names[application_id] = row.get("application") or application_id
        weights[application_id] = weight_of(row)
        buckets.setdefault(application_id, [0] * (minutes + 1))[minutes - ago] += int(row["turns"])
    peak = max((n for counts in buckets.values() for n in counts), default=0)
    grand = sum(sum(counts) for counts in buckets.values())
    step = (CHART_RIGHT - CHART_LEFT) / minutes
    series = []
    given = weight_shares(weights, node_wide=node_wide)
    ordered = sorted(buckets, key=lambda a: (names[a], a))
    for index, application_id in enumerate(ordered):
        counts = buckets[application_id]
        points = " ".join(
            f"{CHART_LEFT + i * step:.1f},{CHART_BOTTOM - (n / peak if peak else 0) * (CHART_BOTTOM - CHART_TOP):.1f}"
            for i, n in enumerate(counts)
        )
        total = sum(counts)
        series.append(
            TurnSeries(
                application_id=application_id,
                application=names[application_id],
                colour=index % COLOURS,
                points=points,
                total=total,
                share=(total / grand if grand else 0.0) if node_wide else None,
                weight=weights[application_id],
                weight_share=given[application_id],
            )
        )
    return TurnHistory(minutes=minutes, peak=peak, series=series)


def application_turns(
    rows: Iterable[Mapping[str, Any]], *, own_application_id: str, node_wide: bool
) -> list[ApplicationTurns]:
    """Claim turns per application from ``claim_turns`` rows of live nodes.

    ``node_wide`` (``metrics:read``): every application with its share of all turns and
    the share its weight gives it. Otherwise only the principal's own application, without
    shares: the total would tell how busy the other tenants are."""
    totals: dict[str, list[Any]] = {}
    for row in rows:
        application_id = row["application_id"]
        if not node_wide and application_id != own_application_id:
            continue
        entry = totals.setdefault(application_id, [row.get("application") or application_id, 0, 0, weight_of(row)])
        entry[1] += int(row["turns"])
        entry[2] += 1
    grand = sum(entry[1] for entry in totals.values())
    given = weight_shares({app: entry[3] for app, entry in totals.items()}, node_wide=node_wide)
    result = [
        ApplicationTurns(
            application_id=application_id,
            application=name,
            turns=turns,
            nodes=nodes,
            share=(turns / grand if grand else 0.0) if node_wide else None,
            weight=weight,
            weight_share=given[application_id],
        )
        for application_id, (name, turns, nodes, weight) in totals.items()
    ]
    return sorted(result, key=lambda a: (a.application, a.application_id))


@attrs.frozen(kw_only=True)
class NodeTurns:
    """One live node's claim turns per application (since the node started)."""

    node_id: str
    applications: list[ApplicationTurns]


def node_turns(rows: Iterable[Mapping[str, Any]], *, own_application_id: str, node_wide: bool) -> list[NodeTurns]:
    """``application_turns`` of each live node on its own, in the order of ``rows``: each
    node rotates on its own, so each node's shares are set against the weights there."""
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_node.setdefault(row["node_id"], []).append(row)
    nodes = []
    for node_id, node_rows in by_node.items():
        applications = application_turns(node_rows, own_application_id=own_application_id, node_wide=node_wide)
        if applications:
            nodes.append(NodeTurns(node_id=node_id, applications=applications))
    return nodes


@attrs.frozen
class ApplicationSlots:
    """One application's Worker connections on this node (``WorkerHub.held``)."""

    application_id: str
    application: str
    connections: int
    weight: int
    # Its fair share of the node's slots once the node is full, among the applications
    # connected and the principal's own (None when other applications are hidden).
    share: float | None


def connection_slots(
    held: Mapping[str, int],
    *,
    slots: int,
    names: Mapping[str, str],
    weight: Callable[[str], int],
    own_application_id: str,
    own_application: str,
    node_wide: bool,
) -> list[ApplicationSlots]:
    """Worker connections per application on this node. ``node_wide`` (``metrics:read``):
    every application with its fair share (``workers/slots.py``); otherwise the principal's
    own application only, without its share (which would tell the others' weights)."""
    holders = {app for app, count in held.items() if count > 0} | {own_application_id}
    shares = fair_shares(slots, holders, weight)
    shown = holders if node_wide else {own_application_id}
    rows = [
        ApplicationSlots(
            application_id=app,
            application=own_application if app == own_application_id else names.get(app, app),
            connections=held.get(app, 0),
            weight=weight(app),
            share=shares[app] if node_wide else None,
        )
        for app in shown
    ]
    return sorted(rows, key=lambda row: (-row.connections, row.application, row.application_id))


def visible_workers(
    workers: Iterable[Mapping[str, Any]],
    *,
    readable: Sequence[str] | None,
    queue_names: Mapping[str, str],
) -> list[dict[str, Any]]:
    """Worker connections serving a queue the principal reads, grouped by node.

    ``readable`` None: every queue of the namespace. A connection shows only the queues
    the principal reads, and the capacity its hello announced (from the registry, so for
    every node's connections alike)."""
    nodes: dict[str, dict[str, Any]] = {}
    for worker in workers:
        served = [q for q in worker["queues"] if readable is None or q in readable]
        if not served:
            continue
        node = nodes.setdefault(
            worker["node_id"],
            {
                "node_id": worker["node_id"],
                "hostname": worker["hostname"],
                "http_addr": worker["http_addr"],
                "connections": [],
            },
        )
        node["connections"].append(
            {
                **worker,
                "queues": [{"queue_id": q, "name": queue_names.get(q, q)} for q in served],
            }
        )
    return list(nodes.values())


class OfQueue(Protocol):
    @property
    def queue_id(self) -> str: ...


Q = TypeVar("Q", bound=OfQueue)


def by_queue(items: Iterable[Q]) -> dict[str, list[Q]]:
    """Items grouped by their queue id, in their order."""
    grouped: dict[str, list[Q]] = {}
    for item in items:
        grouped.setdefault(item.queue_id, []).append(item)
    return grouped


def filter_times(found: TaskFilter) -> dict[str, str]:
    """The filter's times as ``datetime-local`` inputs show them (UTC, to the second)."""
    times = {}
    for name in ("created_after", "created_before", "finished_after", "finished_before"):
        value = getattr(found, name)
        if value is not None:
            times[name] = value.strftime("%Y-%m-%dT%H:%M:%S")
    return times
