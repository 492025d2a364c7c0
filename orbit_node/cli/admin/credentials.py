"""``orbit-admin bootstrap`` and ``orbit-admin credential create|revoke|list``: tenants
and their credentials, and the credentials files a Worker or a client reads."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ...config import parse_addr
from ...db import Database
from ...domain.errors import InvalidArgument, OrbitError
from ...store.operations import OperationsStore
from ...store.tenancy import ALL_QUEUES, NODE_SCOPES, SCOPES, TenancyStore
from ..common import add_json, console, fail, private_file, run_command, table
from ..ready import wait_until_served
from .command import command
from .tasks import resolve_queue

BASE_SCOPES = ("queues:manage", "tasks:submit", "tasks:read", "tasks:cancel")
WORKER_SCOPES = ("workers:connect", "workers:consume")
# The longest bootstrap --when-ready waits for a node (a day: a bound, not a policy).
MAX_READY_WAIT_S = 86400.0
# Queues of a namespace listed per page when a credentials file names them all.
QUEUE_PAGE = 500


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
    with private_file(path) as handle:
        handle.write(content.encode())


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


def grant_text(grants: dict[str, Any]) -> str:
    def extent(scope: str, grant: Any) -> str:
        if scope in NODE_SCOPES:
            return "node-wide"
        if grant == ALL_QUEUES:
            return "all queues"
        return f"{len(grant)} queue" + ("" if len(grant) == 1 else "s")

    return ", ".join(f"{scope} ({extent(scope, grant)})" for scope, grant in grants.items())


def add_parsers(sub: Any) -> None:
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
    command(boot, bootstrap_run, bootstrap_render)

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
    command(create, create_run, create_render)
    revoke = cred.add_parser("revoke", help="revoke a credential at once (idempotent)")
    revoke.add_argument("credential_id", metavar="CREDENTIAL_ID")
    add_json(revoke)
    command(revoke, revoke_run, revoke_render)
    clist = cred.add_parser("list", help="list an application's credentials (never their secrets)")
    clist.add_argument("--application", required=True)
    clist.add_argument("--namespace")
    add_json(clist)
    command(clist, list_run, list_render)


async def bootstrap_run(db: Database, args: argparse.Namespace) -> dict[str, Any]:
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
    return {**document, "token": "***"}


def bootstrap_render(document: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"credentials written to {args.output.resolve()}")


async def create_run(db: Database, args: argparse.Namespace) -> dict[str, Any]:
    if args.output is not None and not args.output.parent.exists():
        fail(f"--output: directory {args.output.parent} does not exist")
    created = await create_credential(
        db, application=args.application, namespace=args.namespace, scopes=args.scope, name=args.name
    )
    if args.output is None:
        return created
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
    return {**created, "token": "***", "output": str(args.output.resolve())}


def create_render(created: dict[str, Any], args: argparse.Namespace) -> None:
    print(
        f"credential {created['credential_id']} created in {args.application}/{args.namespace}: "
        f"{grant_text(created['scopes'])}"
    )
    if args.output is not None:
        print(f"credentials written to {created['output']}")
    else:
        print(f"token (shown once, store it now): {created['token']}")


async def revoke_run(db: Database, args: argparse.Namespace) -> dict[str, Any]:
    await TenancyStore(db).revoke_credential(args.credential_id)
    return {"credential_id": args.credential_id, "revoked": True}


def revoke_render(revoked: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"credential {revoked['credential_id']} revoked")


async def list_run(db: Database, args: argparse.Namespace) -> list[dict[str, Any]]:
    return await OperationsStore(db).credentials(args.application, args.namespace)


def list_render(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    console().print(
        table(
            f"credentials of {args.application}" + (f"/{args.namespace}" if args.namespace else ""),
            ["credential_id", "namespace", "name", "scopes", "created_at", "revoked_at"],
            [
                [
                    r["credential_id"],
                    r["namespace"],
                    r["name"],
                    grant_text(r["scopes"]),
                    r["created_at"],
                    r["revoked_at"],
                ]
                for r in rows
            ],
        )
    )
