"""Submit rate limits per application (orbit_node/admission/submit_rate.py, docs/operations.md).

The token bucket and the shares among nodes are pure, on an injected clock, and checked
with hypothesis; the limits are then checked end to end: set with orbit-admin (or the
store), enforced by real nodes over real HTTP on POST /v1/tasks and the batch route."""

from __future__ import annotations

import json
import math
import re

import httpx
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from orbit_node.admission.submit_rate import CLOSED_RETRY_AFTER_S, SubmitRates, TokenBucket
from orbit_node.domain.submit_limit import SubmitLimit
from orbit_node.services import Shard
from orbit_node.store.operations import OperationsStore

from ..helpers import cli
from ..nodeutil import RunningNode, assert_error, make_tenant, run_node
from .test_api_openapi import Checker
from .test_console import console, sign_in

rates = st.integers(min_value=1, max_value=10_000)
depths = st.integers(min_value=1, max_value=10_000)
# Gaps between two requests, seconds of the injected clock.
gaps = st.lists(st.floats(min_value=0, max_value=5, allow_nan=False), min_size=1, max_size=50)


class Clock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- the bucket, pure ----------------------------------------------------------------------


@given(rate=rates, depth=depths, wanted=st.integers(min_value=1, max_value=30_000))
def test_a_full_bucket_admits_its_depth_at_once_and_nothing_more(rate, depth, wanted):
    bucket = TokenBucket.full(rate, depth, 0.0)
    assert bucket.take(wanted, 0.0) == min(wanted, depth)
    if wanted >= depth:
        assert bucket.take(1, 0.0) == 0


@given(rate=rates, depth=depths, gaps=gaps, asks=st.lists(st.integers(min_value=0, max_value=50), min_size=50))
@settings(max_examples=200)
def test_over_any_span_it_admits_at_most_the_depth_plus_the_rate(rate, depth, gaps, asks):
    bucket = TokenBucket.full(rate, depth, 0.0)
    now = 0.0
    admitted = 0
    for gap, wanted in zip(gaps, asks, strict=False):
        now += gap
        taken = bucket.take(wanted, now)
        assert 0 <= taken <= wanted
        admitted += taken
    assert admitted <= depth + rate * now + 1e-6


@given(rate=rates, depth=depths, steps=st.integers(min_value=1, max_value=200))
def test_a_steady_caller_gets_the_rate(rate, depth, steps):
    """Asking for everything every tenth of a token's time: after the burst, the rate."""
    bucket = TokenBucket.full(rate, depth, 0.0)
    assert bucket.take(depth, 0.0) == depth
    step = 0.1 / rate
    admitted = sum(bucket.take(10**9, i * step) for i in range(1, steps + 1))
    assert admitted == math.floor(steps * step * rate + 1e-6)


@given(
    rate=rates,
    depth=depths,
    later=st.floats(min_value=0, max_value=3, allow_nan=False),
)
def test_retry_after_is_the_wait_for_one_token_rounded_up(rate, depth, later):
    bucket = TokenBucket.full(rate, depth, 0.0)
    bucket.take(depth, 0.0)
    now = later / rate
    tokens = min(depth, now * rate)
    if tokens >= 1 - 1e-9:
        assert bucket.wait_s(now) == 0
        return
    wait = bucket.wait_s(now)
    assert math.isclose(wait, (1 - tokens) / rate, rel_tol=1e-6, abs_tol=1e-9)
    assert bucket.retry_after_s(now) == max(1, math.ceil(wait - 1e-9))
    # Refilled: after the wait there is a token, and not a moment before it.
    assert bucket.take(1, now + wait * 0.999) == 0
    assert bucket.take(1, now + wait + 1e-9) == 1


def test_retry_after_in_whole_seconds():
    bucket = TokenBucket.full(0.25, 1, 0.0)  # one token every 4 s
    assert bucket.take(2, 0.0) == 1
    assert bucket.retry_after_s(0.0) == 4
    assert bucket.retry_after_s(1.5) == 3  # 2.5 s to go
    assert bucket.retry_after_s(3.99) == 1
    assert bucket.take(1, 4.0) == 1
    closed = TokenBucket.full(0, 0, 0.0)
    assert closed.take(1, 0.0) == 0
    assert closed.take(1, 1e6) == 0
    assert closed.retry_after_s(0.0) == CLOSED_RETRY_AFTER_S


@given(rate=rates, depth=depths, back=st.integers(min_value=0, max_value=20_000))
def test_tokens_given_back_never_pass_the_depth(rate, depth, back):
    bucket = TokenBucket.full(rate, depth, 0.0)
    taken = bucket.take(depth, 0.0)
    bucket.give_back(back, 0.0)
    assert bucket.available(0.0) == min(depth, back)
    assert taken == depth


@given(per_second=st.integers(min_value=0, max_value=10_000), burst=st.none() | depths, nodes=st.integers(1, 64))
def test_the_nodes_shares_add_up_to_the_limit(per_second, burst, nodes):
    limit = SubmitLimit(per_second, burst)
    rate, depth = limit.share(nodes)
    assert math.isclose(rate * nodes, per_second)
    if per_second == 0:
        assert depth == 0
    else:
        expected = per_second if burst is None else burst
        assert depth == max(1.0, expected / nodes)


def test_shares_follow_the_limits_and_the_nodes():
    clock = Clock()
    shares = SubmitRates(clock)
    assert shares.admit("a", 1000).admitted == 1000  # no limit: everything
    assert shares.configure({"a": SubmitLimit(10, 4)}, 1) == 1
    assert shares.admit("a", 10).admitted == 4  # starts full: the burst
    assert shares.admit("b", 10).admitted == 10  # another application: unlimited
    refused = shares.admit("a", 1)
    assert (refused.admitted, refused.retry_after_s) == (0, 1)
    clock.now += 0.25  # 2.5 tokens at 10/s
    assert shares.admit("a", 5).admitted == 2
    # A second node: each gets half; the tokens it had stay, up to the new depth.
    clock.now += 10
    assert shares.configure({"a": SubmitLimit(10, 4)}, 2) == 1
    assert shares.bucket("a") is not None and (shares.bucket("a").rate, shares.bucket("a").depth) == (5, 2)
    assert shares.admit("a", 5).admitted == 2
    assert shares.configure({"a": SubmitLimit(10, 4)}, 2) == 0  # nothing changed
    shares.give_back("a", 1)  # a repeat created nothing
    assert shares.admit("a", 5).admitted == 1
    # The limit removed: unlimited again.
    assert shares.configure({}, 2) == 1
    assert shares.admit("a", 1000).admitted == 1000


# -- real nodes -------------------------------------------------------------------------------


def body(queue_id: str, **extra) -> dict:
    return {
        "queue_id": queue_id,
        "handler": "object.prepare",
        "handler_version": "v1",
        "payload_version": "v1",
        "payload": {"n": 1},
        **extra,
    }


async def submit(client: httpx.AsyncClient, queue_id: str, key: str) -> httpx.Response:
    return await client.post("/v1/tasks", json=body(queue_id), headers={"Idempotency-Key": key})


def main_shard(running: RunningNode) -> Shard:
    return running.node.state.shards.main


async def limits_read(running: RunningNode, application_id: str, *, nodes: int = 1) -> None:
    """Wait until the node's follower has read the application's limit among ``nodes`` nodes."""
    shard = main_shard(running)
    assert shard.rate_follower is not None
    with trio.fail_after(10):
        while shard.rates.bucket(application_id) is None or shard.rates.nodes != nodes:
            await shard.rate_follower.wait_for_pass()


def refused_count(running: RunningNode, application: str) -> float:
    value = running.node.state.metrics.registry.get_sample_value(
        "orbit_requests_refused_total", {"application": application, "reason": "submit_rate"}
    )
    return value or 0.0


async def test_a_burst_is_admitted_then_429_with_retry_after_and_the_rate_resumes(node_config, db, dsn):
    check = Checker()
    limited = await make_tenant(db, "limited")
    other = await make_tenant(db, "other")
    done = cli("orbit-admin", "application", "rate", "limited", "--submits-per-second", "2", "--burst", "3", dsn=dsn)
    assert done.returncode == 0, done.stderr
    assert "limited: submits per second 2 (burst 3)" in done.stdout
    async with run_node(node_config) as running:
        await limits_read(running, limited.application_id)
        async with running.client(limited.token) as client, running.client(other.token) as client_b:
            for n in range(3):
                check(await submit(client, limited.queue_id, f"k{n}"), "/v1/tasks")
            over = await submit(client, limited.queue_id, "k3")
            check(over, "/v1/tasks")
            assert_error(over, 429, "RESOURCE_EXHAUSTED", "submits_per_second")
            assert int(over.headers["Retry-After"]) == 1  # a token every 0.5 s
            assert refused_count(running, "limited") == 1
            # Half a second later one more token (rate 2): the repeat of an accepted key
            # creates nothing and costs nothing; the new key then takes the token.
            await trio.sleep(0.55)
            assert (await submit(client, limited.queue_id, "k0")).status_code == 200
            assert (await submit(client, limited.queue_id, "k3")).status_code == 201
            assert (await submit(client, limited.queue_id, "k4")).status_code == 429
            assert refused_count(running, "limited") == 2
            # Another application is not limited by it.
            for n in range(10):
                assert (await submit(client_b, other.queue_id, f"b{n}")).status_code == 201
            assert refused_count(running, "other") == 0
            # The limit lifted: every node applies it within about a second.
            await OperationsStore(db).set_submit_rate("limited", None)
            shard = main_shard(running)
            with trio.fail_after(10):
                while shard.rates.bucket(limited.application_id) is not None:
                    await shard.rate_follower.wait_for_pass()  # type: ignore[union-attr]
            for n in range(5, 15):
                assert (await submit(client, limited.queue_id, f"k{n}")).status_code == 201


async def test_a_batch_takes_the_items_that_fit_and_refuses_the_rest(running_node, db):
    check = Checker()
    tenant = await make_tenant(db, "batcher")
    await OperationsStore(db).set_submit_rate("batcher", 1, 3)
    await limits_read(running_node, tenant.application_id)
    items = [{**body(tenant.queue_id), "idempotency_key": f"i{n}"} for n in range(5)]
    items[1]["priority"] = 10  # invalid: refused for itself, and not charged
    async with running_node.client(tenant.token) as client:
        response = await client.post("/v1/tasks/batch", json={"tasks": items})
        document = check(response, "/v1/tasks/batch")
        statuses = [r["status"] for r in document["data"]["results"]]
        assert statuses == [201, 400, 201, 201, 429]
        refusal = document["data"]["results"][4]["error"]
        assert (refusal["code"], refusal["field"]) == ("RESOURCE_EXHAUSTED", "submits_per_second")
        assert int(response.headers["Retry-After"]) == 1
        assert refused_count(running_node, "batcher") == 1
        # Nothing left in the bucket: the whole request is refused.
        again = await client.post("/v1/tasks/batch", json={"tasks": items[4:]})
        check(again, "/v1/tasks/batch")
        assert_error(again, 429, "RESOURCE_EXHAUSTED", "submits_per_second")
        assert int(again.headers["Retry-After"]) == 1


async def test_two_nodes_each_take_their_share(node_config, db, dsn):
    tenant = await make_tenant(db, "shared")
    await OperationsStore(db).set_submit_rate("shared", 1, 4)
    async with run_node(node_config) as first, run_node(node_config) as second:
        for running in (first, second):
            await limits_read(running, tenant.application_id, nodes=2)
        for running, name in ((first, "one"), (second, "two")):
            bucket = main_shard(running).rates.bucket(tenant.application_id)
            assert bucket is not None and (bucket.rate, bucket.depth) == (0.5, 2)
            async with running.client(tenant.token) as client:
                statuses = [(await submit(client, tenant.queue_id, f"{name}{n}")).status_code for n in range(3)]
            assert statuses == [201, 201, 429]


async def test_the_command_line_shows_and_checks_the_limit(db, dsn):
    await make_tenant(db, "shown")
    await make_tenant(db, "free")
    done = cli("orbit-admin", "application", "rate", "shown", "--submits-per-second", "50", dsn=dsn)
    assert done.returncode == 0, done.stderr
    assert "submits per second 50 (burst 1 s)" in done.stdout
    listed = cli("orbit-admin", "application", "list", "--json", dsn=dsn)
    apps = {a["application"]: a for a in json.loads(listed.stdout)}
    assert (apps["shown"]["submits_per_second"], apps["shown"]["submit_burst"]) == (50, None)
    assert (apps["free"]["submits_per_second"], apps["free"]["submit_burst"]) == (None, None)
    table = cli("orbit-admin", "application", "list", dsn=dsn, env={"COLUMNS": "250"})
    assert "submits/s" in table.stdout and "50 (burst 1 s)" in table.stdout
    top = cli("orbit-admin", "top", "--once", "--json", dsn=dsn)
    assert top.returncode == 0, top.stderr
    frame = json.loads(top.stdout.splitlines()[0])
    assert {a["application"]: a["submits_per_second"] for a in frame["applications"]} == {"shown": 50, "free": None}
    top_text = cli("orbit-admin", "top", "--once", dsn=dsn, env={"COLUMNS": "250"})
    assert "submits/s" in top_text.stdout, top_text
    for bad in (["--submits-per-second", "-1"], ["--submits-per-second", "5", "--burst", "0"], []):
        refused = cli("orbit-admin", "application", "rate", "shown", *bad, dsn=dsn)
        assert refused.returncode == 2, refused
    missing = cli("orbit-admin", "application", "rate", "nobody", "--submits-per-second", "5", dsn=dsn)
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr
    # Unlimited clears the burst too.
    await OperationsStore(db).set_submit_rate("shown", 5, 7)
    assert (await OperationsStore(db).application("shown"))["submit_burst"] == 7
    cleared = await OperationsStore(db).set_submit_rate("shown", None)
    assert (cleared["submits_per_second"], cleared["submit_burst"]) == (None, None)


async def test_the_console_overview_shows_the_limit(running_node, db):
    tenant = await make_tenant(db)
    shown = re.compile(r'<dd id="submit-rate">([^<]*)</dd>')
    async with console(running_node) as client:
        await sign_in(client, tenant.token)
        assert shown.findall((await client.get("/console")).text) == ["unlimited"]
        await OperationsStore(db).set_submit_rate("app", 20)
        assert shown.findall((await client.get("/console")).text) == ["at most 20, 20 at once"]
        await OperationsStore(db).set_submit_rate("app", 20, 100)
        page = (await client.get("/console")).text
        assert shown.findall(page) == ["at most 20, 100 at once"]
        # The retention lines are still there beside it.
        assert "succeeded tasks kept for" in page
