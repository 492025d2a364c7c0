"""Small helpers shared by tests (seeding rows, running CLI commands)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from orbit_node.config import Dsn

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def cli(command: str, *args: str, dsn: Dsn | None = None, env: dict | None = None, check: bool = False):
    """Run an installed console script (orbit, orbit-migrate, orbit-admin)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    if dsn is not None:
        full_env["ORBIT_MYSQL_DSN"] = dsn.url()
    full_env.update(env or {})
    return subprocess.run(
        [str(BIN / command), *args], capture_output=True, text=True, env=full_env, check=check, timeout=60
    )
