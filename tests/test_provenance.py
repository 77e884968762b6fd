"""The provenance of an attempt's numbers: its metrics are evidence only when the attempt
itself ran workspace code that computed and wrote them (`labrun.evidence.unmeasured`, kept
on the attempt); a planned figure holds what such an attempt wrote; a negative outcome
stands on failures that differ in more than a comment or a number.

Each cheat is played through the real tools of a real session (attempts are real Prefect
subtasks running real commands), shown passing the old check where that is cheap (`OLD`,
the regex the engine used before), and refused now; the honest variants pass.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from auto_responder import PLAN
from support import DEMO_IDEA
from labrun.evidence import code_run, precise
from labrun.phase_registry.rules import failure_kind, source_code
from labrun.session import Session
from test_rule_gaming import call

RUNS = [{"id": "R1", "purpose": "the slope, both noises", "conditions": "sigma 0.5, k = 1..64, 300 trials",
         "seeds": [0], "criteria": ["C1", "C2", "C3"]},
        {"id": "R2", "purpose": "the slope again, for uniform noise only", "conditions": "as R1, uniform noise",
         "seeds": [1], "criteria": ["C1"]}]
SPEC = "Does the RMSE of a k-sample mean fall as 1/sqrt(k)? Fit the log-log slope; expect -0.5."
MEASURE = ("import json, math, random, sys\nrng = random.Random(int(sys.argv[1]))\n"
           "SIGMA, TRIALS, THRESHOLD = 0.5, 300, 0.05  # settings: no measurement\n"
           "ks = [1, 4, 16, 64]\nr = [math.sqrt(sum(sum(rng.gauss(0, SIGMA) for _ in range(k)) ** 2 / k ** 2"
           " for _ in range(TRIALS)) / TRIALS) for k in ks]\nxs = [math.log(k) for k in ks]; ys = [math.log(v) for v in r]\n"
           "mx, my = sum(xs) / 4, sum(ys) / 4\n"
           "slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)\n"
           "out = sys.argv[2] if len(sys.argv) > 2 else f'results/m{sys.argv[1]}.json'\n"
           "json.dump({'slope': round(slope, 4), 'rmse_k1': round(r[0], 4), 'sigma': SIGMA, 'trials': TRIALS,\n"
           "           'ok': abs(slope + 0.5) < THRESHOLD}, open(out, 'w'))\n")
FAKE = "print('{\"slope\": -0.4993, \"rmse_k1\": 0.5012}')\n"
"""A script that prints made-up numbers."""
PLOT = ("import json, sys\nm = json.load(open(sys.argv[1]))\n"
        "open(sys.argv[2], 'w').write(f'<svg xmlns=\"http://www.w3.org/2000/svg\"><text>{m[\"slope\"]}</text></svg>')\n")

SOURCE = re.compile(r"[\w./-]*\w\.(?:py|sh|bash|r|R|jl|ipynb|js|ts|lean|m|cpp|cc|c|rs|go|java|scala|pl|rb|lua)\b")


def OLD(command: str, files) -> bool:
    """The check this replaces: the command names a source file of the workspace."""
    files = list(files)
    names = {f.rsplit("/", 1)[-1] for f in files} | set(files)
    named = {m.group(0).lstrip("./") for m in SOURCE.finditer(command)}
    return any(n in names or n.rsplit("/", 1)[-1] in names or any(f.endswith("/" + n) for f in files) for n in named)


def write(session, path: str, text: str) -> None:
    """With the editor, as the agent would."""
    done = call(session, "experiments", "str_replace_based_edit_tool", command="create", path=path, file_text=text)
    assert not done.is_error, done.content


def planned(session, outputs=("results/m0.json",)):
    write(session, "planning.md", "# Plan\n\n" + PLAN)
    done = call(session, "planning", "complete_phase", summary="planned", sections={"research_specification": SPEC},
                run_list=RUNS, analysis_outputs=list(outputs))
    assert not done.is_error, done.content


def attempt(session, command: str, metrics_file: str | None = "results/m0.json", phase="experiments", **more):
    result = call(session, phase, "run_experiment", command=command, purpose="measure the slope",
                  metrics_file=metrics_file, **more)
    return session.state.attempts[-1], result.content


def evidence(session, phase="experiments"):
    return session.work(phase, {}).evidence


def met(session, n: int, run="R1", aside=()):
    """The experiments phase closed with C1 met on attempt #n's slope."""
    return call(session, "experiments", "complete_phase", summary="done", sections={"experiment_results": "R1 measured the slope"},
                deviations=[{"id": "R2", "reason": "R1 covers uniform noise too"}],
                criteria=[{"id": "C1", "status": "met", "note": f"{run}, attempt #{n}: slope"},
                          {"id": "C2", "status": "unmet", "note": "not judged"},
                          {"id": "C3", "status": "unmet", "note": "not judged"}],
                claims=[{"id": "K1", "statement": "the slope", "metric": "slope", "attempts": [n], "criterion": "C1",
                         "value": session.state.attempts[n - 1].metrics.get("slope", 0),
                         "set_aside": [{"attempt": m, "reason": "another way to run it"} for m in aside]}])


def refused(result, *said: str) -> None:
    assert result.is_error, f"the cheat was accepted: {result.content}"
    for part in said:
        assert part in result.content, result.content


# -- which workspace files a command runs ------------------------------------------------------

FILES = dict.fromkeys(["src/run.py", "run.sh", "notes/gen.txt", "pkg/train.py", "src/x.py", "paper/main.tex",
                       "src/pkg/eval/__main__.py", "sim.cpp", "Makefile", "analysis.R", ".venv/"], "d")


@pytest.mark.parametrize("command, ran", [
    ("cd src && python3 run.py", ["src/run.py"]),
    ("timeout 600 .venv/bin/python -m pkg.train --seed 1", ["pkg/train.py"]),
    ("bash run.sh", ["run.sh"]),
    ("./run.sh 2>&1 | tee log.txt", ["run.sh"]),
    ("FOO=1 env PYTHONPATH=src nice -n 5 nohup python -u -m pkg.eval", ["src/pkg/eval/__main__.py"]),
    ("uv run src/run.py", ["src/run.py"]),
    ("poetry run python src/run.py --seed 1", ["src/run.py"]),
    ("conda run -n env python src/run.py", ["src/run.py"]),
    ("srun -n 4 --gres=gpu:1 xvfb-run -a python3.11 src/run.py", ["src/run.py"]),
    ("stdbuf -oL time -v timeout -s KILL 10m python3 src/run.py", ["src/run.py"]),
    ("cd paper && latexmk -pdf main.tex", ["paper/main.tex"]),
    ("bash -c 'cd src && python run.py'", ["src/run.py"]),
    ("g++ -O2 -o sim sim.cpp && ./sim > results/m0.json", ["sim.cpp"]),
    ("make all", ["Makefile"]),
    ("Rscript analysis.R", ["analysis.R"]),
    ("python3 src/run.py  # the main run\npython3 notes/gen.txt", ["src/run.py", "notes/gen.txt"]),
    # naming a file runs nothing
    ("cat src/x.py >/dev/null; python3 notes/gen.txt", ["notes/gen.txt"]),
    ("cat src/run.py; echo src/run.py; ls -l src/x.py", []),
    ("echo 'python3 src/run.py' > results/m0.json", []),
    ("python3 -c 'import json' # src/run.py", []),
    ("run.sh", []),  # looked up on the PATH, not in the workspace
    ("cd src; cd ..; python3 run.py", []),
])
def test_the_code_a_command_runs(command, ran):
    assert code_run(command, FILES) == ran


def test_naming_a_source_no_longer_counts_as_running_it():
    for command in ("cat src/x.py >/dev/null; echo '{\"acc\": 0.99}' > m.json", "ls src/run.py && echo done"):
        assert OLD(command, FILES)  # the weak check took it for running code
        assert code_run(command, FILES) == []


def test_a_setting_is_no_measurement():
    assert [v for v in (0.5, 300, 0.05, 1e-3, 12.0, True, 0.25) if precise(v)] == []
    assert all(precise(v) for v in (0.937, -0.4993, 12.5, 0.001234))


# -- an attempt's metrics ---------------------------------------------------------------------


def test_the_honest_attempts_measure(session, prefect_api):
    planned(session)
    write(session, "src/measure.py", MEASURE)  # constants 0.5, 300 and 0.05, a setting echoed in the metrics
    a, said = attempt(session, "cd src && python3 measure.py 0 ../results/m0.json", run_id="R1")
    assert a.status == "SUCCESS" and a.unmeasured is None and "Not evidence" not in said, said
    assert evidence(session).measured(a)["slope"] == a.metrics["slope"]
    write(session, "run.sh", "#!/bin/sh\nset -e\npython3 src/measure.py \"$1\"\n")
    a, said = attempt(session, "bash run.sh 1", metrics_file="results/m1.json")
    assert a.unmeasured is None, a.unmeasured
    write(session, "pkg/__init__.py", "")
    write(session, "pkg/train.py", MEASURE)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(session.ws.root / ".venv")], check=True)
    a, said = attempt(session, "timeout 600 .venv/bin/python -m pkg.train 2", metrics_file="results/m2.json")
    assert a.status == "SUCCESS" and a.unmeasured is None, said
    done = met(session, session.state.attempts[0].n, aside=(2, 3))  # they measured it too, and name no run
    assert not done.is_error, done.content


def test_a_metrics_file_typed_with_the_editor_is_no_measurement(session, prefect_api):
    planned(session)
    write(session, "src/measure.py", "print('measuring')\n")  # honest-looking code that writes nothing
    write(session, "results/m0.json", '{"slope": -0.4993}')
    a, said = attempt(session, "python3 src/measure.py", run_id="R1")
    assert OLD(a.command, session.records.files(a.n)["before"])
    assert a.status == "SUCCESS"  # it ran: honest exploration is no failure
    assert a.unmeasured == "it did not write results/m0.json: that file holds what it held before the attempt ran"
    assert f"Not evidence: {a.unmeasured}. No result may cite" in said and "the code that computes them" in said
    assert evidence(session).measured(a) == {}
    refused(met(session, a.n), f"claims: K1 cites #{a.n}, whose record holds no measured slope")


def test_a_copied_metrics_file_is_no_measurement(session, prefect_api):
    planned(session)
    write(session, "src/measure.py", MEASURE)
    first, _ = attempt(session, "python3 src/measure.py 0", run_id="R1")
    copy, said = attempt(session, "python3 src/measure.py 0 /tmp/m.json && cp results/m0.json results/m1.json",
                         metrics_file="results/m1.json", run_id="R2")
    assert OLD(copy.command, session.records.files(copy.n)["before"])
    assert copy.unmeasured == "results/m1.json is written by `cp` in the command, not by the code of the workspace"
    assert "Not evidence" in said
    assert evidence(session).measured(copy) == {} and evidence(session).measured(first)
    refused(met(session, copy.n, run="R2"), f"claims: K1 cites #{copy.n}, whose record holds no measured slope")
    # the copy made by code of the workspace, which names the file it copies
    write(session, "src/keep.py", "import shutil\nshutil.copy('results/m0.json', 'results/m2.json')\n")
    kept, _ = attempt(session, "python3 src/keep.py", metrics_file="results/m2.json", run_id="R2", fix_applied="x")
    assert kept.unmeasured == "results/m2.json is a copy of results/m0.json, which was there before it ran"
    # the shell writing it from a value it was given, after the workspace's code ran
    printed, _ = attempt(session, "python3 src/measure.py 0 /tmp/m.json && printf '{\"slope\": -0.%s}' 4993 > "
                         "results/m3.json", metrics_file="results/m3.json", run_id="R2")
    assert printed.unmeasured == "results/m3.json is written by `printf` in the command, not by the code of the workspace"


def test_the_same_result_from_two_seeds_of_a_deterministic_study_is_no_copy(session, prefect_api):
    planned(session)
    write(session, "src/exact.py", "import json, sys\njson.dump({'accuracy': 1.0}, open(sys.argv[1], 'w'))\n")
    attempt(session, "python3 src/exact.py results/s0.json", metrics_file="results/s0.json", run_id="R1")
    again, said = attempt(session, "python3 src/exact.py results/s1.json", metrics_file="results/s1.json", run_id="R2")
    assert again.unmeasured is None and "Not evidence" not in said, said


def test_a_script_that_is_not_the_code_named_is_no_measurement(session, prefect_api):
    planned(session)
    write(session, "src/measure.py", MEASURE)
    write(session, "notes/gen.txt", FAKE)
    a, said = attempt(session, "cat src/measure.py >/dev/null; python3 notes/gen.txt > results/m0.json", run_id="R1")
    assert OLD(a.command, session.records.files(a.n)["before"])
    assert code_run(a.command, session.records.files(a.n)["before"]) == ["notes/gen.txt"]
    assert a.unmeasured is None and a.echoed["slope"] == "notes/gen.txt"
    refused(met(session, a.n), f"claims: K1 cites #{a.n}, whose record holds no measured slope (the value of "
            "slope is written in notes/gen.txt, not computed")


def test_values_written_in_the_code_it_ran_are_no_measurement(session, prefect_api):
    planned(session)
    write(session, "src/measure.py", "import json\nTRIALS = 300\njson.dump({'slope': -0.4993, 'trials': TRIALS},"
                                     " open('results/m0.json', 'w'))\n")
    a, said = attempt(session, "python3 src/measure.py", run_id="R1")
    assert OLD(a.command, session.records.files(a.n)["before"])
    assert a.echoed == {"slope": "src/measure.py"} and "Not measured: slope (its value is written in src/measure.py)" in said
    # the code as the attempt found it: edited afterwards, the record stands
    write(session, "src/measure.py", "print('nothing here')\n")
    assert session.state.attempts[a.n - 1].echoed == a.echoed
    refused(met(session, a.n), f"claims: K1 cites #{a.n}, whose record holds no measured slope")


def test_a_session_of_an_older_labrun_is_judged_when_it_opens(session, prefect_api):
    planned(session)
    write(session, "notes/gen.txt", FAKE)
    a, _ = attempt(session, "python3 notes/gen.txt > results/m0.json", run_id="R1")
    assert a.echoed
    state = json.loads(session.ws.state_file.read_text())
    del state["attempts"][0]["unmeasured"], state["attempts"][0]["echoed"]  # as an older labrun wrote it
    session.ws.state_file.write_text(json.dumps(state))
    session.close()
    again = Session.open(session.ws.root, DEMO_IDEA, "scripted")
    try:
        assert (again.state.attempts[0].unmeasured, again.state.attempts[0].echoed) == (a.unmeasured, a.echoed)
    finally:
        again.close()


# -- planned outputs ---------------------------------------------------------------------------


def test_a_hand_drawn_figure_is_refused_and_the_computed_one_accepted(session, prefect_api):
    planned(session, outputs=("results/fig.svg", "results/summary.md"))
    write(session, "src/measure.py", MEASURE)
    write(session, "src/plot.py", PLOT)
    attempt(session, "python3 src/measure.py 0", run_id="R1")
    write(session, "results/summary.md", "The slope is near -0.5.\n")  # prose: the agent's own
    write(session, "results/fig.svg", '<svg xmlns="http://www.w3.org/2000/svg"><text>-0.5</text></svg>')
    finish = dict(summary="figures drawn", sections={"learnings": "- the slope is near -0.5 as expected"})
    refused(call(session, "analysis", "complete_phase", **finish),
            "results/fig.svg holds what no computing run_experiment attempt wrote",
            "produce it with the run_experiment attempt that computes it")
    a, _ = attempt(session, "cp results/fig.svg /tmp/f.svg && cp /tmp/f.svg results/fig.svg && python3 src/plot.py "
                   "results/m0.json /tmp/g.svg", metrics_file=None, phase="analysis", outputs=["results/fig.svg"])
    refused(call(session, "analysis", "complete_phase", **finish), "results/fig.svg holds what no")  # not rewritten
    attempt(session, "python3 src/plot.py results/m0.json results/fig.svg", metrics_file=None, phase="analysis",
            outputs=["results/fig.svg"])
    done = call(session, "analysis", "complete_phase", **finish)
    assert not done.is_error, done.content


def test_a_figure_drawn_again_as_it_was_is_the_attempts_own_and_a_touched_one_is_not(session, prefect_api):
    """A run cut off by a crash after it drew its figure leaves the figure there; the next run
    draws it again byte for byte, and that counts (it counted only for a metrics file, so an
    honest agent was refused for good). `touch` on a figure drawn by hand does not count."""
    planned(session, outputs=("results/fig.svg",))
    write(session, "src/measure.py", MEASURE)
    write(session, "src/plot.py", PLOT)
    attempt(session, "python3 src/measure.py 0", run_id="R1")
    # What the cut-off run drew: byte for byte what the next run draws.
    subprocess.run([sys.executable, "src/plot.py", "results/m0.json", "results/fig.svg"], cwd=session.ws.root, check=True)
    finish = dict(summary="figure drawn", sections={"learnings": "- the slope is near -0.5 as expected"})
    refused(call(session, "analysis", "complete_phase", **finish), "results/fig.svg holds what no")
    attempt(session, "python3 src/measure.py 0 /tmp/m.json && touch results/fig.svg", metrics_file=None,
            phase="analysis", outputs=["results/fig.svg"])
    refused(call(session, "analysis", "complete_phase", **finish), "results/fig.svg holds what no")  # touched, not drawn
    attempt(session, "python3 src/plot.py results/m0.json results/fig.svg", metrics_file=None, phase="analysis",
            outputs=["results/fig.svg"])
    done = call(session, "analysis", "complete_phase", **finish)
    assert not done.is_error, done.content


def test_a_planned_output_may_still_be_set_aside(session, prefect_api):
    planned(session, outputs=("results/fig.svg",))
    write(session, "results/fig.svg", "<svg/>")
    done = call(session, "analysis", "complete_phase", summary="no figure",
                sections={"learnings": "- nothing to plot, the run was set aside"},
                deviations=[{"id": "results/fig.svg", "reason": "the run it plots was set aside"}])
    assert not done.is_error, done.content


# -- negative outcomes -------------------------------------------------------------------------


def negative(session):
    return call(session, "experiments", "complete_phase", summary="nothing works",
                sections={"experiment_results": "three attempts failed"}, negative_outcome="it cannot be done",
                criteria=[{"id": c, "status": "unmet", "note": "nothing ran"} for c in ("C1", "C2", "C3")])


def test_failures_that_differ_by_a_comment_are_the_same_failure(session, prefect_api):
    planned(session)
    for i in range(3):
        write(session, "src/run.py", f'"""Try {i}."""\n# attempt {i}: tuned\nraise SystemExit("no data")\n')
        a, said = attempt(session, "python3 src/run.py", run_id="R1", fix_applied=f"changed the comment, try {i}" if i else None)
        assert a.status == "FAILED", said
    sources = {session.records.files(a.n)["before"]["src/run.py"] for a in session.state.attempts}
    assert len(sources) == 3  # the old check took these for three changes of the code
    refused(negative(session), "failed attempts that tried different things")


def test_failures_that_differ_only_by_a_number_are_the_same_failure(session, prefect_api):
    planned(session)
    write(session, "src/run.py", "import sys, time\nraise RuntimeError(f'diverged at step {time.time_ns() % 9973} "
                                 "after {time.perf_counter():.3f} s in /tmp/run-{sys.argv[1]}/ckpt at 0x7f{sys.argv[1]}a9')\n")
    for i in range(3):
        a, said = attempt(session, f"python3 src/run.py {i}", run_id="R1", fix_applied=f"another seed, try {i}" if i else None)
        assert a.status == "FAILED" and a.error.startswith("RuntimeError: diverged"), said
    assert len({a.error for a in session.state.attempts}) == 3  # the old check took these for three failures
    refused(negative(session), "failed attempts that tried different things")


def test_real_failures_that_differ_make_a_negative_outcome(session, prefect_api):
    planned(session)
    tries = ["import numpy_that_is_not_there\n", "import json\njson.load(open('results/none.json'))\n",
             "d = {}\nprint(d['slope'])\n"]
    for i, code in enumerate(tries):
        write(session, "src/run.py", code)
        a, said = attempt(session, "python3 src/run.py", run_id="R1", fix_applied=f"rewrote the loader, try {i}" if i else None)
        assert a.status == "FAILED", said
    done = negative(session)
    assert not done.is_error, done.content


def test_the_same_failure_after_a_real_change_of_code_is_an_effort(session, prefect_api):
    planned(session)
    for i, code in enumerate(["raise SystemExit('no data')\n", "x = 1\nraise SystemExit('no data')\n",
                              "for k in range(3):\n    pass\nraise SystemExit('no data')\n"]):
        write(session, "src/run.py", code)
        attempt(session, "python3 src/run.py", run_id="R1", fix_applied=f"changed the loading code, try {i}" if i else None)
    done = negative(session)
    assert not done.is_error, done.content


def test_what_a_failure_and_a_source_are_compared_by():
    assert failure_kind('File "/tmp/x/src/run.py", line 12, in f: ValueError: shape (3, 4) at 0x7f3a after 3.2 s') == \
        failure_kind('File "/tmp/y/src/run.py", line 40, in f: ValueError: shape (5, 4) at 0x1b2c after 9.9 s')
    assert failure_kind("ModuleNotFoundError: No module named 'torch'") != failure_kind("KeyError: 'slope'")
    assert source_code("a.py", '"""Doc."""\nimport os  # why\n\ndef f(x):\n    """D."""\n    return x\n') == \
        source_code("a.py", "# another comment\nimport os\ndef f(x):\n  return x\n")
    assert source_code("a.py", "def f(x):\n    return x\n") != source_code("a.py", "def f(x):\n    return x + 1\n")
    assert source_code("run.sh", "set -e  # strict\n\n# go\npython3 a.py\n") == source_code("run.sh", "set -e\npython3 a.py")
    assert source_code("a.c", "int x; /* a\n b */ // c\n") == source_code("a.c", "int x;")
