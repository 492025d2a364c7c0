"""Measure R and H (bench/units.py) on the running scenario's server, the same way every run.

* R: ``python -m bench.calibrate --dsn URL`` is a helper process that opens one
  trio_mysql connection (autocommit, utf8mb4, the node's dict cursor), runs
  ``WARMUP_TRIPS`` round trips of ``SELECT 1``, then ``--rounds`` rounds of ``--trips``
  each, and prints each round's process CPU seconds (user + system) as JSON. A process of
  its own: nothing else of the harness runs in it, so its CPU is the round trips'.
* H: a node process (``bench.nodeproc``) on a new bench database and 16 keep-alive
  clients sending ``GET /healthz`` back to back (``bench/http.py``'s clients and phase);
  H = the node's CPU over the phase / requests.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import trio
import trio_mysql
import trio_mysql.cursors

from orbit_node.domain.dsn import Dsn

from . import REPO
from .database import bench_database, make_app
from .http import measure_requests
from .processes import node_process
from .units import H_CLIENTS, Units, per_trip_us

# Round trips before the measured rounds (connection set up, code paths warm).
WARMUP_TRIPS = 200
# Bound on the helper process (R's rounds take about a second on a small machine).
HELPER_TIMEOUT_S = 120


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--units-trips", type=int, default=1_000, help="R: SELECT 1 round trips per round (default 1000)"
    )
    parser.add_argument("--units-rounds", type=int, default=5, help="R: rounds; R is their median (default 5)")
    parser.add_argument(
        "--units-helpers",
        type=int,
        default=3,
        help="R: helper processes run one after the other; R is the lowest of their medians (default 3)",
    )
    parser.add_argument(
        "--units-seconds", type=float, default=3.0, help="H: length of the GET /healthz phase (default 3)"
    )


async def measure_r(dsn: Dsn, *, trips: int, rounds: int) -> tuple[float, int]:
    """(R in us, round trips measured), from the helper process."""
    cmd = [sys.executable, "-m", "bench.calibrate", "--dsn", dsn.url(), "--trips", str(trips), "--rounds", str(rounds)]
    with trio.fail_after(HELPER_TIMEOUT_S):
        done = await trio.run_process(cmd, cwd=REPO, capture_stdout=True, capture_stderr=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bench.calibrate exited {done.returncode}: {done.stderr.decode(errors='replace')[-400:]}")
    measured = json.loads(done.stdout.decode().strip().splitlines()[-1])["rounds"]
    return per_trip_us(measured), sum(int(t) for _, t in measured)


async def lowest_r(args: argparse.Namespace, dsn: Dsn) -> tuple[float, int]:
    """(R in us, round trips): the lowest of ``--units-helpers`` helpers' medians. Other work
    on the machine only adds CPU to a round trip (a server just started, the last
    scenario's processes ending), so the lowest is the round trip's own cost."""
    measured = [
        await measure_r(dsn, trips=args.units_trips, rounds=args.units_rounds)
        for _ in range(max(1, args.units_helpers))
    ]
    return min(measured)


async def measure_r_after(args: argparse.Namespace) -> float:
    """R again, on a new bench database, once a scenario has run (``Units.r_after_us``)."""
    async with bench_database() as bdb:
        return (await lowest_r(args, bdb.dsn))[0]


async def measure_units(args: argparse.Namespace, *, h: bool = True) -> Units:
    """R and (unless ``h`` is False: the scenario measures H itself) H, on a new bench database."""
    async with bench_database() as bdb:
        r_us, trips = await lowest_r(args, bdb.dsn)
        if not h:
            return Units(r_us=r_us, r_trips=trips)
        app = await make_app(bdb.db, "units")
        async with node_process(bdb.dsn) as node:
            # Two phases, the cheaper one kept (as R's helpers: other work only adds CPU).
            row = min(
                [
                    await measure_requests(
                        node, app.token, app.queue_id, "GET /healthz", H_CLIENTS, seconds=args.units_seconds
                    )
                    for _ in range(2)
                ],
                key=lambda measured: measured["node_cpu_us_per_request"],
            )
    return Units(
        r_us=r_us,
        h_us=row["node_cpu_us_per_request"],
        healthz_per_s=row["requests_per_s"],
        r_trips=trips,
        h_requests=row["requests"],
    )


# -- the helper process ----------------------------------------------------------------


async def _select_one(conn: trio_mysql.connections.Connection) -> None:
    cursor = conn.cursor(trio_mysql.cursors.DictCursor)
    await cursor.execute("SELECT 1")
    await cursor.fetchall()


async def round_trips(dsn: Dsn, *, trips: int, rounds: int) -> list[list[float]]:
    """``rounds`` x [CPU seconds, ``trips``] of ``SELECT 1`` round trips on one connection."""
    conn = trio_mysql.connect(
        host=dsn.host,
        port=dsn.port,
        user=dsn.user,
        password=dsn.password,
        database=dsn.database,
        unix_socket=dsn.unix_socket,
        charset="utf8mb4",
        autocommit=True,
    )
    await conn.connect()
    try:
        for _ in range(WARMUP_TRIPS):
            await _select_one(conn)
        measured = []
        for _ in range(rounds):
            started = time.process_time()
            for _ in range(trips):
                await _select_one(conn)
            measured.append([time.process_time() - started, trips])
        return measured
    finally:
        await conn.aclose()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.calibrate", description="R: CPU per SELECT 1 round trip")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--trips", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    measured = trio.run(lambda: round_trips(Dsn.parse(args.dsn), trips=args.trips, rounds=args.rounds))
    print(json.dumps({"rounds": measured}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
