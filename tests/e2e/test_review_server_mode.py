"""Review by a person through a deployment run: the run suspends after planning (no worker
process is held), a Retry pressed meanwhile suspends it again, a revision from `labrun review`
resumes it on a worker, and a real click in the Prefect UI's Resume form, in headless
Chromium, approves the plan, which the form shows; the run goes on to the end. Takes docs/prefect-ui-review.png."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from labrun.review import os_user
from labrun.serving import submit as srv

from chromium import Browser, find_chromium
from e2e_helpers import (submit_run, CRASH_AFTER_S, REPO, flow_processes, idea_copy, labrun, latest_task_states, read_run,
                         status_json, wait_for)

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="chromium is not installed (apt-get install chromium, or .ci/install-chromium); the review "
           "is given by a click in the Prefect UI",
)
REVISION = "Add a second noise level, sigma 2.0, to the run list."
COMMENT = "Looks sound; report the slope with a bootstrap interval."
PLAN_LINE = "Monte Carlo: true value 1.0, sigma 0.5, k in 1, 2, 4, ..., 256, 1000 trials per k."
"""A line of the scripted agent's planning.md."""
NOT_PAUSED = {"SCHEDULED", "PENDING", "RUNNING", "COMPLETED", "FAILED", "CRASHED", "CANCELLING", "CANCELLED"}


def phase_tasks(run_id: str) -> set[str]:
    return {name for name in latest_task_states(run_id) if name[:1].isdigit()}


def wait_suspended(run_id: str, worker, since_pids: set[int] | None = None) -> None:
    run = wait_for([run_id], states={"PAUSED"}, timeout_s=240)[run_id]
    assert run.state.name == "Suspended", run.state
    assert run.state.state_details.run_input_keyset, "suspended without a Resume form"
    deadline = time.monotonic() + 60  # the flow process exits after it suspends
    while (left := flow_processes(worker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"the worker still holds {[p.cmdline() for p in left]} for a suspended run"


def approve_in_the_ui(browser, server, run_id: str) -> None:
    """Resume, approve with COMMENT, Submit, as a person does; once more when the server
    answered the resume with "database is locked". Prefect's server on SQLite can refuse a
    state change so under load (PrefectHQ/prefect#17473); its own clients try again, the UI
    does not, and the run stays suspended until the person submits again. Any other run left
    suspended fails the test."""
    server_log = server.logs / "server.log"
    for _ in range(3):
        locked = server_log.read_text(errors="replace").count("database is locked")
        browser.goto(f"{server.ui_url}/runs/flow-run/{run_id}")
        browser.wait_for_text("Suspended", "Resume")
        browser.click_text("Resume")
        browser.wait_for_text("Phase planning awaits review (round 2)", f"The revision asked for: {REVISION}",
                              "Run list:", "Evaluation criteria:", "Submit", timeout_s=30)
        # The plan's own text, not only its name: the reviewer needs no access to the worker.
        browser.wait_for_text("planning.md", PLAN_LINE, timeout_s=5)
        browser.js("[...document.querySelectorAll('.p-modal h2')].find(h => h.innerText.trim() === 'planning.md')"
                   ".scrollIntoView({block: 'start'})")  # the screenshot shows the plan
        browser.choose(".p-modal select", "approve")
        browser.type_into(".p-modal textarea", COMMENT)
        browser.screenshot(REPO / "docs/prefect-ui-review.png")  # docs/server-mode.md shows it
        browser.click_text("Submit")
        try:
            wait_for([run_id], states=NOT_PAUSED, timeout_s=60)
            return
        except AssertionError:
            if server_log.read_text(errors="replace").count("database is locked") == locked:
                raise
    raise AssertionError("the server refused the UI's resume three times: database is locked")


def test_a_deployment_run_awaits_review_suspended_and_a_click_in_the_ui_resumes_it(
        prefect_server, worker, tmp_path):
    from labrun.idea import load_idea

    idea = idea_copy(tmp_path / "ideas", "reviewed.yaml", "Review test: the plan read in the Prefect UI")
    ws = srv.workspace_for(idea, load_idea(idea).content_hash, tmp_path / "workspaces")
    run_id = str(submit_run(idea, ws, agent="scripted", review_after=["planning"]).id)

    wait_suspended(run_id, worker)
    suspended_at = time.monotonic()
    status = status_json(ws, prefect_server.env)
    assert status["session"]["awaiting_review"]["phase"] == "planning", status["session"]
    assert phase_tasks(run_id) == {"1-planning"}  # nothing after planning ran
    assert "Awaiting review: phase planning since" in (ws / "STATE.md").read_text()

    # No heartbeat comes from a suspended run, and the automation that marks silent runs
    # Crashed leaves it alone: a review may wait for days.
    time.sleep(max(0.0, suspended_at + CRASH_AFTER_S + 10 - time.monotonic()))
    assert read_run(run_id).state.name == "Suspended"

    # A Retry pressed while it waits does not skip the review: the run suspends again.
    retried_at = datetime.now(timezone.utc)
    assert srv.retry_like_the_ui(run_id, ui="v2").status.value == "ACCEPT"
    deadline = time.monotonic() + 120
    while "1-planning" not in (again := latest_task_states(run_id, since=retried_at)):
        assert time.monotonic() < deadline, "the retried run never ran"
        time.sleep(1)
    assert again == {"1-planning": "Cached"}, again
    wait_suspended(run_id, worker)
    assert phase_tasks(run_id) == {"1-planning"}

    # A revision from the command line resumes the run on a worker: planning runs again with
    # the text in its conversation, and waits for review again.
    out = labrun("review", str(ws), "--revise", REVISION, env=prefect_server.env).stdout
    assert "resumed with the decision (revise)" in out, out
    deadline = time.monotonic() + 240
    while (review := status_json(ws, prefect_server.env)["session"]["awaiting_review"]) is None \
            or review["round"] != 2:
        assert time.monotonic() < deadline, "planning was not asked for review again"
        time.sleep(1)
    wait_suspended(run_id, worker)
    planning = (ws / ".labrun/phases/planning/conversation-001.jsonl").read_text()
    assert REVISION in planning

    # The approval is a click in the UI's Resume form.
    with Browser(1400, 1000) as browser:
        approve_in_the_ui(browser, prefect_server, run_id)
        done = wait_for([run_id], timeout_s=300)[run_id]
    assert done.state.type.value == "COMPLETED", done.state

    after = status_json(ws, prefect_server.env)
    assert after["session"]["complete"] and after["session"]["awaiting_review"] is None
    assert [(r["round"], r["decision"], r["text"], r["reviewer"], r["applied"]) for r in after["reviews"]] == [
        (1, "revise", REVISION, os_user(), True), (2, "approve", COMMENT, "the Prefect UI", True)]
    assert {p["key"]: p["runs"] for p in after["phases"]}["setup"] == 1
    for phase in ("setup", "implementation", "experiments", "analysis", "documentation"):
        prompt = (ws / f".labrun/phases/{phase}/conversation-001.jsonl").read_text()
        assert COMMENT in prompt, f"the approval's comment is not in {phase}'s prompt"
    state_md = (ws / "STATE.md").read_text()
    assert "approve by the Prefect UI" in state_md and COMMENT in state_md
