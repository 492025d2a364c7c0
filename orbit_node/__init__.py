"""Orbit node: a durable task dispatcher on trio and one MySQL/MariaDB database."""

from orbit_protocol import __version__

__all__ = ["__version__"]
