"""The console's blueprint at /console (docs/operations.md, "The console"): access,
rendering, errors and the read-only panels. A task's pages are ``tasks_view.py``'s, the
writes and the audit page ``actions.py``'s.

Every page is one template (``console/page.html``) around a panel; the panel alone is
served to the page's own script for live refresh (``?fragment=live``), with an ETag, so
an unchanged panel costs a ``304 Not Modified``. Nothing here writes to the database.

Access: a session cookie (``session.py``) names a credential verified at sign-in; each
request reads that credential again, so revoking it signs its sessions out at once. The
credential needs ``tasks:read``; what a panel shows follows its grants like the API's
(``model.py``). Queues, tasks and plans of another namespace render the very page a
missing id renders. Every post of a signed-in session must come from this console's own
pages (``Origin``) and carry the session's form token (``session.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import urllib.parse
from collections.abc import Sequence
from typing import Any

from quart import Blueprint, Response, g, render_template, request

from orbit_protocol import logs

from ...domain.errors import NotFound, OrbitError, PermissionDenied, Unauthenticated
from ...domain.retention import CLASS_OF_STATE, Retention, RetentionClass, format_duration
from ...domain.wire import rfc3339
from ...services import Shard
from ...store.console import ConsoleStore, Stranded
from ...store.console_sessions import ConsoleSessionStore
from ...store.operations import OperationsStore, QueueBacklog
from ...store.tenancy import Principal
from ..auth import node_state
from . import model
from .answers import ANSWER_PARAMS, done_text
from .session import COOKIE_NAME, SessionSigner
from .values import size_text

log = logging.getLogger("orbit.console")

blueprint = Blueprint(
    "console",
    __name__,
    url_prefix="/console",
    template_folder="templates",
    static_folder="static",
    static_url_path="/static",
)

# The scope that opens the console.
SCOPE = "tasks:read"
# Query parameter of a panel fetched alone by the page's script.
FRAGMENT = "fragment"
# Endpoints served without a session.
PUBLIC_ENDPOINTS = {"console.sign_in_form", "console.sign_in", "console.sign_out", "console.static"}
# How the sign-in page says why a session ended (the reason is a fixed word, never echoed text).
ENDED = {
    "revoked": "Your session ended: its credential is unknown, revoked or no longer holds tasks:read.",
    "expired": "Your session expired. Sign in again.",
    "signed-out": "You are signed out.",
}
# A page to return to after sign-in: a console path, nothing else.
NEXT_PATH = re.compile(r"/console(/[A-Za-z0-9/_.-]*)?")
# Rows shown by listings on a page.
RECENT_TASKS = 25
PLAN_TASKS = 20
# No script but the console's own file, no framing, nothing loaded from elsewhere.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
NAVIGATION = (
    ("console.overview", "Overview"),
    ("console.fairness", "Fairness"),
    ("console.workers", "Workers"),
    ("console.plans", "Plans"),
    ("console.tasks", "Tasks"),
    ("console.failed", "Failed"),
    ("console.audit", "Audit"),
)
# What a not-found page says, by the field of the NotFound error (never its id: the page
# of another tenant's id must be the page of a missing one).
NOT_FOUND_TEXT = {
    "queue_id": "There is no queue with this id in your namespace.",
    "task_id": "There is no task with this id in your namespace.",
    "plan_id": "There is no plan with this id in your namespace.",
    "value": "This task has no such value (yet).",
}
# The form field of a post's form token.
FORM_TOKEN = "csrf_token"


def signer() -> SessionSigner:
    state = node_state()
    return SessionSigner(state.console_key, state.config.console_session_s)


def sessions() -> ConsoleSessionStore:
    """Sessions ended by sign-out, on the main database (every node reads the same)."""
    return ConsoleSessionStore(node_state().shards.main.db)


def principal() -> Principal:
    return g.console_principal


def is_fragment() -> bool:
    return request.args.get(FRAGMENT) == "live"


# -- access -------------------------------------------------------------------------------


@blueprint.before_request
async def authenticate() -> Response | None:
    if request.endpoint in PUBLIC_ENDPOINTS:
        return None
    cookie = request.cookies.get(COOKIE_NAME)
    session = signer().session(cookie)
    if session is None:
        return signed_out("expired" if cookie else None)
    if await sessions().ended(session.session_id):
        return signed_out("signed-out")
    try:
        who = await node_state().shards.principal_of(session.credential_id)
    except Unauthenticated:
        return signed_out("revoked")
    if not who.scopes.get(SCOPE):
        return signed_out("revoked")
    g.console_principal = who
    logs.bind(application=who.application, namespace_id=who.namespace_id)
    if request.method == "POST":
        await check_post(cookie)
    return None


async def check_post(cookie: str | None) -> None:
    """A post of a signed-in session: from this console's pages, with the session's form token."""
    if not same_origin():
        raise PermissionDenied("origin: writes are accepted from this console's own pages only", field="origin")
    token = (await request.form).get(FORM_TOKEN)
    if cookie is None or not signer().form_token_valid(cookie, token):
        raise PermissionDenied(
            f"{FORM_TOKEN}: the form's token is missing or not this session's; reload the page and try again",
            field=FORM_TOKEN,
        )


def see_other(target: str, status: int = 303) -> Response:
    """A redirect to a console path (303: the browser follows it with GET)."""
    return Response("", status, headers={"Location": target})


def sign_in_url(ended: str | None, next_path: str | None = None) -> str:
    query = {}
    if ended:
        query["ended"] = ended
    if next_path and next_path != "/console":
        query["next"] = next_path
    return "/console/sign-in" + ("?" + urllib.parse.urlencode(query) if query else "")


def signed_out(ended: str | None) -> Response:
    """No valid session: a page goes to sign-in; a panel's script is told 401 and where to go."""
    target = sign_in_url(ended, request.path)
    if is_fragment():
        response = Response("signed out", 401, mimetype="text/plain")
        response.headers["Orbit-Sign-In"] = target
    else:
        response = see_other(target)
    if request.cookies.get(COOKIE_NAME) is not None:
        clear_cookie(response)
    return response


def set_cookie(response: Response, value: str) -> None:
    state = node_state()
    response.set_cookie(
        COOKIE_NAME,
        value,
        max_age=int(state.config.console_session_s),
        path="/console",
        secure=state.config.tls_cert is not None,
        httponly=True,
        samesite="Strict",
    )


def clear_cookie(response: Response) -> None:
    state = node_state()
    response.delete_cookie(
        COOKIE_NAME, path="/console", secure=state.config.tls_cert is not None, httponly=True, samesite="Strict"
    )


def same_origin() -> bool:
    """A form post comes from a console page of this host (no Origin: not a browser's cross-site post)."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    return urllib.parse.urlsplit(origin).netloc == request.host


@blueprint.get("/sign-in")
async def sign_in_form():
    ended = request.args.get("ended")
    return await sign_in_page(ENDED.get(ended or ""), next_path(request.args.get("next")))


def next_path(value: str | None) -> str:
    return value if value and NEXT_PATH.fullmatch(value) else "/console"


async def sign_in_page(message: str | None, next_to: str, *, error: str | None = None, status: int = 200):
    html = await render_template("console/sign_in.html", message=message, error=error, next_path=next_to)
    return Response(html, status, mimetype="text/html")


@blueprint.post("/sign-in")
async def sign_in():
    if not same_origin():
        raise PermissionDenied("origin: sign-in is accepted from this console's own pages only", field="origin")
    form = await request.form
    next_to = next_path(form.get("next"))
    token = (form.get("token") or "").strip()
    if not token:
        return await sign_in_page(None, next_to, error="token: paste the credential's token", status=400)
    try:
        who = await node_state().shards.authenticate(token)
    except Unauthenticated:
        return await sign_in_page(None, next_to, error="token: unknown or revoked credential", status=401)
    if not who.scopes.get(SCOPE):
        return await sign_in_page(None, next_to, error=f"token: the credential lacks scope {SCOPE}", status=403)
    log.info("console sign-in of credential %s", who.credential_id)
    response = see_other(next_to)
    set_cookie(response, signer().issue(who.credential_id))
    return response


@blueprint.post("/sign-out")
async def sign_out():
    if not same_origin():
        raise PermissionDenied("origin: sign-out is accepted from this console's own pages only", field="origin")
    cookie = request.cookies.get(COOKIE_NAME)
    session = signer().session(cookie)
    if session is not None:
        # A live session ends only by its own pages' form (an expired one has nothing to
        # protect), and on every node: a copy of its cookie is refused from now on.
        await check_post(cookie)
        await sessions().end(session.session_id, session.expires_in_s)
    response = see_other(sign_in_url("signed-out"))
    clear_cookie(response)
    return response


# -- rendering ----------------------------------------------------------------------------


def form_token() -> str | None:
    """The form token of the request's session (None without one)."""
    cookie = request.cookies.get(COOKIE_NAME)
    return signer().form_token(cookie) if cookie and g.get("console_principal") else None


@blueprint.context_processor
def helpers() -> dict[str, Any]:
    return {
        "principal": g.get("console_principal"),
        "form_token": form_token(),
        "form_token_field": FORM_TOKEN,
        "navigation": NAVIGATION,
        "ts": lambda value: rfc3339(value) if value is not None and not isinstance(value, str) else (value or "-"),
        "duration": model.duration,
        "limit": model.limit,
        "size_text": size_text,
        "pretty": lambda value: json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False),
        "levels": model.PRIORITY_LEVELS,
        "bar_height": model.BAR_HEIGHT,
    }


async def page(
    title: str,
    panel: str,
    *,
    status: int = 200,
    live_query: Sequence[tuple[str, str]] | None = None,
    refresh: bool = True,
    **context: Any,
) -> Response:
    """The page ``title`` around ``panel``; with ?fragment=live the panel alone, ETag'd.

    Only a 200 page refreshes itself, unless ``refresh`` is False (its script polls the
    panel, with the page's own query, or ``live_query``). ``static_panel`` (optional) is rendered below the live one, on the page only:
    what never changes is not sent again by each refresh. A page reached after a write
    says what the write did (``?done=``, a word of ``DONE``)."""
    if is_fragment():
        html = await render_template(panel, **context)
        tag = hashlib.sha256(html.encode()).hexdigest()[:32]
        if request.if_none_match.contains(tag):
            response = Response("", 304)
        else:
            response = Response(html, status, mimetype="text/html")
        response.set_etag(tag)
        return response
    query = live_query
    if query is None:
        query = [(k, v) for k, v in request.args.items(multi=True) if k not in (FRAGMENT, *ANSWER_PARAMS)]
    live = None
    if status == 200 and refresh:
        live = request.path + "?" + urllib.parse.urlencode([*query, (FRAGMENT, "live")])
    context.setdefault("endpoint", request.endpoint)
    context.setdefault("static_panel", None)
    html = await render_template(
        "console/page.html", title=title, panel=panel, live_url=live, done=done_text(request.args), **context
    )
    return Response(html, status, mimetype="text/html")


@blueprint.after_request
async def security_headers(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "DENY"
    # same-origin, not no-referrer: with no-referrer a browser posts the sign-in form with
    # "Origin: null", which the origin check must refuse.
    response.headers["Referrer-Policy"] = "same-origin"
    if request.endpoint != "console.static":
        # Pages and panels carry tenant data: never stored by a cache (the script sends
        # If-None-Match itself).
        response.headers["Cache-Control"] = "no-store"
        response.vary.add("Cookie")
    return response


async def error_page(status: int, title: str, text: str, code: str) -> Response:
    if is_fragment():
        return Response(text, status, mimetype="text/plain")
    back = g.get("console_back")
    html = await render_template("console/error.html", title=title, text=text, code=code, back=back)
    return Response(html, status, mimetype="text/html")


@blueprint.errorhandler(NotFound)
async def not_found(exc: NotFound):
    return await error_page(404, "Not found", NOT_FOUND_TEXT.get(exc.field or "", "There is no such page."), exc.code)


@blueprint.errorhandler(PermissionDenied)
async def forbidden(exc: PermissionDenied):
    return await error_page(403, "Not allowed", exc.message, exc.code)


@blueprint.errorhandler(OrbitError)
async def other_error(exc: OrbitError):
    if exc.http_status >= 500:
        log.warning("console page failed: %s", exc.code)
        text = "The node cannot reach the database now; retry later."
        if request.method == "POST":
            text += " What you asked may or may not have been done: look before asking again."
        return await error_page(exc.http_status, "Unavailable", text, exc.code)
    title = "Not done" if request.method == "POST" else "Cannot show this"
    return await error_page(exc.http_status, title, exc.message, exc.code)


# -- panels -------------------------------------------------------------------------------


def shard() -> Shard:
    """The shard of the signed-in credential's application."""
    return node_state().shard(principal())


def operations() -> OperationsStore:
    return shard().operations


def console_store() -> ConsoleStore:
    return ConsoleStore(shard().db)


def readable() -> list[str] | None:
    return principal().queue_filter(SCOPE)


async def queue_names() -> dict[str, str]:
    who = principal()
    queues = await shard().tenancy.list_queues(who.namespace_id, queue_ids=readable(), limit=1000)
    return {q.queue_id: q.name for q in queues}


@blueprint.get("")
async def overview():
    who = principal()
    ops = operations()
    backlogs = await ops.namespace_backlogs(who.namespace_id, readable())
    application = await ops.application(who.application)
    config = node_state().config
    applied = Retention(config.retain_succeeded_s, config.retain_failed_s).applied_to(application)
    return await page(
        "Overview",
        "console/panels/overview.html",
        application=application,
        retention=[
            (
                cls.option,
                states_text([state for state, c in CLASS_OF_STATE.items() if c is cls]),
                format_duration(applied.of(cls)),
                application[f"retain_{cls.option}_s"] is None,
            )
            for cls in RetentionClass
        ],
        queues=[(q, model.priority_bars(q.queued_by_priority)) for q in backlogs],
        stranded=await stranded(backlogs),
    )


def states_text(states: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return " and ".join([", ".join(states[:-1]), states[-1]] if len(states) > 1 else states)


async def stranded(backlogs: list[QueueBacklog]) -> dict[str, list[Stranded]]:
    """Queue id -> its due tasks no connected Worker can run, by capability (queues with due tasks only)."""
    due = [q.queue_id for q in backlogs if q.due]
    return model.by_queue(await console_store().stranded(principal().namespace_id, due))


@blueprint.get("/queues/<queue_id>")
async def queue(queue_id: str):
    who = principal()
    found = await shard().tenancy.get_queue(who.namespace_id, queue_id)
    who.require(SCOPE, found.queue_id)
    backlogs = await operations().namespace_backlogs(who.namespace_id, [found.queue_id])
    if not backlogs:
        raise NotFound("queue_id: not found", field="queue_id")
    recent = await shard().tasks.list(
        who.namespace_id, queue_ids=readable(), queue_id=found.queue_id, limit=RECENT_TASKS
    )
    plans = await shard().plans.list(who.namespace_id, queue_ids=readable(), queue_id=found.queue_id)
    backlog = backlogs[0]
    return await page(
        f"Queue {found.name}",
        "console/panels/queue.html",
        queue=backlog,
        bars=model.priority_bars(backlog.queued_by_priority),
        tasks=recent.tasks,
        plans=plans,
        stranded=(await stranded(backlogs)).get(backlog.queue_id, []),
    )


@blueprint.get("/fairness")
async def fairness():
    who = principal()
    node_wide = who.allows("metrics:read")
    rows = await operations().live_turns()
    minutes = await operations().recent_turn_minutes(model.HISTORY_MINUTES)
    return await page(
        "Fairness",
        "console/panels/fairness.html",
        node_wide=node_wide,
        applications=model.application_turns(rows, own_application_id=who.application_id, node_wide=node_wide),
        nodes=model.node_turns(rows, own_application_id=who.application_id, node_wide=node_wide),
        this_node=node_state().node_id,
        history=model.turn_history(minutes, own_application_id=who.application_id, node_wide=node_wide),
    )


@blueprint.get("/workers")
async def workers():
    who = principal()
    registered = await operations().namespace_workers(who.namespace_id)
    nodes = model.visible_workers(registered, readable=readable(), queue_names=await queue_names())
    state = node_state()
    hub = state.services.hub
    slots = None
    if hub is not None:
        slots = model.connection_slots(
            hub.held,
            slots=hub.config.max_connections,
            names=state.metrics.application_names,
            weight=hub.pool.scheduler.weight,
            own_application_id=who.application_id,
            own_application=who.application,
            node_wide=who.allows("metrics:read"),
        )
    return await page(
        "Workers",
        "console/panels/workers.html",
        nodes=nodes,
        this_node=state.node_id,
        slots=slots,
        max_connections=None if hub is None else hub.config.max_connections,
        served=None if hub is None else hub.admitted,
        own_limit=who.max_worker_connections,
    )


@blueprint.get("/plans")
async def plans():
    who = principal()
    found = await shard().plans.list(who.namespace_id, queue_ids=readable(), limit=100)
    return await page("Plans", "console/panels/plans.html", plans=found, queue_names=await queue_names())


@blueprint.get("/plans/<plan_id>")
async def plan(plan_id: str):
    who = principal()
    store = shard().plans
    found = await store.get(who.namespace_id, plan_id)
    who.require(SCOPE, found.queue_id)
    versions = await store.list_versions(who.namespace_id, found.plan_id)
    fired = await store.list_tasks(who.namespace_id, found.plan_id, limit=PLAN_TASKS)
    return await page(
        f"Plan {found.name}",
        "console/panels/plan.html",
        plan=found,
        versions=versions,
        tasks=fired.tasks,
        queue_names=await queue_names(),
        endpoint="console.plans",
    )


@blueprint.route("/<path:rest>", methods=["GET"])
async def unknown(rest: str):
    raise NotFound("path: no such console page", field="path")
