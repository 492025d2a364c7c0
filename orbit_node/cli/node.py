"""``orbit``: run a node until SIGINT/SIGTERM."""

from __future__ import annotations

import errno
import gc
import logging
import signal
import socket

import trio

from orbit_protocol.commands import Parser

from ..config import SDK_VARIABLES, SETTING_VARIABLES, NodeConfig
from ..domain.errors import ConfigError
from ..node import Node
from ..services import default_services
from .common import run_command

# What the node reads (the SDK's variables are the clients').
NODE_SETTINGS = sorted(SETTING_VARIABLES - SDK_VARIABLES)


# The cyclic garbage collector's thresholds in a node process. A node's objects are
# short-lived and freed by reference counting; the collector only ever finds the rare
# cycle (an exception with its traceback, a cancelled task). At the interpreter's
# defaults (a young pass every 700 net allocations of container objects, a full pass
# every 100 young ones, over everything the process imported) its passes took about 9 %
# of the node's CPU in a bulk submit and 3-8 % serving ``/healthz`` and single submits
# (docs/benchmarks/node-cpu.md).
COLLECTOR_THRESHOLDS = (10_000, 10, 10)


def settle_collector() -> None:
    """Once the node is built, before it serves: what start-up made (modules, classes,
    the app, the configuration) leaves the collector's reach for good (``gc.freeze``),
    and a young pass waits for ``COLLECTOR_THRESHOLDS[0]`` allocations."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)


def build_node(config: NodeConfig) -> Node:
    """The node with every background service this code base provides."""
    return Node(config, services=default_services())


async def serve_until_signal(node: Node) -> None:
    """Run the node; the first SIGINT/SIGTERM drains it, a second one stops it at once."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            stopped = trio.Event()

            async def run_node(task_status=trio.TASK_STATUS_IGNORED):
                try:
                    await node.run(task_status=task_status)
                finally:
                    stopped.set()

            async def watch_signals():
                async for signum in signals:
                    if node.shutdown_requested.is_set():
                        nursery.cancel_scope.cancel()
                        return
                    logging.getLogger("orbit.node").info("signal %d: draining", signum)
                    node.request_shutdown()

            bound = await nursery.start(run_node)
            logging.getLogger("orbit.node").info("node %s listening on %s", node.node_id, ", ".join(bound))
            nursery.start_soon(watch_signals)
            await stopped.wait()
            nursery.cancel_scope.cancel()


# Why a listening address could not be bound, as the one-line start-up error says it.
LISTEN_ERRORS = {
    errno.EADDRINUSE: "address already in use (is another node, or `make run`, already running?)",
    errno.EADDRNOTAVAIL: "address not available on this machine",
    errno.EACCES: "permission denied",
}


def listen_failure(exc: BaseException) -> OSError | None:
    """The bind error in what ``trio.run`` raised (hypercorn's, inside nested exception groups)."""
    if isinstance(exc, OSError) and exc.errno is not None and exc.errno in LISTEN_ERRORS:
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = listen_failure(inner)
            if found is not None:
                return found
    return None


def listen_addresses(config: NodeConfig) -> list[tuple[str, str, int]]:
    """(setting, host, port) of every address the node listens on."""
    addresses = [("ORBIT_HTTP_ADDR", config.http_host, config.http_port)]
    if config.metrics == "open":
        addresses.append(("ORBIT_METRICS_ADDR", config.metrics_host, config.metrics_port))
    return addresses


def can_listen(host: str, port: int) -> bool:
    try:
        socket.create_server((host, port)).close()
    except OSError:
        return False
    return True


def serve(node: Node) -> None:
    """Run the node until a signal; an address it cannot listen on is a one-line start-up error."""
    try:
        trio.run(serve_until_signal, node)
    except BaseException as exc:
        failure = listen_failure(exc)
        if failure is None:
            raise
        addresses = listen_addresses(node.config)
        # hypercorn's error names no address: the ones that cannot be bound now are the culprits.
        blocked = [a for a in addresses if not can_listen(a[1], a[2])] or addresses
        named = "; ".join(f"{setting}: cannot listen on {host}:{port}" for setting, host, port in blocked)
        reason = LISTEN_ERRORS.get(failure.errno or 0, failure.strerror or "cannot listen")
        raise ConfigError(f"{named}: {reason}") from None


def main(argv: list[str] | None = None) -> None:
    parser = Parser(
        prog="orbit",
        description="Run an Orbit node. Settings come from the environment (README.md, docs/operations.md): "
        + ", ".join(NODE_SETTINGS)
        + ". Only ORBIT_MYSQL_DSN is required; an unknown ORBIT_* variable is an error.",
    )
    parser.parse_args(argv)
    config = run_command(NodeConfig.from_env)
    from orbit_protocol.logs import configure_logging

    configure_logging(config.log_level, fmt=config.log_format)
    node = build_node(config)
    settle_collector()
    run_command(lambda: serve(node))


if __name__ == "__main__":
    main()
