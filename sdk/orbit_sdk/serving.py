"""A Worker as a process of its own: ``Worker.serve()`` and the exit status it returns.

The first SIGINT or SIGTERM drains the Worker: it takes no new task (the node withdraws
its claim, reservations that arrive meanwhile are released unstarted), lets the running
handlers finish and report, disconnects, and ``serve`` returns ``EXIT_DRAINED``. A second
signal stops it at once: running handlers are cancelled and not reported (their tasks
come back when their run lease expires, as after a crash) and ``serve`` returns 128 +
the signal's number, as a shell reports a process a signal ended. Signals are received
through trio (``trio.open_signal_receiver``), so Ctrl-C is never a ``KeyboardInterrupt``
while ``serve`` runs; it must run in the main thread.
"""

from __future__ import annotations

import logging
import signal
from typing import TYPE_CHECKING

import trio

from .connect import WorkerRejected
from .errors import ConfigError

if TYPE_CHECKING:
    from .worker import Worker

log = logging.getLogger("orbit.sdk.worker")

# The exit statuses of ``serve`` (and of ``orbit-worker``).
# Drained: a signal (or ``drain()``) ended it and every running handler reported.
EXIT_DRAINED = 0
# An unexpected failure (logged with its traceback).
EXIT_FAILED = 1
# Bad configuration: a queue name the namespace lacks, no handler, no credentials file.
EXIT_CONFIG = 2
# The node refused the Worker (credential, queue or hello): restarting cannot help.
EXIT_REJECTED = 3
# A second signal stopped it at once: 128 + the signal's number (130 SIGINT, 143 SIGTERM).
EXIT_SIGNAL_BASE = 128
# The signals that drain (the first) and stop (the second).
SIGNALS = (signal.SIGINT, signal.SIGTERM)


async def serve(worker: Worker) -> int:
    """Run ``worker`` until it is drained or stopped; its exit status (module docstring)."""
    status = EXIT_FAILED
    stopped_by: list[int] = []
    with trio.open_signal_receiver(*SIGNALS) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                draining = False
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if not draining:
                        draining = True
                        log.info("%s: draining: finishing the running tasks (a second signal stops at once)", name)
                        worker.request_drain()
                    else:
                        log.warning("%s: stopping at once; running tasks come back when their lease expires", name)
                        stopped_by.append(signum)
                        nursery.cancel_scope.cancel()
                        return

            nursery.start_soon(watch)
            status = await _run(worker)
            nursery.cancel_scope.cancel()
    if stopped_by:
        return EXIT_SIGNAL_BASE + stopped_by[0]
    return status


async def _run(worker: Worker) -> int:
    """``worker.run()``, its end as an exit status (each logged in one line but a failure)."""
    try:
        await worker.run()
    except WorkerRejected as exc:
        log.error("worker rejected: %s", exc)
        return EXIT_REJECTED
    except ConfigError as exc:
        log.error("worker not started: %s", exc)
        return EXIT_CONFIG
    except Exception:
        log.exception("worker failed")
        return EXIT_FAILED
    log.info("worker drained: %d tasks finished, %d attempts retried", worker.finished, worker.retried)
    return EXIT_DRAINED
