"""Command-line entry points: ``orbit``, ``orbit-migrate``, ``orbit-admin``."""
