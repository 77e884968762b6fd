"""The optional phases through the deployment: `labrun queue --with resources,paper` passes
them (and the paper style) as the session run's parameters, and the worker's run walks all
eight phase tasks."""

from __future__ import annotations

from e2e_helpers import UUID_RE, idea_copy, labrun, read_run, status_json, task_runs, wait_for


def test_queue_with_the_optional_phases_runs_them_on_the_worker(prefect_server, worker, tmp_path):
    idea = idea_copy(tmp_path / "ideas", "pipeline.yaml", "Pipeline test: literature first, a paper last")
    out = labrun("queue", str(idea), "--with", "resources,paper", "--paper-style", "icml",
                 "--workspaces", str(tmp_path / "workspaces"), env=prefect_server.env).stdout
    run_id = UUID_RE.search(out).group(0)
    workspace = out.split(" → ", 1)[1].splitlines()[0].strip()
    run = wait_for([run_id], timeout_s=300)[run_id]
    assert run.state.type.value == "COMPLETED", run.state
    assert read_run(run_id).parameters["with_phases"] == ["resources", "paper"]
    assert read_run(run_id).parameters["paper_style"] == "icml"
    report = status_json(workspace, prefect_server.env)
    assert [p["key"] for p in report["phases"]][::7] == ["resources", "paper"]
    assert report["session"]["complete"] and report["session"]["paper_style"] == "icml"
    names = {t.name for t in task_runs(run_id)}
    assert {"1-resources", "2-planning", "8-paper"} <= names
