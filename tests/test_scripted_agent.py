"""The scripted agent, labrun's offline stand-in, is honest: on every idea it completes the
session, its plan serves that idea's own criteria, and outside its own demo idea it judges
none of them met and its report says at the top that no research was done."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import DEMO_IDEA, EXAMPLES, NEURICO_IDEAS, assert_complete, labrun, needs_shared
from labrun.agents.scripted import NOT_EVALUATED
from labrun.idea import load_idea

IDEAS = sorted(EXAMPLES.glob("*.yaml")) + sorted(p for p in NEURICO_IDEAS.glob("*.yaml") if p.name != "schema.yaml")


@needs_shared()
def test_neuricos_ideas_are_among_those_run():
    """Without NeuriCo's ideas the test below runs only labrun's own: this one skips then, so
    that CI (where a skip fails) cannot pass without them."""
    neurico = [p for p in IDEAS if NEURICO_IDEAS in p.parents]
    assert len(neurico) >= 5, f"only {len(neurico)} idea files in {NEURICO_IDEAS}"


@pytest.mark.parametrize("idea", [pytest.param(p, id=p.stem) for p in IDEAS] or [
    pytest.param(None, marks=pytest.mark.skip(reason="no idea files found"))])
def test_every_idea_completes_with_honest_verdicts(idea: Path, tmp_path):
    ws = tmp_path / "ws"
    result = labrun("run", str(idea), "--workspace", str(ws), "--agent", "scripted")
    assert_complete(ws, result)
    status = json.loads(labrun("status", str(ws), "--json").stdout)
    criteria = status["plan"]["criteria"]
    assert [c["id"] for c in criteria] == [f"C{i}" for i in range(1, len(load_idea(idea).evaluation_criteria or []) + 1)]
    (run,) = status["plan"]["runs"]
    assert run["criteria"] == [c["id"] for c in criteria] and run["state"] == "done"  # it serves the idea's own
    report = (ws / "REPORT.md").read_text()
    header, _, body = report.partition("<!-- /labrun:results -->\n\n")  # the engine's, under the title
    assert "- attempt 2 (R1): **REPRODUCED**" in header  # the engine ran again the attempt behind its claims
    assert [a["reproduction"]["status"] if a["reproduction"] else None for a in status["attempts"]] == \
        [None, "REPRODUCED", None]  # #3 is the analysis, behind no claim
    assert "Numbers not in any attempt's record" not in header, header  # its prose states only recorded numbers
    if idea == DEMO_IDEA:  # its own study: judged from what R1 measured, citing the attempt
        assert [c["status"] for c in criteria] == ["met", "met", "met"]
        assert all("attempt #2" in c["note"] for c in criteria)
        assert "No research was done" not in report
        # the engine decides the two criteria the plan gave checks, and shows the third as the agent's judgement
        assert "| **met** | engine, by the check planning gave | max_abs_slope_error at most 0.05: " in header
        assert "| **met** | agent |" in header
        assert header.count("| reproduced |") == 3, header
    else:
        assert all((c["status"], c["note"]) == ("unmet", NOT_EVALUATED) for c in criteria), criteria
        assert "| K1: The fitted log-log slope for Gaussian noise in the stand-in's own simulation" in header
        assert body.startswith("**No research was done.**"), report[:800]
        assert "No research on this idea is planned" in (ws / "planning.md").read_text()


def test_the_stand_in_runs_as_many_seeds_as_the_idea_asks(tmp_path):
    idea = tmp_path / "idea.yaml"
    idea.write_text(DEMO_IDEA.read_text().replace(
        'title: "Averaging noisy measurements: does RMSE fall as 1/sqrt(k)?"', 'title: "Three seeds, please"')
        .replace('- "Results reproducible from the fixed seed"', '- "Results reproducible across 3 runs with '
                 'different random seeds"'))
    ws = tmp_path / "ws"
    assert_complete(ws, labrun("run", str(idea), "--workspace", str(ws), "--agent", "scripted"))
    status = json.loads(labrun("status", str(ws), "--json").stdout)
    assert status["plan"]["runs"][0]["seeds"] == [0, 1, 2]
    assert all((ws / f"results/seed-{s}/metrics.json").is_file() for s in (1, 2))
