"""``python -m bench <scenario> [options]``: run one benchmark scenario."""

from __future__ import annotations

import importlib
import sys

# Scenario name -> module with ``main(argv) -> int``.
SCENARIOS = {
    "claim": "bench.claim",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SCENARIOS:
        known = ", ".join(sorted(SCENARIOS))
        if argv and argv[0] not in ("-h", "--help"):
            print(f"unknown scenario {argv[0]!r}; known: {known}", file=sys.stderr)
            return 2
        print(f"usage: python -m bench <scenario> [options]; scenarios: {known}")
        return 0
    return importlib.import_module(SCENARIOS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
