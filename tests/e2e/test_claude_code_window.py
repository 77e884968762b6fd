"""Server mode and Claude Code's usage window: a flow run whose window is spent does not hold
its worker. It reschedules itself for the reset time (state "AwaitingUsageWindow"), its
process exits, and a worker runs the same flow run again then; it resumes the phase in the
same Claude Code session. `claude` is the stand-in of tests/fake_claude (not Claude Code)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from labrun import server as srv

from e2e_helpers import read_run, status_json, wait_for

FAKE = Path(__file__).resolve().parents[1] / "fake_claude"
IDEA = """\
idea:
  title: "Averaging noisy measurements, with a usage window"
  domain: data_science
  hypothesis: |
    The RMSE of the mean of k independent noisy measurements falls as 1/sqrt(k).
  constraints:
    time_limit: 600
    budget: 5
"""


def test_a_spent_window_reschedules_the_flow_run(prefect_server, worker, tmp_path):
    idea, ws = tmp_path / "idea.yaml", tmp_path / "ws"
    idea.write_text(IDEA)
    log, faults = tmp_path / "claude.jsonl", tmp_path / "faults.json"
    faults.write_text(json.dumps([{"phase": "setup", "at_step": 0, "do": "window", "resets_in": 8}]))
    env = {
        "PATH": os.pathsep.join([str(FAKE), str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "FAKE_CLAUDE_HOME": str(tmp_path / "claude-home"),
        "FAKE_CLAUDE_LOG": str(log),
        "FAKE_CLAUDE_FAULTS": str(faults),
        "LABRUN_MIN_WINDOW_WAIT_S": "0",
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30",
    }
    run = srv.submit_session(idea, ws, agent="claude-code", job_variables={"env": env})

    deadline = time.monotonic() + 180
    while (state := read_run(run.id).state) is None or state.name != "AwaitingUsageWindow":
        assert time.monotonic() < deadline and not (state and state.is_final()), state
        time.sleep(0.5)
    assert state.is_scheduled()
    window_run = [json.loads(line) for line in log.read_text().splitlines()][-1]
    # scheduled for the reset time: 8 s after the window was hit (resetsAt is whole seconds)
    assert 5.5 < state.state_details.scheduled_time.timestamp() - window_run["time"] < 9.5

    final = wait_for([run.id])[str(run.id)]
    assert final.state.type.value == "COMPLETED", final.state
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    setup = [c for c in calls if "/phases/setup/" in " ".join(c["argv"])]
    assert len(setup) == 2 and len(calls) == 7  # one run after the window, no retry loop
    # a new engine process ran the rescheduled flow run: the first one had exited
    assert setup[0]["ppid"] != setup[1]["ppid"]
    assert setup[1]["time"] >= state.state_details.scheduled_time.timestamp() - 1
    assert "--resume" in setup[1]["argv"]
    assert status_json(ws, prefect_server.env)["session"]["complete"]
