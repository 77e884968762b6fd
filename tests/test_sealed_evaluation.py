"""Sealed evaluation: a scorer and held-out data that the idea names, outside the workspace,
hidden from every command of the agent, run by the engine on the artifact the experiments
wrote, and refused when changed during the session.

The sealed files lie in a home (a folder under /var/tmp that HOME names), as labrun asks
(under a home or /tmp, which no sandbox of any session shows), not under /tmp: the sandbox's
/tmp is its own, so a file there would be out of sight whatever labrun covered. Each probe is
first shown to work outside the sandbox.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from support import DEMO_IDEA, labrun, wait_for
from test_rule_gaming import call, planned, write

from labrun.idea import IdeaError
from labrun.phases.report_header import stamp_report
from labrun.phases import sealed_scoring
from labrun.phases.sealed_scoring import run_scorer, score_sealed
from labrun.prompts import phase_system_prompt
from labrun.sandbox import Lifeline, bubblewrap, in_network_namespace, in_pid_namespace
from labrun.session import Session
from labrun.status import session_status

pytestmark = pytest.mark.skipif(bubblewrap() is None, reason="a sealed evaluation needs bubblewrap to hide it")

SECRET = "held-out-label-7f3a"
SCORER = """import json, sys
artifact, data, out = sys.argv[1:4]
truth = open(data + '/labels.txt').read().split()
guess = open(artifact).read().split()
print('truth:', *truth)  # its log echoes the held-out data
json.dump({'accuracy': sum(a == b for a, b in zip(truth, guess)) / len(truth)}, open(out, 'w'))
"""
SEALED = """  sealed_evaluation:
    scorer: eval/score.py
    data: eval/heldout
    artifact: results/predictions.txt
    description: "one predicted label per line, in the order of the held-out items"
"""


@pytest.fixture
def sealed_dir(monkeypatch):
    """An idea with a sealed evaluation, beside its scorer and held-out data, in the home."""
    root = Path(tempfile.mkdtemp(prefix="labrun-sealed-", dir="/var/tmp"))
    monkeypatch.setenv("HOME", str(root))
    (root / "eval/heldout").mkdir(parents=True)
    (root / "eval/score.py").write_text(SCORER)
    (root / "eval/heldout/labels.txt").write_text(f"a b a {SECRET}\n")
    text = DEMO_IDEA.read_text()
    (root / "idea.yaml").write_text(text.replace("  constraints:\n", SEALED + "  constraints:\n", 1))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def session_idea(sealed_dir) -> Path:
    """`session` opens the idea with the sealed evaluation."""
    return sealed_dir / "idea.yaml"


def predicted(session, labels: str = "a b b x") -> None:
    """The experiments: an attempt that writes the artifact and its accuracy on its own
    (development) labels, a claim of that accuracy, then verdicts."""
    planned(session)
    write(session, "src/predict.py", f"open('results/predictions.txt', 'w').write({labels!r})\n"
                                     "dev = 'a b b a'.split(); guess = open('results/predictions.txt').read().split()\n"
                                     "accuracy = sum(a == b for a, b in zip(dev, guess)) / len(dev)\n"
                                     "import json; json.dump({'n': 4, 'accuracy': accuracy}, open('results/m0.json', 'w'))\n")
    done = call(session, "experiments", "run_experiment", command="python3 src/predict.py", purpose="predict",
                run_id="R1", metrics_file="results/m0.json")
    assert "SUCCESS" in done.content, done.content
    accuracy = session.state.attempts[-1].metrics["accuracy"]
    finished = call(session, "experiments", "complete_phase", summary="done",
                    sections={"experiment_results": "R1 wrote the predictions"},
                    deviations=[{"id": "R2", "reason": "R1 covers it"}],
                    claims=[{"id": "K1", "statement": "the predictions' accuracy", "metric": "accuracy",
                             "attempts": [session.state.attempts[-1].n], "value": accuracy}],
                    criteria=[{"id": c, "status": "unmet", "note": "scored by the sealed scorer"}
                              for c in ("C1", "C2", "C3")])
    assert not finished.is_error, finished.content


def test_the_agents_commands_cannot_read_the_scorer_or_the_held_out_data(session, sealed_dir):
    scorer, labels = sealed_dir / "eval/score.py", sealed_dir / "eval/heldout/labels.txt"
    probe = f"cat {scorer} {labels}; ls {sealed_dir}/eval/heldout; grep -rl {SECRET} {sealed_dir} .labrun"
    outside = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, cwd=session.ws.root)
    assert SECRET in outside.stdout and "accuracy" in outside.stdout  # the probe works outside the sandbox

    seen = call(session, "setup", "bash", command=probe).content
    assert SECRET not in seen and "accuracy" not in seen, seen
    write(session, "src/peek.py", f"import subprocess; subprocess.run({probe!r}, shell=True)\n")
    call(session, "experiments", "run_experiment", command="python3 src/peek.py", purpose="peek")
    log = (session.ws.root / session.state.attempts[-1].log).read_text()
    assert SECRET not in log and "accuracy" not in log, log

    # the namespace of labrun's a coding CLI runs in (Claude Code's and Codex's network
    # namespace, a PID namespace) covers them too, and keeps the engine's records read-only
    guard = session.confinement.sandbox(network=True)
    for wrap in (lambda argv, fd: in_pid_namespace(argv, fd, guard),
                 lambda argv, fd: in_network_namespace(argv, fd, guard.egress, guard)):
        lifeline = Lifeline()
        proc = lifeline.popen(wrap(["bash", "-c", probe + "; echo forged > .labrun/state.json"], lifeline.fd),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=session.ws.root)
        out = proc.communicate(timeout=60)[0]
        lifeline.cut()
        assert SECRET not in out and "accuracy" not in out and "Read-only file system" in out, out
        assert "forged" not in session.ws.state_file.read_text()

    prompt = phase_system_prompt(session, "experiments")
    assert "results/predictions.txt" in prompt and "one predicted label per line" in prompt
    assert str(sealed_dir) not in prompt and "heldout" not in prompt and SECRET not in prompt


def test_the_engine_scores_the_artifact_and_records_it_beside_the_agents_numbers(session, sealed_dir):
    predicted(session)
    score_sealed(session)
    score = session.state.sealed.score
    assert (score.status, score.scores) == ("SCORED", {"accuracy": 0.5}), score
    assert "**SCORED**, results/predictions.txt: accuracy=0.5" in session.ws.state_md.read_text()
    assert session_status(session.ws.root)["sealed_evaluation"]["score"]["scores"] == {"accuracy": 0.5}
    score_sealed(session)  # the same artifact: not scored again
    assert sum("sealed scoring started" in line or "sealed scoring of" in line
               for line in session.state.worklog) == 1
    write(session, "REPORT.md", "# Report\n\nPredictions written, 75% right on our own labels.\n")
    stamp_report(session)
    report = (session.ws.root / "REPORT.md").read_text()
    assert "\n**Sealed evaluation: SCORED**, by the engine with the idea's scorer and held-out data, which the " \
           "agent never saw: results/predictions.txt: accuracy=0.5" in report
    # the agent's 0.75 on its own labels, beside the sealed 0.5: contradicted, and the sealed score wins
    assert "| K1: the predictions' accuracy | accuracy = 0.75 (#1) | R1 | contradicted by the sealed evaluation | " \
           "0.5 (**contradicts**) |" in report, report


def test_a_criterion_the_idea_binds_to_the_sealed_score_is_decided_by_it_whatever_the_agent_calls_its_metric(
        sealed_dir, tmp_path, prefect_api):
    """The weak target first: without the binding, a claim named `acc` escapes the sealed
    `accuracy` (it is only shown beside); with `criteria: [C1]` the engine judges C1's check
    on the sealed score and shows the claim contradicted."""
    from labrun.phases.report_header import results

    for bound in (False, True):
        idea = sealed_dir / f"idea-{bound}.yaml"
        text = (sealed_dir / "idea.yaml").read_text()
        idea.write_text(text.replace("    artifact: results/predictions.txt\n", "    artifact: results/predictions.txt\n"
                                     "    criteria: [C1]\n") if bound else text)
        s = Session.open(tmp_path / f"ws-{bound}", idea, "scripted")
        try:
            (s.ws.root / "results").mkdir()
            if bound:  # the idea says the sealed score decides C1: planning must give C1 a check
                with pytest.raises(AssertionError, match="criterion_checks: C1 is decided by the sealed evaluation"):
                    planned(s)
            planned(s, checks=[{"id": "C1", "metric": "acc", "comparison": ">=", "threshold": 0.7}])
            write(s, "src/predict.py", "open('results/predictions.txt', 'w').write('a b b x')\n"
                                       "dev = 'a b b a'.split(); guess = 'a b b x'.split()\n"
                                       "import json; json.dump({'acc': sum(a == b for a, b in zip(dev, guess)) / 4},"
                                       " open('results/m0.json', 'w'))\n")
            assert "SUCCESS" in call(s, "experiments", "run_experiment", command="python3 src/predict.py",
                                     purpose="predict", run_id="R1", metrics_file="results/m0.json").content
            done = call(s, "experiments", "complete_phase", summary="done", sections={"experiment_results": "R1 wrote the predictions"},
                        deviations=[{"id": "R2", "reason": "R1 covers it"}],
                        claims=[{"id": "K1", "statement": "dev accuracy", "metric": "acc", "attempts": [1],
                                 "value": 0.75, "criterion": "C1"}],
                        criteria=[{"id": c, "status": "unmet", "note": "not judged"} for c in ("C2", "C3")])
            assert not done.is_error, done.content
            score_sealed(s)
            (claim,), verdicts = results(s)
            if not bound:  # shown beside, but the agent's name decides
                assert claim.sealed is None and claim.scored == "accuracy=0.5" and verdicts[0].verdict == "met"
            else:
                assert claim.contradicted and (verdicts[0].verdict, verdicts[0].by) == ("unmet", "engine, by the sealed score")
        finally:
            s.close()


def test_the_scorers_log_is_kept_where_no_tool_of_the_agents_reaches(session, monkeypatch):
    """The scorer's log echoes the held-out data. Kept in the workspace's `.labrun/` (as it
    once was), the agent's editor, which runs in the engine, reads it; the scorer now runs in
    a private folder under the machine's /tmp, which the editor refuses and the agent's
    sandbox does not show, removed once scored."""
    predicted(session)
    old = session.ws.data / "sealed" / "output.log"
    old.parent.mkdir()
    old.write_text(f"truth: {SECRET}\n")
    assert SECRET in old.read_text()  # the weak target: an engine that reads the name the agent gives
    said = call(session, "analysis", "str_replace_based_edit_tool", command="view", path=".labrun/sealed/output.log")
    assert said.is_error and SECRET not in said.content and "hidden path" in said.content

    places = []

    def watched(sealed, root, place):
        scored = run_scorer(sealed, root, place)
        places.append(place)
        log = place / "output.log"
        assert SECRET in log.read_text()  # the scorer did echo the held-out data
        assert oct(place.stat().st_mode & 0o777) == "0o700"
        said = call(session, "analysis", "str_replace_based_edit_tool", command="view", path=str(log))
        assert said.is_error and "outside the workspace" in said.content, said.content
        seen = call(session, "analysis", "bash", command=f"cat {log}; ls {place}").content
        assert SECRET not in seen and "No such file" in seen, seen
        return scored

    monkeypatch.setattr(sealed_scoring, "run_scorer", watched)
    score_sealed(session)
    assert session.state.sealed.score.status == "SCORED", session.state.sealed.score
    assert not places[0].exists()  # removed once scored
    assert not old.parent.exists()  # an earlier version's log is removed too
    kept = [p for p in session.ws.root.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not kept, kept


def test_an_artifact_linked_to_the_held_out_data_is_refused(session, sealed_dir):
    """The agent's commands cannot read the held-out labels, but they can link the artifact to
    them: read through the link, the scorer compares the labels with themselves."""
    predicted(session)
    artifact = session.ws.root / "results/predictions.txt"
    artifact.unlink()
    call(session, "analysis", "bash", command=f"ln -s {sealed_dir}/eval/heldout/labels.txt {artifact}")
    assert artifact.is_symlink()
    out = session.ws.root / "out.json"  # the weak target: the scorer reading the artifact through the link
    subprocess.run(["python3", str(sealed_dir / "eval/score.py"), str(artifact), str(sealed_dir / "eval/heldout"),
                    str(out)], check=True, capture_output=True)
    assert json.loads(out.read_text()) == {"accuracy": 1.0}

    score_sealed(session)
    score = session.state.sealed.score
    assert (score.status, score.scores) == ("FAILED", {}), score
    assert score.detail == ("the artifact results/predictions.txt is not read: results/predictions.txt is a link; "
                            "labrun follows no link in the workspace")
    assert score.artifact_digest == "missing"  # no digest of the held-out data through the link
    # a folder on its way that is a link is refused as well
    (session.ws.root / "elsewhere").mkdir()
    (session.ws.root / "elsewhere/predictions.txt").write_text("a b a x")
    shutil.rmtree(session.ws.root / "results")
    (session.ws.root / "results").symlink_to(session.ws.root / "elsewhere")
    assert "results is a link" in sealed_scoring.score(session).detail


def test_the_scorer_never_runs_with_a_python_the_agent_wrote(session, sealed_dir):
    """A `.venv/bin/python` in the workspace that forges the score: the scorer once ran with
    it; now with labrun's own Python, or the one the idea names."""
    predicted(session)
    fake = session.ws.root / ".venv/bin/python"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho '{\"accuracy\": 1.0}' > \"$4\"\n")
    fake.chmod(0o755)
    out = session.ws.root / "out.json"  # the weak target: the command as it was made
    subprocess.run([str(fake), str(sealed_dir / "eval/score.py"), "results/predictions.txt",
                    str(sealed_dir / "eval/heldout"), str(out)], check=True, cwd=session.ws.root)
    assert json.loads(out.read_text()) == {"accuracy": 1.0}

    score_sealed(session)
    assert (session.state.sealed.score.status, session.state.sealed.score.scores) == ("SCORED", {"accuracy": 0.5})


def test_the_idea_can_name_the_python_of_its_scorer(sealed_dir, tmp_path, prefect_api):
    named = sealed_dir / "py/bin/python"
    named.parent.mkdir(parents=True)
    named.write_text(f"#!/bin/sh\nNAMED=1 exec {sys.executable} \"$@\"\n")
    named.chmod(0o755)
    (sealed_dir / "eval/score.py").write_text(
        "import json, os, sys\njson.dump({'named': int(os.environ.get('NAMED', 0))}, open(sys.argv[3], 'w'))\n")
    idea = sealed_dir / "named.yaml"
    text = (sealed_dir / "idea.yaml").read_text()
    idea.write_text(text.replace("    scorer:", "    python: py/bin/python\n    scorer:"))
    s = Session.open(tmp_path / "ws", idea, "scripted")
    try:
        (s.ws.root / "results").mkdir()
        assert s.state.sealed.python == str(named)
        predicted(s)
        score_sealed(s)
        assert s.state.sealed.score.scores == {"named": 1}, s.state.sealed.score
    finally:
        s.close()
    inside = tmp_path / "ws2"
    (inside / "bin").mkdir(parents=True)
    (inside / "bin/python").write_text("#!/bin/sh\n")
    (inside / "bin/python").chmod(0o755)
    idea.write_text(idea.read_text().replace("python: py/bin/python", f"python: {inside}/bin/python"))
    with pytest.raises(IdeaError, match=r"sealed_evaluation.python: .* must lie outside the workspace"):
        Session.open(inside, idea, "scripted")


def test_a_scorer_changed_during_the_session_is_refused(session, sealed_dir):
    predicted(session)
    (sealed_dir / "eval/score.py").write_text(SCORER.replace("sum(a == b", "len(truth) + sum(a == b"))
    score_sealed(session)
    score = session.state.sealed.score
    assert score.status == "REFUSED" and not score.scores, score
    assert "score.py changed since the session started; the score is not recorded" in score.detail
    assert "sealed scoring REFUSED" in session.ws.state_md.read_text()


def test_a_missing_artifact_fails_the_scoring_and_says_so(session):
    predicted(session)
    (session.ws.root / "results/predictions.txt").unlink()
    score_sealed(session)
    assert session.state.sealed.score.status == "FAILED"
    assert "results/predictions.txt is not there" in session.state.sealed.score.detail


def test_a_sealed_evaluation_that_cannot_be_kept_sealed_does_not_start(sealed_dir, tmp_path):
    idea = sealed_dir / "idea.yaml"
    inside = tmp_path / "ws"
    (inside / "eval").mkdir(parents=True)
    (inside / "eval/score.py").write_text(SCORER)
    moved = idea.read_text().replace("scorer: eval/score.py", f"scorer: {inside}/eval/score.py")
    (sealed_dir / "inside.yaml").write_text(moved)
    with pytest.raises(IdeaError, match=r"sealed_evaluation.scorer: .* must lie outside the workspace"):
        Session.open(inside, sealed_dir / "inside.yaml", "scripted")
    assert not (inside / ".labrun").exists()  # nothing written
    (sealed_dir / "gone.yaml").write_text(idea.read_text().replace("scorer: eval/score.py", "scorer: eval/nope.py"))
    with pytest.raises(IdeaError, match=r"gone.yaml: sealed_evaluation.scorer: .*nope.py is not there"):
        Session.open(tmp_path / "other", sealed_dir / "gone.yaml", "scripted")
    said = labrun("run", str(sealed_dir / "gone.yaml"), "--workspace", str(tmp_path / "cli"), "--agent", "scripted")
    assert said.returncode == 2 and said.stderr.strip().count("\n") == 0, said.stderr  # one line
    assert "sealed_evaluation.scorer:" in said.stderr and "Traceback" not in said.stderr
    assert not (tmp_path / "cli").exists()
    (sealed_dir / "out.yaml").write_text(idea.read_text().replace("artifact: results/", "artifact: ../"))
    with pytest.raises(IdeaError, match=r"artifact.*must be a path inside the workspace"):
        Session.open(tmp_path / "third", sealed_dir / "out.yaml", "scripted")



def test_a_kill_during_sealed_scoring_leaves_nothing_running_and_the_resume_scores_once(sealed_dir, tmp_path, forker):
    """A whole session of the demo with a sealed scorer of its metrics file, killed as the
    scorer starts: nothing of it lives on; the resume scores once, and REPORT.md says so."""
    (sealed_dir / "eval/score.py").write_text(
        "import json, sys\nm = json.load(open(sys.argv[1]))\n"
        "json.dump({'trials_seen': m['trials']}, open(sys.argv[3], 'w'))\n")
    idea = sealed_dir / "demo.yaml"
    idea.write_text((sealed_dir / "idea.yaml").read_text().replace("results/predictions.txt", "results/metrics.json"))
    ws = tmp_path / "ws"
    killed = forker.run(["run", str(idea), "--workspace", str(ws), "--agent", "scripted"],
                        env={"LABRUN_CRASH_AT": "scoring:1", "HOME": str(sealed_dir)})
    assert killed.returncode == -9, killed.stderr
    wait_for(lambda: not [p for p in psutil.process_iter(["cmdline"]) if "labrun-sealed/score.py" in
                          " ".join(p.info["cmdline"] or [])], timeout=10, what="the scorer to end with the engine")
    resumed = forker.run(["resume", str(ws)], env={"HOME": str(sealed_dir)})
    assert resumed.returncode == 0, resumed.stderr
    status = session_status(ws)
    assert status["session"]["complete"]
    score = status["sealed_evaluation"]["score"]
    assert (score["status"], score["scores"]) == ("SCORED", {"trials_seen": 1000}), score
    assert (ws / "STATE.md").read_text().count("sealed scoring SCORED") == 1
    assert "\n**Sealed evaluation: SCORED**" in (ws / "REPORT.md").read_text()
