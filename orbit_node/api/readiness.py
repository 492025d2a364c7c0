"""Readiness: whether the database can serve this node, and if not, why.

``GET /readyz`` and the node's start-up check probe through one ``Readiness``. Its
answer names the cause class (``errors.CAUSES``: unreachable, access denied, unknown
database, schema behind or ahead) without the driver's text, which may name hosts and
ports and is for the log only. The log gets one line when the answer changes, never one
per probe: a warning with what to do when the node becomes not ready (at start-up too),
an info line when it is ready again.
"""

from __future__ import annotations

import logging

import attrs
import trio

from ..db import Database, migrate
from ..domain.errors import OrbitError, SchemaNotReady, Unavailable

log = logging.getLogger("orbit.readiness")

# The database gets this long to answer a probe before the node reports it unreachable.
READY_TIMEOUT_S = 2.0

# What an operator does about each cause (in the log line).
REMEDIES = {
    "unreachable": "check that the database server runs and that ORBIT_MYSQL_DSN's host and port reach it",
    "access_denied": "check ORBIT_MYSQL_DSN's user and password, and the user's privileges (docs/operations.md)",
    "unknown_database": "create the database ORBIT_MYSQL_DSN names, then run `orbit-migrate up`",
    "schema_behind": "run `orbit-migrate up`",
    "schema_ahead": "run the version of Orbit that migrated the database (or a newer one)",
    "database_error": "see the node's and the database server's logs",
}
# The /readyz message of each cause that is not about the schema (no host, port or errno).
MESSAGES = {
    "unreachable": f"database: unreachable (no connection, or no answer within {READY_TIMEOUT_S:g} s)",
    "access_denied": "database: the server refused the configured user",
    "unknown_database": "database: the configured database does not exist",
    "database_error": "database: the server answered with an error",
}


@attrs.frozen
class Verdict:
    """One probe's answer: ready (``cause`` None) or why not; ``detail`` is for the log."""

    cause: str | None
    schema_version: int | None = None
    detail: str = ""
    # Which of the node's databases answered ("shard 2"); None on a node of one database.
    label: str | None = None

    @property
    def ready(self) -> bool:
        return self.cause is None

    def error(self) -> Unavailable:
        """The /readyz answer: 503 with the cause class, and the versions when it is the schema."""
        which = "" if self.label is None else f" ({self.label})"
        if self.cause in ("schema_behind", "schema_ahead"):
            relation = "older than" if self.cause == "schema_behind" else "newer than"
            return SchemaNotReady(
                f"schema: the database{which} is at version {self.schema_version:06d}, {relation} this node's "
                f"{migrate.HEAD:06d}",
                field="schema",
                cause=self.cause,
            )
        assert self.cause is not None
        return Unavailable(MESSAGES[self.cause] + which, field="database", cause=self.cause)


# The state before the first probe (so that the first answer is always logged).
_UNKNOWN = "unknown"


@attrs.define(eq=False)
class Readiness:
    db: Database
    timeout_s: float = READY_TIMEOUT_S
    # Names the database in answers and log lines when a node has several (its shard).
    label: str | None = None
    # The cause of the last answer (None: ready); logged again only when it changes.
    _last: str | None = attrs.field(default=_UNKNOWN, init=False)

    async def probe(self) -> Verdict:
        """Ask the database for its schema version; log the answer if it changed."""
        verdict = await self._ask()
        if verdict.cause != self._last:
            first, self._last = self._last == _UNKNOWN, verdict.cause
            if verdict.ready:
                # Ready from the start is the normal case: nothing to say.
                if not first:
                    log.info("ready again: the database answers at schema version %06d", verdict.schema_version)
            else:
                cause = verdict.cause
                assert cause is not None  # not ready always names its cause
                log.warning(
                    "not ready (%s): %s%s; %s",
                    cause,
                    "" if self.label is None else f"{self.label}: ",
                    verdict.detail,
                    REMEDIES[cause],
                    extra={"cause": cause},
                )
        return verdict

    async def _ask(self) -> Verdict:
        return attrs.evolve(await self._answer(), label=self.label)

    async def _answer(self) -> Verdict:
        try:
            with trio.fail_after(self.timeout_s):
                version = await migrate.current_version(self.db)
        except trio.TooSlowError:
            return Verdict("unreachable", detail=f"no answer within {self.timeout_s:g} s")
        except Unavailable as exc:
            return Verdict(exc.cause or "unreachable", detail=exc.message)
        except OrbitError as exc:
            return Verdict("database_error", detail=exc.message)
        if version < migrate.HEAD:
            return Verdict(
                "schema_behind",
                version,
                f"the database schema is at version {version:06d}, this node needs {migrate.HEAD:06d}",
            )
        if version > migrate.HEAD and not await migrate.newer_are_compatible(self.db, migrate.HEAD):
            return Verdict(
                "schema_ahead",
                version,
                f"the database schema is at version {version:06d}, newer than this node knows ({migrate.HEAD:06d})",
            )
        return Verdict(None, version)
