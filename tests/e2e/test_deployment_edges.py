"""A deployment run as Prefect's own CLI and client start one: named after its session, its
Logs tab holding labrun's events, bad or missing parameters refused before a workspace
exists, and a finished session's repeated runs writing nothing."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from labrun.run_params import session_run_name
from labrun.serving import SESSION_DEPLOYMENT

from e2e_helpers import client, idea_copy, labrun, wait_for

PREFECT = str(Path(sys.executable).parent / "prefect")


def run_logs(flow_run_id) -> list[str]:
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with client() as c:
        return [log.message for log in c.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(
            any_=[flow_run_id])), limit=200)]


def wait_until(ready, what: str, timeout_s: float = 30) -> None:
    """A run's logs reach the API in batches, just after its final state."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_prefects_own_cli_gets_a_named_run_its_logs_and_one_line_refusals(prefect_server, worker, tmp_path):
    from prefect.deployments import run_deployment
    from prefect.exceptions import PrefectHTTPStatusError

    idea = idea_copy(tmp_path / "ideas", "edges.yaml", "Edge test: a deployment run from Prefect's CLI")
    ws = tmp_path / "workspaces" / "edges-by-hand"
    started = subprocess.run(
        [PREFECT, "deployment", "run", SESSION_DEPLOYMENT, "-p", f"idea_path={idea}", "-p", f"workspace={ws}",
         "-p", "agent=scripted"], env=prefect_server.env, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = next(line.split()[-1] for line in started.stdout.splitlines() if "UUID" in line)
    run = wait_for([run_id], timeout_s=180)[run_id]
    assert run.state.type.value == "COMPLETED", run.state
    assert run.name == session_run_name(ws)  # not a random pair of words
    wait_until(lambda: "session complete" in run_logs(run_id), "the run's last event in its logs")
    logs = run_logs(run_id)
    for event in ("phase 1 of 6 planning started (run 1)", "phase 4 of 6 experiments started (run 1)",
                  "attempt 2 SUCCESS", "session complete"):
        assert event in logs, (event, logs[:30])
    assert any(line.startswith("attempt 1 FAILED: NameError") for line in logs), logs

    # The same run again, as a schedule or a second click would start it: nothing is written.
    before = {p: p.read_bytes() for p in (ws / "STATE.md", ws / ".labrun" / "state.json")}
    again = run_deployment(SESSION_DEPLOYMENT, timeout=0, parameters={"idea_path": str(idea), "workspace": str(ws)})
    assert wait_for([again.id], timeout_s=120)[str(again.id)].state.type.value == "COMPLETED"
    assert {p: p.read_bytes() for p in before} == before
    wait_until(lambda: any("already complete" in line for line in run_logs(again.id)), "the run's log line")

    # No workspace: refused when the run is created, naming it (the UI's form marks it required).
    with pytest.raises(PrefectHTTPStatusError, match="'workspace' is a required property"):
        run_deployment(SESSION_DEPLOYMENT, timeout=0, parameters={"idea_path": str(idea)})

    # Bad values are refused when the run is created: no workspace is made.
    for bad in ({"budget_usd": -5}, {"max_turns": 0}, {"agent": "bogus"}, {"from_phase": "analysys"}):
        target = tmp_path / "workspaces" / f"refused-{next(iter(bad))}"
        with pytest.raises(PrefectHTTPStatusError, match="409|422|Validation"):
            run_deployment(SESSION_DEPLOYMENT, timeout=0,
                           parameters={"idea_path": str(idea), "workspace": str(target), **bad})
        assert not target.exists()


def test_a_cli_resume_of_a_deployment_runs_session_says_it_runs_as_a_new_run(prefect_server, worker, tmp_path):
    from prefect.deployments import run_deployment

    idea = idea_copy(tmp_path / "ideas", "resumed.yaml", "Edge test: a failed deployment run resumed by hand")
    ws = tmp_path / "workspaces" / "resumed-by-hand"
    run = run_deployment(SESSION_DEPLOYMENT, timeout=0, job_variables={"env": {"LABRUN_SCRIPTED_FAULTS": "raise@analysis:1"}},
                         parameters={"idea_path": str(idea), "workspace": str(ws), "agent": "scripted"})
    assert wait_for([run.id], timeout_s=180)[str(run.id)].state.type.value == "FAILED"
    resumed = labrun("resume", str(ws), env=prefect_server.env)
    assert resumed.returncode == 0, resumed.stderr
    said = " ".join(resumed.stdout.split())
    name = session_run_name(ws)
    assert f"the deployment run {name} ({run.id}); this resume runs here as a new flow run" in said, said
