"""The experiment queue (`flows/queue.py`) on the embedded Prefect API: what a run of it is
named, and that a folder that is not there fails the run (the submissions themselves, on a
server with a worker, are in tests/e2e/test_server_mode.py)."""

from __future__ import annotations

import inspect


def _flow_run(state):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(state.state_details.flow_run_id)


def test_a_missing_folder_fails_the_run_in_one_clear_line_and_the_run_is_named(tmp_path, prefect_api):
    from labrun.flows.queue import experiment_queue

    missing = tmp_path / "no-such-ideas"
    state = experiment_queue(str(missing), str(tmp_path / "workspaces"), return_state=True)
    assert state.is_failed(), state
    assert state.message and f"folder {missing}: no such folder on this worker" in state.message, state.message
    assert _flow_run(state).name == f"ideas from {missing}"

    afile = tmp_path / "ideas.yaml"
    afile.write_text("")
    state = experiment_queue(str(afile), str(tmp_path / "workspaces"), return_state=True)
    assert state.is_failed() and f"folder {afile}: not a folder" in (state.message or ""), state


def test_the_queue_passes_on_what_a_session_run_is_given():
    from labrun.flows.queue import experiment_queue

    given = set(inspect.signature(experiment_queue.fn).parameters)
    assert {"agent", "model", "with_phases", "paper_style", "pass_env", "review_after"} <= given
