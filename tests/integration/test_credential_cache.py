"""The cache of verified credentials: a revocation takes effect within its bound, its
memory is bounded, failures are never remembered, and 0 asks the database every time."""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing

from orbit_node.api.credentials import CredentialCache
from orbit_node.config import NodeConfig
from orbit_node.domain.errors import ConfigError, Unauthenticated, Unavailable
from orbit_node.store.tenancy import TenancyStore

from ..nodeutil import make_tenant, run_node

TEST_TIMEOUT_S = 30


@attrs.define
class FakeClock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@attrs.define
class CountingTenancy:
    """A TenancyStore that counts how often the database is asked."""

    inner: TenancyStore
    lookups: int = 0
    # The database cannot be reached.
    down: bool = False

    async def authenticate(self, token):
        self.lookups += 1
        if self.down:
            raise Unavailable("database unreachable")
        return await self.inner.authenticate(token)


async def test_a_revocation_takes_effect_within_the_bound(db):
    tenant = await make_tenant(db)
    tenancy = TenancyStore(db)
    credential_id, token = await tenancy.create_credential(tenant.namespace_id, "short", {"tasks:read": "*"})
    clock = FakeClock()
    counting = CountingTenancy(tenancy)
    cache = CredentialCache(counting, ttl_s=1.0, clock=clock)  # type: ignore[arg-type]

    assert (await cache.authenticate(token)).credential_id == credential_id
    await tenancy.revoke_credential(credential_id)
    # Within the bound the verified credential is served from memory...
    clock.now += 0.999
    assert (await cache.authenticate(token)).credential_id == credential_id
    assert counting.lookups == 1
    # ...and once the bound has passed since it was verified, the revocation holds.
    clock.now += 0.001
    with pytest.raises(Unauthenticated):
        await cache.authenticate(token)
    assert len(cache) == 0
    with pytest.raises(Unauthenticated):
        await cache.authenticate(token)
    assert counting.lookups == 3


async def test_a_changed_scope_takes_effect_within_the_bound(db):
    tenant = await make_tenant(db)
    tenancy = TenancyStore(db)
    credential_id, token = await tenancy.create_credential(tenant.namespace_id, "narrow", {"tasks:read": "*"})
    clock = FakeClock()
    cache = CredentialCache(tenancy, ttl_s=1.0, clock=clock)
    assert not (await cache.authenticate(token)).allows("tasks:submit")
    await db.run(
        lambda tx: tx.execute_raw(
            "UPDATE credentials SET scopes = %s WHERE credential_id = %s",
            ('{"tasks:read": "*", "tasks:submit": "*"}', credential_id),
        )
    )
    clock.now += 1.0
    assert (await cache.authenticate(token)).allows("tasks:submit")


async def test_failures_are_not_remembered_and_the_memory_is_bounded(db):
    tenant = await make_tenant(db)
    tenancy = TenancyStore(db)
    counting = CountingTenancy(tenancy)
    cache = CredentialCache(counting, ttl_s=60.0, max_entries=4, clock=FakeClock())  # type: ignore[arg-type]
    # A flood of well-formed random tokens: each is asked, none is kept.
    for i in range(50):
        with pytest.raises(Unauthenticated):
            await cache.authenticate(f"orb_{i:032x}{i:064x}")
    assert len(cache) == 0 and counting.lookups == 50
    # A credential created after a refusal of its token's shape is accepted at once.
    tokens = [(await tenancy.create_credential(tenant.namespace_id, f"c{i}", {"tasks:read": "*"}))[1] for i in range(6)]
    for token in tokens:
        await cache.authenticate(token)
    # Six verified credentials, four remembered: the least recently used went first.
    assert len(cache) == 4
    counting.lookups = 0
    for token in tokens[2:]:
        await cache.authenticate(token)
    assert counting.lookups == 0
    await cache.authenticate(tokens[0])
    assert counting.lookups == 1 and len(cache) == 4


@attrs.define
class GatedTenancy(CountingTenancy):
    """Holds every question until ``gate`` is set; the first ``refuse`` questions are
    refused (a credential whose creation had not committed when they were asked)."""

    gate: trio.Event = attrs.Factory(trio.Event)
    refuse: int = 0

    async def authenticate(self, token):
        self.lookups += 1
        refused = self.lookups <= self.refuse
        await self.gate.wait()
        if refused:
            raise Unauthenticated("authorization: unknown or revoked credential", field="authorization")
        if self.down:
            raise Unavailable("database unreachable")
        return await self.inner.authenticate(token)


async def ask_together(cache, token, callers: int, *, stale: tuple[bool, ...] = ()):
    """``callers`` concurrent authentications of ``token``; each one's principal or error."""
    outcomes: list = [None] * callers

    async def one(i):
        try:
            outcomes[i] = await cache.authenticate(token, stale_if_unavailable=i < len(stale) and stale[i])
        except (Unauthenticated, Unavailable) as exc:
            outcomes[i] = exc

    async with trio.open_nursery() as nursery:
        for i in range(callers):
            nursery.start_soon(one, i)
        await trio.testing.wait_all_tasks_blocked()
        cache.tenancy.gate.set()
    return outcomes


async def test_concurrent_misses_ask_the_database_once(db):
    tenant = await make_tenant(db)
    tenancy = TenancyStore(db)
    credential_id, token = await tenancy.create_credential(tenant.namespace_id, "busy", {"tasks:read": "*"})
    other_id, other = await tenancy.create_credential(tenant.namespace_id, "other", {"tasks:read": "*"})
    clock = FakeClock()
    gated = GatedTenancy(tenancy)
    cache = CredentialCache(gated, ttl_s=1.0, clock=clock)  # type: ignore[arg-type]
    outcomes = await ask_together(cache, token, 16)
    assert [o.credential_id for o in outcomes] == [credential_id] * 16 and gated.lookups == 1
    # When the entry expires under load, one question again; another token asks its own.
    clock.now += 1.0
    gated.gate = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask_together, cache, token, 8)
        await trio.testing.wait_all_tasks_blocked()
        assert (await cache.authenticate(other)).credential_id == other_id
    assert gated.lookups == 3


async def test_a_refusal_is_not_shared_with_those_who_waited(db):
    """A question asked before the credential's creation committed is refused; the requests
    that waited for it ask for themselves and are accepted."""
    tenant = await make_tenant(db)
    tenancy = TenancyStore(db)
    credential_id, token = await tenancy.create_credential(tenant.namespace_id, "new", {"tasks:read": "*"})
    gated = GatedTenancy(tenancy, refuse=1)
    cache = CredentialCache(gated, ttl_s=1.0, clock=FakeClock())  # type: ignore[arg-type]
    outcomes = await ask_together(cache, token, 5)
    refused = [o for o in outcomes if isinstance(o, Unauthenticated)]
    accepted = [o.credential_id for o in outcomes if o not in refused]
    assert len(refused) == 1 and accepted == [credential_id] * 4 and gated.lookups == 5


async def test_a_stale_answer_is_the_metrics_callers_alone(db):
    """While the database is down, the /metrics caller that asked gets its stale credential;
    a /v1 request that waited for that question still gets Unavailable."""
    tenant = await make_tenant(db)
    tenancy = TenancyStore(db)
    credential_id, token = await tenancy.create_credential(tenant.namespace_id, "m", {"metrics:read": "*"})
    clock = FakeClock()
    gated = GatedTenancy(tenancy)
    gated.gate.set()
    cache = CredentialCache(gated, ttl_s=1.0, clock=clock)  # type: ignore[arg-type]
    await cache.authenticate(token)
    clock.now += 5.0
    gated.down, gated.gate = True, trio.Event()
    for stale in ((True, False), (False, True)):  # whichever asks first
        gated.gate = trio.Event()
        outcomes = await ask_together(cache, token, 2, stale=stale)
        metrics, v1 = outcomes if stale[0] else outcomes[::-1]
        assert metrics.credential_id == credential_id and isinstance(v1, Unavailable)


async def test_zero_asks_the_database_on_every_request(db):
    tenant = await make_tenant(db)
    counting = CountingTenancy(TenancyStore(db))
    cache = CredentialCache(counting, ttl_s=0.0, clock=FakeClock())  # type: ignore[arg-type]
    for _ in range(5):
        await cache.authenticate(tenant.token)
    assert counting.lookups == 5


async def test_only_the_metrics_caller_gets_a_stale_credential_while_the_database_is_down(db):
    tenant = await make_tenant(db)
    clock = FakeClock()
    counting = CountingTenancy(TenancyStore(db))
    cache = CredentialCache(counting, ttl_s=1.0, clock=clock)  # type: ignore[arg-type]
    await cache.authenticate(tenant.token)
    counting.down = True
    clock.now += 30.0
    with pytest.raises(Unavailable):
        await cache.authenticate(tenant.token)
    assert (await cache.authenticate(tenant.token, stale_if_unavailable=True)).namespace_id == tenant.namespace_id


async def accepted_after_revocation(config: NodeConfig, db) -> tuple[int, float]:
    """Requests a node still accepts after a revocation, and the seconds until it refuses."""
    tenant = await make_tenant(db)
    tenancy = TenancyStore(db)
    credential_id, token = await tenancy.create_credential(tenant.namespace_id, "r", {"tasks:read": "*"})
    accepted = 0
    with trio.fail_after(TEST_TIMEOUT_S):
        async with run_node(config) as running, running.client(token) as client:
            assert (await client.get("/v1/tasks")).status_code == 200
            await tenancy.revoke_credential(credential_id)
            revoked = trio.current_time()
            while (response := await client.get("/v1/tasks")).status_code == 200:
                accepted += 1
                await trio.sleep(0.02)
            assert response.status_code == 401
            return accepted, trio.current_time() - revoked


async def test_a_node_refuses_a_revoked_credential_within_its_cache_bound(node_config, db):
    _, seconds = await accepted_after_revocation(attrs.evolve(node_config, credential_cache_s=0.5), db)
    # The bound, plus one poll and one request of slack.
    assert seconds < 0.5 + 0.25


async def test_a_node_without_the_cache_refuses_a_revoked_credential_at_once(node_config, db):
    accepted, _ = await accepted_after_revocation(attrs.evolve(node_config, credential_cache_s=0.0), db)
    assert accepted == 0


def test_the_bound_is_a_setting():
    base = {"ORBIT_MYSQL_DSN": "mysql://r@h/d"}
    assert NodeConfig.from_env(base).credential_cache_s == 1.0
    assert NodeConfig.from_env({**base, "ORBIT_CREDENTIAL_CACHE_S": "0"}).credential_cache_s == 0.0
    for bad in ("-1", "soon"):
        with pytest.raises(ConfigError) as info:
            NodeConfig.from_env({**base, "ORBIT_CREDENTIAL_CACHE_S": bad})
        assert "credential_cache" in info.value.field.lower()
