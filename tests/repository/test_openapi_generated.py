"""schema/openapi.yaml as its users use it: clients generated from it.

A Python client (openapi-python-client) must come out whole: no warning, a function for
every operation, a model for every answer, and task fields typed rather than left in a
bag of extras. TypeScript types (openapi-typescript, through npx) must type every schema,
a plan's schedule included. Then a short flow through the generated Python client
against a real node: every answer is a status the document declares and parses into the
model it names.
"""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from ..helpers import BIN, REPO
from ..nodeutil import make_tenant

DOCUMENT_PATH = REPO / "schema" / "openapi.yaml"
DOCUMENT = yaml.safe_load(DOCUMENT_PATH.read_text())
HTTP_METHODS = {"get", "put", "post", "delete", "patch"}
# The generated package's name: unique, so that it cannot shadow anything importable.
PACKAGE = "orbit_openapi_generated_client"
# What npm prints when it cannot reach its registry (the only reason to skip the TypeScript test).
REGISTRY_UNREACHABLE = re.compile(r"ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH|EHOSTUNREACH")
# A bound on one generator run: each takes a few seconds (npx's first run also downloads
# openapi-typescript).
GENERATE_TIMEOUT_S = 120


def snake(name: str) -> str:
    """openapi-python-client's module name of an operationId (submitTasks -> submit_tasks)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def operations() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in DOCUMENT["paths"].items():
        for method, operation in item.items():
            if method in HTTP_METHODS:
                yield method, path, operation


def used_schemas() -> set[str]:
    """The component schemas the operations use, directly or through other schemas."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/components/"):
                kind, name = ref.split("/")[2:4]
                if kind != "schemas" or name not in found:
                    found.update([name] if kind == "schemas" else [])
                    walk(DOCUMENT["components"][kind][name])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(DOCUMENT["paths"])
    return found


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """openapi-python-client's run over the document, and the package it wrote."""
    root = tmp_path_factory.mktemp("python-client")
    config = root / "config.yaml"
    # No post hooks: by default the generator runs ruff over its output when ruff is on
    # PATH, which makes the run slower and its output depend on PATH; the formatting of
    # the output is not what is tested here.
    config.write_text("post_hooks: []\n")
    package = root / PACKAGE
    result = subprocess.run(
        [
            str(BIN / "openapi-python-client"),
            "generate",
            "--path",
            str(DOCUMENT_PATH),
            "--output-path",
            str(package),
            "--meta",
            "none",
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=GENERATE_TIMEOUT_S,
        cwd=root,
    )
    return result, package


@pytest.fixture(scope="module")
def client_package(generated) -> Iterator[ModuleType]:
    """The generated package, imported."""
    result, package = generated
    assert result.returncode == 0, result.stdout + result.stderr
    sys.path.insert(0, str(package.parent))
    try:
        package_module = importlib.import_module(PACKAGE)
        # Its models subpackage is an attribute only once imported (the generated API
        # modules import it; a test that reads models first must not depend on their order).
        importlib.import_module(PACKAGE + ".models")
        yield package_module
    finally:
        sys.path.remove(str(package.parent))
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def test_the_python_client_is_generated_without_a_warning(generated):
    result, _ = generated
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # A schema the generator cannot read is dropped with a warning, and whatever refers to
    # it goes with it; an operation it cannot read is skipped with a warning.
    assert "warning" not in output.lower(), output
    assert "error" not in output.lower(), output


def test_every_operation_has_a_generated_function_and_every_answer_a_model(generated, client_package):
    _, package = generated
    for method, path, operation in operations():
        tag = operation["tags"][0]
        module = importlib.import_module(f"{PACKAGE}.api.{tag}.{snake(operation['operationId'])}")
        assert hasattr(module, "asyncio_detailed"), (method, path)
        source = (package / "api" / tag / f"{snake(operation['operationId'])}.py").read_text()
        for status, response in operation["responses"].items():
            content = response.get("content", {}).get("application/json")
            if content is None and "$ref" in response:
                name = response["$ref"].rsplit("/", 1)[-1]
                content = DOCUMENT["components"]["responses"][name].get("content", {}).get("application/json")
            if content is None:
                continue
            model = content["schema"]["$ref"].rsplit("/", 1)[-1]
            # The answer is parsed into its model, not left as raw JSON or omitted.
            assert f"if response.status_code == {status}:" in source, (method, path, status)
            assert f"{model}.from_dict(" in source, (method, path, status, model)
    models = client_package.models
    for name in sorted(used_schemas()):
        schema = DOCUMENT["components"]["schemas"][name]
        if schema.get("type") == "object" or "allOf" in schema:
            assert hasattr(models, name), f"no model for {name}"


def test_the_generated_task_models_type_every_field(client_package):
    models = client_package.models
    for model, schemas in [
        ("Task", ["TaskFields", "TaskDetailFields"]),
        ("TaskListItem", ["TaskFields", "WaitingReasonField"]),
        ("PlanTaskSummary", ["TaskFields", "PlanVersionField"]),
    ]:
        fields = {field.name for field in getattr(models, model).__attrs_attrs__}
        expected = {name for schema in schemas for name in DOCUMENT["components"]["schemas"][schema]["properties"]}
        assert expected <= fields, (model, expected - fields)


def test_typescript_types_are_generated_and_a_schedule_is_typed(tmp_path):
    npx = shutil.which("npx")
    assert npx is not None, "npx (Node.js 20 and npm) is needed to generate the TypeScript types"
    output = tmp_path / "orbit.d.ts"
    result = subprocess.run(
        [npx, "--yes", "openapi-typescript@7", str(DOCUMENT_PATH), "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=GENERATE_TIMEOUT_S,
        cwd=tmp_path,
    )
    if result.returncode != 0 and REGISTRY_UNREACHABLE.search(result.stderr):
        pytest.skip(f"the npm registry is unreachable: {result.stderr.strip().splitlines()[-1]}")
    assert result.returncode == 0, result.stdout + result.stderr
    types = output.read_text()
    schedule = re.search(r"^ {8}PlanSchedule: (.*?)^ {8}\S.*?;$", types, re.M | re.S)
    assert schedule is not None, types[:2000]
    assert "unknown" not in schedule.group(0), schedule.group(0)
    assert 'schedule: components["schemas"]["PlanSchedule"];' in types
    # Optional in a request: an interval schedule with a time zone is refused.
    assert re.search(r"^ {12}time_zone\?: string;$", schedule.group(0), re.M), schedule.group(0)
    # Optional in an answer: a plan version's definition is answered as it was given.
    assert re.search(r"^ {12}catch_up\?: ", schedule.group(0), re.M), schedule.group(0)
    # Every enumeration has a type (an untyped one comes out as `@enum {unknown}`).
    assert "@enum {unknown}" not in types


def generated_operation(tag: str, name: str) -> ModuleType:
    """The generated module of one operation (``asyncio_detailed`` and friends)."""
    return importlib.import_module(f"{PACKAGE}.api.{tag}.{name}")


def ok(response: Any, status: int, model: type) -> Any:
    """A generated client's answer: the expected status, parsed into its model with no
    untyped leftovers."""
    assert response.status_code == status, response.content
    assert isinstance(response.parsed, model), (type(response.parsed), response.content)
    data = response.parsed.data
    for value in data if isinstance(data, list) else [data]:
        assert getattr(value, "additional_properties", {}) == {}, value
    return response.parsed


async def test_a_flow_through_the_generated_client(client_package, running_node, db):
    tenant = await make_tenant(db)
    submit_task, submit_tasks, get_task, list_tasks, explain_task, cancel_task, retry_task, bulk_cancel, bulk_retry = (
        generated_operation("tasks", name)
        for name in (
            "submit_task",
            "submit_tasks",
            "get_task",
            "list_tasks",
            "explain_task",
            "cancel_task",
            "retry_task",
            "bulk_cancel_tasks",
            "bulk_retry_tasks",
        )
    )
    create_plan, add_plan_version, list_plan_versions, get_plan_version = (
        generated_operation("plans", name)
        for name in ("create_plan", "add_plan_version", "list_plan_versions", "get_plan_version")
    )
    m = client_package.models
    # An answer with a status the document does not declare raises instead of passing.
    client = client_package.AuthenticatedClient(
        base_url=running_node.base_url, token=tenant.token, raise_on_unexpected_status=True
    )

    def request(**extra: Any) -> Any:
        return m.SubmitTaskRequest(
            queue_id=tenant.queue_id,
            handler="object.prepare",
            handler_version="v1",
            payload_version="v1",
            payload={"n": 10**30, "ref": "objects/example"},
            **extra,
        )

    async with client:
        created = ok(
            await submit_task.asyncio_detailed(client=client, body=request(priority=9), idempotency_key="one"),
            201,
            m.TaskEnvelope,
        )
        task = created.data
        assert task.priority == 9 and task.payload == {"n": 10**30, "ref": "objects/example"}
        assert task.state == m.TaskState.QUEUED

        items = [
            m.SubmitTasksItem(
                idempotency_key=key,
                queue_id=tenant.queue_id,
                handler="object.prepare",
                handler_version="v1",
                payload_version="v1",
                payload={"key": key},
                resource_key="objects/example",
            )
            for key in ("two", "three")
        ]
        batch = ok(
            await submit_tasks.asyncio_detailed(client=client, body=m.SubmitTasksRequest(tasks=items)),
            200,
            m.SubmitTasksEnvelope,
        ).data
        assert (batch.created, batch.existing, batch.refused) == (2, 0, 0)
        assert all(isinstance(r, m.SubmitTasksAccepted) and r.status == 201 for r in batch.results)
        batch_ids = [r.task.task_id for r in batch.results]

        got = ok(await get_task.asyncio_detailed(task.task_id, client=client), 200, m.TaskEnvelope).data
        assert got.task_id == task.task_id and got.backoff.max_ms == 300000 and got.reserved_at is None
        missing = await get_task.asyncio_detailed("0" * 32, client=client)
        assert missing.status_code == 404 and missing.parsed.error.code == m.ErrorCode.NOT_FOUND

        listed = ok(
            await list_tasks.asyncio_detailed(client=client, queue_id=tenant.queue_id, limit=10),
            200,
            m.TaskListEnvelope,
        )
        assert {t.task_id for t in listed.data} == {task.task_id, *batch_ids}
        assert {t.waiting_reason for t in listed.data} == {m.WaitingReason.NO_CAPABLE_WORKER}

        explained = ok(
            await explain_task.asyncio_detailed(task.task_id, client=client), 200, m.ExplanationEnvelope
        ).data
        assert explained.priority == 9 and explained.capable_connections == 0
        assert isinstance(explained.position, m.ExplanationPosition)
        assert "NO_CAPABLE_WORKER" in {reason.code for reason in explained.reasons}

        cancelled = ok(await cancel_task.asyncio_detailed(task.task_id, client=client), 200, m.TaskEnvelope).data
        assert cancelled.state == m.TaskState.CANCELLED and cancelled.finished_at is not None
        retried = ok(await retry_task.asyncio_detailed(task.task_id, client=client), 201, m.TaskEnvelope).data
        assert retried.retried_from == task.task_id

        bulk = m.BulkRequest(filter_=m.TaskFilter(task_ids=batch_ids))
        cancelled_bulk = ok(await bulk_cancel.asyncio_detailed(client=client, body=bulk), 200, m.BulkEnvelope)
        assert cancelled_bulk.data.changed == 2 and cancelled_bulk.next_cursor is None
        assert {r.outcome for r in cancelled_bulk.data.results} == {m.BulkResultOutcome.CANCELLED}
        retried_bulk = ok(await bulk_retry.asyncio_detailed(client=client, body=bulk), 200, m.BulkEnvelope)
        assert {r.outcome for r in retried_bulk.data.results} == {m.BulkResultOutcome.RETRIED}
        assert all(isinstance(r.retry_task_id, str) for r in retried_bulk.data.results)

        template = m.PlanTaskTemplate(
            handler="report.build", handler_version="v1", payload_version="v1", payload={"scope": "all"}, priority=7
        )
        # An interval schedule as the generated model writes it (no time zone: an interval has none).
        plan = ok(
            await create_plan.asyncio_detailed(
                client=client,
                body=m.CreatePlanRequest(
                    name="nightly-report",
                    queue_id=tenant.queue_id,
                    definition=m.PlanDefinition(task=template, schedule=m.PlanSchedule(interval_s=3600)),
                ),
            ),
            201,
            m.PlanEnvelope,
        ).data
        assert plan.active_version == 1 and plan.next_fire_at is not None
        cron = m.PlanSchedule(cron="0 2 * * *", time_zone="Europe/Berlin", catch_up=m.PlanScheduleCatchUp.FIRE_ONCE)
        version = ok(
            await add_plan_version.asyncio_detailed(
                plan.plan_id,
                client=client,
                body=m.AddPlanVersionRequest(definition=m.PlanDefinition(task=template, schedule=cron)),
            ),
            201,
            m.PlanVersionEnvelope,
        ).data
        assert version.version == 2 and version.definition.schedule.time_zone == "Europe/Berlin"
        versions = ok(
            await list_plan_versions.asyncio_detailed(plan.plan_id, client=client),
            200,
            m.PlanVersionListEnvelope,
        )
        assert [v.version for v in versions.data] == [1, 2]
        assert versions.data[0].definition.schedule.interval_s == 3600
        again = ok(
            await get_plan_version.asyncio_detailed(plan.plan_id, 2, client=client), 200, m.PlanVersionEnvelope
        ).data
        assert again.definition.schedule.cron == "0 2 * * *"
        assert again.definition.task.payload == {"scope": "all"}
