"""``orbit``: run a node until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal

import trio

from ..config import NodeConfig
from ..node import Node
from ..services import default_services
from .common import run_command


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="orbit",
        description="Run an Orbit node. Settings come from the environment: ORBIT_MYSQL_DSN, ORBIT_HTTP_ADDR, "
        "ORBIT_TLS_CERT/ORBIT_TLS_KEY, ORBIT_LOG_LEVEL, ORBIT_LOG_FORMAT, ORBIT_METRICS, ORBIT_METRICS_ADDR "
        "(see README.md).",
    )
    parser.parse_args(argv)
    config = run_command(NodeConfig.from_env)
    from ..logs import configure_logging

    configure_logging(config.log_level, fmt=config.log_format)
    node = build_node(config)

    run_command(lambda: trio.run(serve_until_signal, node))


if __name__ == "__main__":
    main()
