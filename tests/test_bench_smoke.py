"""The benchmark harness's pure helpers (no timing assertions, no benchmark-only packages)."""

from __future__ import annotations

import json
import math

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
            "run (trio/_core/_run.py:1);claim (orbit_node/store/dispatch.py:10);_read (trio_mysql/connections.py:5) 6",
            "run (trio/_core/_run.py:1);finish_many (orbit_node/store/dispatch.py:20) 3",
            "run (trio/_core/_run.py:1);dumps (json/__init__.py:3) 1",
            "garbage line",
        ]
    )
    summary = profile_summary(text, top=5)
    assert summary["samples"] == 10
    assert summary["self"][0] == {"frame": "_read (trio_mysql/connections.py)", "percent": 60.0}
    frames = [r["frame"] for r in summary["inclusive"]]
    assert "claim (store/dispatch.py)" in frames and not any(f.startswith("run ") for f in frames)
    components = {r["frame"]: r["percent"] for r in summary["components"]}
    assert components["MySQL driver (trio_mysql)"] == 60.0 and components["json"] == 10.0
