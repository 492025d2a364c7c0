"""Console sessions: a cookie signed by the node that names a verified credential.

Sign-in verifies the token once; the cookie then carries the credential's id (never the
token), a session id drawn at random for this sign-in, the time of sign-in and an
HMAC-SHA256 signature under the node's console key (``ORBIT_CONSOLE_SECRET``, or a random
key per process). A cookie is valid on every node that shares the key until
``max_age_s`` after sign-in, unless its session was ended by sign-out (the database keeps
the ended sessions until their cookies expire: ``store/console_sessions.py``, so a copied
cookie is refused by every node once its session signed out); the credential itself is
looked up again on every request, so a revoked credential ends its sessions at once.

Signing and expiry are itsdangerous's (the Pallets library Flask and Quart sign their own
sessions with): ``TimestampSigner`` over the id, with a salt of its own for this use.

Every form that writes carries the session's form token (``form_token``): an HMAC-SHA256
of the cookie value under a key derived from the console key for this use only. Each
sign-in has its own token, every node sharing the key computes the same one, and a page
of another site cannot read it (the cookie is HttpOnly, the page is same-origin only), so
a write posted from elsewhere is refused even by a browser that sends the cookie along.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

import attrs
from itsdangerous import BadSignature, SignatureExpired, TimestampSigner

from ...domain.ids import is_hex32

COOKIE_NAME = "orbit_console"
# Separates these signatures from any other use of the same key.
SALT = "orbit-console-session-v2"
# Derives the key of form tokens from the console key (never the session signatures' key).
FORM_TOKEN_LABEL = b"orbit-console-form-token-v1"


@attrs.frozen
class Session:
    """What a valid cookie says: whose session, which one, and how long it has left."""

    credential_id: str
    session_id: str
    expires_in_s: float


@attrs.frozen
class SessionSigner:
    key: bytes = attrs.field(repr=False)
    max_age_s: float

    def _signer(self) -> TimestampSigner:
        return TimestampSigner(self.key, salt=SALT, digest_method=hashlib.sha256)

    def issue(self, credential_id: str) -> str:
        """The cookie value of a new session of ``credential_id``, starting now: its own
        session id, so two sign-ins never share a cookie or a form token."""
        if not is_hex32(credential_id):
            raise ValueError("a session names a credential id (32 hex digits)")
        return self._signer().sign(f"{credential_id}.{secrets.token_hex(16)}").decode()

    def session(self, value: str | None) -> Session | None:
        """The session of a valid, unexpired cookie value; None for anything else."""
        if not value:
            return None
        try:
            text, issued = self._signer().unsign(value, max_age=int(self.max_age_s), return_timestamp=True)
            credential_id, _, session_id = text.decode().partition(".")
        except (SignatureExpired, BadSignature, UnicodeDecodeError):
            return None
        if not (is_hex32(credential_id) and is_hex32(session_id)):
            return None
        return Session(credential_id, session_id, self.max_age_s - (time.time() - issued.timestamp()))

    def credential_id(self, value: str | None) -> str | None:
        """The credential id of a valid, unexpired cookie value; None for anything else."""
        found = self.session(value)
        return None if found is None else found.credential_id

    def form_token(self, cookie: str) -> str:
        """The form token of the session whose cookie value is ``cookie``."""
        key = hmac.new(self.key, FORM_TOKEN_LABEL, hashlib.sha256).digest()
        return hmac.new(key, cookie.encode(), hashlib.sha256).hexdigest()

    def form_token_valid(self, cookie: str, token: str | None) -> bool:
        """``token`` is the form token of this session (compared in constant time)."""
        if not token or not token.isascii():
            return False
        return hmac.compare_digest(self.form_token(cookie), token)
