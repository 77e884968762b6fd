"""How a session came out, said the same everywhere (`labrun.verdicts`): `labrun status`, a
run's closing lines, the flow run's state message and the Prefect UI's verdict artifact, for a
real scripted demo session; and the verdict follows the records when they say otherwise."""

from __future__ import annotations

import json
import re
import shutil
from uuid import UUID

import pytest

from support import labrun, status

from labrun.artifacts import artifact_key

LINE = "3 of 3 criteria met; results reproduced"


@pytest.fixture(scope="module")
def demo(tmp_path_factory, prefect_api):
    """`labrun demo`, run once as a user runs it: its workspace and what it printed."""
    ws = tmp_path_factory.mktemp("verdict") / "ws"
    done = labrun("demo", str(ws), env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    return ws, done


def test_a_finished_session_says_its_verdict_in_status_its_closing_lines_its_flow_run_and_the_ui(demo):
    ws, done = demo
    assert f"Verdict: {LINE}" in done.stdout, done.stdout  # the run's closing lines
    shown = labrun("status", str(ws), env={"COLUMNS": "80"})
    assert f"verdict: {LINE}" in shown.stdout, shown.stdout
    assert "C1 Fitted slope within -0.5 ± 0.05 for both noise distributions — met (engine, by the check " \
           "planning gave): max_abs_slope_error at most 0.05: 0.0027 (K1)" in shown.stdout
    verdict = status(ws)["verdict"]
    assert (verdict["met"], verdict["unmet"], verdict["unconfirmed"], verdict["reproduced"]) == (3, 0, 0, True)
    assert [c["standing"] for c in verdict["claims"]] == ["reproduced"] * 3
    # REPORT.md's engine section is rendered from the same records: the same verdict per criterion
    report = (ws / "REPORT.md").read_text()
    for v in verdict["verdicts"]:
        assert re.search(rf"\| {v['id']}: .* \| \*\*{v['verdict']}\*\* \| {re.escape(v['by'])} \|", report), v

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    state = json.loads((ws / ".labrun/state.json").read_text())
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(UUID(state["last_run"]["id"]))
        key = artifact_key(state["title"], state["session_id"], "verdict")
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    assert run.state.is_completed() and run.state.message == f"session complete; {LINE}", run.state
    assert len(artifacts) == 1, [a.key for a in artifacts]
    assert f"**Verdict:** {LINE}" in artifacts[0].data
    assert "| C2: RMSE within 10% of sigma / sqrt(k) for every k | **met** |" in artifacts[0].data
    assert "| K1: Both fitted slopes lie this close to -0.5 at most | max_abs_slope_error = 0.0027 | reproduced |" \
        in artifacts[0].data


def test_the_verdict_is_the_records_not_the_agents_word(demo, tmp_path):
    """A stricter planned check, then a rerun that diverged: the counts follow, and the
    agent's own "met" on C3 turns unconfirmed."""
    ws = tmp_path / "ws"
    shutil.copytree(demo[0], ws, symlinks=True)
    state_file = ws / ".labrun/state.json"
    state = json.loads(state_file.read_text())
    state["plan"]["checks"][1]["threshold"] = 0.01  # C2: a gap of 0.0308 no longer passes
    state_file.write_text(json.dumps(state))
    assert status(ws)["verdict"]["line"] == "2 of 3 criteria met, 1 unmet; results reproduced"

    rerun = state["attempts"][1]["reproduction"]
    rerun.update(status="DIVERGED", detail="max_abs_slope_error 0.0027 then 0.0031; slope_gaussian -0.5016 then -0.51")
    rerun["metrics"].update(max_abs_slope_error=0.0031, slope_gaussian=-0.51)  # K1's and K3's numbers
    state_file.write_text(json.dumps(state))
    verdict = status(ws)["verdict"]
    assert verdict["line"] == "0 of 3 criteria met, 1 unmet, 2 unconfirmed; results not reproduced: 1 of 1 " \
                              "reruns diverged"
    assert verdict["reproduced"] is False
    assert {v["id"]: v["verdict"] for v in verdict["verdicts"]} == {"C1": "unconfirmed", "C2": "unmet",
                                                                   "C3": "unconfirmed"}
    shown = labrun("status", str(ws))
    assert f"verdict: {verdict['line']}" in shown.stdout


def test_the_attempts_table_fits_80_columns_one_line_per_attempt(demo):
    ws, _ = demo
    shown = labrun("status", str(ws), env={"COLUMNS": "80"}).stdout.splitlines()
    head = next(i for i, line in enumerate(shown) if "error / fix" in line)
    rows = shown[head + 2:head + 5]
    assert [r.split("│")[1].strip() for r in rows] == ["1", "2", "3"], "\n".join(shown)
    assert all(len(line) <= 80 for line in shown if "│" in line or "┃" in line), "\n".join(shown)
    assert "…" in rows[0]  # the long command and error are cut, not wrapped
