"""A rerun in server mode: the deployment's `from_phase` parameter, as a run started from
the UI would give it, then a failed rerun retried from the UI and the same run requested
again: each continues the branch the first one started, and the phases before `from_phase`
are cache hits in Prefect's task states."""

from __future__ import annotations

from datetime import datetime, timezone

from labrun.serving import SESSION_DEPLOYMENT
from labrun.serving import submit as srv

from e2e_helpers import submit_run, idea_copy, latest_task_states, status_json, wait_for

BEFORE = ("1-planning", "2-setup", "3-implementation", "4-experiments")
AFTER = ("5-analysis", "6-documentation")


def test_a_deployment_run_with_from_phase_reruns_from_it(prefect_server, worker, tmp_path):
    from prefect.deployments import run_deployment
    from labrun.idea import load_idea

    idea = idea_copy(tmp_path / "ideas", "rerun.yaml", "Rerun test: analysis again from the UI")
    ws = srv.workspace_for(idea, load_idea(idea).content_hash, tmp_path / "workspaces")
    first = str(submit_run(idea, ws, agent="scripted").id)
    assert wait_for([first], timeout_s=180)[first].state.type.value == "COMPLETED"
    before = status_json(ws, prefect_server.env)

    def rerun(**job):
        run = run_deployment(SESSION_DEPLOYMENT, timeout=0, job_variables=job or None, parameters={
            "idea_path": str(idea), "workspace": str(ws), "from_phase": "analysis", "note": "from the UI"})
        return str(run.id), wait_for([run.id], timeout_s=180)[str(run.id)]

    # The rerun fails once in analysis (a fault in that run's environment only) ...
    failed_id, failed = rerun(env={"LABRUN_SCRIPTED_FAULTS": "raise@analysis:1"})
    assert failed.state.type.value == "FAILED", failed.state
    states = latest_task_states(failed_id)
    assert all(states[name] == "Cached" for name in BEFORE), states
    assert states["5-analysis"] == "Failed", states

    # ... and Retry in the UI continues the branch it started, not a third one.
    retried_at = datetime.now(timezone.utc)
    assert srv.retry_like_the_ui(failed_id, ui="v2").status.value == "ACCEPT"
    done = wait_for([failed_id], timeout_s=180)[failed_id]
    assert done.state.type.value == "COMPLETED", done.state
    states = latest_task_states(failed_id, since=retried_at)
    assert all(states[name] == "Cached" for name in BEFORE), states
    assert all(states[name] == "Completed" for name in AFTER), states

    after = status_json(ws, prefect_server.env)
    assert after["session"]["complete"] and after["session"]["branch"] == 2
    assert [(b["n"], b["from_phase"], b["note"]) for b in after["branches"]] == [
        (1, "planning", ""), (2, "analysis", "from the UI")]
    runs = {p["key"]: p["runs"] for p in after["phases"]}
    assert runs == {"planning": 1, "setup": 1, "implementation": 1, "experiments": 1,
                    "analysis": 2, "documentation": 1}
    # experiments was reused; the analysis drew its figures again, in an attempt of branch 2
    assert after["attempts"][:len(before["attempts"])] == before["attempts"]
    assert [(a["phase"], a["branch"]) for a in after["attempts"][len(before["attempts"]):]] == [("analysis", 2)]
    assert (ws / ".labrun/branches/1/phases/analysis/conversation-001.jsonl").is_file()

    # The same run requested again (a deployment re-run with the same parameters) is the
    # branch it already made: every phase a cache hit, still two branches.
    again_id, again = rerun()
    assert again.state.type.value == "COMPLETED", again.state
    assert set(latest_task_states(again_id).values()) == {"Cached"}
    assert status_json(ws, prefect_server.env)["session"]["branch"] == 2
