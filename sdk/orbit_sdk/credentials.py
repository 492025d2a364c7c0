"""Credentials files (what ``orbit-admin bootstrap`` and ``credential create --output``
write) and the SDK's environment (``ORBIT_CREDENTIALS_FILE``, ``ORBIT_URL``)."""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Mapping
from pathlib import Path

import attrs

from .errors import ConfigError

# Keys every credentials file has (the format orbit-admin bootstrap writes).
CREDENTIALS_KEYS = ("url", "token", "application", "namespace", "environment", "scopes", "queues")


@attrs.frozen(kw_only=True)
class Credentials:
    """The credentials file ``orbit-admin bootstrap`` writes: the node's ``url``, the
    ``token``, the names of its application / namespace / environment, its ``scopes``
    and ``queues`` (queue name -> 32-hex queue id)."""

    url: str
    token: str = attrs.field(repr=False)
    application: str
    namespace: str
    environment: str
    scopes: tuple[str, ...]
    queues: Mapping[str, str]

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Credentials:
        """Read a credentials file; a missing, unreadable or incomplete file is a ``ConfigError``."""
        where = f"credentials file {os.fspath(path)}"
        try:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{where}: cannot be read ({exc.strerror})", field="ORBIT_CREDENTIALS_FILE") from None
        except ValueError:
            raise ConfigError(f"{where}: not valid JSON", field="ORBIT_CREDENTIALS_FILE") from None
        if not isinstance(document, dict):
            raise ConfigError(f"{where}: expected a JSON object", field="ORBIT_CREDENTIALS_FILE")
        missing = [key for key in CREDENTIALS_KEYS if key not in document]
        if missing:
            raise ConfigError(f"{where}: missing {missing[0]!r}", field="ORBIT_CREDENTIALS_FILE")
        return cls(
            url=str(document["url"]),
            token=str(document["token"]),
            application=str(document["application"]),
            namespace=str(document["namespace"]),
            environment=str(document["environment"]),
            scopes=tuple(document["scopes"]),
            queues=dict(document["queues"]),
        )


def credentials_from_env(env: Mapping[str, str] | None = None) -> tuple[Credentials, str | None]:
    """The credentials file named by ORBIT_CREDENTIALS_FILE (required) and ORBIT_URL (or None)."""
    env = os.environ if env is None else env
    path = env.get("ORBIT_CREDENTIALS_FILE")
    if not path:
        near = difflib.get_close_matches(
            "ORBIT_CREDENTIALS_FILE", [k for k in env if k.startswith("ORBIT") and env[k]], n=1, cutoff=0.8
        )
        hint = f" ({near[0]} is set: a typo of ORBIT_CREDENTIALS_FILE?)" if near else ""
        raise ConfigError(f"ORBIT_CREDENTIALS_FILE is not set{hint}", field="ORBIT_CREDENTIALS_FILE")
    return Credentials.load(path), env.get("ORBIT_URL") or None


# -- the client --------------------------------------------------------------------
