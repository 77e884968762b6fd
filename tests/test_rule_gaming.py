"""The rule-gaming suite: each completion rule, attacked by an agent that tries to satisfy it
without doing the work. Every strategy plays its calls through the real tools of a real
session (attempts are real Prefect subtasks running real commands) and must be refused,
the refusal naming what is missing; the honest play of the same phases completes.

The strategies are those issue 22 lists, and more found while writing the rules. What no
rule here can catch (a script of the agent's that prints made-up numbers and is run as an
attempt) is for the engine's own reproduction of the attempts, not for these rules.
"""

from __future__ import annotations

import pytest

from auto_responder import PLAN
from support import DEMO_IDEA
from labrun.phase_registry import BY_KEY
from labrun.phases.phase import toolbox
from labrun.phases.report_header import stamp_report
from labrun.session import Session

RUNS = [{"id": "R1", "purpose": "the slope, both noises", "conditions": "sigma 0.5, k = 1..64, 400 trials",
         "seeds": [0], "criteria": ["C1", "C2", "C3"]},
        {"id": "R2", "purpose": "the slope again, for uniform noise only", "conditions": "as R1, uniform noise",
         "seeds": [1], "criteria": ["C1"]}]
SPEC = "Does the RMSE of a k-sample mean fall as 1/sqrt(k)? Fit the log-log slope; expect -0.5."
MEASURE = ("import json, math, random, sys\nrng = random.Random(int(sys.argv[1]))\n"
           "ks = [1, 4, 16, 64]\nr = [math.sqrt(sum(sum(rng.gauss(0, 0.5) for _ in range(k)) ** 2 / k ** 2"
           " for _ in range(400)) / 400) for k in ks]\nxs = [math.log(k) for k in ks]; ys = [math.log(v) for v in r]\n"
           "mx, my = sum(xs) / 4, sum(ys) / 4\n"
           "slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)\n"
           "json.dump({'slope': round(slope, 4), 'rmse_k1': round(r[0], 4)}, open(f'results/m{sys.argv[1]}.json', 'w'))\n")


def call(session, phase: str, tool: str, **inp):
    return toolbox(session, BY_KEY[phase]).call(tool, inp)


def write(session, path: str, text: str) -> None:
    (session.ws.root / path).parent.mkdir(parents=True, exist_ok=True)
    (session.ws.root / path).write_text(text)


def planned(session, runs=RUNS, checks=None):
    write(session, "planning.md", "# Plan\n\n" + PLAN)
    done = call(session, "planning", "complete_phase", summary="planned", sections={"research_specification": SPEC},
                run_list=runs, analysis_outputs=["results/m0.json"], **({"criterion_checks": checks} if checks else {}))
    assert not done.is_error, done.content


def measured(session, run="R1", seed=0, fix=None):
    write(session, "src/measure.py", MEASURE)
    result = call(session, "experiments", "run_experiment", command=f"python3 src/measure.py {seed}",
                  purpose="measure the slope", run_id=run, metrics_file=f"results/m{seed}.json", fix_applied=fix)
    assert "SUCCESS" in result.content, result.content
    return session.state.attempts[-1]


def verdicts(n: int, met=("C1", "C2", "C3"), note="R1, attempt #{n}: slope"):
    return [{"id": c, "status": "met" if c in met else "unmet", "note": note.format(n=n)} for c in ("C1", "C2", "C3")]


def claims(attempt, criteria=("C1",), metric="slope") -> list[dict]:
    """One honest claim per criterion: the metric as the attempt recorded it."""
    return [{"id": f"K{i}", "statement": f"the slope, for {c}", "metric": metric, "attempts": [attempt.n],
             "value": attempt.metrics[metric], "criterion": c} for i, c in enumerate(criteria, 1)]


def refused(result, *said: str) -> None:
    assert result.is_error, f"the cheat was accepted: {result.content}"
    for part in said:
        assert part in result.content, result.content


# -- resources --------------------------------------------------------------------------------


def test_nothing_could_be_fetched_is_refused_until_a_fetch_was_tried(tmp_path, prefect_api):
    s = Session.open(tmp_path / "ws", DEMO_IDEA, "scripted", with_phases=("resources",))
    try:
        write(s, "literature_review.md", "# Review\n\nNothing found.\n")
        write(s, "resources.md", "# Resources\n\nNone.\n")
        claim = {"literature": "No source could be fetched: the network gave nothing at all today."}
        refused(call(s, "resources", "complete_phase", summary="nothing", sections=claim),
                "`No source could be fetched:` stands only after fetches that failed")
        tried = call(s, "resources", "run_experiment", command="curl -fsS -m 5 https://unreachable.invalid/paper.pdf",
                     purpose="fetch the idea's reference")
        assert "FAILED" in tried.content
        done = call(s, "resources", "complete_phase", summary="nothing", sections=claim)
        assert not done.is_error, done.content
    finally:
        s.close()


# -- planning -----------------------------------------------------------------------------


def test_a_plan_of_dots_is_refused(session):
    write(session, "planning.md", "")
    result = call(session, "planning", "complete_phase", summary=".", sections={"research_specification": "."},
                  run_list=[{**RUNS[0], "seeds": []}], analysis_outputs=["results/m0.json"],
                  criteria=[{"id": c, "status": "unmet", "note": "."} for c in ("C2", "C3")])
    refused(result, "planning.md: the sections Motivation and related work;", "section research_specification with "
            "what it must say (0 words given)")


def test_headings_without_content_are_refused(session):
    write(session, "planning.md", "".join(f"## {h}\n\n" for h in BY_KEY["planning"].outline))
    result = call(session, "planning", "complete_phase", summary="planned", sections={"research_specification": SPEC},
                  run_list=RUNS, analysis_outputs=["results/m0.json"])
    refused(result, "each a heading with its content under it")


def test_fewer_seeds_than_the_idea_asks_are_refused(tmp_path):
    idea = tmp_path / "idea.yaml"
    idea.write_text(DEMO_IDEA.read_text().replace('- "Results reproducible from the fixed seed"',
                                                  '- "Results reproducible across 3 runs with different random seeds"'))
    s = Session.open(tmp_path / "ws", idea, "scripted")
    try:
        write(s, "planning.md", "# Plan\n\n" + PLAN)
        result = call(s, "planning", "complete_phase", summary="planned", sections={"research_specification": SPEC},
                      run_list=RUNS, analysis_outputs=["results/m0.json"])
        refused(result, "run_list: the idea asks for 3 seeds and no run names that many (the most is 1)")
        ok = call(s, "planning", "complete_phase", summary="planned", sections={"research_specification": SPEC},
                  run_list=[{**RUNS[0], "seeds": [0, 1, 2]}], analysis_outputs=["results/m0.json"])
        assert not ok.is_error, ok.content
    finally:
        s.close()


# -- setup and implementation ----------------------------------------------------------------


def test_a_setup_and_a_design_of_dots_are_refused(session):
    refused(call(session, "setup", "complete_phase", summary=".", sections={"files_and_resources": ".",
                                                                         "workflow": "."}),
            "section files_and_resources with what it must say", "section workflow")
    refused(call(session, "implementation", "complete_phase", summary=".", sections={"experiment_design": "."}),
            "section experiment_design with what it must say")


def test_an_environment_left_unpinned_is_refused(session):
    sections = {"files_and_resources": "- `src/`: the code, `results/`: outputs, no data to fetch",
                "workflow": "Run src/measure.py with each seed through run_experiment."}
    refused(call(session, "setup", "complete_phase", summary="ready", sections=sections),
            "a pinned environment file: requirements.txt with each package at its exact version")
    for loose, said in (("numpy\npandas>=2.0\nscipy==1.13.1\n", "requirements.txt: numpy, pandas>=2.0 without an "
                                                                   "exact version"),
                        ("", "requirements.txt names no package and no comment says why")):
        write(session, "requirements.txt", loose)
        refused(call(session, "setup", "complete_phase", summary="ready", sections=sections), said)
    write(session, "requirements.txt", "numpy==1.26.4\nscipy==1.13.1 --hash=sha256:abc\n# pinned by pip freeze\n")
    done = call(session, "setup", "complete_phase", summary="ready", sections=sections)
    assert not done.is_error, done.content


# -- experiments ------------------------------------------------------------------------------


def test_no_attempt_and_every_run_set_aside_is_refused(session, prefect_api):
    planned(session)
    result = call(session, "experiments", "complete_phase", summary=".", sections={"experiment_results": "none ran here"},
                  deviations=[{"id": r["id"], "reason": "."} for r in RUNS],
                  criteria=[{"id": c, "status": "unmet", "note": "."} for c in ("C1", "C2", "C3")])
    refused(result, "run R1, the primary run (the first of the run list), cannot be set aside")


def test_the_primary_run_cannot_be_dropped_for_an_easier_one(session, prefect_api):
    planned(session)
    n = measured(session, run="R2", seed=1).n
    result = call(session, "experiments", "complete_phase", summary="R2 done",
                  sections={"experiment_results": "R2 measured the slope"},
                  deviations=[{"id": "R1", "reason": "no time"}],
                  criteria=[{"id": "C1", "status": "met", "note": f"R2, attempt #{n}: slope"},
                            {"id": "C2", "status": "unmet", "note": "R1 set aside"},
                            {"id": "C3", "status": "unmet", "note": "R1 set aside"}])
    refused(result, "run R1, the primary run")


def test_a_hard_coded_metric_serves_no_criterion(session, prefect_api):
    planned(session)
    echo = call(session, "experiments", "run_experiment", command="echo '{\"acc\": 0.99}' > results/m0.json",
                purpose="measure", run_id="R1", metrics_file="results/m0.json")
    assert "SUCCESS" in echo.content  # the attempt itself succeeds: the command did what it says
    n = session.state.attempts[-1].n
    result = call(session, "experiments", "complete_phase", summary="all met",
                  sections={"experiment_results": "acc 0.99 everywhere"}, deviations=[{"id": "R2", "reason": "covered by R1"}],
                  criteria=verdicts(n, note="R1, attempt #{n}: acc 0.99"),
                  claims=[{"id": "K1", "statement": "acc", "metric": "acc", "attempts": [n], "value": 0.99, "criterion": "C1"}])
    refused(result, f"claims: K1 cites #{n}, whose record holds no measured acc (its metrics are not evidence")


def test_met_without_a_claim_on_it_is_refused(session, prefect_api):
    planned(session)
    attempt = measured(session)
    finish = dict(summary="done", sections={"experiment_results": "R1 measured the slope"},
                  deviations=[{"id": "R2", "reason": "R1 covers uniform noise too"}])
    refused(call(session, "experiments", "complete_phase", **finish, criteria=verdicts(attempt.n, note="all good")),
            "claims: the key results", "criteria: C1 is met only with a claim that bears on it")
    refused(call(session, "experiments", "complete_phase", **finish, criteria=verdicts(attempt.n),
                 claims=claims(attempt, ("C1",))), "criteria: C2 is met only with a claim", "C3")
    # the honest verdicts, each with a claim that bears on it, are accepted
    ok = call(session, "experiments", "complete_phase", **finish, criteria=verdicts(attempt.n),
              claims=claims(attempt, ("C1", "C2", "C3")))
    assert not ok.is_error, ok.content


def test_a_failed_attempt_or_another_runs_attempt_backs_no_criterion(session, prefect_api):
    planned(session)
    write(session, "src/broken.py", "raise SystemExit('no data')\n")
    failed = call(session, "experiments", "run_experiment", command="python3 src/broken.py", purpose="measure",
                  run_id="R1")
    assert "FAILED" in failed.content
    other = measured(session, run="R2", seed=1, fix="wrote the measurement script").n
    result = call(session, "experiments", "complete_phase", summary="done", sections={"experiment_results": "R2 only"},
                  deviations=[{"id": "R1", "reason": "broken"}],
                  criteria=[{"id": "C2", "status": "met", "note": f"R1, attempt #1: slope; R2, attempt #{other}: slope"},
                            {"id": "C1", "status": "unmet", "note": "not judged"},
                            {"id": "C3", "status": "unmet", "note": "not judged"}])
    refused(result, "criteria: C2 is met only when a run that serves it (R1) has a SUCCESS attempt")


def test_three_identical_failures_are_no_negative_outcome(session, prefect_api):
    planned(session)
    for i in range(3):  # the same failure three times, the command changed only to pass the retry rule
        call(session, "experiments", "run_experiment", command=f"exit 1 # {i}", purpose="measure", run_id="R1",
             fix_applied="." if i else None)
    result = call(session, "experiments", "complete_phase", summary="nothing works",
                  sections={"experiment_results": "three attempts failed"}, negative_outcome="it cannot be done",
                  criteria=[{"id": c, "status": "unmet", "note": "nothing ran"} for c in ("C1", "C2", "C3")])
    refused(result, "what was changed before attempts #2, #3", "failed attempts that tried different things")


# -- documentation and the paper ---------------------------------------------------------------


@pytest.fixture
def experimented(session, prefect_api):
    planned(session)
    attempt = measured(session)
    done = call(session, "experiments", "complete_phase", summary="done",
                sections={"experiment_results": "R1 measured the slope"},
                deviations=[{"id": "R2", "reason": "R1 covers it"}],
                criteria=verdicts(attempt.n, met=("C1",), note="R1, attempt #{n}: slope"), claims=claims(attempt))
    assert not done.is_error, done.content
    write(session, "README.md", "# Readme\n\nRun `python3 src/measure.py 0`.\n")
    return session.state.attempts[-1]


def report(attempt, slope: str) -> str:
    return (f"# Report\n\nRun R1 (attempt #{attempt.n}) measured a slope of {slope}; R2 was set aside.\n\n"
            "- C1: met\n- C2: unmet\n- C3: unmet\n")


def test_an_empty_report_is_refused(session, experimented):
    write(session, "REPORT.md", "")
    refused(call(session, "documentation", "complete_phase", summary="."), "run R1 of the run list named in REPORT.md",
            "criterion C1 in REPORT.md with its recorded verdict, met")


def test_a_report_that_turns_a_verdict_is_refused(session, experimented):
    slope = str(experimented.metrics["slope"])
    write(session, "REPORT.md", report(experimented, slope).replace("C2: unmet", "C2: met"))
    refused(call(session, "documentation", "complete_phase", summary="done"),
            "criterion C2 in REPORT.md with its recorded verdict, unmet")


def hand_typed(session, attempt):
    write(session, "results/extra.json", '{"accuracy": 0.937}\n')  # with the editor, not by an attempt


def edited_afterwards(session, attempt):
    path = session.ws.root / "results/m0.json"
    path.write_text(path.read_text().replace("}", ', "accuracy": 0.937}'))


def laundered(session, attempt):
    write(session, "notes.md", "Accuracy: 0.937.\n")
    copy = call(session, "documentation", "run_experiment", command="cp notes.md results/notes.md",
                purpose="keep the notes with the results", outputs=["results/notes.md"])
    assert "SUCCESS" in copy.content


@pytest.mark.parametrize("how", [None, hand_typed, edited_afterwards, laundered])
def test_a_number_no_record_holds_is_listed_by_the_engine_not_refused(session, experimented, how):
    """Prose is the agent's: an invented number is not refused (an honest one written in some
    other way would be refused with it) but listed in the engine's section, however the agent
    put it in a file first."""
    if how:
        how(session, experimented)
    write(session, "REPORT.md", report(experimented, str(experimented.metrics["slope"])) + "\nAccuracy: 0.937.\n")
    done = call(session, "documentation", "complete_phase", summary="done")
    assert not done.is_error, done.content
    stamp_report(session)
    text = session.ws.root.joinpath("REPORT.md").read_text()
    engine = text.partition("<!-- /labrun:results -->")[0]
    assert "**Numbers not in any attempt's record** (the agent's own, not vouched for): REPORT.md:" in engine
    assert ": 0.937." in engine and str(experimented.metrics["slope"]) not in engine.partition("Numbers not")[2]


def test_the_honest_report_completes(session, experimented):
    slope = experimented.metrics["slope"]
    write(session, "REPORT.md", report(experimented, str(slope)) + f"\nRounded, the slope is {slope:.2f}; the idea "
                                "expects -0.5 within 0.05, with sigma 0.5.\n")
    done = call(session, "documentation", "complete_phase", summary="done")
    assert not done.is_error, done.content
