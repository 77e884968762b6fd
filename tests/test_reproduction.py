"""Reproduction by the engine: the attempts behind met criteria are run again, from the files
as each attempt found them, in a sandbox of their own, and their metrics compared.

Each test plays the experiments phase through the real tools of a real session (attempts and
reruns are Prefect subtasks running real commands), then lets the engine do what it does
once that phase is complete (`phases.reproduction.reproduce`).
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from labrun.sandbox import bubblewrap

from support import DEMO_IDEA
from test_rule_gaming import MEASURE, call, planned, write

from labrun.artifacts import attempts_table
from labrun.phases.reproduction import reproduce
from labrun.phases.report_header import stamp_report
from labrun.session import Session
from labrun.status import session_status

UNSEEDED = MEASURE.replace("random.Random(int(sys.argv[1]))", "random.Random()")


def open_session(tmp_path, constraints: str = ""):
    tmp_path.mkdir(exist_ok=True)
    idea = tmp_path / "idea.yaml"
    text = DEMO_IDEA.read_text()
    if constraints:
        text = text.replace("  constraints:\n", "  constraints:\n" + constraints, 1)
        assert constraints in text
    idea.write_text(text)
    s = Session.open(tmp_path / "ws", idea, "scripted")
    (s.ws.root / "results").mkdir()
    return s


def attempt(session, script: str, run: str, seed: int, name: str = "measure.py"):
    write(session, f"src/{name}", script)
    result = call(session, "experiments", "run_experiment", command=f"python3 src/{name} {seed}",
                  purpose="measure the slope", run_id=run, metrics_file=f"results/m{seed}.json",
                  fix_applied="another script")
    assert "SUCCESS" in result.content, result.content
    return session.state.attempts[-1].n


def judged(session, backing: dict[str, int]) -> None:
    """Experiments complete, each criterion met with a claim on the attempt `backing` names
    (its run's other attempts set aside)."""
    aside = [{"id": "R2", "reason": "R1 covers uniform noise too"}] \
        if all(a.run_id != "R2" for a in session.state.attempts) else []
    attempts = session.state.attempts
    claims = [{"id": f"K{c}", "statement": "the slope", "metric": "slope", "attempts": [n], "criterion": c,
               "value": attempts[n - 1].metrics["slope"],
               "set_aside": [{"attempt": a.n, "reason": "another check"} for a in attempts
                             if a.run_id == attempts[n - 1].run_id and a.n != n and a.status == "SUCCESS"]}
              for c, n in backing.items()]
    done = call(session, "experiments", "complete_phase", summary="done", deviations=aside,
                sections={"experiment_results": "R1 and R2 measured the slope"}, claims=claims,
                criteria=[{"id": c, "status": "met", "note": f"attempt #{n}: slope"} for c, n in backing.items()])
    assert not done.is_error, done.content


def test_an_unseeded_draw_diverges_and_a_seeded_one_reproduces(session):
    planned(session)
    seeded = attempt(session, MEASURE, "R1", 0)
    unseeded = attempt(session, UNSEEDED, "R2", 1, "draw.py")
    judged(session, {"C1": unseeded, "C2": seeded, "C3": seeded})
    reproduce(session)

    again = {a.n: a.reproduction for a in session.state.attempts}
    assert again[seeded].status == "REPRODUCED", again[seeded]
    assert again[unseeded].status == "DIVERGED", again[unseeded]
    assert " then " in again[unseeded].detail
    # the rerun's own metrics, not the attempt's file read again
    assert again[unseeded].metrics != session.state.attempts[unseeded - 1].metrics
    state_md = session.ws.state_md.read_text()
    assert f"- Reproduction: **DIVERGED**, {again[unseeded].detail}" in state_md
    assert "- Reproduction: **REPRODUCED**, 1 metric the same, within a relative 0.001" in state_md  # the claimed one
    report = session_status(session.ws.root)
    assert {a["n"]: a["reproduction"]["status"] for a in report["attempts"]} == \
        {seeded: "REPRODUCED", unseeded: "DIVERGED"}
    reruns = attempts_table(report)["engine's rerun"]  # the UI's attempts artifact
    assert reruns[seeded - 1].startswith("REPRODUCED: ") and reruns[unseeded - 1].startswith("DIVERGED: ")

    write(session, "REPORT.md", "# Report\n\nThe slope came out near -0.5.\n")
    stamp_report(session)
    stamp_report(session)  # a second stamp replaces the first
    report = (session.ws.root / "REPORT.md").read_text()
    assert report.startswith("# Report\n\n<!-- labrun:results -->\n## Results as the engine recorded them\n"), report
    assert "**Reproduction by the engine: 1 REPRODUCED, 1 DIVERGED.**" in report
    assert report.count("labrun:results -->") == 2
    assert f"- attempt {unseeded} (R2): **DIVERGED**" in report
    # the claim on the diverged attempt, and the verdict that rests on it, are unconfirmed; the others stand
    assert f"| KC1: the slope | slope = {session.state.attempts[unseeded - 1].metrics['slope']} (#{unseeded}) | R2 " \
           "| unconfirmed: the rerun diverged |" in report, report
    assert "| C1: " in report and "| **unconfirmed** | agent |" in report and report.count("| **met** | agent |") == 2
    assert report.endswith("The slope came out near -0.5.\n")


def test_the_rerun_starts_from_the_files_as_the_attempt_found_them_and_leaves_the_workspace_alone(session):
    """After the attempt, the agent edits the script and writes the metrics by hand: the
    rerun still runs the script it ran and compares with what it recorded. Whatever the rerun
    writes stays in its own copy: the workspace's files, its log, are as the attempt left them."""
    planned(session)
    counting = MEASURE + "open('results/runs.log', 'a').write('ran\\n')\n"
    n = attempt(session, counting, "R1", 0)
    judged(session, {"C1": n, "C2": n, "C3": n})
    write(session, "src/measure.py", "raise SystemExit('rewritten after the attempt')\n")
    write(session, "results/m0.json", json.dumps({"slope": -0.5, "rmse_k1": 0.5}))
    reproduce(session)

    assert session.state.attempts[n - 1].reproduction.status == "REPRODUCED"
    assert (session.ws.root / "results/runs.log").read_text() == "ran\n"
    assert json.loads((session.ws.root / "results/m0.json").read_text()) == {"slope": -0.5, "rmse_k1": 0.5}
    reproduce(session)  # done once: not run again
    assert "reruns it" in " ".join(session.state.worklog)
    assert sum("reruns it" in line for line in session.state.worklog) == 1
    # the code it ran is no longer the workspace's: the engine's section says so beside the claims
    write(session, "REPORT.md", "# Report\n")
    stamp_report(session)
    assert "- KC1: the code its attempts ran has changed or gone since: src/measure.py" in \
        (session.ws.root / "REPORT.md").read_text()


def test_reproduction_turned_off_or_out_of_time_is_said(tmp_path, prefect_api):
    off = open_session(tmp_path / "off", "    reproduce_minutes: 0\n")
    try:
        planned(off)
        n = attempt(off, MEASURE, "R1", 0)
        judged(off, {"C1": n, "C2": n, "C3": n})
        reproduce(off)
        assert off.state.attempts[n - 1].reproduction.status == "SKIPPED"
        assert "turned off" in off.state.attempts[n - 1].reproduction.detail
        write(off, "REPORT.md", "# Report\n\nText.\n")
        stamp_report(off)
        assert "Reproduction by the engine: turned off" in (off.ws.root / "REPORT.md").read_text()
    finally:
        off.close()

    short = open_session(tmp_path / "short", "    reproduce_minutes: 0.03\n")  # 1.8 s
    try:
        planned(short)
        slow = "import time\ntime.sleep(3)\n" + MEASURE
        n = attempt(short, slow, "R1", 0)
        judged(short, {"C1": n, "C2": n, "C3": n})
        reproduce(short)
        record = short.state.attempts[n - 1].reproduction
        assert record.status == "SKIPPED" and "minutes for reproduction ran out" in record.detail, record
    finally:
        short.close()


@pytest.mark.skipif(bubblewrap() is None, reason="needs bubblewrap: unsandboxed, a rerun runs in its copy but "
                    "could write the workspace by its absolute path")
def test_a_rerun_cannot_write_the_workspace_by_its_absolute_path(session):
    planned(session)
    log = session.ws.root / "results" / "runs.log"
    n = attempt(session, MEASURE + f"open({str(log)!r}, 'a').write('ran\\n')\n", "R1", 0)
    judged(session, {"C1": n, "C2": n, "C3": n})
    reproduce(session)
    assert session.state.attempts[n - 1].reproduction.status == "REPRODUCED"
    assert log.read_text() == "ran\n"


@pytest.mark.skipif(bubblewrap() is None, reason="needs bubblewrap: unsandboxed, the copy links to the environment, "
                    "which a rerun could change")
def test_a_rerun_uses_the_workspaces_environment_as_it_is_read_only(session):
    """An attempt run with the workspace's virtual environment: the rerun gets that
    environment (bound in whole, not copied) and cannot change it."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(session.ws.root / ".venv")], check=True)
    planned(session)
    write(session, "src/measure.py", MEASURE + "open('.venv/touched', 'w').write('x')\n")
    result = call(session, "experiments", "run_experiment", command=".venv/bin/python src/measure.py 0",
                  purpose="measure the slope", run_id="R1", metrics_file="results/m0.json")
    assert "SUCCESS" in result.content, result.content
    n = session.state.attempts[-1].n
    (session.ws.root / ".venv/touched").unlink()
    judged(session, {"C1": n, "C2": n, "C3": n})
    reproduce(session)
    record = session.state.attempts[n - 1].reproduction  # the rerun ran the environment's Python, whose write failed
    assert record.status == "DIVERGED" and "the rerun failed" in record.detail, record
    assert "Read-only file system: '.venv/touched'" in (session.ws.root / record.log).read_text()
    assert not (session.ws.root / ".venv/touched").exists()


def test_a_rerun_a_killed_engine_left_running_is_ended_by_its_identity(tmp_path):
    """Unsandboxed, nothing else ends it: the next rerun kills the group the last one noted,
    and only if its leader is still the process that was noted (a reused pid is left alone)."""
    import subprocess

    from labrun.phases.reproduction import GROUP, end_left_over, note_group

    left = subprocess.Popen(["sleep", "300"], start_new_session=True)
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        note_group(tmp_path, left.pid)
        end_left_over(tmp_path)
        assert left.wait(timeout=10) == -9
        noted = json.loads((tmp_path / GROUP).read_text())
        (tmp_path / GROUP).write_text(json.dumps({"pgid": other.pid, "started": noted["started"] - 1}))
        end_left_over(tmp_path)  # the pid names another process now
        assert other.poll() is None
    finally:
        left.kill()
        other.kill()


needs_bubblewrap = pytest.mark.skipif(bubblewrap() is None, reason="needs bubblewrap: unsandboxed, a rerun runs as "
                                      "the user, with the user's home, and reaches all the user can anyway")


@pytest.fixture
def credentials(monkeypatch):
    """A home whose credential store the sandbox hides (under /var/tmp: the sandbox's /tmp is its own)."""
    import shutil
    import tempfile
    from pathlib import Path

    home = Path(tempfile.mkdtemp(prefix="labrun-home-", dir="/var/tmp"))
    (home / ".ssh").mkdir()
    (home / ".ssh/id_rsa").write_text("PRIVATE-KEY-5e1f\n")
    monkeypatch.setenv("HOME", str(home))
    yield home / ".ssh"
    shutil.rmtree(home, ignore_errors=True)


@needs_bubblewrap
@pytest.mark.parametrize("swap", ["a credential store", "nothing"])
def test_an_environment_swapped_for_a_link_after_the_attempt_is_not_bound(session, credentials, swap):
    """After the attempt, the agent replaces its `.venv/` with a link: to a credential store
    the sandbox hides, or to nothing. Bound as the rerun once bound it, the store shows at
    `.venv/` and a dangling link stops the engine; now the rerun is SKIPPED, saying why."""
    from dataclasses import replace

    from labrun.commands import run_command

    planned(session)
    (session.ws.root / ".venv").mkdir()
    n = attempt(session, MEASURE, "R1", 0)
    judged(session, {"C1": n, "C2": n, "C3": n})
    venv = session.ws.root / ".venv"
    venv.rmdir()
    venv.symlink_to(credentials if swap == "a credential store" else session.ws.root / "gone")
    seen = call(session, "analysis", "bash", command="cat .venv/id_rsa").content
    assert "PRIVATE-KEY" not in seen, seen  # the agent's own commands do not see it

    weak = session.ws.root.parent / "weak"  # the weak target: a copy with the environment bound as it was
    (weak / ".venv").mkdir(parents=True)
    sandbox = replace(session.confinement.sandbox(), mounted_from=weak, tmp=weak / "tmp", readonly=(venv,))
    if swap == "a credential store":
        out = run_command("cat .venv/id_rsa", weak, weak / "log", 60, 10_000, sandbox=sandbox)
        assert "PRIVATE-KEY" in out.output, out.output
    else:
        with pytest.raises(FileExistsError):
            run_command("true", weak, weak / "log", 60, 10_000, sandbox=sandbox)

    reproduce(session)
    record = session.state.attempts[n - 1].reproduction
    assert record.status == "SKIPPED", record
    assert record.detail == ("not rerun: the environment .venv/ is not shown to the rerun: .venv is a link; "
                             "labrun follows no link in the workspace")


@needs_bubblewrap
def test_a_rerun_does_not_replay_a_result_from_the_agents_cache(session):
    """A script that keeps its first result in its home and replays it: the agent's attempts
    share the session's home (`.labrun/cache/`), so a second attempt gives the first one's
    number; a rerun gets a home of its own, and the unseeded number differs."""
    replaying = ("import json, os, random, sys\nmemo = os.path.join(os.environ['HOME'], 'memo.json')\n"
                 "if not os.path.exists(memo):\n    json.dump({'slope': random.random()}, open(memo, 'w'))\n"
                 "json.dump({**json.load(open(memo)), 'seed': int(sys.argv[1])}, open(f'results/m{sys.argv[1]}.json', 'w'))\n")
    planned(session)
    first = attempt(session, replaying, "R1", 0)
    second = attempt(session, replaying, "R2", 1)
    recorded = session.state.attempts[second - 1].metrics
    assert recorded["slope"] == session.state.attempts[first - 1].metrics["slope"]  # replayed from the shared home
    judged(session, {"C1": second, "C2": first, "C3": first})
    reproduce(session)
    record = session.state.attempts[second - 1].reproduction
    assert record.status == "DIVERGED" and record.detail.startswith("slope "), record
    assert record.metrics["slope"] != recorded["slope"]


def test_a_rerun_cannot_link_its_metrics_to_the_attempts(session):
    """The rerun's code links the metrics file to the workspace's, where the attempt wrote it:
    read through the link, the engine would compare the attempt's numbers with themselves."""
    linking = UNSEEDED.replace(
        "json.dump(", f"import os\nif not os.path.exists('.labrun/kept'):  # the rerun\n"
        f"    os.symlink({str(session.ws.root)!r} + f'/results/m{{sys.argv[1]}}.json', "
        "f'results/m{sys.argv[1]}.json'); sys.exit()\njson.dump(", 1)
    planned(session)
    n = attempt(session, linking, "R1", 0)
    judged(session, {"C1": n, "C2": n, "C3": n})
    reproduce(session)
    record = session.state.attempts[n - 1].reproduction
    assert record.status == "DIVERGED", record
    assert record.detail == ("the rerun wrote no readable results/m0.json "
                             "(results/m0.json is a link; labrun follows no link in the workspace)")
    left = session.ws.data / "reproductions" / f"attempt-{n:03d}" / "work" / "results/m0.json"
    assert left.is_symlink()  # the weak target: read through the link, the attempt's own numbers
    from labrun.tools import parse_metrics
    assert parse_metrics(left.read_text()) == session.state.attempts[n - 1].metrics


def test_a_run_time_that_differs_is_said_and_the_claimed_metric_decides(session):
    """A metrics file with the run's own wall time: the rerun's differs, and is said, but the
    attempt (and its claim) stand on the metric the claim cites."""
    planned(session)
    timed = MEASURE.replace("json.dump({", "import time\njson.dump({'seconds': time.perf_counter() % 1 + 0.01, ")
    n = attempt(session, timed, "R1", 0)
    judged(session, {"C1": n, "C2": n, "C3": n})
    reproduce(session)
    again = session.state.attempts[n - 1].reproduction
    assert again.status == "REPRODUCED", again
    assert again.detail.startswith("1 metric the same") and "no claim's, and differing: seconds " in again.detail


def test_the_rerun_of_an_attempt_with_a_gpu_gets_one_of_its_own(session, monkeypatch):
    """A fake device list (this machine has no GPU). The script stops unless it sees exactly
    one GPU: the rerun, like the attempt, must be given one, not all nor none."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(f"GPU-{uuid.uuid4()}" for _ in range(2)))
    planned(session)
    one_gpu = "import os\nassert len(os.environ['CUDA_VISIBLE_DEVICES'].split(',')) == 1, 'not one GPU'\n" + MEASURE
    write(session, "src/measure.py", one_gpu)
    result = call(session, "experiments", "run_experiment", command="python3 src/measure.py 0", gpus=1,
                  purpose="measure the slope", run_id="R1", metrics_file="results/m0.json")
    assert "SUCCESS" in result.content, result.content
    n = session.state.attempts[-1].n
    judged(session, {"C1": n, "C2": n, "C3": n})
    reproduce(session)
    assert session.state.attempts[n - 1].reproduction.status == "REPRODUCED", session.state.attempts[n - 1].reproduction
    # Both GPUs held elsewhere (another session's attempts): the rerun waits no longer than its time.
    from labrun import gpus
    from labrun.phases.reproduction import reproduce_one

    held = gpus.claim(2)
    try:
        started = time.monotonic()
        again = reproduce_one(session, session.state.attempts[n - 1], 2.0, 0.001)
    finally:
        held.close()
    assert again.status == "SKIPPED" and "GPUs were not free" in again.detail and time.monotonic() - started < 10
