"""``orbit-worker MODULE:ATTRIBUTE``: run a Worker of your code as a process of its own.

``ATTRIBUTE`` names a ``Worker`` (with its handlers registered) or a function that
takes no argument and returns one. The module is imported from the current directory
first (like ``python -m``). The process runs ``Worker.serve()`` and exits with its
status (docs/sdk.md, "A Worker process"): 0 drained, 1 failed, 2 bad usage or
configuration, 3 rejected by the node, 128 + N stopped by a second signal N.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from typing import Any

import trio

from orbit_protocol.commands import Parser, fail
from orbit_protocol.logs import configure_logging

from .errors import ConfigError
from .serving import EXIT_CONFIG, EXIT_SIGNAL_BASE
from .worker import Worker

# Log levels --log-level accepts.
LEVELS = ("debug", "info", "warning", "error")


def load_worker(target: str) -> Worker:
    """The Worker ``MODULE:ATTRIBUTE`` names; a ``ConfigError`` saying what is wrong."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"{target!r}: expected MODULE:ATTRIBUTE, e.g. myapp.workers:worker", field="target")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only the named module (or a package of it) missing is a usage error; an import
        # that fails inside it is the module's own failure, with its traceback.
        if exc.name is None or not (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise
        raise ConfigError(f"{target!r}: no module named {exc.name!r} (from {os.getcwd()})", field="target") from None
    value: Any = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise ConfigError(f"{target!r}: module {module_name!r} has no attribute {attribute!r}", field="target")
        value = getattr(value, part)
    if not isinstance(value, Worker) and callable(value):
        value = value()
    if not isinstance(value, Worker):
        raise ConfigError(
            f"{target!r}: expected a Worker (or a function returning one), got {type(value).__name__}", field="target"
        )
    return value


def main(argv: list[str] | None = None) -> None:
    parser = Parser(
        prog="orbit-worker",
        description="Run the Worker MODULE:ATTRIBUTE names until SIGINT/SIGTERM: the first signal drains it "
        "(running tasks finish and report), a second stops it at once. Exit status: 0 drained, 1 failed, "
        "2 bad usage or configuration, 3 rejected by the node, 128+N stopped by a second signal N.",
    )
    parser.add_argument("target", metavar="MODULE:ATTRIBUTE", help="e.g. myapp.workers:worker")
    parser.add_argument("--log-level", choices=LEVELS, default="info", help="default: info")
    parser.add_argument(
        "--log-format", choices=("auto", "json", "text"), default="auto", help="default: text on a terminal, else json"
    )
    args = parser.parse_args(argv)
    configure_logging(args.log_level, fmt=args.log_format)
    try:
        try:
            worker = load_worker(args.target)
        except ConfigError as exc:
            fail(exc.message, EXIT_CONFIG)
        status = trio.run(worker.serve)
    except KeyboardInterrupt:
        # Ctrl-C before ``serve`` listened for signals: nothing was running yet.
        status = EXIT_SIGNAL_BASE + signal.SIGINT
    raise SystemExit(status)


if __name__ == "__main__":
    main()
