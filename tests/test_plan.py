"""The plan binds: the run list planning records is what the later phases' completion rules
hold the agent to. Real sessions, real tools, real attempts (Prefect subtasks)."""

from __future__ import annotations

import json


from auto_responder import PLAN
from support import DEMO_IDEA, labrun
from labrun.phase_registry import BY_KEY
from labrun.phases.phase import toolbox
from labrun.session import Session
from labrun.state import parse_state_md
from labrun.status import session_status

THREE_RUNS = [
    {"id": "R1", "purpose": "method against theory", "conditions": "gaussian noise", "seeds": [0, 1],
     "criteria": ["C1", "C2"]},
    {"id": "R2", "purpose": "the same with uniform noise", "conditions": "uniform noise", "seeds": [0, 1],
     "criteria": ["C1"]},
    {"id": "R3", "purpose": "a rerun from the same seed", "conditions": "as R1", "seeds": [0],
     "criteria": ["C3"]},
]
OK_SCRIPT = ("import json, os, sys\nos.makedirs('out', exist_ok=True)\n"
             "json.dump({'score': sum(range(10)) / 7}, open(f'out/{sys.argv[1]}.json', 'w'))\n")
SPEC = "Does averaging cut the RMSE as 1/sqrt(k)? Fit the log-log slope."


def call(session, phase: str, tool: str, **inp):
    return toolbox(session, BY_KEY[phase]).call(tool, inp)


def plan(session, runs=THREE_RUNS, outputs=("results/summary.json", "figures/slopes.png"), **more):
    (session.ws.root / "planning.md").write_text("# plan\n\n" + PLAN)
    return call(session, "planning", "complete_phase", summary="planned",
                sections={"research_specification": SPEC}, run_list=list(runs),
                analysis_outputs=list(outputs), **more)


def attempt(session, run_id: str | None, ok: bool = True, fix: str | None = None):
    script = session.ws.root / "run.py"
    script.write_text(OK_SCRIPT if ok else f"raise SystemExit('cannot reach the service ({run_id}, {fix})')\n")
    return call(session, "experiments", "run_experiment", command=f"python3 run.py {run_id}",
                purpose=f"run {run_id}", run_id=run_id, fix_applied=fix,
                metrics_file=f"out/{run_id}.json" if ok else None)


def test_planning_needs_a_run_list_that_serves_every_criterion(session):
    (session.ws.root / "planning.md").write_text("# plan\n")
    bare = call(session, "planning", "complete_phase", summary="x", sections={"research_specification": "Q?"})
    assert bare.is_error and "a run_list" in bare.content and "analysis_outputs" in bare.content

    unknown = plan(session, runs=[dict(THREE_RUNS[0], criteria=["C1", "C9"])])
    assert unknown.is_error and "run R1 serves C9, which is not one of the idea's evaluation criteria (C1, C2, C3)" in unknown.content
    twice = plan(session, runs=[THREE_RUNS[0], THREE_RUNS[0]])
    assert twice.is_error and "the id R1 is given twice" in twice.content
    unserved = plan(session, runs=THREE_RUNS[:2])
    assert unserved.is_error and "criterion C3" in unserved.content and "Results reproducible" in unserved.content
    early = plan(session, runs=THREE_RUNS[:2], criteria=[{"id": "C3", "status": "met", "note": "surely"}])
    assert early.is_error and "C3 cannot be met before anything has run" in early.content
    outside = plan(session, outputs=["../summary.json"])
    assert outside.is_error and "must be a path inside the workspace" in outside.content
    assert not session.state.plan.runs  # nothing refused was kept

    ok = plan(session, runs=THREE_RUNS[:2], criteria=[{"id": "C3", "status": "unmet", "note": "no time for a rerun"}])
    assert not ok.is_error, ok.content
    kept = session.state.plan
    assert kept.run_ids() == ["R1", "R2"] and kept.outputs == ["results/summary.json", "figures/slopes.png"]
    assert [(c.id, c.status, c.phase) for c in kept.criteria] == [
        ("C1", None, None), ("C2", None, None), ("C3", "unmet", "planning")]
    spec = parse_state_md((session.ws.root / "STATE.md").read_text())["Research Specification"]
    assert spec.startswith(SPEC + "\n\n## Run List")
    assert "| R2 | the same with uniform noise | uniform noise | 0, 1 | C1 | not done yet |" in spec
    assert "- C3: Results reproducible from the fixed seed — **unmet** (planning): no time for a rerun" in spec


def test_a_phase_takes_only_the_parts_its_rule_reads(session):
    result = call(session, "setup", "complete_phase", summary="x", run_list=THREE_RUNS,
                  sections={"files_and_resources": "f", "workflow": "w"})
    assert result.is_error
    assert "The setup phase does not take run_list (it takes: none of them)" in result.content
    assert "files_and_resources" not in session.state.sections


def test_an_attempt_names_a_planned_run_or_none(session, prefect_api):
    plan(session)
    refused = attempt(session, "R7")
    assert refused.is_error and "run_id R7 is not in the run list (R1, R2, R3)" in refused.content
    assert session.state.attempts == []  # a refused call is not an attempt
    done = attempt(session, "R1")
    assert "Attempt 1: SUCCESS" in done.content and "Run: R1" in done.content
    check = call(session, "experiments", "run_experiment", command="true", purpose="smoke test")
    assert "Attempt 2: SUCCESS" in check.content
    assert [(a.n, a.run_id) for a in session.state.attempts] == [(1, "R1"), (2, None)]
    text = (session.ws.root / "STATE.md").read_text()
    assert "### Attempt 1\n- Status: SUCCESS\n- Phase: experiments\n- Command: `python3 run.py R1`\n" \
           "- Purpose: run R1\n- Run: R1\n" in text
    assert "| R1 | method against theory | gaussian noise | 0, 1 | C1, C2 | done: attempt #1 |" in text


def test_experiments_complete_only_when_every_planned_run_is_accounted_for(session, prefect_api):
    plan(session)
    attempt(session, "R1")
    finish = dict(summary="done", sections={"experiment_results": "the table of scores"}, criteria=[
        {"id": "C1", "status": "met", "note": "R1 (#1): score 6.43"}, {"id": "C2", "status": "met", "note": "#1, score"},
        {"id": "C3", "status": "unmet", "note": "R3 was cut"}],
        claims=[{"id": f"K{c}", "statement": "the score", "metric": "score", "attempts": [1], "value": 6.43,
                 "criterion": c} for c in ("C1", "C2")])

    one = call(session, "experiments", "complete_phase", **finish)
    assert one.is_error
    assert 'run R2 ("the same with uniform noise"): a SUCCESS attempt with run_id R2, or a deviation' in one.content
    assert "run R3" in one.content and "run R1" not in one.content

    attempt(session, "R2", ok=False)
    failed = call(session, "experiments", "complete_phase", **finish,
                  deviations=[{"id": "R3", "reason": "cut for time"}])
    assert failed.is_error and "run R2" in failed.content and "run R3" not in failed.content
    stray = call(session, "experiments", "complete_phase", **finish, deviations=[{"id": "R9", "reason": "x"}])
    assert stray.is_error and "deviations: R9 is not a run of the run list (R1, R2, R3)" in stray.content

    attempt(session, "R2", fix="the service call now retries")
    unjudged = call(session, "experiments", "complete_phase", **{**finish, "criteria": finish["criteria"][:2]},
                    deviations=[{"id": "R3", "reason": "cut for time"}])
    assert unjudged.is_error and "a verdict on criterion C3" in unjudged.content
    claimed = call(session, "experiments", "complete_phase",
                   **{**finish, "criteria": [*finish["criteria"][:2], {"id": "C3", "status": "met", "note": "?"}]},
                   deviations=[{"id": "R3", "reason": "cut for time"}])
    assert claimed.is_error and "C3 is met only when a run that serves it (R3) has a SUCCESS attempt" in claimed.content

    ok = call(session, "experiments", "complete_phase", **finish, deviations=[{"id": "R3", "reason": "cut for time"}])
    assert not ok.is_error, ok.content
    report = session_status(session.ws.root)["plan"]
    assert [(r["id"], r["state"], r["succeeded"], r["attempts"], r["deviation"]) for r in report["runs"]] == [
        ("R1", "done", [1], [1], None), ("R2", "done", [3], [2, 3], None), ("R3", "deviated", [], [], "cut for time")]
    assert report["coverage"] == {"runs": 3, "done": 2, "deviated": 1, "open": 0}
    assert [(c["id"], c["status"], c["runs"]) for c in report["criteria"]] == [
        ("C1", "met", ["R1", "R2"]), ("C2", "met", ["R1"]), ("C3", "unmet", ["R3"])]


def test_a_negative_outcome_needs_an_honest_effort_then_the_write_up_says_what_failed(session, prefect_api):
    plan(session)
    negative = dict(summary="nothing ran", sections={"experiment_results": "every attempt failed"},
                    negative_outcome="the service refused every call: no key for it here",
                    criteria=[{"id": c, "status": "unmet", "note": "no run succeeded"} for c in ("C1", "C2", "C3")])
    attempt(session, "R1", ok=False)
    early = call(session, "experiments", "complete_phase", **negative)
    assert early.is_error and "at least 3 failed attempts in this phase" in early.content and "(1 so far)" in early.content
    attempt(session, "R1", ok=False, fix="retry with backoff")
    attempt(session, "R1", ok=False, fix="try another endpoint")
    ok = call(session, "experiments", "complete_phase", **negative)
    assert not ok.is_error, ok.content
    assert session.state.plan.negative_outcome == "the service refused every call: no key for it here"
    results = parse_state_md((session.ws.root / "STATE.md").read_text())["Experiment Results"]
    assert "## Negative Outcome" in results and "no key for it here" in results

    # The statistics phase: the planned outputs exist, or a deviation says why.
    (session.ws.root / "results/summary.json").write_text("{}")
    learnings = {"learnings": "what failed and why"}
    by_hand = call(session, "analysis", "complete_phase", summary="x", sections=learnings)
    assert by_hand.is_error and "results/summary.json holds what no computing run_experiment attempt wrote" in by_hand.content
    (session.ws.root / "src").mkdir(exist_ok=True)
    (session.ws.root / "src/summarize.py").write_text("import json\njson.dump({'failed': 3}, open('results/summary.json', 'w'))\n")
    assert "SUCCESS" in call(session, "analysis", "run_experiment", command="python3 src/summarize.py",
                             purpose="summarise the failures", outputs=["results/summary.json"],
                             fix_applied="no service call: only the failures, summarised").content
    missing = call(session, "analysis", "complete_phase", summary="x", sections=learnings)
    assert missing.is_error and "file figures/slopes.png (planned in analysis_outputs)" in missing.content
    assert "results/summary.json" not in missing.content
    wrong = call(session, "analysis", "complete_phase", summary="x", sections=learnings,
                 deviations=[{"id": "R1", "reason": "x"}])
    assert wrong.is_error and "deviations: R1 is not one of the planned analysis_outputs" in wrong.content
    done = call(session, "analysis", "complete_phase", summary="x", sections=learnings,
                deviations=[{"id": "./figures/slopes.png", "reason": "no run produced slopes"}])
    assert not done.is_error, done.content

    # The write-up: REPORT.md must say what failed.
    (session.ws.root / "README.md").write_text("# readme\n")
    (session.ws.root / "REPORT.md").write_text("# Report\n\nIt did not work.\n")
    vague = call(session, "documentation", "complete_phase", summary="x")
    assert vague.is_error and 'a section of REPORT.md headed "What failed and why"' in vague.content
    (session.ws.root / "REPORT.md").write_text("# Report\n\n## What failed and why\n\nNo key, so R1, R2 and R3 "
                                               "never ran.\n\n- C1: unmet\n- C2: unmet\n- C3: unmet\n")
    assert not call(session, "documentation", "complete_phase", summary="x").is_error


def test_without_a_run_list_one_successful_attempt_still_completes_experiments(session, prefect_api):
    """A session planned before run lists existed (its plan has no runs)."""
    attempt(session, None)
    criteria = [{"id": c, "status": "unmet", "note": "not planned"} for c in ("C1", "C2", "C3")]
    ok = call(session, "experiments", "complete_phase", summary="x", sections={"experiment_results": "one run, no plan"},
              criteria=criteria, claims=[{"id": "K1", "statement": "s", "metric": "score", "attempts": [1], "value": 6.4286}])
    assert not ok.is_error, ok.content


def test_setup_names_every_code_reference(tmp_path):
    idea = tmp_path / "idea.yaml"
    idea.write_text(DEMO_IDEA.read_text().replace("  methodology:", """    code_references:
      - repo: "https://github.com/example/averaging.git"
        description: "A reference implementation"
      - repo: "https://github.com/example/plots"
        description: "Plotting helpers"
  methodology:""", 1))
    s = Session.open(tmp_path / "ws", idea, "scripted")
    (s.ws.root / "requirements.txt").write_text("matplotlib==3.9.2\n")
    try:
        first = call(s, "setup", "complete_phase", summary="x", sections={
            "files_and_resources": "- code/averaging: example/averaging at 1a2b3c", "workflow": "run src/run.py, then plot"})
        assert first.is_error
        assert "the idea's code reference https://github.com/example/plots in section files_and_resources" in first.content
        assert "averaging.git" not in first.content
        ok = call(s, "setup", "complete_phase", summary="x", sections={
            "files_and_resources": "- code/averaging: example/averaging at 1a2b3c\n"
                                   "- github.com/example/plots: not cloned (the network is off)", "workflow": "run src/run.py, then plot"})
        assert not ok.is_error, ok.content
    finally:
        s.close()


def test_status_json_shows_the_plan_and_each_attempts_run(session, prefect_api):
    plan(session)
    attempt(session, "R1")
    session.close()
    result = labrun("status", str(session.ws.root), "--json")
    report = json.loads(result.stdout)
    assert report["attempts"][0]["run_id"] == "R1"
    assert report["plan"]["coverage"] == {"runs": 3, "done": 1, "deviated": 0, "open": 2}
    assert report["plan"]["outputs"] == [
        {"path": "results/summary.json", "exists": False, "deviation": None},
        {"path": "figures/slopes.png", "exists": False, "deviation": None}]
    text = labrun("status", str(session.ws.root))
    assert "run list: 1 of 3 done, 0 set aside, 2 open" in text.stdout
    assert "C3 Results reproducible from the fixed seed — not judged" in text.stdout


def test_a_rerun_forgets_what_the_replaced_phases_gave():
    from labrun.plan import Plan

    plan = Plan.for_criteria(["a", "b"]).merged(
        {"run_list": THREE_RUNS, "analysis_outputs": ["s.json"], "criteria": [{"id": "C2", "status": "unmet", "note": "n"}]},
        "planning").merged(
        {"criteria": [{"id": "C1", "status": "met", "note": "R1"}], "deviations": [{"id": "R3", "reason": "cut"}],
         "negative_outcome": "x"}, "experiments")
    again = plan.forget(["experiments", "analysis"])
    assert again.run_ids() == ["R1", "R2", "R3"] and again.outputs == ["s.json"]
    assert [(c.id, c.status) for c in again.criteria] == [("C1", None), ("C2", "unmet")]
    assert again.deviations == [] and again.negative_outcome is None
    fresh = plan.forget(["planning", "experiments"])
    assert fresh.runs == [] and fresh.outputs == [] and [c.status for c in fresh.criteria] == [None, None]
    assert [c.text for c in fresh.criteria] == ["a", "b"]
