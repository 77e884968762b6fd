"""A session run's parameters (labrun.run_params) as the flow takes them: the UI's form and
the server refuse a run without `workspace` (tests/e2e/test_server_mode.py and
test_deployment_edges.py check the deployed schema); a run the server did not check (a
schedule's, which passes no parameters) fails at once in one line that says what to give."""

from __future__ import annotations


def test_a_run_without_a_workspace_fails_saying_what_to_give(prefect_api):
    from labrun.flows.session import research_session

    state = research_session(return_state=True)
    assert state.is_failed(), state
    assert state.message.startswith("Flow run encountered an exception: SessionStopped: this run names no workspace")
    assert "Scheduling a session" in state.message and "FieldInfo" not in state.message
