"""The Prefect UI shows a session: its six phase tasks and its artifacts (STATE.md first), each
once on a retried run's Artifacts tab, REPORT.md with the engine's results section among them,
and the figures the session wrote, drawn.

Takes docs/prefect-ui-session.png (the session's flow run page, Artifacts tab),
docs/prefect-ui-state-artifact.png (the STATE.md artifact) and docs/prefect-ui-figures.png
(the figures artifact) with headless Chromium.
"""

from __future__ import annotations

import time

import pytest

from labrun.artifacts import artifact_key
from labrun.serving import submit

from chromium import Browser, find_chromium
from e2e_helpers import REPO, client, read_run, status_json, task_runs, wait_for

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="chromium is not installed (apt-get install chromium, or .ci/install-chromium)",
)
DOCS = REPO / "docs"
KINDS = ("state", "attempts", "progress", "usage", "verdict", "report", "figures")


def test_ui_shows_the_phases_and_each_artifact_once_after_a_retry(prefect_server, three_sessions):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    name = three_sessions.failing  # the session that failed, retried as the UI retries
    run_id = three_sessions.runs[name]
    if read_run(run_id).run_count < 2:  # test_server_mode's test retries it; alone, this one does
        assert submit.retry_like_the_ui(run_id, ui="v1").status.value == "ACCEPT"
        wait_for([run_id], timeout_s=180)
    assert read_run(run_id).state.type.value == "COMPLETED"
    status = status_json(three_sessions.workspaces[name], prefect_server.env)
    sid = status["session"]["id"]
    keys = {kind: artifact_key(status["idea"]["title"], sid, kind) for kind in KINDS}
    phase_tasks = {t.name for t in task_runs(run_id) if t.name[:1].isdigit()}
    assert phase_tasks == {"1-planning", "2-setup", "3-implementation", "4-experiments",
                           "5-analysis", "6-documentation"}
    with client() as c:
        latest = {a.key: a for a in c.read_latest_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=list(keys.values()))))}

    with Browser(1400, 1000) as browser:
        browser.goto(f"{prefect_server.ui_url}/runs/flow-run/{run_id}")
        browser.wait_for_text("Job Variables", "Completed")
        browser.click_text("Artifacts", "li.p-tab, [role=tab], button")
        browser.wait_for_text(*keys.values())
        time.sleep(2)  # the run graph (a canvas) draws its task bars; every card is in
        shown = browser.text()
        assert {k: shown.count(key) for k, key in keys.items()} == dict.fromkeys(KINDS, 1), shown
        browser.screenshot(DOCS / "prefect-ui-session.png")

        browser.goto(f"{prefect_server.ui_url}/artifacts/artifact/{latest[keys['state']].latest_id}")
        browser.wait_for_text("Current State", "Phase 6 — documentation: DONE", "Experiment Attempts")
        time.sleep(1)
        browser.screenshot(DOCS / "prefect-ui-state-artifact.png")

        browser.goto(f"{prefect_server.ui_url}/artifacts/artifact/{latest[keys['report']].latest_id}")
        browser.wait_for_text("Report: ", "Results as the engine recorded them", "REPRODUCED", "criterion")

        browser.goto(f"{prefect_server.ui_url}/artifacts/artifact/{latest[keys['figures']].latest_id}")
        browser.wait_for_text("results/rmse_vs_k.svg")
        drawn = "[...document.images].filter(i => i.src.startsWith('data:image/svg+xml') && i.naturalWidth > 100).length"
        deadline = time.monotonic() + 15
        while browser.js(drawn) != 1:
            assert time.monotonic() < deadline, "the figure is not drawn"
            time.sleep(0.5)
        browser.screenshot(DOCS / "prefect-ui-figures.png")
    for png in ("prefect-ui-session.png", "prefect-ui-state-artifact.png", "prefect-ui-figures.png"):
        assert (DOCS / png).stat().st_size > 20_000
