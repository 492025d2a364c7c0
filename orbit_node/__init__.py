"""Orbit node: a durable task dispatcher on trio and one MySQL/MariaDB database."""

__version__ = "0.1.0"
