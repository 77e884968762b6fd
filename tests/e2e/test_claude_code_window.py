"""Server mode and Claude Code's usage window: a flow run whose window is spent does not hold
its worker. It reschedules itself for the reset time (state "AwaitingUsageWindow"), its
process exits, and a worker runs the same flow run again then; it resumes the phase in the
same Claude Code session. `claude` is the stand-in of tests/fake_claude (not Claude Code)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


from e2e_helpers import submit_run, client, status_json, wait_for

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
        "LABRUN_PASS_ENV": "FAKE_CLAUDE_HOME,FAKE_CLAUDE_LOG,FAKE_CLAUDE_FAULTS,FAKE_CLAUDE_LOGGED_OUT",  # claude gets a scrubbed environment
        "LABRUN_CLI_WRITABLE": str(tmp_path),  # the stand-in's files, in the namespace labrun runs it in
        "LABRUN_MIN_WINDOW_WAIT_S": "0",
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30",
    }
    run = submit_run(idea, ws, agent="claude-code", job_variables={"env": env})

    final = wait_for([run.id])[str(run.id)]
    assert final.state.type.value == "COMPLETED", final.state
    # Read from the run's history: a worker prefetches runs due within 10 s
    # (PREFECT_WORKER_PREFETCH_SECONDS), so a window of 8 s can be left in a moment.
    with client() as c:
        history = c.read_flow_run_states(run.id)
    [state] = [s for s in history if s.name == "AwaitingUsageWindow"]
    assert state.is_scheduled()
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    setup = [c for c in calls if "/phases/setup/" in " ".join(c["argv"])]
    assert len(setup) == 2 and len(calls) == 7  # one run after the window, no retry loop
    # scheduled for the reset time that claude gave, about 8 s after the window was hit
    [window] = [json.loads(line) for line in Path(f"{log}.windows").read_text().splitlines()]
    assert abs(state.state_details.scheduled_time.timestamp() - window["resets_at"]) < 1
    assert window["resets_at"] - setup[0]["time"] > 5.5
    # a new engine process ran the rescheduled flow run: the first one had exited
    engines = [json.loads(f.read_text().splitlines()[0])["engine_pid"]
               for f in sorted((ws / ".labrun" / "phases" / "setup").glob("claude-run-*.jsonl"))]
    assert len(engines) == 2 and engines[0] != engines[1]
    assert setup[1]["time"] >= state.state_details.scheduled_time.timestamp() - 1
    assert "--resume" in setup[1]["argv"]
    assert status_json(ws, prefect_server.env)["session"]["complete"]
