"""The benchmark harness's pure helpers (no timing assertions, no benchmark-only packages)."""

from __future__ import annotations

import json
import math

import attrs
import pytest

from bench.report import (
    Target,
    fairness,
    fmt_number,
    format_table,
    jain_index,
    max_priority_advantage,
    percentile,
    profile_summary,
    rate_series,
    summarize,
    targets_table,
    write_result,
)


def test_percentiles_are_nearest_rank():
    data = list(range(1, 101))
    assert percentile(data, 50) == 50
    assert percentile(data, 99) == 99
    assert percentile(data, 100) == 100
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile(data, 101)
    s = summarize([3, 1, 2])
    assert (s["count"], s["p50"], s["max"], s["mean"]) == (3, 2.0, 3.0, 2.0)
    assert summarize([])["count"] == 0


def test_jain_index_and_shares():
    assert jain_index([5, 5, 5]) == pytest.approx(1.0)
    assert jain_index([1, 0, 0, 0]) == pytest.approx(0.25)
    assert jain_index([0, 0]) == 1.0
    f = fairness({"a": 30, "b": 10})
    assert f["shares"] == {"a": 0.75, "b": 0.25}
    assert f["min_over_max"] == pytest.approx(1 / 3)
    assert f["jain"] == pytest.approx(40**2 / (2 * (900 + 100)))


def test_priority_advantage_is_measured_against_older_level_zero_tasks():
    # Dispatch order: a level-9 task due at t=500 went before level-0 tasks due at 240 and 260.
    rows = [(0, 100.0), (9, 500.0), (0, 240.0), (4, 10.0), (0, 260.0), (9, 600.0)]
    assert max_priority_advantage(rows) == pytest.approx(260.0)
    assert max_priority_advantage([(0, 1.0), (9, 2.0)]) == 0.0


def test_rate_series_buckets_events():
    assert rate_series([0.1, 0.2, 1.5, 3.9], 0.0, 1.0) == [(0.0, 2), (1.0, 1), (2.0, 0), (3.0, 1)]
    assert rate_series([], 0.0, 1.0) == []


def test_tables_and_targets_format():
    table = format_table(["name", "tasks/s"], [["orbit", 1234.5], ["huey", 12.5]])
    lines = table.splitlines()
    assert lines[0].startswith("name") and set(lines[1]) <= {"-", " "}
    assert "1,234" in lines[2] and lines[3].endswith("12.5")
    assert fmt_number(float("nan")) == "n/a" and fmt_number(3) == "3" and fmt_number(0.1234) == "0.123"
    met = Target.at_least("orbit/peer", 2.5, 2.0, unit="x")
    missed = Target.at_most("p50", 40.0, 10.0, unit=" ms", note="see profile")
    unknown = Target.at_least("x", float("nan"), 1.0)
    assert (met.verdict, missed.verdict, unknown.verdict) == ("met", "MISSED", "n/a")
    text = targets_table([met, missed, unknown])
    assert "MISSED" in text and "<= 10.0 ms" in text


def test_result_json_is_strict_and_has_a_latest_copy(tmp_path):
    report = {"scenario": "s0", "value": float("nan"), "targets": [Target.at_least("t", 1.0, 2.0)], "n": [1, 2.5]}
    latest = write_result(report, tmp_path / "results", "s0", stamp="20260101T000000Z")
    assert latest.name == "s0.json"
    document = json.loads(latest.read_text())
    assert document["value"] is None
    assert document["targets"][0]["verdict"] == "MISSED"
    assert (tmp_path / "results" / "s0-20260101T000000Z.json").read_text() == latest.read_text()


def test_profile_summary_from_collapsed_stacks():
    text = "\n".join(
        [
            "run (trio/_core/_run.py:1);claim (orbit_node/store/leases.py:10);_read (trio_mysql/connections.py:5) 6",
            "run (trio/_core/_run.py:1);finish_many (orbit_node/store/leases.py:20) 3",
            "run (trio/_core/_run.py:1);dumps (json/__init__.py:3) 1",
            "garbage line",
        ]
    )
    summary = profile_summary(text, top=5)
    assert summary["samples"] == 10
    assert summary["self"][0] == {"frame": "_read (trio_mysql/connections.py)", "percent": 60.0}
    frames = [r["frame"] for r in summary["inclusive"]]
    assert "claim (store/leases.py)" in frames and not any(f.startswith("run ") for f in frames)
    components = {r["frame"]: r["percent"] for r in summary["components"]}
    assert components["MySQL driver (trio_mysql)"] == 60.0 and components["json"] == 10.0


# -- issue 27: durability settings, R and H, columns per durability, Worker shapes -----


def test_durability_choices_and_plans(capsys):
    from bench.__main__ import build_parser
    from bench.durability import DEV, PROD, plan

    parser = build_parser()
    assert parser.parse_args(["s0", "--durability", " Both "]).durability == "both"
    assert parser.parse_args(["s0"]).durability is None
    with pytest.raises(SystemExit):
        parser.parse_args(["s0", "--durability", "fast"])
    assert "argument --durability: 'fast' is not one of prod, dev, both, server" in capsys.readouterr().err
    # A scenario with a column per durability runs at both; one without runs at prod alone.
    assert plan(None, default="both", columns=True) == (PROD, DEV)
    assert plan("both", default="prod", columns=False) == (PROD,)
    assert plan(None, default="prod", columns=True) == (PROD,)
    assert plan("dev", default="both", columns=True) == (DEV,)
    (no_binlog,) = plan("prod", default="both", columns=True, prod_binlog=False)
    assert no_binlog.flush_log_at_trx_commit == 1 and not no_binlog.binlog
    (server,) = plan("server", default="both", columns=True)
    assert not server.private


def test_durability_server_options_follow_docs_operations():
    from bench.durability import DEV, PROD, check_settings, of_server

    prod = PROD.server_args()
    assert "--innodb-flush-log-at-trx-commit=1" in prod
    assert {"--sync-binlog=1", "--binlog-format=ROW"} <= set(prod) and any(a.startswith("--log-bin") for a in prod)
    dev = DEV.server_args()
    assert "--innodb-flush-log-at-trx-commit=2" in dev and not any("binlog" in a or "log-bin" in a for a in dev)
    assert (PROD.pg_synchronous_commit, DEV.pg_synchronous_commit) == ("on", "off")
    assert (PROD.redis_appendfsync, DEV.redis_appendfsync) == ("always", "everysec")
    good = {"innodb_flush_log_at_trx_commit": 1, "log_bin": 1, "sync_binlog": 1, "binlog_format": "ROW"}
    assert check_settings(PROD, good) == []
    problems = check_settings(PROD, {**good, "innodb_flush_log_at_trx_commit": 2, "sync_binlog": 0})
    assert len(problems) == 2 and "not 1" in problems[0]
    assert check_settings(DEV, {"innodb_flush_log_at_trx_commit": 2, "log_bin": 0}) == []
    seen = of_server({"innodb_flush_log_at_trx_commit": "2", "log_bin": "0", "sync_binlog": "0"})
    assert (seen.name, seen.pg_synchronous_commit, seen.private) == ("dev", "off", False)
    assert seen.redis_appendfsync == "everysec"
    assert of_server({"innodb_flush_log_at_trx_commit": "1"}).redis_appendfsync == "always"


def test_the_private_redis_keeps_every_write_in_its_append_only_file(tmp_path):
    from bench.redisserver import server_args

    args = server_args(tmp_path, 6390, "always")
    options = dict(zip(args[::2], args[1::2], strict=True))
    assert options["--bind"] == "127.0.0.1" and options["--port"] == "6390"
    assert options["--dir"] == str(tmp_path)
    assert (options["--appendonly"], options["--appendfsync"], options["--save"]) == ("yes", "always", "")
    assert server_args(tmp_path, 6390, "everysec")[args.index("--appendfsync") + 1] == "everysec"
    with pytest.raises(ValueError, match="appendfsync 'no'"):
        server_args(tmp_path, 6390, "no")


def test_units_convert_costs_into_r_and_h():
    from bench.units import Units, cost, per_trip_us

    units = Units(r_us=200.0, h_us=2000.0, healthz_per_s=300.0, r_trips=5000, h_requests=900)
    assert units.r(500.0) == pytest.approx(2.5) and units.h(3000.0) == pytest.approx(1.5)
    assert cost(500.0, units) == "500 us = 2.50 R"
    assert cost(3000.0, units, in_h=True) == "3,000 us = 15.0 R = 1.50 H"
    assert "H = 2,000 us = 10.0 R" in units.describe()
    no_h = Units(r_us=200.0)
    assert math.isnan(no_h.h(100.0)) and no_h.describe().endswith("H not measured")
    # JSON (NaN written as null) and back.
    # (as tuples: a field not measured is NaN, which no float equals, but the same object)
    assert attrs.astuple(Units.from_json({**units.to_json(), "unknown": 1})) == attrs.astuple(units)
    assert math.isnan(Units.from_json({"r_us": 1.0, "h_us": None}).h_us)
    # R measured again after the scenario: its drift is stated, and warned of beyond 20 %.
    steady = attrs.evolve(units, r_after_us=220.0)
    assert "220 us after the scenario, +10%" in steady.describe() and "WARNING" not in steady.describe()
    assert steady.r(500.0) == pytest.approx(2.5)  # figures stay in the R measured first
    moved = attrs.evolve(units, r_after_us=120.0)
    assert moved.r_drift() == pytest.approx(-0.4) and "WARNING: R moved -40%" in moved.describe()
    assert "WARNING" not in units.describe() and math.isnan(units.r_drift())
    assert Units.from_json(moved.to_json()) == moved
    # R: the median of the rounds' CPU per trip, so one disturbed round does not move it.
    assert per_trip_us([[0.1, 1000], [0.5, 1000], [0.12, 1000]]) == pytest.approx(120.0)
    assert math.isnan(per_trip_us([]))


def test_grid_puts_durabilities_side_by_side():
    from bench.grids import grid, grid_table

    prod = grid(["system"], ["tasks/s", "R"], [["orbit", 1000.0, 2.5], ["huey", 90.0, 1.0]], "prod", title="t")
    single = grid_table(prod).splitlines()
    assert single[0] == "t" and single[1].split() == ["system", "tasks/s", "R"]
    both = {**prod, "rows": {**prod["rows"], "dev": [["orbit", 1500.0, 2.0], ["pgqueuer", 3000.0, 0.5]]}}
    lines = grid_table(both).splitlines()
    assert lines[1].split() == ["system", "tasks/s", "[prod]", "tasks/s", "[dev]", "R", "[prod]", "R", "[dev]"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[3:]}
    assert rows["orbit"] == ["1,000", "1,500", "2.50", "2.00"]
    assert rows["huey"] == ["90.0", "-", "1.00", "-"] and rows["pgqueuer"] == ["-", "3,000", "-", "0.500"]
    with pytest.raises(ValueError, match="has 2 cells, not 3"):
        grid(["system"], ["tasks/s", "R"], [["orbit", 1.0]], "prod")
    # Too wide for a column per durability: a row per durability under each key instead.
    values = [f"v{i}" for i in range(6)]
    wide = grid(["system"], values, [["orbit", *range(6)]], "prod")
    wide["rows"]["dev"] = [["orbit", *range(10, 16)], ["huey", *range(20, 26)]]
    lines = grid_table(wide).splitlines()
    assert lines[0].split() == ["system", "durability", *values]
    assert [line.split()[:3] for line in lines[2:]] == [
        ["orbit", "prod", "0"],
        ["orbit", "dev", "10"],
        ["huey", "prod", "-"],
        ["huey", "dev", "20"],
    ]


def test_reports_of_two_durabilities_combine_into_one():
    from bench.grids import combine_reports, figures_at, grid, grid_table

    def report(name, rate, notes):
        return {
            "scenario": "s1",
            "figures": {"rate": rate},
            "grids": [grid(["system"], ["tasks/s"], [["orbit", rate]], name)],
            "tables": ["statements"],
            "targets": [Target.at_least("Orbit >= pgqueuer", rate / 100, 1.0)],
            "notes": notes,
            "profiles": {"node": {"samples": 1}},
            "durability": {"name": name},
        }

    combined = combine_reports(
        {"prod": report("prod", 90.0, ["shared", "sync on"]), "dev": report("dev", 150.0, ["shared", "sync off"])}
    )
    assert combined["figures"] == {"rate": 90.0} and figures_at(combined, "dev") == {"rate": 150.0}
    assert [t.name for t in combined["targets"]] == ["[prod] Orbit >= pgqueuer", "[dev] Orbit >= pgqueuer"]
    assert [t.verdict for t in combined["targets"]] == ["MISSED", "met"]
    assert combined["notes"] == ["shared", "[prod] sync on", "[dev] sync off"]
    assert set(combined["profiles"]) == {"node [prod]", "node [dev]"}
    assert combined["tables"] == ["[prod]\nstatements", "[dev]\nstatements"]
    assert "tasks/s [dev]" in grid_table(combined["grids"][0])
    assert [d["name"] for d in combined["durability"]] == ["prod", "dev"]
    alone = combine_reports({"prod": report("prod", 90.0, [])})
    assert figures_at(alone, "prod") == {"rate": 90.0} and figures_at(alone, "dev") is None
    broken = report("dev", 1.0, [])
    broken["grids"] = []
    with pytest.raises(ValueError, match="different numbers of grids"):
        combine_reports({"prod": report("prod", 90.0, []), "dev": broken})


def test_worker_shapes_are_bounded_by_the_pace():
    from bench.s1 import Shape, parse_shapes

    shapes = parse_shapes("64,1,16", "10,0", connections=8)
    assert [(s.capacity, s.handler) for s in shapes] == [
        (1, "no-op"),
        (1, "10 ms"),
        (16, "no-op"),
        (16, "10 ms"),
        (64, "no-op"),
        (64, "10 ms"),
    ]
    # Capacity 1: 8 connections x 4 claims/s x 1 task = 32 tasks/s, so 30 s hold 960 tasks.
    assert Shape(1, 0, 8).tasks(20_000, 30.0) == 960
    assert Shape(64, 0, 8).tasks(20_000, 30.0) == 20_000
    assert Shape(64, 0, 8).tasks(10, 30.0) == 512  # at least one full claim per connection
    with pytest.raises(ValueError, match="--capacities '0,16'"):
        parse_shapes("0,16", "0", connections=8)
    with pytest.raises(ValueError, match="integers expected"):
        parse_shapes("16", "ten", connections=8)


def test_orbit_runs_at_its_best_concurrency_too():
    from bench.s1 import Shape, concurrency_shapes, parse_shapes

    shapes = concurrency_shapes(parse_shapes("16,64", "0,10", connections=8), "8,32")
    # The no-op shape of the largest capacity also runs with 32 connections; 8 is there already.
    assert [(s.capacity, s.handler_ms, s.connections) for s in shapes] == [
        (16, 0, 8),
        (16, 10, 8),
        (64, 0, 8),
        (64, 0, 32),
        (64, 10, 8),
    ]
    assert [s.judged for s in shapes] == [True, False, True, False, False]
    assert Shape(64, 0, 32).tasks(20_000, 30.0) == 20_000
    with pytest.raises(ValueError, match="--orbit-connections '8,x'"):
        concurrency_shapes(shapes, "8,x")
    with pytest.raises(ValueError, match="positive integers expected"):
        concurrency_shapes(shapes, "0")


def test_s1_machine_cpu_per_task_splits_off_what_is_outside_python():
    from bench.s1 import machine_us_per_task

    orbit = {"tasks": 1000, "cpu": {"machine_cpu_s": 1.0, "node_cpu_s": 0.25, "harness_cpu_s": 0.35}}
    assert machine_us_per_task(orbit) == pytest.approx((1000.0, 400.0))
    peer = {"tasks": 2000, "cpu_s": 0.2, "machine_cpu_s": 0.5}
    assert machine_us_per_task(peer) == pytest.approx((250.0, 150.0))
    # A peer that reported no machine CPU (or no task) shows nothing, not a made-up figure.
    assert all(math.isnan(v) for v in machine_us_per_task({"tasks": 10, "cpu_s": 0.1}))
    assert all(math.isnan(v) for v in machine_us_per_task({"tasks": 0, "cpu_s": 0.1, "machine_cpu_s": 0.5}))


def test_s1_targets_are_ratios_in_r_and_to_peers_at_prod():
    from bench.s1 import orbit_targets
    from bench.units import Units

    units = Units(r_us=100.0)
    shapes = [
        # More connections (Orbit's best concurrency) are not where CPU per task is judged.
        {"capacity": 64, "handler_ms": 0, "connections": 32, "node_cpu_us_per_task": 150.0},
        {"capacity": 64, "handler_ms": 0, "connections": 8, "node_cpu_us_per_task": 250.0},
        {"capacity": 64, "handler_ms": 10, "connections": 8, "node_cpu_us_per_task": 900.0},
        {"capacity": 16, "handler_ms": 0, "connections": 8, "node_cpu_us_per_task": 280.0},
    ]
    orbit = {"tasks_per_s": 1000.0, "pacing_bound_tasks_per_s": 2048.0}
    peers = {"pgqueuer": {"tasks_per_s": 2000.0, "concurrency": 128}, "huey": {"tasks_per_s": 200.0}}
    floor = {"tasks_per_s": 1500.0}
    targets = {t.name: t for t in orbit_targets(orbit, floor, peers, shapes, units)}
    assert targets["S1 node CPU per executed task, capacity 64"].value == pytest.approx(2.5)
    assert targets["S1 node CPU per executed task, capacity 64"].verdict == "MISSED"
    assert targets["S1 node CPU per executed task, capacity 16"].verdict == "met"
    assert targets["S1 Orbit >= pgqueuer"].verdict == "MISSED"
    assert targets["S1 Orbit / huey at its best"].verdict == "met"
    dev = {t.name for t in orbit_targets(orbit, floor, peers, shapes, units, against_peers=False)}
    assert not any("pgqueuer" in name or "huey" in name for name in dev)
    # Celery and Dramatiq are measured beside Orbit, with no target of their own.
    more = {**peers, "celery": {"tasks_per_s": 100.0}, "dramatiq": {"tasks_per_s": 1000.0}}
    names = {t.name for t in orbit_targets(orbit, floor, more, shapes, units)}
    assert names == set(targets)


def test_peers_chosen_by_name_and_scenario():
    import argparse

    from bench.peers import E2E_PEERS
    from bench.s1 import wanted_peers

    chosen = argparse.Namespace(peers="huey, celery,pgqueuer,dramatiq", peer_concurrency="8,32")
    assert wanted_peers(chosen) == (["huey", "celery", "pgqueuer", "dramatiq"], [8, 32])
    # e2e runs only the peers with an end-to-end mode.
    assert wanted_peers(chosen, among=E2E_PEERS) == (["huey", "celery", "dramatiq"], [8, 32])
    assert wanted_peers(argparse.Namespace(peers="none", peer_concurrency="8")) == ([], [8])
    with pytest.raises(SystemExit, match="no peer named rq"):
        wanted_peers(argparse.Namespace(peers="celery,rq", peer_concurrency="8"))


class _InstantPeer:
    """A peer whose started workers run and acknowledge each task as it is enqueued."""

    def __init__(self, completions):
        self.completions = completions
        self.waiting = []
        self.running = False
        self.stopped = False

    def enqueue(self, submitted):
        if self.running:
            self.completions.started(submitted)
            self.completions.finished()
        else:
            self.waiting.append(submitted)

    def start(self):
        self.running = True
        for submitted in self.waiting:
            self.completions.started(submitted)
            self.completions.finished()

    def stop(self):
        self.stopped = True


@pytest.mark.parametrize("mode", ["burn-down", "e2e"])
def test_threaded_peers_count_acknowledged_tasks_in_both_modes(mode):
    from bench.thread_peers import Completions, drive

    completions = Completions(200)
    peer = _InstantPeer(completions)
    result = drive(peer, completions, dist="pytest", setup="s", mode=mode, submitters=4, timeout_s=30)
    assert (result["tasks"], result["timed_out"], peer.stopped) == (200, False, True)
    assert result["progress"][-1] == (result["seconds"], 200)
    assert result["setup"] == "s" and result["version"]
    if mode == "burn-down":
        # Every task was enqueued before the workers started, none with a submit time.
        assert len(peer.waiting) == 200 and set(peer.waiting) == {None} and "enqueue_s" in result
    else:
        # The workers ran first; each task carried its submit time to its handler.
        assert peer.waiting == [] and result["start_latency_s"]["count"] == 200
        assert 0 <= result["start_latency_s"]["max"] < 30 and result["submit_tasks_per_s"] > 0


def test_a_judged_shape_is_stated_in_the_r_measured_beside_it():
    """R drifts within a scenario: a judged shape's CPU per task is in the mean of the R
    measured just before and just after it, and the target says so."""
    from bench.s1 import orbit_targets, shape_r_us
    from bench.units import Units

    units = Units(r_us=100.0)
    beside = {"capacity": 16, "handler_ms": 0, "connections": 8, "node_cpu_us_per_task": 500.0}
    beside["r_beside_us"] = [150.0, 250.0]
    plain = {"capacity": 64, "handler_ms": 0, "connections": 8, "node_cpu_us_per_task": 250.0}
    assert shape_r_us(beside, units) == pytest.approx(200.0)
    assert shape_r_us(plain, units) == pytest.approx(100.0)
    orbit = {"tasks_per_s": 1000.0, "pacing_bound_tasks_per_s": 2048.0}
    targets = {t.name: t for t in orbit_targets(orbit, {"tasks_per_s": 1.0}, {}, [beside, plain], units)}
    sixteen = targets["S1 node CPU per executed task, capacity 16"]
    assert sixteen.value == pytest.approx(2.5) and sixteen.verdict == "met"
    assert "R beside the shape 150 / 250 us" in sixteen.note
    assert targets["S1 node CPU per executed task, capacity 64"].value == pytest.approx(2.5)
    assert "the scenario's R" in targets["S1 node CPU per executed task, capacity 64"].note


def test_http_targets_are_ratios_to_r_and_h():
    from bench.http import http_targets
    from bench.units import Units

    units = Units(r_us=200.0, h_us=1500.0)
    healthz = {"node_cpu_us_per_request": 1500.0, "requests_per_s": 400.0}
    submit = {"node_cpu_us_per_request": 2100.0, "requests_per_s": 260.0}
    healthz_r, submit_h, rate = http_targets(healthz, submit, units)
    assert (healthz_r.value, healthz_r.verdict) == (pytest.approx(7.5), "met")
    assert (submit_h.value, submit_h.verdict) == (pytest.approx(1.4), "met")
    assert (rate.value, rate.verdict) == (pytest.approx(0.65), "met")
    slow = http_targets(healthz, {"node_cpu_us_per_request": 3000.0, "requests_per_s": 200.0}, units)
    assert [t.verdict for t in slow] == ["met", "MISSED", "MISSED"]


def test_the_task_clock_counts_a_steps_cpu_not_its_wall_time():
    """A step that burns CPU is counted; one that blocks the thread (a wall-clock wait
    inside the step, as when the machine runs another process instead) is not."""
    import time

    import trio

    from bench.steps import TaskClock

    async def burning() -> None:
        started = time.thread_time()
        while time.thread_time() - started < 0.05:
            pass
        await trio.lowlevel.checkpoint()

    async def blocked() -> None:
        time.sleep(0.1)
        await trio.lowlevel.checkpoint()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(burning, name="t.burning")
            nursery.start_soon(blocked, name="t.blocked")

    clock = TaskClock()
    trio.run(main, instruments=[clock])
    seconds = clock.statistics()["task_seconds"]
    assert seconds["t.burning"] >= 0.045
    assert seconds["t.blocked"] < 0.02
    assert clock.statistics()["task_steps"]["t.burning"] >= 2


def test_the_nodes_parts_are_the_differences_of_its_task_clocks():
    from bench.steps import OTHER, OUTSIDE, by_part

    before = {"task_seconds": {"orbit_node.dispatch.claim_pool.ClaimPool._run_claim": 1.0}}
    after = {
        "task_seconds": {
            "orbit_node.dispatch.claim_pool.ClaimPool._run_claim": 3.0,
            "orbit_node.group_commit.engine.GroupCommit._run_group": 1.5,
            "orbit_node.workers.connection.WorkerConnection._writer": 0.5,
            "hypercorn.trio.task_group._handle": 0.25,
            "quart_trio.asgi.TrioASGIWebsocketConnection.handle_websocket": 0.25,
            "orbit_node.dispatch.periodic.PeriodicService.run": 0.1,
        }
    }
    parts = by_part(before, after, node_cpu_s=5.0)
    assert parts == pytest.approx(
        {
            "claims": 2.0,
            "group commits": 1.5,
            "Worker connections": 0.5,
            "HTTP and WebSocket server": 0.5,
            OTHER: 0.1,
            OUTSIDE: 0.4,
        }
    )
    # A node that kept no clock (another source tree's) has no parts, not zeros.
    assert by_part({}, {"claims_with_tasks": 3}, node_cpu_s=1.0) == {}
