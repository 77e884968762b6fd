"""The phase registry: a phase is one declaration and its templates; the flow, the tools and
STATE.md take it from there."""

from __future__ import annotations

import json

import pytest

from support import DEMO_IDEA, labrun
from labrun import phase_registry as registry
from labrun.journal import Conversation
from labrun.phase_registry import BY_KEY, DEFAULT, Phase, phase_list, register
from labrun.state import parse_state_md, phase_table
from labrun.status import session_status

def test_a_phase_declared_outside_the_flow_runs_in_its_place(tmp_path, prefect_api, throwaway):
    from labrun.flows.session import research_session

    ws = tmp_path / "ws"
    state = research_session(str(DEMO_IDEA), str(ws), "scripted", with_phases=["second_look"],
                             return_state=True)
    assert state.is_completed(), state.message
    keys = ["planning", "setup", "implementation", "experiments", "analysis", "second_look",
            "documentation"]
    report = session_status(ws)
    assert [(p["key"], p["number"], p["status"], p["runs"]) for p in report["phases"]] == [
        (k, n, "DONE", 1) for n, k in enumerate(keys, 1)]
    text = (ws / "STATE.md").read_text()
    assert "Phase 6 of 7 — second_look: DONE" in text
    assert phase_table(text) == {k: "DONE" for k in keys}
    assert parse_state_md(text)["Doubts"] == "- Only one seed was run."
    assert (ws / "notes/second-look.md").is_file()
    convo = Conversation.latest(ws / ".labrun/phases/second_look")
    system = convo.system.text
    assert system.splitlines()[0] == "# Phase 6 of 7: second_look"
    assert "`notes/second-look.md` exists and the section `doubts` is given" in system
    # The other phases count to 7 too, and documentation comes last.
    first_lines = {k: Conversation.latest(ws / f".labrun/phases/{k}").system.text.splitlines()[0]
                   for k in keys}
    assert first_lines["documentation"] == "# Phase 7 of 7: documentation"
    # A fresh flow run (a resume, a UI retry) walks the same seven phases from the cache.
    again = research_session(None, str(ws), return_state=True)
    assert again.is_completed()
    assert [p["runs"] for p in session_status(ws)["phases"]] == [1] * 7


def test_a_session_keeps_the_phases_it_started_with(tmp_path, prefect_api, throwaway):
    from labrun.session import Session, SessionMismatch

    ws = tmp_path / "ws"
    Session.open(ws, DEMO_IDEA, "scripted").close()  # the default six
    with pytest.raises(SessionMismatch, match="phases were fixed when it started"):
        Session.open(ws, DEMO_IDEA, with_phases=["second_look"])
    stored = json.loads((ws / ".labrun/state.json").read_text())
    assert list(stored["phases"]) == list(DEFAULT)


def test_phase_list_keeps_pipeline_order_and_names_unknown_phases():
    assert phase_list() == DEFAULT
    with pytest.raises(ValueError, match=r"unknown phase 'reviews'; the phases are: planning, setup"):
        phase_list(["reviews"])


def test_unknown_phase_on_the_command_line_is_one_line(tmp_path):
    result = labrun("run", str(DEMO_IDEA), "--workspace", str(tmp_path / "ws"), "--agent", "scripted",
                    "--with", "reviews")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"labrun: --with: unknown phase 'reviews'; the phases are: {', '.join(BY_KEY)}"]
    assert not (tmp_path / "ws").exists()


def test_register_refuses_a_second_phase_of_the_same_key():
    with pytest.raises(ValueError, match="registered already"):
        register(Phase("planning", "Other", "x", ()))
    assert registry.BY_KEY["planning"].title == "Planning"
