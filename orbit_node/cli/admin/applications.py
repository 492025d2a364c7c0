"""``orbit-admin application create|list|quota|weight|connections|retention|rate|suspend|resume``."""

from __future__ import annotations

import argparse
import os
from typing import Any

import attrs

from ...config import NodeConfig
from ...db import Database
from ...domain.errors import ConfigError, InvalidArgument
from ...domain.retention import CLASS_OF_STATE, Retention, RetentionClass, format_duration, parse_duration
from ...domain.rules import MAX_WEIGHT, MIN_WEIGHT, fairness_weight
from ...domain.rules import QUEUE_NAME as NAME
from ...domain.wire import rfc3339
from ...store.operations import UNCHANGED as STORE_UNCHANGED
from ...store.operations import OperationsStore
from ...store.pruning import PruneStore
from ...store.tenancy import TenancyStore
from ..common import add_json, console, fail, table
from .command import command

# Default of an option that was not given (None means "unlimited" for quota options).
UNCHANGED = object()


def quota_value(text: str) -> int | None:
    if text.strip().lower() in ("none", "unlimited"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer or 'none', got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer or 'none', got {text!r}")
    return value


# Expired tasks ``application retention`` counts at most, per class (an index range).
DUE_CAP = 100_000


def retention_value(text: str) -> str | None:
    """An option's duration (checked), or None for ``default`` (the node's setting)."""
    if text.strip().lower() == "default":
        return None
    try:
        parse_duration(text, "duration")
    except InvalidArgument:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 90s, 15m, 12h, 7d, plain seconds (at least 1) or 'default', got {text!r}"
        ) from None
    return text


def retention_defaults(env=None) -> Retention:
    """The node defaults as this environment sets them (ORBIT_RETAIN_SUCCEEDED and
    ORBIT_RETAIN_FAILED, as a node reads them), else the built-in ones."""
    env = os.environ if env is None else env
    fields = attrs.fields_dict(NodeConfig)
    values: list[int] = []
    for name in ("retain_succeeded_s", "retain_failed_s"):
        found = fields[name].metadata["orbit.setting"]
        text = env.get(found.env)
        try:
            value: Any = fields[name].default if text is None else found.parse(text, found.env)
            values.append(int(value))
        except ConfigError as exc:
            fail(exc.message, 2)
    return Retention(*values)


def with_retention(app: dict[str, Any], defaults: Retention) -> dict[str, Any]:
    """The application with the retention that applies to it, per class: seconds, as a
    duration, and whether it is the node's default."""
    applied = defaults.applied_to(app)
    return {
        **app,
        "retention": {
            cls.option: {
                "seconds": applied.of(cls),
                "duration": format_duration(applied.of(cls)),
                "default": app[f"retain_{cls.option}_s"] is None,
            }
            for cls in RetentionClass
        },
    }


def retention_text(app: dict[str, Any], cls: RetentionClass) -> str:
    kept = app["retention"][cls.option]
    return f"{kept['duration']} (default)" if kept["default"] else kept["duration"]


def add_parsers(sub: Any) -> None:
    app = sub.add_parser(
        "application", help="list applications, set quota, fairness weight or Worker connections, suspend or resume"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    alist = app.add_parser("list", help="applications with their quota, state and live tasks")
    add_json(alist)
    command(alist, list_run, list_render)
    acreate = app.add_parser(
        "create",
        help="create an application and a namespace of it (idempotent)",
        description="Create (idempotently) APPLICATION and its namespace, e.g. for a credential of its own "
        "(orbit-admin credential create --application APPLICATION --namespace NAMESPACE ...). "
        "Names: a letter or digit, then letters, digits, '.', '_' or '-' (at most 128).",
    )
    acreate.add_argument("application", metavar="APPLICATION")
    acreate.add_argument("--namespace", default="default", help="namespace to create (default: default)")
    acreate.add_argument("--environment", default="production", help="its environment (default: production)")
    add_json(acreate)
    command(acreate, create_run, create_render)
    quota = app.add_parser(
        "quota",
        help="set an application's quota (only the options given change)",
        description="Quota across all nodes: reserved + running tasks at once, and reservations per database-clock "
        "second. A value is a non-negative integer or 'none' (unlimited).",
    )
    quota.add_argument("application", metavar="APPLICATION")
    quota.add_argument("--max-concurrent", type=quota_value, default=UNCHANGED, metavar="N|none")
    quota.add_argument("--max-starts-per-second", type=quota_value, default=UNCHANGED, metavar="N|none")
    add_json(quota)
    command(quota, quota_run, changed_render)
    retention = app.add_parser(
        "retention",
        help="show or set how long an application's finished tasks are kept, and what is deleted next",
        description="A finished task is deleted, with its attempts and its Idempotency-Key, once it finished "
        "longer ago than its application's retention for its outcome: --succeeded for succeeded tasks, --failed "
        "for failed, cancelled and expired ones. A duration is 90s, 15m, 12h, 7d or plain seconds (at least 1 s); "
        "'default' goes back to the node's setting (ORBIT_RETAIN_SUCCEEDED, ORBIT_RETAIN_FAILED). Without an "
        "option the command only shows the retention and what it deletes next. Every node's pruner applies a "
        "change at its next round (ORBIT_PRUNE_INTERVAL_S).",
    )
    retention.add_argument("application", metavar="APPLICATION")
    retention.add_argument("--succeeded", type=retention_value, default=UNCHANGED, metavar="D|default")
    retention.add_argument("--failed", type=retention_value, default=UNCHANGED, metavar="D|default")
    add_json(retention)
    command(retention, retention_run, retention_render)
    add_rate_parser(app)
    weight = app.add_parser(
        "weight",
        help="set an application's fairness weight (1-100, default 1)",
        description="With every application asking, each node shares its claim turns in proportion to the "
        "weights; weight 1 everywhere is the plain rotation. Every node applies a change within about a second. "
        "A weight shares turns, not limits: quotas and the in-flight limit per application still hold.",
    )
    weight.add_argument("application", metavar="APPLICATION")
    weight.add_argument("weight", metavar="WEIGHT", help=f"an integer from {MIN_WEIGHT} to {MAX_WEIGHT}")
    add_json(weight)
    command(weight, weight_run, changed_render)
    connections = app.add_parser(
        "connections",
        help="set how many Worker connections of an application one node accepts at most",
        description="A node refuses a Worker connection of the application beyond N at the handshake (503 "
        "RESOURCE_EXHAUSTED, field max_worker_connections); 0 refuses them all; 'none' (the default) leaves only "
        "its fair share of a full node (docs/operations.md, Worker connections per application). A node reads "
        "it at each handshake, so it applies to the next connection; connections already open stay.",
    )
    connections.add_argument("application", metavar="APPLICATION")
    connections.add_argument("limit", type=quota_value, metavar="N|none")
    add_json(connections)
    command(connections, connections_run, changed_render)
    for action, text in (
        ("suspend", "no new reservations for the application (running tasks go on)"),
        ("resume", "let the application's tasks be reserved again"),
    ):
        gate = app.add_parser(action, help=text)
        gate.add_argument("application", metavar="APPLICATION")
        add_json(gate)
        command(gate, gate_run, changed_render)


async def create_run(db: Database, args: argparse.Namespace) -> dict[str, Any]:
    for option, value in (("APPLICATION", args.application), ("--namespace", args.namespace)):
        if not NAME.fullmatch(value):
            fail(f"{option}: {value!r} is not a valid name (a letter or digit, then letters, digits, . _ -)", 2)
    if not args.environment:
        fail("--environment: must not be empty", 2)
    tenancy = TenancyStore(db)
    app_row = await tenancy.ensure_application(args.application)
    ns_row = await tenancy.ensure_namespace(app_row["application_id"], args.namespace, args.environment)
    return {
        "application": args.application,
        "application_id": app_row["application_id"],
        "namespace": args.namespace,
        "namespace_id": ns_row["namespace_id"],
        "environment": ns_row["environment"],
    }


def create_render(created: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"application {created['application']}: namespace {created['namespace']} ({created['environment']}) ready")


async def list_run(db: Database, args: argparse.Namespace) -> list[dict[str, Any]]:
    defaults = retention_defaults()
    return [with_retention(app, defaults) for app in await OperationsStore(db).applications()]


def list_render(apps: list[dict[str, Any]], args: argparse.Namespace) -> None:
    console().print(
        table(
            "applications",
            [
                "application",
                "state",
                "max_concurrent",
                "max_starts/s",
                "weight",
                "submits/s",
                "workers/node",
                "keep succeeded",
                "keep failed",
                "queued",
                "reserved",
                "running",
            ],
            [
                [
                    a["application"],
                    "suspended" if a["suspended"] else "active",
                    a["max_concurrent_executions"],
                    a["max_starts_per_second"],
                    a["fairness_weight"],
                    submit_rate_text(a),
                    _text(a["max_worker_connections"]),
                    retention_text(a, RetentionClass.SUCCEEDED),
                    retention_text(a, RetentionClass.FAILED),
                    a["queued"],
                    a["reserved"],
                    a["running"],
                ]
                for a in apps
            ],
        )
    )


async def quota_run(db: Database, args: argparse.Namespace) -> dict[str, Any]:
    changes: dict[str, int | None] = {}
    if args.max_concurrent is not UNCHANGED:
        changes["max_concurrent_executions"] = args.max_concurrent
    if args.max_starts_per_second is not UNCHANGED:
        changes["max_starts_per_second"] = args.max_starts_per_second
    if not changes:
        fail("quota: give --max-concurrent and/or --max-starts-per-second", 2)
    return await OperationsStore(db).patch_quota(args.application, changes)


async def retention_run(db: Database, args: argparse.Namespace) -> dict[str, Any]:
    ops = OperationsStore(db)
    changes = {
        cls.option: getattr(args, cls.option) for cls in RetentionClass if getattr(args, cls.option) is not UNCHANGED
    }
    app = await (ops.patch_retention(args.application, changes) if changes else ops.application(args.application))
    defaults = retention_defaults()
    app = with_retention(app, defaults)
    due = await PruneStore(db).due(app["application_id"], defaults.applied_to(app), cap=DUE_CAP)
    return {
        "application": app["application"],
        "application_id": app["application_id"],
        "changed": sorted(changes),
        "retention": app["retention"],
        "due": [
            {
                "class": d.retention_class.option,
                "states": [s for s, c in CLASS_OF_STATE.items() if c is d.retention_class],
                "expired": d.expired,
                "expired_capped": d.expired >= DUE_CAP,
                "oldest_finished_at": rfc3339(d.oldest_finished_at),
                "next_expiry_at": rfc3339(d.next_expiry_at),
                "now": rfc3339(d.now),
            }
            for d in due
        ],
    }


def retention_render(data: dict[str, Any], args: argparse.Namespace) -> None:
    name = data["application"]
    if data["changed"]:
        print(f"application {name}: retention of {' and '.join(data['changed'])} tasks changed")
    rows = []
    for due in data["due"]:
        kept = data["retention"][due["class"]]
        expired = f"{due['expired']}+" if due["expired_capped"] else str(due["expired"])
        rows.append(
            [
                due["class"],
                ", ".join(due["states"]),
                f"{kept['duration']} (node default)" if kept["default"] else kept["duration"],
                expired,
                due["oldest_finished_at"],
                due["next_expiry_at"],
            ]
        )
    console().print(
        table(
            f"retention of {name}: what the pruner deletes next",
            ["class", "states", "kept for", "expired now", "oldest finished", "next expires at"],
            rows,
        )
    )


def rate_limit(text: str) -> int | None:
    """``--submits-per-second``: a non-negative integer, or None for ``none`` (unlimited)."""
    return quota_value(text)


def burst_value(text: str) -> int | None:
    """``--burst``: a positive integer, or None for ``default`` (one second of the rate)."""
    if text.strip().lower() == "default":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'default', got {text!r}")
    return value


def add_rate_parser(app: Any) -> None:
    rate = app.add_parser(
        "rate",
        help="set how many tasks an application may submit per second (POST /v1/tasks and batch items)",
        description="The submit rate limit across the cluster: tasks per second (a batch item counts one; 0 "
        "admits none) or 'none' (unlimited, the default; it clears the burst too), and --burst, the tasks it may "
        "submit at once above that rate ('default': one second of the rate; omitted: unchanged). A submission "
        "over it is refused with 429 RESOURCE_EXHAUSTED and Retry-After. Each of the N live nodes admits 1/N of "
        "both; every node applies a change within about a second (docs/operations.md).",
    )
    rate.add_argument("application", metavar="APPLICATION")
    rate.add_argument("--submits-per-second", type=rate_limit, required=True, metavar="N|none")
    rate.add_argument("--burst", type=burst_value, default=UNCHANGED, metavar="M|default")
    add_json(rate)
    command(rate, rate_run, rate_render)


async def rate_run(db: Database, args: argparse.Namespace) -> dict[str, Any]:
    if args.submits_per_second is None and args.burst not in (UNCHANGED, None):
        fail("--burst: an unlimited application (--submits-per-second none) has no burst", 2)
    burst = STORE_UNCHANGED if args.burst is UNCHANGED else args.burst
    return await OperationsStore(db).set_submit_rate(args.application, args.submits_per_second, burst)


def submit_rate_text(app: dict[str, Any]) -> str:
    """``unlimited``, or the rate with its burst: ``100 (burst 500)``, ``100 (burst 1 s)``."""
    if app["submits_per_second"] is None:
        return "unlimited"
    burst = "1 s" if app["submit_burst"] is None else str(app["submit_burst"])
    return f"{app['submits_per_second']} (burst {burst})"


def rate_render(app: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"application {app['application']}: submits per second {submit_rate_text(app)}")


async def weight_run(db: Database, args: argparse.Namespace) -> dict[str, Any]:
    try:
        weight = fairness_weight(args.weight)
    except InvalidArgument as exc:
        fail(f"{exc.code}: {exc.message}", 2)
    return await OperationsStore(db).set_weight(args.application, weight)


async def connections_run(db: Database, args: argparse.Namespace) -> dict[str, Any]:
    return await OperationsStore(db).set_max_worker_connections(args.application, args.limit)


async def gate_run(db: Database, args: argparse.Namespace) -> dict[str, Any]:
    ops = OperationsStore(db)
    app = await ops.application(args.application)
    await TenancyStore(db).set_application_suspended(app["application_id"], args.action == "suspend")
    return await ops.application(args.application)


def changed_render(app: dict[str, Any], args: argparse.Namespace) -> None:
    """The application as a quota, weight, connections, suspend or resume left it."""
    if args.action == "quota":
        print(
            f"application {app['application']}: max_concurrent={_text(app['max_concurrent_executions'])} "
            f"max_starts_per_second={_text(app['max_starts_per_second'])}"
        )
    elif args.action == "weight":
        print(f"application {app['application']}: fairness weight {app['fairness_weight']}")
    elif args.action == "connections":
        limit = app["max_worker_connections"]
        print(
            f"application {app['application']}: Worker connections per node "
            f"{'its fair share of a full node' if limit is None else f'at most {limit}'}"
        )
    elif args.action == "suspend":
        print(f"application {app['application']} suspended: no new reservations; running tasks go on")
    else:
        print(f"application {app['application']} resumed")


def _text(value: int | None) -> str:
    return "unlimited" if value is None else str(value)
