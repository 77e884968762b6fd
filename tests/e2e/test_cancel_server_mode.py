"""A session's run on a process worker cancelled from Prefect's UI in the middle of an
experiment attempt: the run is Cancelled in seconds, STATE.md says the phase was
interrupted, nothing the run started is left (the flow run's process, the attempt's sandbox,
the egress proxy), and the UI's Retry resumes the session and completes it with nothing
finished done again."""

from __future__ import annotations

import time
from datetime import datetime, timezone

from labrun import prefect_processes as processes
from labrun.idea import load_idea
from labrun.serving import submit
from labrun.state import phase_table

from e2e_helpers import cancel_like_the_ui, idea_copy, submit_run, latest_task_states, status_json, wait_for
from support import attempt_group, alive

FIRST_THREE = ("planning", "setup", "implementation")


def test_a_run_cancelled_from_the_ui_mid_attempt_stops_in_seconds_and_its_retry_completes(
        prefect_server, worker, tmp_path, bubblewrap_works):
    idea = idea_copy(tmp_path / "ideas", "cancel.yaml", "Cancel test: a run cancelled from the UI")
    ws = submit.workspace_for(idea, load_idea(idea).content_hash, tmp_path / "workspaces")
    run_id = str(submit_run(idea, ws, agent="scripted", job_variables={"env": {
        "LABRUN_SCRIPTED_FAULTS": "hang-attempt@experiments:1"}}).id)
    seen: dict[int, str] = {}  # every process seen below the worker (the flow run's and all it started)

    def below_worker() -> list[str]:
        for p in processes.descendants(worker.proc.pid):
            seen.setdefault(p.pid, " ".join(_cmd(p))[:150])
        return list(seen.values())

    def in_attempt() -> bool:
        return attempt_group(ws) is not None and any(c.startswith("sleep") for c in below_worker())

    _wait(in_attempt, 180, "the session's first experiment attempt")
    time.sleep(0.5)
    started = below_worker()
    assert any("labrun.egress_proxy" in c for c in started) and any("bwrap" in c for c in started), started
    cancelled_at = time.monotonic()
    assert cancel_like_the_ui(run_id, ui="v2").status.value == "ACCEPT"
    run = wait_for([run_id], timeout_s=60)[run_id]
    took = time.monotonic() - cancelled_at
    assert run.state.type.value == "CANCELLED", run.state
    assert took < 10, f"{took:.1f} s to be Cancelled"  # the worker hears of it at once (an event); we poll each 1 s
    _wait(lambda: not [pid for pid in seen if alive(pid)], 5,
          f"the run's processes to end: {[c for pid, c in seen.items() if alive(pid)]}")

    state_md = (ws / "STATE.md").read_text()
    assert phase_table(state_md)["experiments"] == "INTERRUPTED", state_md
    assert "phase 4 experiments interrupted by a cancellation of its flow run in Prefect" in state_md, state_md
    assert "- Status: RUNNING" not in state_md

    # Retry, as the Retry button of the run's page (V1 UI) does: the session resumes where it was cut off.
    retried_at = datetime.now(timezone.utc)
    assert submit.retry_like_the_ui(run_id, ui="v1").status.value == "ACCEPT"
    done = wait_for([run_id], timeout_s=180)[run_id]
    assert done.state.type.value == "COMPLETED", done.state
    status = status_json(ws, prefect_server.env)
    assert status["session"]["complete"]
    assert {p["key"]: p["runs"] for p in status["phases"]} == {
        "planning": 1, "setup": 1, "implementation": 1, "experiments": 2, "analysis": 1, "documentation": 1}
    # the cut-off attempt is not a failure; the agent runs it again, unfixed, and it fails
    assert [(a["n"], a["status"]) for a in status["attempts"]] == [
        (1, "INTERRUPTED"), (2, "FAILED"), (3, "SUCCESS"), (4, "SUCCESS")]
    states = latest_task_states(run_id, since=retried_at)
    assert all(states[f"{n}-{k}"] == "Cached" for n, k in enumerate(FIRST_THREE, 1)), states


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _cmd(p) -> list[str]:
    try:
        return p.cmdline()
    except Exception:
        return []
