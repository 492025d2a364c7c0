"""``orbit-admin``: operator commands against the database (ORBIT_MYSQL_DSN).

Every command reads and writes the database directly (no node needs to run), has
``--help`` and ``--json``, and fails with one line on stderr and a non-zero status:
1 for an operation that failed (unknown task, database down, ...), 2 for bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from ..config import parse_addr
from ..db import Database
from ..errors import InvalidArgument, OrbitError
from ..ids import is_hex32
from ..rules import MAX_WEIGHT, MIN_WEIGHT, fairness_weight
from ..rules import QUEUE_NAME as NAME
from ..store.dispatch import DispatchStore
from ..store.operations import OperationsStore
from ..store.tenancy import ALL_QUEUES, NODE_SCOPES, SCOPES, TenancyStore
from . import admin_audit
from .admin_tasks import (
    QUEUE_ACTIONS,
    TASK_ACTIONS,
    add_queue_actions,
    add_task_actions,
    resolve_queue,
    run_queue_action,
    run_task_action,
)
from .common import Parser, add_json, console, database_from_env, fail, print_json, run_command, table
from .ready import wait_until_served

BASE_SCOPES = ("queues:manage", "tasks:submit", "tasks:read", "tasks:cancel")
WORKER_SCOPES = ("workers:connect", "workers:consume")
# The longest bootstrap --when-ready waits for a node (a day: a bound, not a policy).
MAX_READY_WAIT_S = 86400.0


def node_url(env=None) -> str:
    """The URL written into credentials files: ORBIT_URL, else derived from ORBIT_HTTP_ADDR."""
    env = os.environ if env is None else env
    if env.get("ORBIT_URL"):
        return env["ORBIT_URL"].rstrip("/")
    host, port = parse_addr(env.get("ORBIT_HTTP_ADDR", "127.0.0.1:8080"))
    scheme = "https" if env.get("ORBIT_TLS_CERT") else "http"
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


def write_private_file(path: Path, content: str) -> None:
    """Write atomically with mode 0600 from the first byte."""
    path = path.resolve()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(content)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


async def bootstrap(
    db: Database,
    *,
    application: str,
    namespace: str,
    environment: str,
    queues: list[str],
    worker_access: bool,
    output: Path,
    url: str,
    when_ready: Callable[[str, str], Awaitable[None]] | None = None,
) -> dict:
    """Create (idempotently) the application, namespace, queues and a credential; write the file.

    An existing credentials file whose token is still valid for this namespace and has
    the requested scopes is kept (secrets are stored hashed, so a token cannot be
    re-read); otherwise a new credential is issued. With ``when_ready``, the file is
    written only once ``await when_ready(url, token)`` returns (it raises to leave the
    file as it was).
    """
    tenancy = TenancyStore(db)
    app_row = await tenancy.ensure_application(application)
    ns_row = await tenancy.ensure_namespace(app_row["application_id"], namespace, environment)
    queue_ids = {}
    for name in queues:
        queue, _ = await tenancy.create_queue(ns_row["namespace_id"], app_row["application_id"], name, exist_ok=True)
        queue_ids[name] = queue.queue_id
    scopes = list(BASE_SCOPES + (WORKER_SCOPES if worker_access else ()))
    token = None
    if output.exists():
        try:
            previous = json.loads(output.read_text())
            principal = await tenancy.authenticate(previous.get("token"))
            if (
                principal.namespace_id == ns_row["namespace_id"]
                and all(principal.allows(s) for s in scopes)
                and all(principal.scopes.get(s) == "*" for s in scopes)
            ):
                token = previous["token"]
        except (OrbitError, ValueError, AttributeError):
            token = None
    if token is None:
        _, token = await tenancy.create_credential(
            ns_row["namespace_id"], f"bootstrap:{namespace}", {scope: "*" for scope in scopes}
        )
    document = {
        "url": url,
        "token": token,
        "application": application,
        "namespace": namespace,
        "environment": environment,
        "scopes": scopes,
        "queues": queue_ids,
    }
    if when_ready is not None:
        await when_ready(url, token)
    write_private_file(output, json.dumps(document, indent=2) + "\n")
    return document


# Reading only: explanations never use the leases or batch size a claim would.
EXPLAIN_LEASE_S = 30.0
EXPLAIN_BATCH = 16
# Queues of a namespace listed per page when a credentials file names them all.
QUEUE_PAGE = 500
# Default of an option that was not given (None means "unlimited" for quota options).
UNCHANGED = object()


def parse_scope(text: str) -> tuple[str, str | list[str]]:
    """``SCOPE`` (all queues) or ``SCOPE=QUEUE[,QUEUE...]`` (queue names or ids)."""
    name, sep, queues = text.partition("=")
    name = name.strip()
    if name not in SCOPES:
        raise InvalidArgument(f"--scope: unknown scope {name!r} (one of {', '.join(SCOPES)})", field="scope")
    if not sep or queues.strip() == ALL_QUEUES:
        return name, ALL_QUEUES
    if name in NODE_SCOPES:
        raise InvalidArgument(f"--scope: {name} is node-wide and takes no queue list", field="scope")
    names = [q.strip() for q in queues.split(",") if q.strip()]
    if not names:
        raise InvalidArgument(f"--scope: {text!r} names no queue", field="scope")
    return name, names


async def namespace_queues(tenancy: TenancyStore, namespace_id: str) -> dict[str, str]:
    queues: dict[str, str] = {}
    after = ""
    while True:
        page = await tenancy.list_queues(namespace_id, after=after, limit=QUEUE_PAGE)
        queues.update({q.name: q.queue_id for q in page})
        if len(page) < QUEUE_PAGE:
            return queues
        after = page[-1].queue_id


async def create_credential(
    db: Database, *, application: str, namespace: str, scopes: list[str], name: str
) -> dict[str, Any]:
    """Issue a credential with exactly the chosen scopes; returns it with its token (shown once)."""
    if not scopes:
        raise InvalidArgument("--scope: name at least one scope (e.g. --scope tasks:read)", field="scope")
    ops, tenancy = OperationsStore(db), TenancyStore(db)
    ns = await ops.namespace(application, namespace)
    grants: dict[str, Any] = {}
    queue_ids: dict[str, str] = {}
    for text in scopes:
        scope, grant = parse_scope(text)
        if scope in grants:
            raise InvalidArgument(f"--scope: {scope} given more than once", field="scope")
        if grant == ALL_QUEUES:
            grants[scope] = ALL_QUEUES
            continue
        ids = []
        for queue_name in grant:
            queue = await resolve_queue(tenancy, ns["namespace_id"], queue_name)
            queue_ids[queue.name] = queue.queue_id
            ids.append(queue.queue_id)
        grants[scope] = ids
    if any(grant == ALL_QUEUES for scope, grant in grants.items() if scope not in NODE_SCOPES):
        queue_ids = await namespace_queues(tenancy, ns["namespace_id"])
    credential_id, token = await tenancy.create_credential(ns["namespace_id"], name, grants)
    return {
        "credential_id": credential_id,
        "token": token,
        "name": name,
        "application": application,
        "namespace": namespace,
        "environment": ns["environment"],
        "scopes": grants,
        "queues": queue_ids,
    }


def _grant_text(grants: dict[str, Any]) -> str:
    def extent(scope: str, grant: Any) -> str:
        if scope in NODE_SCOPES:
            return "node-wide"
        if grant == ALL_QUEUES:
            return "all queues"
        return f"{len(grant)} queue" + ("" if len(grant) == 1 else "s")

    return ", ".join(f"{scope} ({extent(scope, grant)})" for scope, grant in grants.items())


def _quota_value(text: str) -> int | None:
    if text.strip().lower() in ("none", "unlimited"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer or 'none', got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer or 'none', got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="orbit-admin",
        description="Operate an Orbit database (ORBIT_MYSQL_DSN). Every command has --help and --json; a failure is "
        "one line on stderr and exit status 1 (2 for bad usage).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    boot = sub.add_parser("bootstrap", help="create an application, namespace, queue and credentials file (idempotent)")
    boot.add_argument("--application", required=True)
    boot.add_argument("--namespace", required=True)
    boot.add_argument("--environment", required=True)
    boot.add_argument("--queue", required=True, action="append", help="queue name (repeatable)")
    boot.add_argument("--worker-access", action="store_true", help="also grant workers:connect and workers:consume")
    boot.add_argument("--output", required=True, type=Path, help="credentials file to write (mode 0600)")
    boot.add_argument(
        "--when-ready",
        type=float,
        metavar="SECONDS",
        help="write the file only once the node at its url answers GET /readyz and accepts its token, "
        "waiting at most SECONDS; until then an existing file stays as it was (make run uses this)",
    )
    boot.add_argument(
        "--node-pid",
        type=int,
        metavar="PID",
        help="with --when-ready: stop waiting, the file unchanged, as soon as process PID (the node) has exited",
    )
    boot.add_argument("--json", action="store_true", help="print the written document (token masked)")

    cred = sub.add_parser("credential", help="create, revoke or list credentials").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    create = cred.add_parser(
        "create",
        help="issue a credential with chosen scopes (the token is shown once)",
        description="Issue a credential of one namespace. Each --scope is SCOPE (all queues of the namespace) or "
        f"SCOPE=QUEUE[,QUEUE...] (queue names or ids). Scopes: {', '.join(SCOPES)}; metrics:read is node-wide "
        "(GET /metrics with ORBIT_METRICS=credential). Without --output the token is printed once on stdout.",
    )
    create.add_argument("--application", required=True)
    create.add_argument("--namespace", required=True)
    create.add_argument(
        "--scope", action="append", required=True, metavar="SCOPE[=QUEUES]", help="at least one; repeatable"
    )
    create.add_argument("--name", default="orbit-admin", help="a label for operators (default: orbit-admin)")
    create.add_argument(
        "--output", type=Path, help="write a credentials file (mode 0600) instead of printing the token"
    )
    add_json(create)
    revoke = cred.add_parser("revoke", help="revoke a credential at once (idempotent)")
    revoke.add_argument("credential_id", metavar="CREDENTIAL_ID")
    add_json(revoke)
    clist = cred.add_parser("list", help="list an application's credentials (never their secrets)")
    clist.add_argument("--application", required=True)
    clist.add_argument("--namespace")
    add_json(clist)

    app = sub.add_parser(
        "application", help="list applications, set quota or fairness weight, suspend or resume"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    alist = app.add_parser("list", help="applications with their quota, state and live tasks")
    add_json(alist)
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
    quota = app.add_parser(
        "quota",
        help="set an application's quota (only the options given change)",
        description="Quota across all nodes: reserved + running tasks at once, and reservations per database-clock "
        "second. A value is a non-negative integer or 'none' (unlimited).",
    )
    quota.add_argument("application", metavar="APPLICATION")
    quota.add_argument("--max-concurrent", type=_quota_value, default=UNCHANGED, metavar="N|none")
    quota.add_argument("--max-starts-per-second", type=_quota_value, default=UNCHANGED, metavar="N|none")
    add_json(quota)
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
    for action, text in (
        ("suspend", "no new reservations for the application (running tasks go on)"),
        ("resume", "let the application's tasks be reserved again"),
    ):
        gate = app.add_parser(action, help=text)
        gate.add_argument("application", metavar="APPLICATION")
        add_json(gate)

    queue = sub.add_parser("queue", help="list queues with their backlog, pause or resume one").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    qlist = queue.add_parser("list", help="queues with backlog by state and queued tasks by priority level")
    qlist.add_argument("--application")
    qlist.add_argument("--namespace", help="needs --application")
    add_json(qlist)
    add_queue_actions(queue)

    task = sub.add_parser("task", help="show, list, cancel or retry tasks").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    show = task.add_parser("show", help="a task of any namespace with its attempts")
    show.add_argument("task_id", metavar="TASK_ID")
    add_json(show)
    add_task_actions(task)

    explain = sub.add_parser("explain", help="why a task is (not) being dispatched right now")
    explain.add_argument("task_id", metavar="TASK_ID")
    add_json(explain)

    database = sub.add_parser("database", help="the servers of ORBIT_MYSQL_DSN").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    writer = database.add_parser(
        "writer",
        help="show the servers and the one every node writes to; --host moves the nodes to another",
        description="With several hosts in ORBIT_MYSQL_DSN (a Galera cluster) every node writes to one server: "
        "the first it reaches, the next when that one is lost. It returns to an earlier server only when told: "
        "--host HOST:PORT records that server in the cluster, and every node follows within a second.",
    )
    writer.add_argument("--host", metavar="HOST:PORT", help="record this server (as spelled in ORBIT_MYSQL_DSN)")
    add_json(writer)

    top = sub.add_parser(
        "top",
        help="live view of queues, backlog per priority, running and claim turns per application",
        description="Refreshes every --interval seconds until interrupted (Ctrl-C), or --iterations times. "
        "Claim turns come from the counters every node records in the database.",
    )
    top.add_argument("--application")
    top.add_argument("--namespace", help="needs --application")
    top.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="refresh period (default 1)")
    top.add_argument("--iterations", type=int, default=None, metavar="N", help="stop after N frames")
    top.add_argument("--once", action="store_true", help="one frame, then exit (same as --iterations 1)")
    top.add_argument("--json", action="store_true", help="one JSON object per frame, one per line")
    admin_audit.add_parser(sub)
    return parser


async def _bootstrap(db: Database, args) -> None:
    for name, value in (
        ("--application", args.application),
        ("--namespace", args.namespace),
        ("--environment", args.environment),
    ):
        if not value or len(value) > 128:
            fail(f"{name}: must be 1-128 characters")
    if not args.output.parent.exists():
        fail(f"--output: directory {args.output.parent} does not exist")
    if args.node_pid is not None and args.when_ready is None:
        fail("--node-pid: goes with --when-ready", 2)
    if args.when_ready is not None and not 0 < args.when_ready <= MAX_READY_WAIT_S:
        fail(f"--when-ready: must be more than 0 and at most {MAX_READY_WAIT_S:g} seconds", 2)

    async def when_ready(url: str, token: str) -> None:
        why = await wait_until_served(url, token, timeout_s=args.when_ready, node_pid=args.node_pid)
        if why is not None:
            fail(f"{why}; {args.output} left as it was")

    document = await bootstrap(
        db,
        application=args.application,
        namespace=args.namespace,
        environment=args.environment,
        queues=args.queue,
        worker_access=args.worker_access,
        output=args.output,
        url=run_command(node_url),
        when_ready=None if args.when_ready is None else when_ready,
    )
    if args.json:
        print_json({**document, "token": "***"})
    else:
        print(f"credentials written to {args.output.resolve()}")


async def _credential(db: Database, args) -> None:
    if args.action == "create":
        if args.output is not None and not args.output.parent.exists():
            fail(f"--output: directory {args.output.parent} does not exist")
        created = await create_credential(
            db, application=args.application, namespace=args.namespace, scopes=args.scope, name=args.name
        )
        if args.output is not None:
            document = {
                "url": run_command(node_url),
                "token": created["token"],
                "application": created["application"],
                "namespace": created["namespace"],
                "environment": created["environment"],
                "scopes": sorted(created["scopes"]),
                "queues": created["queues"],
            }
            write_private_file(args.output, json.dumps(document, indent=2) + "\n")
            created = {**created, "token": "***", "output": str(args.output.resolve())}
        if args.json:
            print_json(created)
        else:
            print(
                f"credential {created['credential_id']} created in {args.application}/{args.namespace}: "
                f"{_grant_text(created['scopes'])}"
            )
            if args.output is not None:
                print(f"credentials written to {created['output']}")
            else:
                print(f"token (shown once, store it now): {created['token']}")
    elif args.action == "revoke":
        tenancy = TenancyStore(db)
        await tenancy.revoke_credential(args.credential_id)
        if args.json:
            print_json({"credential_id": args.credential_id, "revoked": True})
        else:
            print(f"credential {args.credential_id} revoked")
    else:
        rows = await OperationsStore(db).credentials(args.application, args.namespace)
        if args.json:
            print_json(rows)
        else:
            console().print(
                table(
                    f"credentials of {args.application}" + (f"/{args.namespace}" if args.namespace else ""),
                    ["credential_id", "namespace", "name", "scopes", "created_at", "revoked_at"],
                    [
                        [
                            r["credential_id"],
                            r["namespace"],
                            r["name"],
                            _grant_text(r["scopes"]),
                            r["created_at"],
                            r["revoked_at"],
                        ]
                        for r in rows
                    ],
                )
            )


async def _application(db: Database, args) -> None:
    ops = OperationsStore(db)
    if args.action == "create":
        for option, value in (("APPLICATION", args.application), ("--namespace", args.namespace)):
            if not NAME.fullmatch(value):
                fail(f"{option}: {value!r} is not a valid name (a letter or digit, then letters, digits, . _ -)", 2)
        if not args.environment:
            fail("--environment: must not be empty", 2)
        tenancy = TenancyStore(db)
        app_row = await tenancy.ensure_application(args.application)
        ns_row = await tenancy.ensure_namespace(app_row["application_id"], args.namespace, args.environment)
        created = {
            "application": args.application,
            "application_id": app_row["application_id"],
            "namespace": args.namespace,
            "namespace_id": ns_row["namespace_id"],
            "environment": ns_row["environment"],
        }
        if args.json:
            print_json(created)
        else:
            print(f"application {args.application}: namespace {args.namespace} ({ns_row['environment']}) ready")
        return
    if args.action == "list":
        apps = await ops.applications()
        if args.json:
            print_json(apps)
        else:
            console().print(
                table(
                    "applications",
                    [
                        "application",
                        "state",
                        "max_concurrent",
                        "max_starts/s",
                        "weight",
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
                            a["queued"],
                            a["reserved"],
                            a["running"],
                        ]
                        for a in apps
                    ],
                )
            )
        return
    if args.action == "quota":
        changes: dict[str, int | None] = {}
        if args.max_concurrent is not UNCHANGED:
            changes["max_concurrent_executions"] = args.max_concurrent
        if args.max_starts_per_second is not UNCHANGED:
            changes["max_starts_per_second"] = args.max_starts_per_second
        if not changes:
            fail("quota: give --max-concurrent and/or --max-starts-per-second", 2)
        app = await ops.patch_quota(args.application, changes)
        message = (
            f"application {app['application']}: max_concurrent={_text(app['max_concurrent_executions'])} "
            f"max_starts_per_second={_text(app['max_starts_per_second'])}"
        )
    elif args.action == "weight":
        try:
            weight = fairness_weight(args.weight)
        except InvalidArgument as exc:
            fail(f"{exc.code}: {exc.message}", 2)
        app = await ops.set_weight(args.application, weight)
        message = f"application {app['application']}: fairness weight {app['fairness_weight']}"
    else:
        app = await ops.application(args.application)
        suspended = args.action == "suspend"
        await TenancyStore(db).set_application_suspended(app["application_id"], suspended)
        app = await ops.application(args.application)
        message = (
            f"application {app['application']} suspended: no new reservations; running tasks go on"
            if suspended
            else f"application {app['application']} resumed"
        )
    if args.json:
        print_json(app)
    else:
        print(message)


def _text(value: int | None) -> str:
    return "unlimited" if value is None else str(value)


async def _queue(db: Database, args) -> None:
    if args.action in QUEUE_ACTIONS:
        await run_queue_action(db, args)
        return
    if args.namespace and not args.application:
        fail("--namespace needs --application", 2)
    queues = await OperationsStore(db).queue_backlogs(application=args.application, namespace=args.namespace)
    if args.json:
        print_json([q.as_json() for q in queues])
        return
    rows = []
    for q in queues:
        levels = " ".join(f"p{level}:{n}" for level, n in sorted(q.queued_by_priority.items(), reverse=True))
        rows.append(
            [
                q.application,
                q.namespace,
                q.name + (" (paused)" if q.paused else ""),
                q.queue_id,
                q.due,
                q.queued - q.due,
                q.reserved,
                q.running,
                levels or "-",
            ]
        )
    console().print(
        table(
            "queues",
            [
                "application",
                "namespace",
                "queue",
                "queue_id",
                "due",
                "later",
                "reserved",
                "running",
                "queued by priority",
            ],
            rows,
        )
    )


def _task_id(value: str) -> str:
    if not is_hex32(value):
        fail(f"TASK_ID: {value!r} is not a task id (32 lowercase hex characters)", 2)
    return value


async def _task(db: Database, args) -> None:
    if args.action in TASK_ACTIONS:
        await run_task_action(db, args)
        return
    _task_id(args.task_id)
    task = await OperationsStore(db).task(args.task_id)
    if args.json:
        print_json(task)
        return
    history = task.pop("attempt_history")
    width = max(len(k) for k in task)
    for key, value in task.items():
        if isinstance(value, (dict, list)):
            value = json.dumps(value, ensure_ascii=False, default=str)
        print(f"{key:<{width}}  {'-' if value is None else value}")
    print()
    console().print(
        table(
            f"attempts ({len(history)})",
            ["attempt", "outcome", "node", "connection", "reserved_at", "started_at", "finished_at", "error"],
            [
                [
                    a["attempt"],
                    a["outcome"] or "(live)",
                    (a["owner_node_id"] or "")[:12] or None,
                    a["connection_id"],
                    a["reserved_at"],
                    a["started_at"],
                    a["finished_at"],
                    None if a["error"] is None else json.dumps(a["error"], ensure_ascii=False)[:80],
                ]
                for a in history
            ],
        )
    )


async def _explain(db: Database, args) -> None:
    _task_id(args.task_id)
    task = await OperationsStore(db).task(args.task_id)
    store = DispatchStore(
        db, reservation_lease_s=EXPLAIN_LEASE_S, run_lease_s=EXPLAIN_LEASE_S, batch_size=EXPLAIN_BATCH
    )
    explanation = await store.explain(task["namespace_id"], args.task_id)
    if args.json:
        print_json(explanation)
        return
    print(
        f"task {explanation['task_id']} ({task['application']}/{task['namespace']}/{explanation['queue']}): "
        f"{explanation['state']}, priority {explanation['priority']}, attempts "
        f"{explanation['attempts']}/{explanation['max_attempts']}"
    )
    print(
        f"available_at {explanation['available_at']}  dispatch_at {explanation['dispatch_at']}  "
        f"database now {explanation['database_now']}"
    )
    if explanation["capable_connections"] is not None:
        print(f"capable Worker connections: {explanation['capable_connections']}")
    position = explanation.get("position")
    if position:
        capped = "at least " if position["capped"] else ""
        print(
            f"due tasks ahead in dispatch order: {capped}{position['due_tasks_ahead']} "
            f"({position['due_tasks_ahead_same_capability']} with the same handler and versions)"
        )
    if explanation["dispatchable"]:
        print("dispatchable: the next claim of a capable Worker takes it in this order")
    else:
        print("waiting because:")
        for reason in explanation["reasons"]:
            print(f"  {reason['code']}: {reason['message']}")


async def _database(db: Database, args) -> None:
    if args.host is not None:
        await db.set_writer(args.host)
    record = await db.recorded_writer()
    servers = await db.servers()
    if args.json:
        print_json({"recorded_writer": record, "servers": servers})
        return
    if record is None:
        print("recorded writer: none (each node writes to the first server it reaches)")
    else:
        print(f"recorded writer: {record['host']} (by {record['changed_by']} at {record['changed_at']})")
    console().print(
        table(
            "servers",
            ["host", "answers", "this command writes to", "error"],
            [[s["host"], "yes" if s["answers"] else "no", "yes" if s["writer"] else "", s["error"]] for s in servers],
        )
    )


async def _top(db: Database, args) -> None:
    from .top import run_top

    if args.namespace and not args.application:
        fail("--namespace needs --application", 2)
    if args.interval <= 0:
        fail("--interval: must be positive", 2)
    if args.iterations is not None and args.iterations < 1:
        fail("--iterations: must be at least 1", 2)
    iterations = 1 if args.once else args.iterations
    try:
        await run_top(
            OperationsStore(db),
            console(),
            interval_s=args.interval,
            iterations=iterations,
            as_json=args.json,
            application=args.application,
            namespace=args.namespace,
        )
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a live view ends


COMMANDS = {
    "bootstrap": _bootstrap,
    "credential": _credential,
    "application": _application,
    "queue": _queue,
    "task": _task,
    "explain": _explain,
    "database": _database,
    "top": _top,
    "audit": admin_audit.run,
}


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    # A command about one application works on the database of its shard (ORBIT_SHARDS).
    db = run_command(lambda: database_from_env(application=getattr(args, "application", None)))

    async def go():
        try:
            await COMMANDS[args.command](db, args)
        finally:
            with trio.CancelScope(shield=True):
                await db.aclose()

    try:
        run_command(lambda: trio.run(go))
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # a bug or an unexpected driver error: still one line
        fail(f"unexpected {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
