"""Prometheus metrics of a node: its registry, the hooks that feed it, and the values
read at scrape time.

Every node has its own ``CollectorRegistry`` (never the library's global one), so several
nodes in one process (tests, benchmarks) keep separate counts. Two kinds of metrics:

* instruments updated as things happen, through small hooks: claim latency
  (``ClaimPool.observe``), the wait of a claim request for its turn per application
  (``ClaimPool.observe_wait``), dispatch -> Start latency (the Worker hub), HTTP requests (the
  app), database replays (``Database.on_replay``);
* values the node already keeps, read when scraped (``NodeCollector``): connections,
  claim requests pending / in flight, SQL slots, claims by outcome, claim turns per
  application, tasks dispatched and finished, leases recovered, the database pool.

How ``/metrics`` is served (open, with a credential, or not at all) is the API's
business: ``orbit_node.api.metrics``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import attrs
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from . import __version__
from .db import Database
from .dispatch.claim_pool import ClaimPool
from .dispatch.pruner import Pruner
from .dispatch.recovery import Sweeper
from .dispatch.scheduler import Grant
from .dispatch.signals import SignalRelay
from .dispatch.waits import TaskWaits
from .group_commit.transitions import GroupCommitter
from .store.pruning import PRUNED_TABLES
from .workers.hub import WorkerHub

# Claim SQL takes milliseconds; a slow one is a lock wait or a sick database.
CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# From the dispatch frame leaving the node to the Worker's Start arriving: network round
# trip plus the Worker's own queueing.
START_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# From a claim request entering the fair pool to its grant: nothing while the pool has room,
# up to about a scan cycle (1 s) for a paced-out request, longer when the pool is saturated.
TURN_WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# RecoveryStats fields, one label value each.
# orbit_signals{event}: the event, and the field of RelayStatistics that counts it.
SIGNAL_EVENTS = (
    ("written", "published"),
    ("write_failed", "publish_failures"),
    ("dropped", "dropped"),
    ("heard", "heard"),
    ("queue_woken", "woken"),
    ("due_set", "due"),
    ("cancel_pushed", "cancels_pushed"),
    ("finished_heard", "finished_heard"),
)
RECOVERY_OUTCOMES = ("requeued", "retried", "failed", "cancelled", "expired")
# Methods counted under their own name; any other (a client may send anything) is "other".
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


@attrs.define(eq=False)
class NodeMetrics:
    """One node's registry and the hooks that feed it."""

    node_id: str
    db: Database
    registry: CollectorRegistry = attrs.field(factory=CollectorRegistry, init=False)
    # Application id -> name, learnt from the credentials of connections (turn labels).
    application_names: dict[str, str] = attrs.field(factory=dict, init=False)
    claim_seconds: Histogram = attrs.field(init=False)
    claim_turn_wait_seconds: Histogram = attrs.field(init=False)
    dispatch_to_start_seconds: Histogram = attrs.field(init=False)
    http_requests: Counter = attrs.field(init=False)
    http_seconds: Histogram = attrs.field(init=False)
    db_replays: Counter = attrs.field(init=False)
    requests_refused: Counter = attrs.field(init=False)
    admission_wait_seconds: Histogram = attrs.field(init=False)
    # Application name -> its admission wait histogram's child (looked up once each).
    _admission_children: dict[str, Histogram] = attrs.field(factory=dict, init=False)
    # (method, route, status) -> the request counter's and (method, route) histogram's
    # children: bounded by methods x routes x statuses, looked up once each.
    _http_children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self):
        r = self.registry
        self.claim_seconds = Histogram(
            "orbit_claim_duration_seconds",
            "Claim transactions by outcome (tasks, empty, error), seconds.",
            ["outcome"],
            buckets=CLAIM_BUCKETS,
            registry=r,
        )
        self.claim_turn_wait_seconds = Histogram(
            "orbit_claim_turn_wait_seconds",
            "From a claim request entering this node's fair pool to its turn (the grant), per application, seconds.",
            ["application"],
            buckets=TURN_WAIT_BUCKETS,
            registry=r,
        )
        self.dispatch_to_start_seconds = Histogram(
            "orbit_dispatch_to_start_seconds",
            "From sending a dispatch to the Worker's accepted Start, seconds.",
            buckets=START_BUCKETS,
            registry=r,
        )
        self.http_requests = Counter(
            "orbit_http_requests",
            "HTTP requests by method, route template and status.",
            ["method", "route", "status"],
            registry=r,
        )
        self.http_seconds = Histogram(
            "orbit_http_request_duration_seconds",
            "HTTP request handling time by method and route template, seconds.",
            ["method", "route"],
            registry=r,
        )
        self.db_replays = Counter(
            "orbit_db_replays",
            "Transactions replayed after a deadlock or lock-wait error, by MySQL errno.",
            ["errno"],
            registry=r,
        )
        self.requests_refused = Counter(
            "orbit_requests_refused",
            "Submissions refused by a limit of their application, by application (name) and reason "
            "(submit_rate: the submit rate limit, a batch item counts one; admission: a request refused "
            "by the node's fair admission, saturated, the application over its share).",
            ["application", "reason"],
            registry=r,
        )
        self.admission_wait_seconds = Histogram(
            "orbit_request_admission_wait_seconds",
            "From an authenticated request asking for its turn on this node (fair admission) to its "
            "handler starting, per application (name), seconds; 0 when it did not wait.",
            ["application"],
            buckets=TURN_WAIT_BUCKETS,
            registry=r,
        )
        for outcome in ("tasks", "empty", "error"):
            self.claim_seconds.labels(outcome)
        ProcessCollector(registry=r)

    def collect_from(
        self,
        *,
        hub: WorkerHub | None,
        pool: ClaimPool | None,
        sweepers: Sequence[Sweeper] = (),
        commits: Sequence[GroupCommitter] = (),
        databases: Sequence[Database] = (),
        signals: Sequence[SignalRelay] = (),
        pruners: Sequence[Pruner] = (),
        waits: Sequence[TaskWaits] = (),
    ) -> None:
        """Read the node's services at every scrape (called once, when the node is built).

        A node with several shards has a sweeper, a group commit and a database per shard:
        their figures are summed (``databases`` defaults to the node's own)."""
        self.registry.register(
            NodeCollector(self, hub, pool, sweepers, commits, databases or (self.db,), signals, pruners, waits)
        )

    # -- hooks ---------------------------------------------------------------------------

    def observe_claim(self, grant: Grant, outcome: str, seconds: float) -> None:
        self.claim_seconds.labels(outcome).observe(seconds)

    def observe_turn_wait(self, grant: Grant, seconds: float) -> None:
        application_id = grant.request.application_id
        application = self.application_names.get(application_id, application_id)
        self.claim_turn_wait_seconds.labels(application).observe(max(seconds, 0.0))

    def observe_start(self, seconds: float) -> None:
        self.dispatch_to_start_seconds.observe(max(seconds, 0.0))

    def observe_replay(self, errno: int) -> None:
        self.db_replays.labels(str(errno)).inc()

    def observe_http(self, method: str, route: str, status: int, seconds: float) -> None:
        method = method if method in HTTP_METHODS else "other"
        children = self._http_children.get((method, route, status))
        if children is None:
            children = self._http_children[(method, route, status)] = (
                self.http_requests.labels(method, route, str(status)),
                self.http_seconds.labels(method, route),
            )
        children[0].inc()
        children[1].observe(max(seconds, 0.0))

    def note_application(self, application_id: str, name: str) -> None:
        self.application_names[application_id] = name

    def observe_refused(self, application_id: str, name: str, reason: str, count: int = 1) -> None:
        """``count`` submissions of the application refused for ``reason`` (``submit_rate``)."""
        self.note_application(application_id, name)
        self.requests_refused.labels(name, reason).inc(count)

    # -- exposure ------------------------------------------------------------------------

    def observe_admission_wait(self, application: str, seconds: float) -> None:
        child = self._admission_children.get(application)
        if child is None:
            child = self._admission_children[application] = self.admission_wait_seconds.labels(application)
        child.observe(seconds)

    def observe_admission_refused(self, application: str) -> None:
        self.requests_refused.labels(application, "admission").inc()

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """The registry in the format the scraper asked for (Prometheus text by default)."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


class NodeCollector:
    """Values the node keeps anyway, read at scrape time (nothing is copied in between)."""

    def __init__(
        self,
        metrics: NodeMetrics,
        hub: WorkerHub | None,
        pool: ClaimPool | None,
        sweepers: Sequence[Sweeper],
        commits: Sequence[GroupCommitter],
        databases: Sequence[Database],
        signals: Sequence[SignalRelay] = (),
        pruners: Sequence[Pruner] = (),
        waits: Sequence[TaskWaits] = (),
    ):
        self.metrics = metrics
        self.pruners = pruners
        self.waits = waits
        self.signals = signals
        self.hub = hub
        self.pool = pool
        self.sweepers = sweepers
        self.commits = commits
        self.databases = databases

    def collect(self) -> Iterator[Metric]:
        metrics = self.metrics
        info = GaugeMetricFamily(
            "orbit_node_info", "This node: id and version (always 1).", labels=["node_id", "version"]
        )
        info.add_metric([metrics.node_id, __version__], 1)
        yield info

        hub = self.hub
        if hub is not None:
            yield GaugeMetricFamily("orbit_worker_connections", "Worker connections served now.", value=hub.admitted)
            yield GaugeMetricFamily(
                "orbit_worker_connections_limit",
                "Worker connections this node accepts at most.",
                value=hub.config.max_connections,
            )
            refused = CounterMetricFamily(
                "orbit_worker_connections_refused",
                "Worker connections refused at the handshake, by reason: node_full (the node serves "
                "max_connections and the application is not a whole slot under its fair share), "
                "application_limit (the application holds its max_worker_connections here).",
                labels=["reason"],
            )
            for reason, count in hub.refusals.items():
                refused.add_metric([reason], count)
            yield refused
            yield CounterMetricFamily(
                "orbit_worker_connections_moved",
                "Worker connections told to drain and closed (4004) to make room on a full node for "
                "an application under its fair share.",
                value=hub.moved,
            )
            by_application = GaugeMetricFamily(
                "orbit_worker_connections_by_application",
                "Worker connections served now, per application (name).",
                labels=["application"],
            )
            names = metrics.application_names
            for application_id, count in sorted(hub.held.items()):
                by_application.add_metric([names.get(application_id, application_id)], count)
            yield by_application
            yield CounterMetricFamily("orbit_tasks_dispatched", "Reserved tasks sent to Workers.", value=hub.dispatched)
            finished = CounterMetricFamily(
                "orbit_tasks_finished",
                "Finish reports applied, by outcome (succeeded, retry, failed, cancelled, expired, ownership_lost).",
                labels=["outcome"],
            )
            for outcome in ("succeeded", "retry", "failed", "cancelled", "expired", "ownership_lost"):
                finished.add_metric([outcome], hub.finished.get(outcome, 0))
            yield finished
            yield CounterMetricFamily(
                "orbit_dependency_releases",
                "Waiting tasks released (queued) by the Finish of their last parent.",
                value=hub.released,
            )

        if self.commits:
            groups = [commits.statistics() for commits in self.commits]
            yield CounterMetricFamily(
                "orbit_transition_groups",
                "Group transactions of Worker transitions.",
                value=sum(g.groups for g in groups),
            )
            yield CounterMetricFamily(
                "orbit_transition_batches",
                "Transition batches (one per Worker message) committed in groups.",
                value=sum(g.batches for g in groups),
            )
            yield CounterMetricFamily(
                "orbit_transition_items",
                "Task transitions decided in group transactions.",
                value=sum(g.items for g in groups),
            )

        pool = self.pool
        if pool is not None:
            stats = pool.statistics()
            scheduler = pool.scheduler.statistics()
            limits = pool.scheduler.limits
            yield GaugeMetricFamily(
                "orbit_claim_requests_pending", "Claim requests waiting for a turn.", value=stats.pending
            )
            yield GaugeMetricFamily(
                "orbit_claim_requests_in_flight", "Claim requests whose SQL runs now.", value=stats.in_flight
            )
            yield GaugeMetricFamily(
                "orbit_claim_requests_limit",
                "Pending + in-flight claim requests a node holds at most.",
                value=limits.max_requests,
            )
            yield CounterMetricFamily(
                "orbit_claim_requests_refused",
                "Claim requests refused (node full, or one already outstanding).",
                value=scheduler.refused,
            )
            yield GaugeMetricFamily(
                "orbit_claim_sql_slots_in_use", "Claim SQL slots occupied now.", value=stats.in_flight
            )
            yield GaugeMetricFamily("orbit_claim_sql_slots", "Claim SQL slots of this node.", value=limits.sql_slots)
            claims = CounterMetricFamily(
                "orbit_claims",
                "Claims by outcome: tasks (reserved some), empty, error, and cached_empty "
                "(a turn skipped because an empty result for the same key is remembered this scan cycle).",
                labels=["outcome"],
            )
            claims.add_metric(["tasks"], stats.claims_with_tasks)
            claims.add_metric(["empty"], stats.claims_empty)
            claims.add_metric(["error"], stats.claims_failed)
            claims.add_metric(["cached_empty"], stats.cached_empty_skips)
            yield claims
            yield CounterMetricFamily(
                "orbit_tasks_reserved", "Tasks reserved by this node's claims.", value=stats.tasks_reserved
            )
            turns = CounterMetricFamily(
                "orbit_claim_turns",
                "Claim turns granted per application by this node's fair pool (the fairness "
                "signal: busy applications should advance at the same pace).",
                labels=["application_id", "application"],
            )
            names = metrics.application_names
            for application_id, count in sorted(stats.turns_by_application.items()):
                turns.add_metric([application_id, names.get(application_id, "")], count)
            yield turns

        if self.signals:
            relays = [relay.statistics() for relay in self.signals]
            signals = CounterMetricFamily(
                "orbit_signals",
                "Signals between nodes: written, write_failed and dropped (not written), heard "
                "(what other nodes' signals asked of this one), and what they did here: "
                "queue_woken, due_set, cancel_pushed, finished_heard (a task another node ended that "
                "requests here waited for).",
                labels=["event"],
            )
            for event, field in SIGNAL_EVENTS:
                signals.add_metric([event], sum(getattr(r, field) for r in relays))
            yield signals
            reads = CounterMetricFamily(
                "orbit_signal_reads", "Reads of the signal table, by outcome (ok, failed).", labels=["outcome"]
            )
            reads.add_metric(["ok"], sum(r.reads for r in relays))
            reads.add_metric(["failed"], sum(r.read_failures for r in relays))
            yield reads

        if self.waits:
            yield GaugeMetricFamily(
                "orbit_task_waiting_requests",
                "Requests waiting for their task to finish (GET /v1/tasks/{id}?wait_s=), now.",
                value=sum(w.waiting_requests for w in self.waits),
            )
            waited = CounterMetricFamily(
                "orbit_task_waits",
                "Waits of requests for their task to finish, by how they ended: woken (the task may "
                "have finished: read again), timed_out (wait_s was up, or the node shut down).",
                labels=["outcome"],
            )
            waited.add_metric(["woken"], sum(w.woken for w in self.waits))
            waited.add_metric(["timed_out"], sum(w.timed_out for w in self.waits))
            yield waited

        if self.sweepers:
            recovered = CounterMetricFamily(
                "orbit_leases_recovered",
                "Tasks this node's recovery sweeper settled: requeued (reservation lease "
                "expired), retried/failed/cancelled (run lease expired), expired (deadline passed while queued "
                "or reserved).",
                labels=["outcome"],
            )
            for outcome in RECOVERY_OUTCOMES:
                recovered.add_metric([outcome], sum(getattr(s.totals, outcome) for s in self.sweepers))
            yield recovered
            yield CounterMetricFamily(
                "orbit_dependency_cancelled",
                "Waiting tasks cancelled (DEPENDENCY_FAILED) because a parent did not succeed.",
                value=sum(s.dependency_cancelled for s in self.sweepers),
            )
            yield CounterMetricFamily(
                "orbit_recovery_passes", "Recovery sweeper passes run.", value=sum(s.passes for s in self.sweepers)
            )

        if self.pruners:
            pruned = CounterMetricFamily(
                "orbit_retention_pruned_rows",
                "Rows this node's pruner deleted because their retention had passed, per table.",
                labels=["table"],
            )
            for table, field in PRUNED_TABLES.items():
                pruned.add_metric([table], sum(getattr(p.pruned, field) for p in self.pruners))
            yield pruned
            yield GaugeMetricFamily(
                "orbit_retention_lag_seconds",
                "How long past its retention the oldest expired task not yet deleted was at the pruner's last "
                "batch (0: nothing expired is waiting).",
                value=max(p.lag_s for p in self.pruners),
            )
            yield CounterMetricFamily(
                "orbit_retention_rounds", "Pruner rounds run.", value=sum(p.passes for p in self.pruners)
            )

        pools = [db.statistics() for db in self.databases]
        yield GaugeMetricFamily(
            "orbit_db_pool_size", "Database connections this node may open.", value=sum(db.size for db in pools)
        )
        yield GaugeMetricFamily(
            "orbit_db_connections_open", "Database connections open now.", value=sum(db.open for db in pools)
        )
        yield GaugeMetricFamily(
            "orbit_db_connections_in_use", "Database connections borrowed now.", value=sum(db.in_use for db in pools)
        )
