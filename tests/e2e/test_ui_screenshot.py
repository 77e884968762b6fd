"""The Prefect UI shows a session: its six phase tasks and its artifacts (STATE.md first).

Takes docs/prefect-ui-session.png (the session's flow run page, Artifacts tab) and
docs/prefect-ui-state-artifact.png (the STATE.md artifact) with headless Chromium.
"""

from __future__ import annotations

import time

import pytest

from labrun.artifacts import artifact_key

from chromium import Browser, find_chromium
from e2e_helpers import REPO, client, status_json, task_runs

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="chromium is not installed (apt-get install chromium, or .ci/install-chromium)",
)
DOCS = REPO / "docs"


def test_ui_shows_the_six_phases_and_state_md(prefect_server, three_sessions):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    name = three_sessions.failing  # the session that failed and was retried from the UI
    run_id = three_sessions.runs[name]
    status = status_json(three_sessions.workspaces[name], prefect_server.env)
    sid = status["session"]["id"]
    keys = [artifact_key(status["idea"]["title"], sid, k) for k in ("state", "attempts", "progress", "usage")]
    phase_tasks = {t.name for t in task_runs(run_id) if t.name[:1].isdigit()}
    assert phase_tasks == {"1-planning", "2-setup", "3-implementation", "4-experiments",
                           "5-analysis", "6-documentation"}
    with client() as c:
        state = c.read_latest_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[keys[0]])))[0]

    with Browser(1400, 1000) as browser:
        browser.goto(f"{prefect_server.ui_url}/runs/flow-run/{run_id}")
        browser.wait_for_text("Job Variables", "Completed")
        browser.click_text("Artifacts", "li.p-tab, [role=tab], button")
        browser.wait_for_text(*keys)
        time.sleep(2)  # the run graph (a canvas) draws its task bars
        browser.screenshot(DOCS / "prefect-ui-session.png")

        browser.goto(f"{prefect_server.ui_url}/artifacts/artifact/{state.latest_id}")
        browser.wait_for_text("Current State", "Phase 6 — documentation: DONE", "Experiment Attempts")
        time.sleep(1)
        browser.screenshot(DOCS / "prefect-ui-state-artifact.png")
    for png in ("prefect-ui-session.png", "prefect-ui-state-artifact.png"):
        assert (DOCS / png).stat().st_size > 20_000
