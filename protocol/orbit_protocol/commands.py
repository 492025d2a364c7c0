"""What every Orbit command (the node's ``orbit``, ``orbit-migrate``, ``orbit-admin`` and
the SDK's ``orbit-worker``) shares: a failure is one line on stderr and an exit status."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


def fail(message: str, code: int = 1) -> NoReturn:
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    raise SystemExit(code)


class Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit status 2); ``--help`` is unchanged."""

    def error(self, message: str) -> NoReturn:
        fail(f"{self.prog}: {message} (see --help)", 2)
