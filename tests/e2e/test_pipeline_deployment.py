"""The optional phases through the deployment: a session run whose `with_phases` ask for
them walks all eight phase tasks on the worker, and a Retry from the UI after its paper
phase failed reads the seven before it from the cache. (`labrun queue --with` giving a run
those parameters: tests/test_pipeline.py.)"""

from __future__ import annotations

from e2e_helpers import submit_run, idea_copy, latest_task_states, read_run, status_json, wait_for


def test_a_failed_paper_phase_retried_from_the_ui_reads_the_seven_before_it_from_the_cache(
        prefect_server, worker, tmp_path):
    from datetime import datetime, timezone

    from labrun.idea import load_idea
    from labrun.serving import submit

    idea = idea_copy(tmp_path / "ideas", "retry.yaml", "Pipeline test: a paper that fails once")
    workspace = submit.workspace_for(idea, load_idea(idea).content_hash, tmp_path / "workspaces")
    run = submit_run(idea, workspace, agent="scripted", with_phases=["resources", "paper"], paper_style="icml",
                                job_variables={"env": {"LABRUN_SCRIPTED_FAULTS": "raise@paper:2",
                                                       "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}})
    run_id = str(run.id)
    assert wait_for([run_id], timeout_s=300)[run_id].state.type.value == "FAILED"
    retried_at = datetime.now(timezone.utc)
    assert submit.retry_like_the_ui(run_id, ui="v2").status.value == "ACCEPT"
    done = wait_for([run_id], timeout_s=300)[run_id]
    assert done.state.type.value == "COMPLETED", done.state
    states = latest_task_states(run_id, since=retried_at)
    keys = ["resources", "planning", "setup", "implementation", "experiments", "analysis", "documentation"]
    assert all(states[f"{n}-{k}"] == "Cached" for n, k in enumerate(keys, 1)), states
    assert states["8-paper"] == "Completed", states
    assert read_run(run_id).parameters["with_phases"] == ["resources", "paper"]
    report = status_json(workspace, prefect_server.env)
    assert {p["key"]: p["runs"] for p in report["phases"]} == {**{k: 1 for k in keys}, "paper": 2}
    assert report["session"]["complete"] and report["session"]["paper_style"] == "icml"
