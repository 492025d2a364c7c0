"""A short-lived cache of verified bearer credentials, shared by /v1 and /metrics.

A credential verified against the database is trusted for ``ttl_s`` (``ORBIT_CREDENTIAL_CACHE_S``,
1 s by default) before the database is asked again, so a revoked credential, or one whose
scopes changed, takes effect on this node within ``ttl_s`` of the change. ``ttl_s = 0``
asks the database on every request.

* Entries are keyed by SHA-256 of the token: the cache never holds a token itself.
* Only successes are remembered. An unknown, revoked or forged token is looked up every
  time (one primary-key read, as without a cache), so a credential created a moment ago
  is never refused from memory, and a flood of random tokens adds nothing to the cache.
* At most ``max_entries`` credentials are remembered; beyond that the least recently used
  one is forgotten (a node sees a handful of distinct credentials in practice).
* The time of an entry is taken before the database is asked: an answer read just before
  a revocation committed is trusted until ``ttl_s`` after the question, never longer.
* One question at a time per credential: requests that miss while the database is being
  asked about the same token wait for that answer instead of each asking (when an entry
  expires under load, every concurrent request of the credential would otherwise ask at
  once). A shared answer is a success only: when the question fails or is cancelled,
  each waiter asks for itself, so a refusal is never handed to a request that arrived
  after the question was asked.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

import attrs
import trio

from ..domain.errors import Unauthenticated, Unavailable
from ..store.tenancy import Principal

# Default bound on how long a verified credential is trusted (ORBIT_CREDENTIAL_CACHE_S).
DEFAULT_TTL_S = 1.0
# Verified credentials remembered per node.
MAX_ENTRIES = 1024


def token_key(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class Verifier(Protocol):
    """Verifies a bearer token against the database (``services.Shards``, ``TenancyStore``)."""

    async def authenticate(self, token: str | None) -> Principal: ...


@attrs.define(eq=False)
class _Question:
    """A verification under way: its answer, once ``answered`` is set (None: it failed)."""

    answered: trio.Event = attrs.field(factory=trio.Event)
    principal: Principal | None = None


@attrs.define(eq=False)
class CredentialCache:
    tenancy: Verifier
    ttl_s: float = DEFAULT_TTL_S
    max_entries: int = MAX_ENTRIES
    # A monotonic clock in seconds (trio's by default; tests inject their own).
    clock: Callable[[], float] = trio.current_time
    # sha256(token) -> (clock time the verification began, the principal), least recently used first.
    _entries: OrderedDict[bytes, tuple[float, Principal]] = attrs.field(factory=OrderedDict, init=False)
    # sha256(token) -> the verification under way.
    _asking: dict[bytes, _Question] = attrs.field(factory=dict, init=False)

    def __len__(self) -> int:
        return len(self._entries)

    async def authenticate(self, token: str, *, stale_if_unavailable: bool = False) -> Principal:
        """The principal of ``token``, from memory when verified less than ``ttl_s`` ago.

        With ``stale_if_unavailable``, a credential verified before (however long ago) is
        accepted while the database cannot be reached (/metrics: it matters most then).
        Raises ``Unauthenticated`` for a token the database does not accept."""
        key = token_key(token)
        now = self.clock()
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            if now - entry[0] < self.ttl_s:
                return entry[1]
        asked = self._asking.get(key)
        if asked is not None:
            await asked.answered.wait()
            if asked.principal is not None:
                return asked.principal
            return await self._ask(key, token, now, entry, stale_if_unavailable, None)
        question = self._asking[key] = _Question()
        try:
            return await self._ask(key, token, now, entry, stale_if_unavailable, question)
        finally:
            del self._asking[key]
            question.answered.set()

    async def _ask(
        self,
        key: bytes,
        token: str,
        now: float,
        entry: tuple[float, Principal] | None,
        stale_if_unavailable: bool,
        question: _Question | None,
    ) -> Principal:
        """Ask the database; its acceptance is remembered, and shared through ``question``
        when this caller asks for the others too (a stale answer while the database cannot
        be reached is this caller's alone)."""
        try:
            principal = await self.tenancy.authenticate(token)
        except Unavailable:
            if stale_if_unavailable and entry is not None:
                return entry[1]
            raise
        except Unauthenticated:
            self._entries.pop(key, None)
            raise
        if question is not None:
            question.principal = principal
        self._entries[key] = (now, principal)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return principal
