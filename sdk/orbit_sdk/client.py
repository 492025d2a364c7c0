"""A trio-native client of the task interface (HTTP, JSON) over httpx.

    async with OrbitClient.from_env() as client:          # ORBIT_URL, ORBIT_CREDENTIALS_FILE
        accepted = await client.submit_task("prepare-001", SubmitTaskRequest(
            queue_id=queue_id, handler="object.prepare", handler_version="v1",
            payload_version="v1", payload={"object_ref": "objects/example"}, priority=9))
        accepted.task.priority, accepted.created
        results = await client.submit_many([("prepare-002", request_2), ("prepare-003", request_3)])
        [r.status for r in results]                        # 201, 200, 409, 400, ... per item

Everything the client raises is an ``OrbitClientError``: every error the server
reports is an ``ApiError`` subclass carrying the server's ``code``, ``field`` and
``request_id``; a request that cannot be sent (a payload holding a ``set``) is an
``InvalidRequestError`` naming the field. Timeouts are the caller's: wrap a call in
``trio.fail_after(...)`` / ``trio.move_on_after(...)``, or give ``wait`` its ``timeout_s``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import httpx

from orbit_protocol.limits import MAX_BATCH_TASKS, MAX_TASK_WAIT_S

from . import tracing
from .credentials import Credentials, credentials_from_env
from .errors import ConfigError, InvalidRequestError, ProtocolError, TransportError, api_error
from .filters import BulkItem, BulkResult, TaskFilter
from .models import (
    BatchItemResult,
    FanIn,
    Page,
    Plan,
    PlanDefinition,
    PlanTaskSummary,
    PlanVersion,
    Queue,
    SubmitResult,
    SubmitTaskRequest,
    Task,
    TaskChild,
    TaskSummary,
    definition_json,
    encode_json,
    path_segment,
)

UNSET: Any = object()


def wait_param(wait_s: float) -> str:
    """``wait_s`` as GET /v1/tasks/{id} takes it: seconds from 0 to ``MAX_TASK_WAIT_S``,
    at most three decimals; anything else is an ``InvalidRequestError`` naming it."""
    if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not 0 <= wait_s <= MAX_TASK_WAIT_S:
        raise InvalidRequestError(
            f"wait_s: expected a number of seconds from 0 to {MAX_TASK_WAIT_S}, got {wait_s!r}", field="wait_s"
        )
    return f"{wait_s:.3f}".rstrip("0").rstrip(".")


class OrbitClient:
    """One node's task interface. Use as ``async with``, or call ``aclose()``."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        event_hooks: Mapping[str, list[Callable[..., Any]]] | None = None,
    ):
        self.url = url.rstrip("/")
        try:
            self._http = httpx.AsyncClient(
                base_url=self.url,
                headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
                transport=transport,
                event_hooks=dict(event_hooks or {}),
                # Timeouts are cancel scopes set by the caller (trio.fail_after around a call).
                timeout=None,
            )
        except httpx.InvalidURL as exc:
            raise ConfigError(f"url: not a node URL ({exc}): {url!r}", field="url") from None

    @classmethod
    def from_credentials(cls, credentials: Credentials, *, url: str | None = None, **kwargs: Any) -> OrbitClient:
        """A client with the file's token and url (``url`` overrides it)."""
        return cls(url or credentials.url, credentials.token, **kwargs)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> OrbitClient:
        """ORBIT_CREDENTIALS_FILE (required) and ORBIT_URL (overrides the file's url)."""
        credentials, url = credentials_from_env(env)
        return cls.from_credentials(credentials, url=url, **kwargs)

    async def __aenter__(self) -> OrbitClient:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP connections (``async with`` does it)."""
        await self._http.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        content: bytes | None = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """Send one request; returns (status, envelope) or raises the server's error.

        ``body`` is encoded here (a value that is not JSON is an ``InvalidRequestError``
        naming its path, and nothing is sent); ``content`` is a body encoded already."""
        request_headers = dict(headers or {})
        if body is not None:
            content = encode_json(body, "").encode("utf-8")
        if content is not None:
            request_headers["Content-Type"] = "application/json"
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = await self._http.request(method, path, content=content, params=query, headers=request_headers)
        except httpx.TransportError as exc:
            raise TransportError(f"{method} {path}: {exc!r}") from exc
        except httpx.HTTPError as exc:
            # Not a transport failure: the answer could not be decoded (or redirected on and on).
            raise ProtocolError(f"{method} {path}: {exc!r}") from exc
        except httpx.InvalidURL as exc:
            raise InvalidRequestError(
                f"{method} {path}: not a valid URL ({exc}); nothing was sent", field="url"
            ) from None
        try:
            document = json.loads(response.content)
        except ValueError:
            document = None
        if not isinstance(document, dict):
            raise ProtocolError(
                f"{method} {path}: HTTP {response.status_code} without a JSON envelope", status=response.status_code
            )
        error = document.get("error")
        if isinstance(error, dict):
            raise api_error(error, response.status_code, document.get("request_id"))
        if not 200 <= response.status_code < 300 or "data" not in document:
            raise ProtocolError(
                f"{method} {path}: HTTP {response.status_code} without data", status=response.status_code
            )
        return response.status_code, document

    # -- tasks

    async def submit_task(self, acceptance_key: str, request: SubmitTaskRequest) -> SubmitResult:
        """Submit once per ``acceptance_key``: repeating the same request returns the same task.

        Safe to retry after a TransportError with the same key and request.
        """
        # The active span's trace context goes with the task to its handler (``tracing``).
        headers = {"Idempotency-Key": acceptance_key, **tracing.context_headers()}
        status, document = await self._call("POST", "/v1/tasks", body=request.to_json(), headers=headers)
        return SubmitResult(Task.from_json(document["data"]), created=status == 201)

    async def submit_many(
        self,
        requests: Iterable[tuple[str, SubmitTaskRequest]],
        *,
        batch_size: int = MAX_BATCH_TASKS,
        return_tasks: bool = True,
    ) -> list[BatchItemResult]:
        """Submit (acceptance key, request) pairs, ``batch_size`` (1-1,000) per ``POST /v1/tasks/batch``.

        One result per pair, in order. An item the server refuses (invalid, conflict,
        unknown queue, ...) is a result with ``error``; the other items are accepted. A
        failure of a whole batch raises: the batches sent before it are committed, the
        failing one committed nothing. Like ``submit_task``, safe to retry with the same
        keys and requests.

        ``return_tasks=False`` asks the node for ids and states only (``Prefer:
        return=minimal``): ``task`` is then None and ``task_id``/``state`` say what was
        accepted. It is the cheaper way to submit many tasks that are not read back.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH_TASKS:
            raise InvalidRequestError(
                f"batch_size: expected 1 to {MAX_BATCH_TASKS}, got {batch_size!r}", field="batch_size"
            )
        # Every item is encoded before the first batch is sent: one that is not JSON
        # (named by its place in ``requests``) stops the call before anything is accepted.
        items = [
            encode_json({"idempotency_key": key, **request.to_json()}, f"requests[{index}]")
            for index, (key, request) in enumerate(requests)
        ]
        results: list[BatchItemResult] = []
        # The active span's trace context goes with every item to its handler (``tracing``).
        headers = tracing.context_headers()
        if not return_tasks:
            headers["Prefer"] = "return=minimal"
        for start in range(0, len(items), batch_size):
            content = '{"tasks":[' + ",".join(items[start : start + batch_size]) + "]}"
            _, document = await self._call("POST", "/v1/tasks/batch", content=content.encode("utf-8"), headers=headers)
            request_id = document.get("request_id")
            for item in document["data"]["results"]:
                status = int(item["status"])
                if "error" in item:
                    results.append(BatchItemResult(status, error=api_error(item["error"], status, request_id)))
                elif "task" in item:
                    task = Task.from_json(item["task"])
                    results.append(BatchItemResult(status, task=task, task_id=task.task_id, state=task.state))
                else:
                    results.append(BatchItemResult(status, task_id=item["task_id"], state=item["state"]))
        return results

    async def submit_fan_in(
        self, parts: Sequence[tuple[str, SubmitTaskRequest]], join: tuple[str, SubmitTaskRequest]
    ) -> FanIn:
        """A fan-out and its fan-in in one batch: ``parts`` (key, request) pairs, then
        ``join``, which waits until every part has succeeded (its ``depends_on_keys`` are
        the parts' keys, after any it names itself) and is cancelled if one does not.

        At most 999 parts (one batch). Like ``submit_many``, safe to repeat with the same
        keys and requests: nothing is created twice."""
        if len(parts) + 1 > MAX_BATCH_TASKS:
            raise InvalidRequestError(
                f"parts: at most {MAX_BATCH_TASKS - 1} in one fan-in, got {len(parts)}", field="parts"
            )
        key, request = join
        keys = tuple(dict.fromkeys((*request.depends_on_keys, *(k for k, _ in parts))))
        joined = attrs.evolve(request, depends_on_keys=keys)
        *done, last = await self.submit_many([*parts, (key, joined)])
        return FanIn(done, last)

    async def list_children(
        self, task_id: str, *, limit: int | None = None, after: str | None = None
    ) -> Page[TaskChild]:
        """One page of the tasks that name ``task_id`` in ``depends_on``, by id, with their
        states; pass ``page.next_cursor`` as ``after`` for the next."""
        _, document = await self._call(
            "GET", f"/v1/tasks/{path_segment(task_id)}/children", params={"limit": limit, "after": after}
        )
        return Page.from_document(TaskChild, document)

    async def get_task(self, task_id: str, *, wait_s: float | None = None) -> Task:
        """One task, with its payload and, once finished, its result or error. With
        ``wait_s`` (0 to ``MAX_TASK_WAIT_S``, 30), the node answers once the task is in a
        terminal state, or after at most ``wait_s`` seconds with the task as it is then
        (docs/api.md, "Waiting for a task"); a node of a version before it answers at once."""
        params = None
        if wait_s is not None:
            params = {"wait_s": wait_param(wait_s)}
        _, document = await self._call("GET", f"/v1/tasks/{path_segment(task_id)}", params=params)
        return Task.from_json(document["data"])

    async def list_tasks(
        self,
        *,
        queue_id: str | None = None,
        state: str | Sequence[str] | None = None,
        filter: TaskFilter | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[TaskSummary]:
        """One page of summaries, newest first by (created_at, task_id); ``filter`` (and the
        ``queue_id`` / ``state`` shortcuts) narrow it. A queued task says why it waits
        (``waiting_reason``). Pass ``page.next_cursor`` as ``cursor``, with the same filter."""
        params = {} if filter is None else filter.to_params()
        if queue_id is not None:
            params["queue_id"] = queue_id
        if state is not None:
            params["state"] = state if isinstance(state, str) else ",".join(state)
        _, document = await self._call("GET", "/v1/tasks", params={**params, "limit": limit, "cursor": cursor})
        return Page.from_document(TaskSummary, document)

    async def iter_tasks(
        self, filter: TaskFilter | None = None, *, page_size: int | None = None
    ) -> AsyncIterator[TaskSummary]:
        """Every task ``filter`` matches, newest first, a page (``page_size``, 1-500) at a time."""
        cursor = None
        while True:
            page = await self.list_tasks(filter=filter, limit=page_size, cursor=cursor)
            for task in page.items:
                yield task
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def cancel_task(self, task_id: str) -> Task:
        """Queued: cancelled at once. Reserved/running: cancel requested; the Worker's handler is
        cancelled and the task ends ``cancelled``. A task that finished otherwise: ``FailedPreconditionError``."""
        _, document = await self._call("POST", f"/v1/tasks/{path_segment(task_id)}/cancel")
        return Task.from_json(document["data"])

    async def retry_task(self, task_id: str) -> SubmitResult:
        """Run a failed, cancelled or expired task again, as a new task linked to it
        (``retried_from``); ``created`` is False when it was retried before (the same new
        task). Any other state: ``FailedPreconditionError``."""
        status, document = await self._call("POST", f"/v1/tasks/{path_segment(task_id)}/retry")
        return SubmitResult(Task.from_json(document["data"]), created=status == 201)

    async def bulk_cancel(
        self, filter: TaskFilter, *, limit: int | None = None, cursor: str | None = None
    ) -> BulkResult:
        """Cancel the next ``limit`` (at most 1,000) tasks ``filter`` matches, newest first; go on
        with ``cursor=result.next_cursor`` until it is None (``iter_bulk_cancel`` does)."""
        return await self._bulk("cancel", filter, limit, cursor)

    async def bulk_retry(
        self, filter: TaskFilter, *, limit: int | None = None, cursor: str | None = None
    ) -> BulkResult:
        """Retry the next ``limit`` (at most 1,000) tasks ``filter`` matches, newest first; go on
        with ``cursor=result.next_cursor`` until it is None (``iter_bulk_retry`` does)."""
        return await self._bulk("retry", filter, limit, cursor)

    async def iter_bulk_cancel(self, filter: TaskFilter, *, limit: int | None = None) -> AsyncIterator[BulkResult]:
        """``bulk_cancel`` call after call, following the cursor until no more tasks match."""
        async for result in self._bulk_pages("cancel", filter, limit):
            yield result

    async def iter_bulk_retry(self, filter: TaskFilter, *, limit: int | None = None) -> AsyncIterator[BulkResult]:
        """``bulk_retry`` call after call, following the cursor until no more tasks match."""
        async for result in self._bulk_pages("retry", filter, limit):
            yield result

    async def _bulk_pages(self, action: str, filter: TaskFilter, limit: int | None) -> AsyncIterator[BulkResult]:
        cursor = None
        while True:
            result = await self._bulk(action, filter, limit, cursor)
            yield result
            if result.next_cursor is None:
                return
            cursor = result.next_cursor

    async def _bulk(self, action: str, filter: TaskFilter, limit: int | None, cursor: str | None) -> BulkResult:
        body: dict[str, Any] = {"filter": filter.to_json()}
        if limit is not None:
            body["limit"] = limit
        if cursor is not None:
            body["cursor"] = cursor
        _, document = await self._call("POST", f"/v1/tasks/bulk-{action}", body=body)
        data, request_id = document["data"], document.get("request_id")
        items = [
            BulkItem(
                task_id=item["task_id"],
                outcome=item["outcome"],
                state=item["state"],
                retry_task_id=item.get("retry_task_id"),
                # A refusal is the error the single route would raise (409 FAILED_PRECONDITION).
                error=api_error(item["error"], 409, request_id) if "error" in item else None,
            )
            for item in data["results"]
        ]
        return BulkResult(
            changed=data["changed"],
            unchanged=data["unchanged"],
            refused=data["refused"],
            items=items,
            next_cursor=document.get("next_cursor"),
        )

    # -- plans

    async def create_plan(
        self, name: str, queue_id: str, definition: PlanDefinition | Mapping[str, Any] | None = None
    ) -> Plan:
        """A plan in a queue; with ``definition``, version 1 is created and activated at once."""
        body: dict[str, Any] = {"name": name, "queue_id": queue_id}
        if definition is not None:
            body["definition"] = definition_json(definition)
        _, document = await self._call("POST", "/v1/plans", body=body)
        return Plan.from_json(document["data"])

    async def add_plan_version(self, plan_id: str, definition: PlanDefinition | Mapping[str, Any]) -> PlanVersion:
        """The next immutable version; it takes effect once activated."""
        _, document = await self._call(
            "POST", f"/v1/plans/{path_segment(plan_id)}/versions", body={"definition": definition_json(definition)}
        )
        return PlanVersion.from_json(document["data"])

    async def activate_plan_version(self, plan_id: str, version: int) -> Plan:
        """Make ``version`` the one the plan fires from."""
        _, document = await self._call("POST", f"/v1/plans/{path_segment(plan_id)}/activate", body={"version": version})
        return Plan.from_json(document["data"])

    async def pause_plan(self, plan_id: str) -> Plan:
        """Stop firing (fire times passed while paused are not caught up)."""
        _, document = await self._call("POST", f"/v1/plans/{path_segment(plan_id)}/pause")
        return Plan.from_json(document["data"])

    async def resume_plan(self, plan_id: str) -> Plan:
        """Fire again from the active version."""
        _, document = await self._call("POST", f"/v1/plans/{path_segment(plan_id)}/resume")
        return Plan.from_json(document["data"])

    async def get_plan(self, plan_id: str) -> Plan:
        """One plan."""
        _, document = await self._call("GET", f"/v1/plans/{path_segment(plan_id)}")
        return Plan.from_json(document["data"])

    async def list_plans(
        self, *, queue_id: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> Page[Plan]:
        """One page of plans (of one queue with ``queue_id``)."""
        _, document = await self._call(
            "GET", "/v1/plans", params={"queue_id": queue_id, "limit": limit, "cursor": cursor}
        )
        return Page.from_document(Plan, document)

    async def get_plan_version(self, plan_id: str, version: int) -> PlanVersion:
        """One version of a plan."""
        _, document = await self._call("GET", f"/v1/plans/{path_segment(plan_id)}/versions/{int(version)}")
        return PlanVersion.from_json(document["data"])

    async def list_plan_versions(
        self, plan_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[PlanVersion]:
        """Versions, oldest first."""
        _, document = await self._call(
            "GET", f"/v1/plans/{path_segment(plan_id)}/versions", params={"limit": limit, "cursor": cursor}
        )
        return Page.from_document(PlanVersion, document)

    async def list_plan_tasks(
        self, plan_id: str, *, state: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> Page[PlanTaskSummary]:
        """The tasks the plan created, newest first."""
        _, document = await self._call(
            "GET", f"/v1/plans/{path_segment(plan_id)}/tasks", params={"state": state, "limit": limit, "cursor": cursor}
        )
        return Page.from_document(PlanTaskSummary, document)

    # -- queues

    async def create_queue(
        self,
        name: str,
        *,
        max_concurrency: int | None = None,
        max_starts_per_second: int | None = None,
        max_running_per_key: int | None = None,
    ) -> Queue:
        """A queue in the credential's namespace; controls default to unlimited, and
        ``max_running_per_key`` (1-1000) to 1: one task of a resource key at a time."""
        body: dict[str, Any] = {"name": name}
        if max_concurrency is not None:
            body["max_concurrency"] = max_concurrency
        if max_starts_per_second is not None:
            body["max_starts_per_second"] = max_starts_per_second
        if max_running_per_key is not None:
            body["max_running_per_key"] = max_running_per_key
        _, document = await self._call("POST", "/v1/queues", body=body)
        return Queue.from_json(document["data"])

    async def get_queue(self, queue_id: str) -> Queue:
        """One queue."""
        _, document = await self._call("GET", f"/v1/queues/{path_segment(queue_id)}")
        return Queue.from_json(document["data"])

    async def list_queues(self, *, limit: int | None = None, cursor: str | None = None) -> Page[Queue]:
        """One page of the namespace's queues the credential may read."""
        _, document = await self._call("GET", "/v1/queues", params={"limit": limit, "cursor": cursor})
        return Page.from_document(Queue, document)

    async def pause_queue(self, queue_id: str) -> Queue:
        """Stop dispatching the queue's tasks (submissions are still accepted)."""
        _, document = await self._call("POST", f"/v1/queues/{path_segment(queue_id)}/pause")
        return Queue.from_json(document["data"])

    async def resume_queue(self, queue_id: str) -> Queue:
        """Dispatch the queue's tasks again."""
        _, document = await self._call("POST", f"/v1/queues/{path_segment(queue_id)}/resume")
        return Queue.from_json(document["data"])

    async def set_queue_controls(
        self,
        queue_id: str,
        *,
        max_concurrency: int | None = UNSET,
        max_starts_per_second: int | None = UNSET,
        max_running_per_key: int = UNSET,
    ) -> Queue:
        """Change the named controls; None means unlimited (``max_running_per_key``:
        1-1000, never None), an omitted control is kept."""
        body = {
            name: value
            for name, value in (
                ("max_concurrency", max_concurrency),
                ("max_starts_per_second", max_starts_per_second),
                ("max_running_per_key", max_running_per_key),
            )
            if value is not UNSET
        }
        if not body:
            raise InvalidRequestError(
                "set_queue_controls: name max_concurrency, max_starts_per_second and/or max_running_per_key",
                field="max_concurrency",
            )
        _, document = await self._call("PATCH", f"/v1/queues/{path_segment(queue_id)}/controls", body=body)
        return Queue.from_json(document["data"])

    # -- waiting for tasks

    def as_finished(self, task_ids: Iterable[str], timeout_s: float | None = None) -> AsyncIterator[Task]:
        """Each task of ``task_ids`` once it reached a terminal state (succeeded, failed,
        cancelled, expired), in the order they are seen finished:
        ``async for task in client.as_finished(ids, timeout_s=60): ...``.

        Reads ``GET /v1/tasks/{id}`` of every unfinished task, 0.1 s after the first
        round then doubling to one round every 2 s; the last unfinished task is read
        with ``wait_s`` instead, answered by the node as soon as it ends (docs/sdk.md,
        "Waiting for tasks", has the cost). ``timeout_s`` (None: no bound) ends it with ``WaitTimeoutError``
        naming the tasks not finished. A read the node could not answer (unreachable,
        503, 429) is tried again next round; any other refusal (``NotFoundError`` for an
        unknown id, ...) is raised at once. Ids that are not 32-hex are an
        ``InvalidRequestError`` naming ``task_ids[i]``; a repeated id is waited for once."""
        from .waiting import as_finished  # waiting builds on this module

        return as_finished(self, task_ids, timeout_s)

    async def wait(self, task_ids: Iterable[str], timeout_s: float | None = None) -> list[Task]:
        """Wait until every task of ``task_ids`` reached a terminal state; the tasks, in
        the order of ``task_ids`` (each id once). ``WaitTimeoutError`` after ``timeout_s``
        names the unfinished ones (``.unfinished``) and holds the finished (``.finished``).
        Each round reads every unfinished task with ``wait_s``: the node answers each as
        soon as it ends (or after 30 s), so a wait costs about a request per task per
        30 s; a node that does not wait (a version before ``wait_s``) is polled as
        ``as_finished`` polls."""
        from .waiting import as_finished, task_id_list

        order = task_id_list(task_ids)
        tasks = {task.task_id: task async for task in as_finished(self, order, timeout_s, every_task_waits=True)}
        return [tasks[task_id] for task_id in order]
