"""The session's artifacts for the Prefect UI (labrun.artifacts), without a server: what
they hold, that secrets stay out, that following the state costs the engine next to
nothing, and that a server that does not answer never stops a session."""

from __future__ import annotations

import base64
import threading
import time
from pathlib import Path

import pytest

from labrun import artifacts
from labrun.state import StateStore, load_state
from labrun.tools import RunExperimentInput

DEMO_IDEA = Path(__file__).resolve().parents[1] / "examples" / "demo_noise_averaging.yaml"


def test_views_hold_state_md_attempts_progress_and_usage(session, monkeypatch):
    monkeypatch.setenv("LAB_SERVICE_TOKEN", "tok-123456789-secret")
    session.records.new("experiments", RunExperimentInput(
        command="python3 run.py --token tok-123456789-secret", purpose="p"), {})
    session.records.update(1, status="FAILED", error="exit code 1", exit_code=1)
    session.store.set_phase("planning", "DONE", "phase 1 planning finished")
    views = artifacts.SessionArtifacts(session).views()

    assert views["state"] == (session.ws.root / "STATE.md").read_text()
    assert views["progress"] == pytest.approx(100 / 6, abs=0.1)
    table = views["attempts"]
    assert list(table) == list(artifacts.ATTEMPT_COLUMNS)
    assert table["status"] == ["FAILED"] and table["exit code"] == [1]
    assert "tok-123456789-secret" not in repr(views)
    assert "[REDACTED]" in table["command"][0]
    usage = views["usage"]
    assert usage["phase"] == ["planning", "setup", "implementation", "experiments", "analysis",
                              "documentation", "session"]
    assert usage["status"][0] == "DONE"


def test_keys_are_fixed_per_session_and_name_its_idea(session):
    key = artifacts.artifact_key(session.state.title, session.state.session_id, "state")
    assert key.startswith("labrun-averaging-noisy-measurements-") and key.endswith(f"-{session.state.session_id}-state")
    assert key.replace("-", "").isalnum() and key == key.lower()


def test_following_the_state_is_cheap_and_throttled(session, monkeypatch):
    calls = {"create": 0, "update": 0}
    engine = threading.current_thread()
    updated_from: list[threading.Thread] = []

    def count(kind):
        def record(self):
            calls[kind] += 1
            if kind == "update":
                updated_from.append(threading.current_thread())
        return record

    monkeypatch.setattr(artifacts.SessionArtifacts, "_create", count("create"))
    monkeypatch.setattr(artifacts.SessionArtifacts, "_update", count("update"))
    publisher = artifacts.SessionArtifacts.attach(session, interval_s=0.3)
    time.sleep(0.7)
    assert calls["update"] == 0, calls  # nothing saved: nothing sent
    started = time.monotonic()
    for _ in range(20):  # saves spread over ~0.6 s (longer on a busy machine)
        session.store.log("something happened")
        time.sleep(0.03)
    time.sleep(0.4)
    publisher.close()
    intervals = (time.monotonic() - started) / 0.3
    assert calls["create"] == 1
    assert 1 <= calls["update"] <= intervals + 2, calls  # ~1 per interval, plus the final one
    # The background thread sends; the engine only the final state, when the run ends.
    assert updated_from.count(engine) <= 1, updated_from


def test_saves_of_another_store_are_followed(session, monkeypatch):
    """A phase task records through a store of its own, in whatever process it runs."""
    sent = []
    monkeypatch.setattr(artifacts.SessionArtifacts, "_update", lambda self: sent.append(self.views()["state"]))
    publisher = artifacts.SessionArtifacts.attach(session, interval_s=0.1)
    other = StateStore(session.ws, load_state(session.ws)[0])
    other.log("recorded by another store")
    deadline = time.monotonic() + 10
    while not any("recorded by another store" in text for text in sent) and time.monotonic() < deadline:
        time.sleep(0.05)
    publisher.close()
    other.close()
    assert any("recorded by another store" in text for text in sent), sent


def test_a_server_that_does_not_answer_never_stops_the_session(session, monkeypatch, caplog):
    def down(self):
        raise ConnectionError("the Prefect API at http://127.0.0.1:9/api does not answer")

    monkeypatch.setattr(artifacts.SessionArtifacts, "_create", down)
    publisher = artifacts.SessionArtifacts.attach(session)
    session.store.log("the session goes on")
    publisher.close()
    assert "stopped updating" in caplog.text
    assert "the session goes on" in (session.ws.root / "STATE.md").read_text()


def test_a_retried_run_shows_each_artifact_once_with_the_report_and_the_figures(tmp_path, prefect_api, monkeypatch):
    """A flow run that fails at experiments and is retried (Prefect runs the same flow run
    again, as the UI's Retry does): each of the session's artifacts is on the run once, the
    version its first try made, brought up to date."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    from labrun.flows.session import research_session
    from labrun.status import session_status

    monkeypatch.setenv("LABRUN_SCRIPTED_FAULTS", "raise@experiments:3")
    ws = tmp_path / "ws"
    state = research_session.with_options(retries=1, retry_delay_seconds=0)(
        str(DEMO_IDEA), str(ws), "scripted", return_state=True)
    assert state.is_completed(), state
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
        made = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id])))
    assert run.run_count == 2, "the run was not retried"
    status = session_status(ws)
    kinds = ("state", "attempts", "progress", "usage", "verdict", "report", "figures")
    keys = sorted(artifacts.artifact_key(status["idea"]["title"], status["session"]["id"], k) for k in kinds)
    made = [a for a in made if a.key]  # Prefect's own (a task's result) have none
    assert sorted(a.key for a in made) == keys
    by_kind = {a.key.rsplit("-", 1)[1]: a.data for a in made}
    assert by_kind["state"] == (ws / "STATE.md").read_text() and "Phase 6 — documentation: DONE" in by_kind["state"]
    report = (ws / "REPORT.md").read_text()
    assert by_kind["report"] == report and "<!-- labrun:results -->" in report
    svg = base64.b64encode((ws / "results/rmse_vs_k.svg").read_bytes()).decode()
    assert f"![results/rmse_vs_k.svg](data:image/svg+xml;base64,{svg})" in by_kind["figures"]


def test_report_images_by_path_are_named_and_figures_past_the_limit_are_listed(session):
    root = session.ws.root
    (root / "REPORT.md").write_text("# R\n\n![the plot](results/plot.png)\n\n![remote](https://example.org/a.png)\n")
    assert artifacts.report_markdown(root) == (
        "# R\n\n*(figure `results/plot.png`: in the session's figures artifact)*\n\n![remote](https://example.org/a.png)\n")
    (root / "results/big.png").write_bytes(b"\x89PNG" + b"0" * artifacts.FIGURE_BYTES)
    (root / "results/small.png").write_bytes(b"\x89PNG")
    (root / "results/link.png").symlink_to("/etc/hostname")
    shown = artifacts.figures_markdown(root, ["results/big.png", "results/small.png", "results/link.png", "results/gone.png"])
    assert "- `results/big.png`: not shown: results/big.png holds more than 1,048,576 bytes" in shown
    assert "![results/small.png](data:image/png;base64,iVBORw==)" in shown
    assert "- `results/link.png`: not shown: results/link.png is a link" in shown
    assert "- `results/gone.png`: no longer in the workspace" in shown
