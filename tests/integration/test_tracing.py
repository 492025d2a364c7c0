"""OpenTelemetry tracing through a real node: the producer's span context goes with the
submit, is kept with the task (and its retry), and the Worker's ``orbit.task`` span
continues it; a malformed ``traceparent`` is ignored and nothing is stored.

The spans are recorded in memory by the OpenTelemetry SDK. Its tracer provider is
global and can be installed once per process, so it is installed by the first test
that needs it and kept; each test reads only the spans of its own trace ids.
"""

from __future__ import annotations

import pytest
import trio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from orbit_node import trace_context
from orbit_node.services import default_services
from orbit_sdk import OrbitClient, PermanentError, SubmitTaskRequest, Worker, WorkerTask

from ..nodeutil import make_tenant, run_node

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACE_ID = int("0af7651916cd43dd8448eb211c80319c", 16)

_exporter: InMemorySpanExporter | None = None


@pytest.fixture
def spans() -> InMemorySpanExporter:
    """The process's in-memory span exporter (installed once), emptied for this test."""
    global _exporter
    if _exporter is None:
        _exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)
    _exporter.clear()
    return _exporter


@pytest.fixture
async def node(node_config):
    async with run_node(node_config, services=default_services()) as running:
        yield running


def request(queue_id: str, payload: object, handler: str = "h") -> SubmitTaskRequest:
    return SubmitTaskRequest(
        queue_id=queue_id, handler=handler, handler_version="v1", payload_version="v1", payload=payload
    )


async def run_worker(worker: Worker, finished: int) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await worker.wait_finished(finished)
            await worker.drain()


def task_spans(spans: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    """The Worker's orbit.task spans by task id (one attempt each here)."""
    found = {}
    for span in spans.get_finished_spans():
        if span.name == "orbit.task":
            assert span.attributes is not None
            found[str(span.attributes["orbit.task_id"])] = span
    return found


def worker_of(node, tenant) -> Worker:
    worker = Worker(node.base_url, tenant.token, [tenant.queue_id], capacity=4)
    worker.register("h", "v1", "v1", lambda task: {"ok": task.payload})
    return worker


async def stored_contexts(db) -> dict[str, str]:
    rows = await db.run(lambda tx: tx.fetchall_raw("SELECT task_id, trace_context FROM task_trace_contexts"))
    return {r["task_id"]: r["trace_context"] for r in rows}


async def test_a_submits_trace_reaches_the_handlers_span(spans, node, db):
    tenant = await make_tenant(db, "traced")
    tracer = trace.get_tracer("test.producer")
    seen: list[str] = []
    worker = Worker(node.base_url, tenant.token, [tenant.queue_id], capacity=4)

    @worker.handler("h", "v1", "v1")
    async def handle(task: WorkerTask) -> None:
        # The handler runs inside orbit.task: its own spans are children of it.
        seen.append(f"{trace.get_current_span().get_span_context().trace_id:032x}")

    async with OrbitClient(node.base_url, tenant.token) as client:
        with tracer.start_as_current_span("produce") as producer:
            accepted = await client.submit_task("traced-1", request(tenant.queue_id, 1))
        await run_worker(worker, 1)
    task_id = accepted.task.task_id
    trace_id = producer.get_span_context().trace_id
    span = task_spans(spans)[task_id]
    assert span.context.trace_id == trace_id
    assert span.parent is not None and span.parent.span_id == producer.get_span_context().span_id
    assert seen == [f"{trace_id:032x}"]
    assert span.attributes is not None
    assert span.attributes["orbit.handler"] == "h"
    assert span.attributes["orbit.attempt"] == 1
    assert span.attributes["orbit.queue_id"] == tenant.queue_id
    assert span.status.status_code is StatusCode.UNSET
    # The node's spans of the task are in the same trace.
    node_spans = {s.name for s in spans.get_finished_spans() if s.context.trace_id == trace_id}
    assert {"orbit.submit", "orbit.dispatch", "orbit.start", "orbit.finish"} <= node_spans
    assert (await stored_contexts(db))[task_id].startswith(f"00-{trace_id:032x}-")


async def test_each_item_of_a_batch_carries_the_trace(spans, node, db):
    tenant = await make_tenant(db, "batch")
    tracer = trace.get_tracer("test.producer")
    async with OrbitClient(node.base_url, tenant.token) as client:
        with tracer.start_as_current_span("produce") as producer:
            results = await client.submit_many([(f"b-{i}", request(tenant.queue_id, i)) for i in range(3)])
        await run_worker(worker_of(node, tenant), 3)
    found = task_spans(spans)
    trace_id = producer.get_span_context().trace_id
    assert {found[r.task_id].context.trace_id for r in results} == {trace_id}


async def test_a_retry_of_a_failed_task_continues_its_trace(spans, node, db):
    tenant = await make_tenant(db, "retried")
    tracer = trace.get_tracer("test.producer")
    calls: list[int] = []

    async def flaky(task: WorkerTask) -> str:
        calls.append(task.attempt)
        if len(calls) == 1:
            raise PermanentError("not yet", code="NOT_YET")
        return "done"

    # A drained Worker does not run again: one for the task, one for its retry.
    first_worker, second_worker = (Worker(node.base_url, tenant.token, [tenant.queue_id]) for _ in range(2))
    for worker in (first_worker, second_worker):
        worker.register("h", "v1", "v1", flaky)

    async with OrbitClient(node.base_url, tenant.token) as client:
        with tracer.start_as_current_span("produce") as producer:
            accepted = await client.submit_task("retried-1", request(tenant.queue_id, 1))
        await run_worker(first_worker, 1)
        [failed] = await client.wait([accepted.task.task_id], timeout_s=10)
        assert failed.state == "failed"
        retry = await client.retry_task(failed.task_id)  # no span is active here
        await run_worker(second_worker, 1)
    found = task_spans(spans)
    trace_id = producer.get_span_context().trace_id
    first, second = found[failed.task_id], found[retry.task.task_id]
    assert first.context.trace_id == second.context.trace_id == trace_id
    assert first.status.status_code is StatusCode.ERROR
    assert [event.name for event in first.events] == ["exception"]
    assert second.status.status_code is StatusCode.UNSET


async def test_without_a_traceparent_the_task_starts_a_trace_of_its_own(spans, node, db):
    tenant = await make_tenant(db, "untraced")
    async with OrbitClient(node.base_url, tenant.token) as client:
        accepted = await client.submit_task("untraced-1", request(tenant.queue_id, 1))
        await run_worker(worker_of(node, tenant), 1)
    span = task_spans(spans)[accepted.task.task_id]
    assert span.parent is None
    assert await stored_contexts(db) == {}


@pytest.mark.parametrize(
    "header",
    [
        "not a traceparent",
        "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # version 01
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # zero trace id
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # zero span id
        "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",  # uppercase
        "00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01",  # 31 hex
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1",  # 1-hex flags
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
    ],
)
async def test_a_malformed_traceparent_is_ignored(spans, node, db, header):
    tenant = await make_tenant(db, "malformed")
    body = {"queue_id": tenant.queue_id, "handler": "h", "handler_version": "v1", "payload_version": "v1", "payload": 1}
    async with node.client(tenant.token) as http:
        single = await http.post("/v1/tasks", json=body, headers={"Idempotency-Key": "m-1", "traceparent": header})
        batch = await http.post(
            "/v1/tasks/batch",
            json={"tasks": [{**body, "idempotency_key": "m-2"}]},
            headers={"traceparent": header, "tracestate": "vendor=value"},
        )
    assert single.status_code == 201, single.text
    assert batch.status_code == 200 and batch.json()["data"]["results"][0]["status"] == 201, batch.text
    assert await stored_contexts(db) == {}


async def test_a_valid_header_is_stored_as_given_and_repeats_do_not_conflict(spans, node, db):
    tenant = await make_tenant(db, "stored")
    body = {"queue_id": tenant.queue_id, "handler": "h", "handler_version": "v1", "payload_version": "v1", "payload": 1}
    async with node.client(tenant.token) as http:
        first = await http.post(
            "/v1/tasks",
            json=body,
            headers={"Idempotency-Key": "s-1", "traceparent": TRACEPARENT, "tracestate": "vendor=value"},
        )
        # The same request under another trace is the same request: 200, nothing changed.
        again = await http.post("/v1/tasks", json=body, headers={"Idempotency-Key": "s-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    task_id = first.json()["data"]["task_id"]
    assert await stored_contexts(db) == {task_id: f"{TRACEPARENT} vendor=value"}
    submit = [s for s in spans.get_finished_spans() if s.name == "orbit.submit" and s.context.trace_id == TRACE_ID]
    assert len(submit) == 1 and submit[0].parent is not None and submit[0].parent.is_remote


def test_trace_context_parse_follows_the_w3c_format():
    parsed = trace_context.parse(f" {TRACEPARENT} ", " vendor=value ")
    assert parsed == trace_context.TraceContext(TRACEPARENT, "vendor=value")
    assert trace_context.TraceContext.from_stored(parsed.stored()) == parsed
    assert trace_context.parse(TRACEPARENT, "x" * 513) == trace_context.TraceContext(TRACEPARENT)
    assert trace_context.parse(TRACEPARENT, "caf\u00e9=1") == trace_context.TraceContext(TRACEPARENT)
    assert trace_context.parse(None, "vendor=value") is None
    assert trace_context.parse("00-" + "f" * 32 + "-" + "f" * 16 + "-zz") is None


async def test_without_a_provider_the_dispatch_still_carries_the_producers_context(monkeypatch, node, db):
    """The node's own tracing off (no SDK installed) changes nothing the Worker receives: a
    task submitted with a context is dispatched with it, one submitted beside it without
    a context is dispatched with none."""
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: trace.ProxyTracerProvider())
    tenant = await make_tenant(db, "node-untraced")
    body = {"queue_id": tenant.queue_id, "handler": "h", "handler_version": "v1", "payload_version": "v1"}
    async with node.client(tenant.token) as http:
        traced = await http.post(
            "/v1/tasks",
            json={**body, "payload": 1},
            headers={"Idempotency-Key": "t-1", "traceparent": TRACEPARENT, "tracestate": "vendor=value"},
        )
        plain = await http.post("/v1/tasks", json={**body, "payload": 2}, headers={"Idempotency-Key": "t-2"})
    assert (traced.status_code, plain.status_code) == (201, 201)
    received: dict[str, tuple[str | None, str | None]] = {}
    worker = Worker(node.base_url, tenant.token, [tenant.queue_id], capacity=4)

    @worker.handler("h", "v1", "v1")
    async def record(task: WorkerTask) -> None:
        received[task.task_id] = (task.traceparent, task.tracestate)

    await run_worker(worker, 2)
    assert received == {
        traced.json()["data"]["task_id"]: (TRACEPARENT, "vendor=value"),
        plain.json()["data"]["task_id"]: (None, None),
    }


async def test_no_span_is_made_without_a_provider(monkeypatch):
    """Without an SDK the node and the SDK make no span at all (the API's defaults)."""
    from orbit_node import tracing as node_tracing
    from orbit_sdk import tracing as sdk_tracing

    monkeypatch.setattr(trace, "get_tracer_provider", lambda: trace.ProxyTracerProvider())
    assert not node_tracing.enabled() and not sdk_tracing.enabled()
    with node_tracing.span("orbit.submit", trace_context.parse(TRACEPARENT)) as span:
        assert span is trace.INVALID_SPAN
    assert sdk_tracing.context_headers() == {}
