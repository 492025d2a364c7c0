"""Benchmarks: they print figures measured in one run; they are never tests."""
