"""REPORT.md's engine section shows what a claim's prose could leave out: every try of a cited
run, the successes beside a negative outcome, the paper's inputs from elsewhere in the
workspace, and an edit of the paper's results file. Sessions play through the real tools."""

from __future__ import annotations

from test_rule_gaming import MEASURE, call, claims, planned, refused, write

from labrun import paper
from labrun.phases.report_header import section, stamp_report, write_paper_results
from labrun.session import Session
from support import DEMO_IDEA


def run(session, command: str, run_id: str | None, expect: str = "SUCCESS", phase: str = "experiments", **more):
    result = call(session, phase, "run_experiment", command=command, purpose="measure", run_id=run_id, **more)
    assert f": {expect}" in result.content, result.content
    return session.state.attempts[-1]


def test_every_try_of_a_cited_run_is_shown_beside_its_claims(session, prefect_api):
    """The weak target: a claim cites the one lucky seed; the failed tries of its run and a
    later attempt of it in another phase are in no claim. The section names them all."""
    planned(session)
    write(session, "src/measure.py", MEASURE)
    write(session, "src/lucky.py", "raise SystemExit('the slope missed: no metrics written')\n")
    failed = run(session, "python3 src/lucky.py", "R1", expect="FAILED")
    good = run(session, "python3 src/measure.py 0", "R1", metrics_file="results/m0.json", fix_applied="another script")
    done = call(session, "experiments", "complete_phase", summary="done", sections={"experiment_results": "R1 ran twice"},
                deviations=[{"id": "R2", "reason": "R1 covers it"}], claims=claims(good),
                criteria=[{"id": c, "status": "unmet", "note": "not judged"} for c in ("C2", "C3")] +
                [{"id": "C1", "status": "met", "note": f"#{good.n}"}])
    assert not done.is_error, done.content
    later = run(session, "python3 src/measure.py 1", "R1", phase="analysis", metrics_file="results/m1.json")
    text = section(session)
    assert f"- Run R1 also has attempts no claim cites: #{failed.n} FAILED (exit code 1)" in text
    assert f"#{later.n} SUCCESS" in text


def test_a_negative_outcome_beside_the_primary_runs_success_is_refused_and_another_runs_is_claimed(
        session, prefect_api):
    planned(session)
    write(session, "src/measure.py", MEASURE)
    for i, fix in enumerate((None, "read the data from a file", "generate the data instead")):
        write(session, "src/broken.py", f"raise SystemExit('cannot reach the data ({i})')\n" if i < 2 else "import nothere\n")
        run(session, "python3 src/broken.py", "R1", expect="FAILED", fix_applied=fix)
    other = run(session, "python3 src/measure.py 1", "R2", metrics_file="results/m1.json", fix_applied="R2's own script")
    negative = dict(summary="R1 cannot run", sections={"experiment_results": "three attempts of R1 failed"},
                    negative_outcome="R1's data cannot be reached here",
                    criteria=[{"id": c, "status": "unmet", "note": "R1 never ran"} for c in ("C1", "C2", "C3")])
    refused(call(session, "experiments", "complete_phase", **negative),
            f"claims: run R2 succeeded (#{other.n}) beside the negative outcome: hand its result over as a claim")
    done = call(session, "experiments", "complete_phase", **negative, claims=claims(other, criteria=(None,)))
    assert not done.is_error, done.content
    assert f"- Negative outcome: R1's data cannot be reached here; successful attempts of the experiments all the " \
           f"same: #{other.n} (R2)" in section(session)
    # once the primary run succeeds, its result is a result: no negative outcome
    first = run(session, "python3 src/measure.py 0", "R1", metrics_file="results/m0.json", fix_applied="found the data")
    refused(call(session, "experiments", "complete_phase", **negative, claims=claims(other, criteria=(None,))),
            f"negative_outcome: run R1, the primary run, succeeded (#{first.n})")


def test_the_papers_inputs_and_an_edit_of_its_results_file_are_shown(tmp_path, prefect_api):
    s = Session.open(tmp_path / "ws", DEMO_IDEA, "scripted", with_phases=("paper",))
    try:
        assert not write_paper_results(s)  # the engine's own: nothing to say
        write(s, paper.MAIN, "\\documentclass{article}\\input{labrun_results}\\begin{document}"
                             "\\input{../results/numbers}\\input{/etc/hostname}\\input{../../outside}\\end{document}\n")
        write(s, "results/numbers.tex", "The accuracy was 0.8156.\n")  # outside paper/: still the paper's text
        write(s, paper.RESULTS, "\\newcommand{\\labrunvalue}[1]{0.99}\n")  # the agent's edit of the engine's file
        write(s, "REPORT.md", "# Report\n")
        stamp_report(s)
        text = (s.ws.root / "REPORT.md").read_text()
        assert "results/numbers.tex:1: 0.8156" in text
        assert f"{paper.RESULTS}, edited since the engine wrote it" in text
        assert "0.99" not in (s.ws.root / paper.RESULTS).read_text()  # the engine's again
    finally:
        s.close()
