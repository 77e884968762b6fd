"""The model is not the phase: a finished phase stays finished when its templates are
reworded (it shows as finished with an older prompt) and runs again only when what the phase
asks changes (its declared version or its completion rule)."""

from __future__ import annotations

import dataclasses

from support import DEMO_IDEA
from labrun.phase_registry import BY_KEY
from labrun.phase_registry import phase_version
from labrun.status import session_status


def test_a_reworded_template_leaves_its_phase_finished_and_says_so(tmp_path, prefect_api, throwaway, capsys):  # noqa: F811
    from labrun.cli import main
    from labrun.flows.session import research_session

    ws = tmp_path / "ws"
    assert research_session(str(DEMO_IDEA), str(ws), "scripted", with_phases=["second_look"],
                            return_state=True).is_completed()
    template = throwaway.templates / "phases" / "second_look.md.j2"
    template.write_text(template.read_text().replace("fresh reader", "fresh, sceptical reader"))

    assert research_session(None, str(ws), return_state=True).is_completed()
    report = session_status(ws)
    assert [p["runs"] for p in report["phases"]] == [1] * 7  # nothing redone silently
    assert [p["key"] for p in report["phases"] if p["older_prompt"]] == ["second_look"]
    capsys.readouterr()
    assert main(["status", str(ws)]) == 0
    notes = [l for l in capsys.readouterr().out.splitlines() if "older prompt" in l]
    assert notes == [notes[0]] and notes[0].startswith("phase second_look: finished with an older prompt")

    # What the phase asks changed: it runs again, and so do the phases after it.
    BY_KEY["second_look"] = dataclasses.replace(throwaway, version=2)
    assert research_session(None, str(ws), return_state=True).is_completed()
    runs = {p["key"]: (p["runs"], p["older_prompt"]) for p in session_status(ws)["phases"]}
    assert runs["second_look"] == (2, False) and runs["documentation"] == (2, False)
    assert runs["analysis"] == (1, False)


def test_the_cache_version_is_what_the_phase_asks(monkeypatch):
    phase, before = BY_KEY["analysis"], phase_version("analysis")
    monkeypatch.setitem(BY_KEY, "analysis", dataclasses.replace(phase, max_turns=99, title="Analysis!"))
    assert phase_version("analysis") == before  # not what it asks
    monkeypatch.setitem(BY_KEY, "analysis", dataclasses.replace(phase, version=2))
    assert phase_version("analysis") != before
    monkeypatch.setitem(BY_KEY, "analysis", dataclasses.replace(phase, done_when=BY_KEY["experiments"].done_when))
    assert phase_version("analysis") != before  # another completion rule
