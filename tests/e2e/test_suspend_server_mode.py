"""A running session suspended from the Prefect UI: Prefect refuses the run's next task and its
process ends; STATE.md, `labrun status` and the Worklog say so and how to go on. Resume
(before the suspension's timeout) and Retry (after Prefect failed the run for it) each go on
from where it stopped, nothing finished done again."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from datetime import datetime, timedelta, timezone

from prefect.client.schemas.objects import StateDetails, StateType
from prefect.states import State

from labrun.serving import submit as srv

from e2e_helpers import client, flow_processes, idea_copy, labrun, read_run, status_json, submit_run, wait_for


def suspend_like_the_ui(flow_run_id: str, timeout_s: int) -> None:
    """What Suspend (the classic UI) and Pause (the new UI) send: the run's state set, forced,
    to Suspended, to be rescheduled on a worker when resumed, failed if not resumed in
    `timeout_s` (the dialog's field, 300 s unless changed)."""
    with client() as c:
        result = c.set_flow_run_state(flow_run_id, State(
            type=StateType.PAUSED, name="Suspended", state_details=StateDetails(
                pause_timeout=datetime.now(timezone.utc) + timedelta(seconds=timeout_s), pause_reschedule=True)),
            force=True)
    assert result.status.value == "ACCEPT", result


def wait_phase(ws, phase: str, env) -> None:
    deadline = time.monotonic() + 180
    while not (ws / ".labrun/state.json").exists() or status_json(ws, env)["session"]["active_phase"] != phase:
        assert time.monotonic() < deadline, f"phase {phase} never ran"
        time.sleep(0.5)


def wait_stopped(ws, worker) -> str:
    """Once the engine has stopped and said so: STATE.md's next action."""
    deadline = time.monotonic() + 60
    while "suspended from the Prefect UI" not in (next_action := re.search(
            r"^Next action: .*$", (ws / "STATE.md").read_text(), re.M).group(0)) or flow_processes(worker):
        assert time.monotonic() < deadline, (next_action, [p.cmdline() for p in flow_processes(worker)])
        time.sleep(0.5)
    return next_action


def test_a_run_suspended_from_the_ui_says_so_and_goes_on_when_resumed_or_retried(prefect_server, worker, tmp_path):
    from labrun.idea import load_idea

    idea = idea_copy(tmp_path / "ideas", "suspended.yaml", "Suspend test: Suspend pressed in the Prefect UI")
    ws = srv.workspace_for(idea, load_idea(idea).content_hash, tmp_path / "workspaces")
    run_id = str(submit_run(idea, ws, agent="scripted", job_variables={"env": {
        "LABRUN_SCRIPTED_LATENCY_S": "0.5", "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}}).id)
    name = read_run(run_id).name

    # Suspend pressed while implementation runs: the process ends, no worker slot is held.
    wait_phase(ws, "implementation", prefect_server.env)
    suspend_like_the_ui(run_id, timeout_s=300)
    current = wait_stopped(ws, worker)
    assert read_run(run_id).state.name == "Suspended"
    status = status_json(ws, prefect_server.env)
    assert status["phases"][2]["status"] == "IN PROGRESS", status["phases"]
    next_action = status["session"]["next_action"]
    assert next_action.startswith(f"flow run {name} was suspended from the Prefect UI at "), next_action
    assert "press Resume on its page in the Prefect UI before " in next_action
    assert f"press Retry, or `prefect flow-run retry {run_id}`" in next_action
    assert "phase implementation goes on from its last finished step" in next_action
    assert current == f"Next action: {next_action}"
    assert f"flow run {name} suspended from the Prefect UI at" in (ws / "STATE.md").read_text()  # the Worklog
    assert f"next: {next_action}" in labrun("status", str(ws), env=prefect_server.env).stdout.replace("\n", " ")

    # Resume, as both UIs' Resume does for a run that asks no input: a worker goes on.
    with client() as c:
        c.resume_flow_run(run_id)
    wait_phase(ws, "experiments", prefect_server.env)

    # Suspended again with a short timeout: Prefect fails the run; Retry goes on.
    suspend_like_the_ui(run_id, timeout_s=5)
    wait_stopped(ws, worker)
    failed = wait_for([run_id], timeout_s=60)[run_id]
    assert failed.state.type.value == "FAILED" and "never resumed" in failed.state.message, failed.state
    assert srv.retry_like_the_ui(run_id, ui="v1").status.value == "ACCEPT"
    done = wait_for([run_id], timeout_s=240)[run_id]
    assert done.state.type.value == "COMPLETED", done.state

    after = status_json(ws, prefect_server.env)
    assert after["session"]["complete"], after["session"]
    runs = {p["key"]: p["runs"] for p in after["phases"]}
    assert runs == {"planning": 1, "setup": 1, "implementation": 2, "experiments": 2, "analysis": 1,
                    "documentation": 1}, runs
    billed = Counter((b["phase"], b["turn"]) for b in map(json.loads, (
        ws / ".labrun/faults/billed.jsonl").read_text().splitlines()))
    assert [call for call, n in billed.items() if n > 1] == [], "model calls made twice"
    deadline = time.monotonic() + 60  # the run is Completed a moment before its process has exited
    while (left := flow_processes(worker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, [p.cmdline() for p in left]
