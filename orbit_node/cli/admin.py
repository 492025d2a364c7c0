"""``orbit-admin``: operator commands against the database (ORBIT_MYSQL_DSN)."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import trio

from ..config import parse_addr
from ..db import Database
from ..errors import OrbitError
from ..store.tenancy import SCOPES, TenancyStore
from .common import database_from_env, fail, print_json, run_command

BASE_SCOPES = ("queues:manage", "tasks:submit", "tasks:read", "tasks:cancel")
WORKER_SCOPES = ("workers:connect", "workers:consume")


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
) -> dict:
    """Create (idempotently) the application, namespace, queues and a credential; write the file.

    An existing credentials file whose token is still valid for this namespace and has
    the requested scopes is kept (secrets are stored hashed, so a token cannot be
    re-read); otherwise a new credential is issued.
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
            if principal.namespace_id == ns_row["namespace_id"] and all(principal.allows(s) for s in scopes) and all(
                principal.scopes.get(s) == "*" for s in scopes
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
    write_private_file(output, json.dumps(document, indent=2) + "\n")
    return document


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orbit-admin", description="Operate an Orbit database (ORBIT_MYSQL_DSN).")
    sub = parser.add_subparsers(dest="command", required=True)
    boot = sub.add_parser("bootstrap", help="create an application, namespace, queue and credentials file (idempotent)")
    boot.add_argument("--application", required=True)
    boot.add_argument("--namespace", required=True)
    boot.add_argument("--environment", required=True)
    boot.add_argument("--queue", required=True, action="append", help="queue name (repeatable)")
    boot.add_argument("--worker-access", action="store_true", help="also grant workers:connect and workers:consume")
    boot.add_argument("--output", required=True, type=Path, help="credentials file to write (mode 0600)")
    boot.add_argument("--json", action="store_true", help="print the written document (token masked)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    db = run_command(database_from_env)

    async def go():
        try:
            if args.command == "bootstrap":
                for name, value in (("--application", args.application), ("--namespace", args.namespace),
                                    ("--environment", args.environment)):
                    if not value or len(value) > 128:
                        fail(f"{name}: must be 1-128 characters")
                if not args.output.parent.exists():
                    fail(f"--output: directory {args.output.parent} does not exist")
                document = await bootstrap(
                    db,
                    application=args.application,
                    namespace=args.namespace,
                    environment=args.environment,
                    queues=args.queue,
                    worker_access=args.worker_access,
                    output=args.output,
                    url=run_command(node_url),
                )
                if args.json:
                    print_json({**document, "token": "***"})
                else:
                    print(f"credentials written to {args.output.resolve()}")
        finally:
            await db.aclose()

    run_command(lambda: trio.run(go))


if __name__ == "__main__":
    main()
