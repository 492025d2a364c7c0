"""Console sessions ended by sign-out: the one row that makes a signed cookie worthless on
every node before it expires (``api/console/session.py`` signs the cookies; the database
only remembers which sessions ended, until their cookies would have expired anyway)."""

from __future__ import annotations

import attrs

from ..db import Database, Tx

# Expired rows deleted per sign-out: sign-outs keep the table to the sessions still live.
FORGET_BATCH = 100


@attrs.frozen
class ConsoleSessionStore:
    db: Database

    async def ended(self, session_id: str) -> bool:
        return bool(await self.db.fetchall("console_session_ended", {"session_id": session_id}))

    async def end(self, session_id: str, expires_in_s: float) -> None:
        """End the session, remembered until its cookie expires (``expires_in_s`` from now)."""

        async def body(tx: Tx) -> None:
            await tx.execute("console_session_end", {"session_id": session_id, "expires_in_s": max(0.0, expires_in_s)})
            await tx.execute("console_sessions_forget", {"limit": FORGET_BATCH})

        await self.db.transaction(body)
