"""Interrupting a real `labrun run` as a person does: Ctrl-C typed in its terminal (SIGINT to
the whole foreground process group), SIGINT or SIGTERM sent to the labrun process alone, its
terminal closed (SIGHUP), its output piped into a reader that goes (`| head -5`); at a
model call, in an experiment attempt, in the engine's rerun of one (reproduction), and while
the Prefect API starts.

Each run starts its own Prefect API (no PREFECT_API_URL), as a new user's does, and that
API lives as long as the run. After each interruption: the exit code, the message, no process
labrun started left alive, STATE.md saying what happened; then `labrun resume` finishes the
session with nothing redone that had finished.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import DEMO_IDEA, alive, attempt_group, on_prefect_home, wait_for
from terminal import Terminal
from labrun.agents.scripted import RERUN_HANGS
from labrun.journal import Conversation, ReplyRecord
from labrun.state import phase_table
from labrun.status import session_status

SCRIPT_TURNS = {"planning": 2, "setup": 2, "implementation": 2, "experiments": 4,
                "analysis": 2, "documentation": 3}
POINTS = {
    "model-call": "hang@experiments:3",
    "attempt": "hang-attempt@experiments:1",
    "api-start": "",
}
SIGNALS = {"ctrl-c": 130, "sigint": 130, "sigterm": 143, "hang-up": 129}
REASON = {"ctrl-c": "Ctrl-C (SIGINT)", "sigint": "Ctrl-C (SIGINT)", "sigterm": "SIGTERM",
          "hang-up": "a hang-up (SIGHUP: its terminal closed)"}


@pytest.fixture(scope="module")
def own_api_env(tmp_path_factory):
    """No PREFECT_API_URL: each labrun starts its own API, in a Prefect home of these tests
    (warmed once: its database is made by the first run)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "LABRUN_SCRIPTED_FAULTS")}
    env["PREFECT_HOME"] = str(tmp_path_factory.mktemp("interrupt-prefect-home"))
    return env


def replies(workspace: Path, phase: str) -> int:
    return sum(len(Conversation(f).of(ReplyRecord))
               for f in Conversation.files(workspace / ".labrun" / "phases" / phase))


def reach(point: str, term: Terminal, ws: Path) -> None:
    """Hold the session at `point`, noting the processes below labrun on the way."""
    if point == "api-start":
        wait_for(lambda: any("labrun.run_api.process" in " ".join(_cmd(p)) for p in term.watch()), timeout=60,
                 what="labrun to start its Prefect API")
        assert not (ws / ".labrun").exists()
        return
    marker = ws / ".labrun" / "faults" / f"experiments-{1 if point == 'attempt' else 3}.reached"
    wait_for(lambda: term.watch() is not None and marker.exists(), timeout=180,
             what=f"the session to reach its {point}")
    if point == "attempt":
        # The attempt is recorded a moment after the reply that asks for it (the workspace's
        # snapshot comes first).
        wait_for(lambda: attempt_group(ws), what="the attempt's process group")
        wait_for(lambda: any("sleep" in _cmd(p) for p in term.watch()), what="the attempt's command")
    term.watch()


def _cmd(p) -> list[str]:
    try:
        return p.cmdline()
    except Exception:
        return []


def interrupt(how: str, term: Terminal) -> None:
    if how == "ctrl-c":
        term.ctrl_c()
    elif how == "hang-up":
        term.hang_up()
    else:
        os.kill(term.proc.pid, signal.SIGINT if how == "sigint" else signal.SIGTERM)


CASES = [(point, how) for point in POINTS for how in SIGNALS
         if (point, how) != ("api-start", "sigint")  # there the group's SIGINT is labrun's alone
         and (how != "hang-up" or point == "attempt")]  # the same path as SIGTERM: once


@pytest.mark.parametrize("point,how", CASES)
def test_an_interrupted_run_stops_cleanly_and_resumes_with_nothing_redone(point, how, tmp_path, own_api_env,
                                                                          prefect_api, cli, monkeypatch):
    ws = tmp_path / "ws"
    env = {**own_api_env, "LABRUN_SCRIPTED_FAULTS": POINTS[point]}
    term = Terminal("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted", env=env)
    try:
        reach(point, term, ws)
        started = time.monotonic()
        interrupt(how, term)
        code = term.wait(timeout=30)
        took = time.monotonic() - started
        out = term.output
        assert code == SIGNALS[how], out
        assert took < 5, f"{took:.1f} s to stop:\n{out}"
        assert "Traceback" not in out and "ERROR" not in out, out
        assert not term.survivors(), f"processes outlived labrun:\n{term.survivors()}\n{out}"
    finally:
        term.close()
    if how == "hang-up":  # its terminal is gone, and what labrun said with it
        out = f"interrupted; resume with: labrun resume {ws}"

    if point == "api-start":
        assert f"interrupted before the session started; start it again with: labrun run {DEMO_IDEA} " \
               f"--workspace {ws}" in " ".join(out.split()), out
        assert not (ws / ".labrun" / "state.json").exists()
        return
    assert f"interrupted; resume with: labrun resume {ws}" in " ".join(out.split()), out
    state_md = (ws / "STATE.md").read_text()
    assert f"phase 4 experiments interrupted by {REASON[how]}" in state_md
    assert phase_table(state_md)["experiments"] == "INTERRUPTED"
    assert "- Status: RUNNING" not in state_md
    assert "Task run is not set" not in state_md + out

    monkeypatch.delenv("LABRUN_SCRIPTED_FAULTS", raising=False)
    resumed = cli("resume", str(ws))  # on the shared test API
    assert resumed.returncode == 0, resumed.stderr
    report = session_status(ws)
    assert {p["key"]: p["runs"] for p in report["phases"]} == {
        "planning": 1, "setup": 1, "implementation": 1, "experiments": 2, "analysis": 1, "documentation": 1}
    attempts = [(a["n"], a["status"]) for a in report["attempts"]]
    if point == "model-call":
        assert attempts == [(1, "FAILED"), (2, "SUCCESS"), (3, "SUCCESS")]  # 3: the analysis's figures
        assert replies(ws, "experiments") == SCRIPT_TURNS["experiments"]  # the cut-off call, once
    else:  # the cut-off attempt is not a failure; the agent runs it again, unfixed, and it fails
        assert attempts == [(1, "INTERRUPTED"), (2, "FAILED"), (3, "SUCCESS"), (4, "SUCCESS")]
        assert replies(ws, "experiments") == SCRIPT_TURNS["experiments"] + 1
    for phase in ("planning", "setup", "implementation", "analysis", "documentation"):
        assert replies(ws, phase) == SCRIPT_TURNS[phase], phase


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_an_interrupt_during_the_engines_rerun_stops_its_sandbox_and_the_resume_reruns_it(
        how, tmp_path, own_api_env, prefect_api, cli, monkeypatch):
    """Once the experiments are complete the engine reruns the attempt behind the claims
    (phases/reproduction.py), in a sandbox of its own; that rerun hangs. A Ctrl-C or a
    SIGTERM stops the session in seconds and the rerun with it; the resume reruns it from a
    fresh copy and completes, with nothing finished asked again."""
    ws = tmp_path / "ws"
    env = {**own_api_env, "LABRUN_SCRIPTED_FAULTS": "hang-rerun@experiments:3", RERUN_HANGS: "1"}
    term = Terminal("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted", env=env)
    rerun = ws / ".labrun" / "reproductions" / "attempt-002"
    try:
        wait_for(lambda: term.watch() is not None and (rerun / "group.json").exists(), timeout=180,
                 what=f"the engine's rerun of attempt 2:\n{term.output[-2000:]}")
        wait_for(lambda: any("sleep" in _cmd(p) for p in term.watch()), what="the rerun's command")
        term.watch()
        started = time.monotonic()
        interrupt(how, term)
        code = term.wait(timeout=30)
        took = time.monotonic() - started
        out = term.output
        assert code == SIGNALS[how], out
        assert took < 5, f"{took:.1f} s to stop:\n{out}"
        assert "Traceback" not in out and "ERROR" not in out, out
        assert not term.survivors(), f"processes outlived labrun:\n{term.survivors()}\n{out}"
    finally:
        term.close()
    assert f"interrupted; resume with: labrun resume {ws}" in " ".join(out.split()), out
    state_md = (ws / "STATE.md").read_text()
    assert f"phase 4 experiments interrupted by {REASON[how]}" in state_md
    assert phase_table(state_md)["experiments"] == "INTERRUPTED"
    assert "REPRODUCED" not in state_md and "DIVERGED" not in state_md

    monkeypatch.delenv("LABRUN_SCRIPTED_FAULTS", raising=False)
    asked = replies(ws, "experiments")
    resumed = cli("resume", str(ws))  # on the shared test API, without RERUN_HANGS
    assert resumed.returncode == 0, resumed.stderr
    report = session_status(ws)
    assert report["session"]["complete"]
    assert replies(ws, "experiments") == asked, "the agent was asked about the experiments again"
    assert {p["key"]: p["runs"] for p in report["phases"]} == {
        "planning": 1, "setup": 1, "implementation": 1, "experiments": 2, "analysis": 1, "documentation": 1}
    assert [(a["n"], a["status"], (a["reproduction"] or {}).get("status")) for a in report["attempts"]] == [
        (1, "FAILED", None), (2, "SUCCESS", "REPRODUCED"), (3, "SUCCESS", None)]
    assert (ws / "STATE.md").read_text().count("attempt 2 REPRODUCED by the engine's rerun") == 1


def test_a_first_run_on_a_new_prefect_home_says_what_it_waits_for(tmp_path, own_api_env):
    """On a new PREFECT_HOME Prefect migrates its database before its API answers: tens of
    seconds with nothing else on the terminal. The run says so as it starts the API (a run on
    a home with a database does not: the test below), and SIGTERM still stops it."""
    ws = tmp_path / "ws"
    env = {**own_api_env, "PREFECT_HOME": str(tmp_path / "new-home")}
    term = Terminal("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted", env=env)
    said = "a new Prefect home, so the first run takes longer: Prefect builds its database"
    try:
        wait_for(lambda: said in " ".join(term.output.split()), timeout=60, what="the first-run line")
        assert "starting Prefect's API (for this run;" in " ".join(term.output.split()), term.output
        term.watch()
        os.kill(term.proc.pid, signal.SIGTERM)
        assert term.wait(timeout=30) == 143, term.output
        assert not term.survivors(), term.survivors()
    finally:
        term.close() if term.proc.poll() is None else os.close(term.master)


def test_a_second_ctrl_c_ends_labrun_at_once(tmp_path, own_api_env, prefect_api, cli, monkeypatch):
    """The first Ctrl-C cannot finish: the Prefect API is frozen (SIGSTOP), so the crash
    report hangs. The second ends labrun at once, and with it what it started."""
    ws = tmp_path / "ws"
    env = {**own_api_env, "LABRUN_SCRIPTED_FAULTS": "hang-attempt@experiments:1"}
    term = Terminal("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted", env=env)
    try:
        reach("attempt", term, ws)
        api = next(p for p in term.watch() if "labrun.run_api.process" in " ".join(_cmd(p)))
        api.suspend()
        term.ctrl_c()
        time.sleep(2)
        assert term.proc.poll() is None, term.output  # still waiting on the frozen API
        started = time.monotonic()
        term.ctrl_c()
        code = term.wait(timeout=10)
        assert time.monotonic() - started < 2
        assert code == 130, term.output
        assert "stopped at once" in term.output
        assert not term.survivors(), term.survivors()
    finally:
        term.close()
    monkeypatch.delenv("LABRUN_SCRIPTED_FAULTS", raising=False)
    resumed = cli("resume", str(ws))
    assert resumed.returncode == 0, resumed.stderr
    assert session_status(ws)["session"]["complete"]


def test_a_finished_run_and_a_ctrl_c_leave_no_prefect_api_behind(tmp_path, own_api_env):
    """A run without a server starts a Prefect API that lives as long as the run: a run
    interrupted from the terminal takes it along, and so does a run that finishes. Nothing
    on the run's Prefect home is left running, in labrun's process tree or out of it."""
    ws = tmp_path / "ws"
    home = Path(own_api_env["PREFECT_HOME"])
    env = {**own_api_env, "LABRUN_SCRIPTED_FAULTS": POINTS["model-call"]}
    term = Terminal("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted", env=env)
    try:
        reach("model-call", term, ws)
        assert [p for p in term.watch() if "labrun.run_api.process" in " ".join(_cmd(p))], "no API of its own"
        term.ctrl_c()
        assert term.wait(timeout=30) == 130, term.output
        assert term.survivors() == [] and on_prefect_home(home) == []
    finally:
        term.close() if term.proc.poll() is None else os.close(term.master)

    resumed = subprocess.run([sys.executable, "-m", "labrun.cli", "resume", str(ws)], capture_output=True, text=True,
                             timeout=300, env=own_api_env)
    assert resumed.returncode == 0, resumed.stderr
    said = " ".join(resumed.stderr.split())
    assert "starting a Prefect API (for this run;" in said and "builds its database" not in said, said
    assert session_status(ws)["session"]["complete"]
    assert on_prefect_home(home) == []


def test_a_kill_9_of_the_run_takes_its_prefect_api_along(tmp_path, own_api_env):
    """A run killed with -9 cannot stop anything; its API dies with it all the same (a
    parent-death signal)."""
    ws = tmp_path / "ws"
    env = {**own_api_env, "LABRUN_SCRIPTED_FAULTS": POINTS["model-call"]}
    term = Terminal("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted", env=env)
    try:
        reach("model-call", term, ws)
        api = next(p for p in term.watch() if "labrun.run_api.process" in " ".join(_cmd(p)))
        term.proc.kill()
        term.wait(timeout=10)
        wait_for(lambda: not alive(api.pid), timeout=10, what="the run's API to die with it")
        assert term.survivors() == [] and on_prefect_home(Path(own_api_env["PREFECT_HOME"])) == []
    finally:
        term.close() if term.proc.poll() is None else os.close(term.master)


def test_a_closed_output_pipe_stops_the_run_as_sigterm_does(tmp_path, own_api_env, cli, monkeypatch):
    """`labrun run … 2>&1 | head -5`: once the reader has its lines and goes, labrun's next
    line meets a closed pipe (SIGPIPE). The session stops on its clean path: the phase
    INTERRUPTED in STATE.md, nothing left running, and the resume completes."""
    ws = tmp_path / "ws"
    home = Path(own_api_env["PREFECT_HOME"])
    labrun = subprocess.Popen([sys.executable, "-m", "labrun.cli", "run", str(DEMO_IDEA), "--workspace", str(ws),
                               "--agent", "scripted"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=own_api_env, start_new_session=True)
    try:
        head: list[bytes] = []  # its first lines, up to the first phase's start (the reader goes then)
        while not head or (b"planning" not in head[-1] and head[-1] and len(head) < 50):
            head.append(labrun.stdout.readline())
        labrun.stdout.close()
        code = labrun.wait(timeout=120)
    finally:
        if labrun.poll() is None:
            os.killpg(labrun.pid, signal.SIGKILL)
    assert code == 141, head
    state_md = (ws / "STATE.md").read_text()
    assert "interrupted by a closed output pipe (SIGPIPE)" in state_md
    assert "INTERRUPTED" in phase_table(state_md).values() and "- Status: RUNNING" not in state_md
    assert on_prefect_home(home) == []
    resumed = cli("resume", str(ws))
    assert resumed.returncode == 0, resumed.stderr
    assert session_status(ws)["session"]["complete"]


def test_a_run_suspended_from_the_ui_stops_in_one_line_and_resumes(tmp_path, prefect_api, cli, monkeypatch):
    """Suspend pressed in the Prefect UI on a `labrun run` (no deployment to resume it): Prefect
    refuses the run's next task; labrun ends in one line that says so and how to go on."""
    from datetime import datetime, timedelta, timezone

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateDetails, StateType
    from prefect.states import State

    from labrun.state import load_state
    from labrun.workspace import Workspace

    ws = tmp_path / "ws"
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "LABRUN_SCRIPTED_LATENCY_S": "0.3"}
    labrun = subprocess.Popen([sys.executable, "-m", "labrun.cli", "run", str(DEMO_IDEA), "--workspace", str(ws),
                               "--agent", "scripted"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env, start_new_session=True)
    try:
        wait_for(lambda: (ws / ".labrun" / "state.json").exists() and load_state(Workspace(ws))[0].last_run, 120)
        run_id = load_state(Workspace(ws))[0].last_run.id
        with get_client(sync_client=True) as client:  # what the UI's Suspend sends
            client.set_flow_run_state(run_id, State(type=StateType.PAUSED, name="Suspended", state_details=StateDetails(
                pause_timeout=datetime.now(timezone.utc) + timedelta(seconds=300), pause_reschedule=True)), force=True)
        out, _ = labrun.communicate(timeout=60)
    finally:
        if labrun.poll() is None:
            os.killpg(labrun.pid, signal.SIGKILL)
    assert labrun.returncode == 1, out
    assert "session suspended from the Prefect UI" in out and f"resume {ws}" in out, out
    assert "Traceback" not in out, out
    resumed = cli("resume", str(ws))
    assert resumed.returncode == 0, resumed.stderr
    assert session_status(ws)["session"]["complete"]
