"""Benchmarks: they print figures measured in one run; they are never tests."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The no-op handler every scenario uses.
HANDLER = ("bench.noop", "v1", "v1")
