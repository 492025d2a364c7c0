"""Everything the SDK raises is an ``OrbitClientError`` (docs/sdk.md, "Errors"): a value
that is not JSON is an ``InvalidRequestError`` naming its path and nothing is sent, a
Worker's result that is not JSON fails the attempt with a message naming it, and the
SDK's errors are its own, none of them one of the node's."""

from __future__ import annotations

import math
from datetime import datetime

import httpx
import pytest
import trio

import orbit_sdk as sdk
from orbit_node.domain import errors
from orbit_sdk import (
    ConfigError,
    Credentials,
    InvalidRequestError,
    OrbitClient,
    OrbitClientError,
    Worker,
    WorkerRejected,
    WorkerTask,
)

from ..nodeutil import count_rows, make_tenant, task_request


class Sent:
    """Counts the requests that reached the transport."""

    def __init__(self):
        self.requests: list[httpx.Request] = []

    async def on_request(self, request: httpx.Request):
        self.requests.append(request)


class Opaque:
    pass


# (payload, the field the error names, words of its message)
NOT_JSON = [
    ({"tags": {"a", "b"}}, "payload.tags", "a set is not a JSON value"),
    ({"items": [1, {"score": math.nan}]}, "payload.items[1].score", "nan is not a JSON number"),
    ({"when": datetime(2030, 1, 1)}, "payload.when", "a datetime is not a JSON value"),
    ([1, 2, b"raw"], "payload[2]", "a bytes is not a JSON value"),
    ({"pair": {(1, 2): "x"}}, "payload.pair", "key (1, 2) is a tuple; JSON object keys are strings"),
    (Opaque(), "payload", "a Opaque is not a JSON value"),
]


async def test_a_payload_that_is_not_json_names_its_path_and_sends_nothing(running_node, db):
    tenant = await make_tenant(db)
    sent = Sent()
    async with OrbitClient(running_node.base_url, tenant.token, event_hooks={"request": [sent.on_request]}) as client:
        for payload, field, words in NOT_JSON:
            with pytest.raises(InvalidRequestError) as info:
                await client.submit_task("k", task_request(tenant.queue_id, payload))
            error = info.value
            assert isinstance(error, OrbitClientError) and isinstance(error, ValueError)
            assert error.field == field, error
            assert str(error).startswith(f"{field}: ") and words in str(error), str(error)
            assert "nothing was sent" in str(error)
        cyclic: list = []
        cyclic.append(cyclic)
        with pytest.raises(InvalidRequestError, match=r"payload\[0\]: the value contains itself"):
            await client.submit_task("k", task_request(tenant.queue_id, cyclic))
        # A tuple is a list and an int key a string, as Python's json writes them.
        accepted = await client.submit_task("ok", task_request(tenant.queue_id, {"t": (1, 2), 3: "x"}))
        assert accepted.task.payload == {"t": [1, 2], "3": "x"}
    assert len(sent.requests) == 1
    assert await count_rows(db, "tasks") == 1


async def test_submit_many_checks_every_item_before_the_first_batch(running_node, db):
    """One bad item among many: named by its place among the requests, and no batch is
    sent (before, the batches ahead of it were committed, then a bare TypeError)."""
    tenant = await make_tenant(db)
    items = [(f"k{i}", task_request(tenant.queue_id, {"n": i})) for i in range(3)]
    items.append(("bad", task_request(tenant.queue_id, {"n": 3, "seen": {3}})))
    async with OrbitClient(running_node.base_url, tenant.token) as client:
        with pytest.raises(InvalidRequestError) as info:
            await client.submit_many(items, batch_size=1)
        assert info.value.field == "requests[3].payload.seen"
        assert await count_rows(db, "tasks") == 0
        for bad in (0, 1001, True, 2.5):
            with pytest.raises(InvalidRequestError) as info:
                await client.submit_many(items[:3], batch_size=bad)
            assert info.value.field == "batch_size"
        results = await client.submit_many(items[:3], batch_size=2)
        assert [r.status for r in results] == [201, 201, 201]
        with pytest.raises(InvalidRequestError) as info:
            await client.set_queue_controls(tenant.queue_id)
        assert info.value.field == "max_concurrency"
    with pytest.raises(InvalidRequestError) as info:
        task_request(tenant.queue_id, 1, available_at=datetime(2030, 1, 1))
    assert info.value.field == "available_at"


def test_the_sdks_errors_are_its_own():
    """Every error the SDK exports is an ``OrbitClientError`` and none is one of the node's
    (``orbit_node.domain.errors``, which carry the status the node answers with)."""
    classes = [getattr(sdk, name) for name in sdk.__all__]
    # PermanentError is the handlers' to raise, not the SDK's.
    error_classes = [
        c for c in classes if isinstance(c, type) and issubclass(c, BaseException) and c is not sdk.PermanentError
    ]
    assert {c.__name__ for c in error_classes} >= {"ConfigError", "WorkerRejected", "WaitTimeoutError", "ApiError"}
    for cls in error_classes:
        assert issubclass(cls, OrbitClientError), cls
        assert not issubclass(cls, errors.OrbitError), cls
        assert not hasattr(cls, "http_status"), cls
    api = sdk.InvalidArgumentError("bad", status=400, code="INVALID_ARGUMENT", field="priority", request_id="req_1")
    assert (api.status, api.code, api.field, api.message) == (400, "INVALID_ARGUMENT", "priority", "bad")


def test_configuration_errors_are_client_errors(tmp_path):
    for call in (lambda: Credentials.load(tmp_path / "missing.json"), lambda: OrbitClient.from_env({})):
        with pytest.raises(ConfigError) as info:
            call()
        assert isinstance(info.value, OrbitClientError) and not isinstance(info.value, errors.OrbitError)
        assert info.value.field == "ORBIT_CREDENTIALS_FILE"
    with pytest.raises(ConfigError) as info:  # before: httpx.InvalidURL
        OrbitClient("http://[::1", "t")
    assert info.value.field == "url" and "'http://[::1'" in str(info.value)
    assert issubclass(WorkerRejected, OrbitClientError)


async def test_a_result_that_is_not_json_fails_the_attempt_naming_it(full_node, db):
    """NaN in a result used to go out in the Finish, which the node refuses as malformed:
    no ack came and the Worker waited for ever. Now the attempt fails, saying where."""
    tenant = await make_tenant(db)
    worker = Worker(full_node.base_url, tenant.token, [tenant.queue_id], capacity=2)

    @worker.handler("h", "v1", "v1")
    async def answer(task: WorkerTask):
        return {"nan": {"score": math.nan}, "set": {"tags": {"x"}}}[task.payload]

    async with OrbitClient(full_node.base_url, tenant.token) as client:
        ids = {
            kind: (await client.submit_task(kind, task_request(tenant.queue_id, kind, max_attempts=1))).task.task_id
            for kind in ("nan", "set")
        }
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await worker.wait_finished(2)
                await worker.drain()
        tasks = [await client.get_task(task_id) for task_id in ids.values()]
    messages = {task.task_id: (task.state, task.error["message"]) for task in tasks}
    assert messages[ids["nan"]] == (
        "failed",
        "ValueError: result.score: nan is not a JSON number (NaN and infinities are not)",
    )
    assert messages[ids["set"]][1].startswith("ValueError: result.tags: a set is not a JSON value")
