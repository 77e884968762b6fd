"""An experiment attempt outlives the engine: its command runs under a supervisor of its own
(`labrun.supervisor`), so a `kill -9` of the engine's process (not its group: as the OOM
killer or a crash would) leaves it running; the resume re-attaches to it and records it once,
with its real duration, and never starts it again. A supervisor that is gone without
reporting an end makes the attempt INTERRUPTED, and the model is told.

Real engines (`tests/engine_forker.py`), real processes, the real sandbox where bubblewrap
works. The scripted agent's `slow-attempt` fault puts `echo started >> attempt-starts.txt &&
sleep 4` before the experiments' successful attempt (turn 3), so each start of its command
leaves a line in the workspace.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from support import DEMO_IDEA, attempt_supervisor, kill_attempt_supervisor, wait_for
from labrun.agents.scripted import SLOW_ATTEMPT_S, SLOW_ATTEMPT_STARTS
from labrun.journal import Conversation, ToolResultRecord
from labrun.status import session_status
from labrun.supervisor import start_ticks

SLOW = {"LABRUN_SCRIPTED_FAULTS": "slow-attempt@experiments:3"}
KILLED = -9


def start_slow_attempt(forker, ws: Path, env: dict | None = None):
    """`labrun run` on the demo, held until the slow attempt's command has started."""
    proc = forker.start(["run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted"],
                        env={**SLOW, **(env or {})})
    wait_for(lambda: (ws / SLOW_ATTEMPT_STARTS).exists() or proc.poll() is not None, timeout=120,
             what="the slow attempt's command to start")
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    wait_for(lambda: (attempt_supervisor(ws) or {}).get("pgid"), what="its supervisor's report")
    return proc, attempt_supervisor(ws)


def kill_engine(proc) -> None:
    proc.send_signal(signal.SIGKILL)  # its process alone, not its group
    assert proc.wait(60) == KILLED


def supervisor_alive(report: dict) -> bool:
    return start_ticks(report["pid"]) == report["ticks"]


def slow_attempt(ws: Path) -> dict:
    [attempt] = [a for a in session_status(ws)["attempts"] if "attempt-starts" in a["command"]]
    return attempt


def first_result_of_turn_3(ws: Path) -> ToolResultRecord:
    convo = Conversation.latest(ws / ".labrun/phases/experiments")
    return [r for r in convo.of(ToolResultRecord) if r.name == "run_experiment"][1]


def assert_recorded_once(ws: Path, resumed) -> None:
    """The slow attempt ran once, to its end, and the session went on to complete."""
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert session_status(ws)["session"]["complete"]
    assert (ws / SLOW_ATTEMPT_STARTS).read_text() == "started\n", "the command was started again"
    attempt = slow_attempt(ws)
    assert attempt["status"] == "SUCCESS" and attempt["duration_s"] >= SLOW_ATTEMPT_S, attempt
    assert [a["status"] for a in session_status(ws)["attempts"]] == ["FAILED", "SUCCESS", "SUCCESS"]
    result = first_result_of_turn_3(ws)  # the cut-off call answered with the attempt's real result
    assert not result.is_error and "ran on to its end" in result.content, result.content
    assert f"Attempt {attempt['n']}: SUCCESS" in result.content


def test_a_kill_9_mid_attempt_leaves_it_running_and_the_resume_waits_for_it_and_records_it_once(tmp_path, forker):
    ws = tmp_path / "ws"
    proc, report = start_slow_attempt(forker, ws)
    kill_engine(proc)
    assert supervisor_alive(report), "the attempt died with the engine"
    assert "- Status: RUNNING" in (ws / "STATE.md").read_text()

    resumed = forker.run(["resume", str(ws)])  # while the command still sleeps: the resume waits
    assert_recorded_once(ws, resumed)
    assert "attempt 2 runs on; the resume records it" in (ws / "STATE.md").read_text()
    assert not supervisor_alive(report), "a supervisor outlived its session"


def test_an_attempt_that_ends_while_no_engine_runs_is_recorded_by_the_next_resume_even_after_a_kill_in_the_wait(
        tmp_path, forker):
    """The first resume is killed as it re-attaches (`attempt-reattached`); the attempt then
    ends with no engine running; the second resume records it once and goes on."""
    ws = tmp_path / "ws"
    proc, report = start_slow_attempt(forker, ws)
    kill_engine(proc)
    again = forker.run(["resume", str(ws)], env={"LABRUN_CRASH_AT": "attempt-reattached:1"})
    assert again.returncode == KILLED, again.stderr[-3000:]
    assert supervisor_alive(report) or "ended" in attempt_supervisor(ws)
    wait_for(lambda: "ended" in (attempt_supervisor(ws) or {}), timeout=30, what="the attempt to end with no engine")
    wait_for(lambda: not supervisor_alive(report), what="its supervisor to exit")
    time.sleep(0.5)  # nothing runs now: the record is the supervisor's report alone

    resumed = forker.run(["resume", str(ws)])
    assert_recorded_once(ws, resumed)
    assert "attempt 2 ended while no engine ran; the resume records it" in (ws / "STATE.md").read_text()


def test_an_attempt_whose_supervisor_is_killed_is_interrupted_and_the_model_is_told(tmp_path, forker):
    """With the engine running: the engine sees the supervisor gone without an end, records
    the attempt INTERRUPTED and answers the call so; the scripted agent runs it again."""
    ws = tmp_path / "ws"
    proc, report = start_slow_attempt(forker, ws)
    kill_attempt_supervisor(ws)
    out, err = proc.communicate(300)
    assert proc.returncode == 0, err[-3000:]
    statuses = [(a["status"], "attempt-starts" in a["command"]) for a in session_status(ws)["attempts"]]
    assert statuses[:2] == [("FAILED", False), ("INTERRUPTED", True)], statuses
    interrupted = session_status(ws)["attempts"][1]
    assert "supervisor ended before its command did" in interrupted["error"]
    result = first_result_of_turn_3(ws)
    assert "Attempt 2: INTERRUPTED" in result.content and "supervisor ended" in result.content
    assert session_status(ws)["session"]["complete"]


def test_ctrl_c_stops_the_attempt_unless_asked_to_leave_it_running(tmp_path, forker):
    """LABRUN_KEEP_EXPERIMENTS=on: Ctrl-C (SIGINT) stops labrun but not the attempt, and says
    so at the terminal; the resume records it once. Without it, the attempt is stopped, and
    the terminal says how to keep it."""
    ws = tmp_path / "ws"
    proc, report = start_slow_attempt(forker, ws, env={"LABRUN_KEEP_EXPERIMENTS": "on"})
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(60)
    assert proc.returncode == 130, err[-3000:]
    assert "attempt 2 keeps running (LABRUN_KEEP_EXPERIMENTS=on)" in out + err
    assert supervisor_alive(report)
    assert_recorded_once(ws, forker.run(["resume", str(ws)]))

    ws = tmp_path / "stopped"
    proc, report = start_slow_attempt(forker, ws)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(60)
    assert proc.returncode == 130, err[-3000:]
    assert "with LABRUN_KEEP_EXPERIMENTS=on, Ctrl-C leaves experiments running" in out + err
    assert not supervisor_alive(report)
    assert slow_attempt(ws)["status"] == "INTERRUPTED"
    assert json.loads((ws / ".labrun/state.json").read_text())["attempts"][1]["status"] == "INTERRUPTED"


def test_a_report_of_another_boot_or_without_an_identity_names_no_process_to_kill():
    """After a restart (or on another machine) a report's ids are other processes'. Shown first
    with this boot's id: the same report names the live group, which a stop would kill."""
    import os
    import subprocess

    from labrun.commands import Supervised
    from labrun.supervisor import boot_id

    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        report = {"pid": stranger.pid, "ticks": start_ticks(stranger.pid), "pgid": stranger.pid,
                  "pgid_ticks": start_ticks(stranger.pid), "boot": boot_id()}
        assert Supervised(lambda: report).groups() == [stranger.pid, stranger.pid]  # this boot's: its own
        other_boot = {**report, "boot": "0" * 32}
        assert Supervised(lambda: other_boot).groups() == [] and not Supervised(lambda: other_boot).alive(other_boot)
        gone = {"pid": 2 ** 22 + 7, "ticks": None, "boot": boot_id()}  # no identity: never alive
        assert not Supervised(lambda: gone).alive(gone)
        assert stranger.poll() is None and os.getpgid(stranger.pid) == stranger.pid
    finally:
        stranger.kill()
        stranger.wait()
