"""The chaos run (harness/chaos.py) for 40 s of faults: three node processes on a private
mariadbd, SDK Workers on each, every kind of fault at least once; the history checker must
find every property holding. The ten-minute run is ``python -m bench chaos``."""

from __future__ import annotations

import pytest

from harness.chaos import FAULTS, NO_RERUN_FAULTS, ChaosPlan, run_chaos

# Faults cover 40 s; starting the server and three nodes, and the settling after the faults,
# take the rest. The cap leaves room for a loaded 2-core machine.
PLAN = ChaosPlan(seconds=40.0, submits_per_s=8.0, settle_s=90.0, seed=23)


@pytest.mark.time_cap(300)
async def test_a_chaos_run_keeps_every_history_property(tmp_path):
    result = await run_chaos(PLAN, tmp_path)
    print(result.text())
    assert result.verdict.ok, result.text()
    assert result.settled and not result.refused and not result.worker_rejections, result.text()
    assert result.failed_tasks == 0, result.text()
    # The run did what it is for: every kind of fault happened and work was lost and redone.
    assert all(result.faults[kind] >= 1 for kind in FAULTS), result.faults
    assert result.verdict.figures["acknowledged"] >= PLAN.seconds * PLAN.submits_per_s * 0.5, result.text()
    assert result.verdict.figures["lost_attempts"] >= 1, result.text()
    # A connection cut or a rolling restart re-runs nothing: the Workers re-attach.
    assert not any(result.reruns[kind] for kind in NO_RERUN_FAULTS), result.text()


# Only connection cuts and rolling restarts, each hitting running handlers: on 15723f5
# every task running at a cut or a drain ran again (issue 39).
CUTS = ChaosPlan(seconds=30.0, submits_per_s=8.0, settle_s=60.0, seed=5, faults=NO_RERUN_FAULTS)


@pytest.mark.time_cap(240)
async def test_connection_cuts_and_rolling_restarts_run_no_task_twice(tmp_path):
    result = await run_chaos(CUTS, tmp_path)
    print(result.text())
    assert result.ok, result.text()
    assert all(result.faults[kind] >= 2 for kind in NO_RERUN_FAULTS), result.faults
    assert all(result.handlers_through[kind] >= 1 for kind in NO_RERUN_FAULTS), result.text()
    assert sum(result.reruns.values()) == 0, result.text()
