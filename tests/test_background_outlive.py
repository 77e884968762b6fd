"""A background attempt outlives the engine too: killed, interrupted or stopped on an error
while an attempt runs in the background, the session re-attaches to it, records it once and
goes on; its supervisor killed, the model is told; and nothing of a session runs on after it,
unless LABRUN_KEEP_EXPERIMENTS=on asked for it.

Real engines (`tests/engine_forker.py`), real processes. The scripted agent's
`background-attempt` mode (`labrun.agents.scripted`) runs the experiments' successful attempt
(turn 3) in the background with `slow-attempt`'s command, which notes each start of its
command in `attempt-starts.txt` and sleeps a few seconds, and follows it with
`experiment_output` (wait_s of 1 s) over the next turns until it ends.
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

BACKGROUND = "background-attempt@experiments:3"
KILLED = -9


def start_background_attempt(forker, ws: Path, faults: str = BACKGROUND, env: dict | None = None):
    """`labrun run` on the demo, held until its background attempt's command has started."""
    proc = forker.start(["run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted"],
                        env={"LABRUN_SCRIPTED_FAULTS": faults, **(env or {})})
    wait_for(lambda: (ws / SLOW_ATTEMPT_STARTS).exists() or proc.poll() is not None, timeout=120,
             what="the background attempt's command to start")
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    wait_for(lambda: (attempt_supervisor(ws) or {}).get("pgid"), what="its supervisor's report")
    state = json.loads((ws / ".labrun/state.json").read_text())
    assert state["attempts"][1]["background"] and state["attempts"][1]["status"] == "RUNNING"
    return proc, attempt_supervisor(ws)


def alive(report: dict) -> bool:
    """The attempt's supervisor, or any process of its command's group, still runs."""
    return start_ticks(report["pid"]) == report["ticks"] or start_ticks(report["pgid"]) == report["pgid_ticks"]


def kill_engine(proc) -> None:
    proc.send_signal(signal.SIGKILL)  # its process alone, not its group
    assert proc.wait(60) == KILLED


def outputs(ws: Path) -> list[ToolResultRecord]:
    """The experiments phase's `experiment_output` results, as the model read them."""
    convo = Conversation.latest(ws / ".labrun/phases/experiments")
    return [r for r in convo.of(ToolResultRecord) if r.name == "experiment_output"]


def assert_recorded_once(ws: Path, done) -> None:
    """The background attempt's command ran once, to its end; it is recorded SUCCESS once, with
    the duration its supervisor measured; the model read that end; the session completed."""
    assert done.returncode == 0, done.stderr[-3000:]
    assert session_status(ws)["session"]["complete"]
    assert (ws / SLOW_ATTEMPT_STARTS).read_text() == "started\n", "the command was started again"
    attempts = session_status(ws)["attempts"]
    assert [a["status"] for a in attempts] == ["FAILED", "SUCCESS", "SUCCESS"], attempts
    ended = json.loads((ws / ".labrun/attempts/attempt-002.supervisor.json").read_text())
    assert attempts[1]["duration_s"] >= SLOW_ATTEMPT_S
    assert abs(attempts[1]["duration_s"] - ended["duration_s"]) < 0.1, (attempts[1], ended)
    assert (ws / "STATE.md").read_text().count("### Attempt 2\n") == 1
    told = [r.content for r in outputs(ws) if not r.is_error]
    assert [t.splitlines()[0] for t in told if not t.startswith("Attempt 2: RUNNING")] == ["Attempt 2: SUCCESS"]


def test_a_kill_9_with_a_background_attempt_running_and_the_resume_follows_it_again(tmp_path, forker):
    ws = tmp_path / "ws"
    proc, report = start_background_attempt(forker, ws)
    time.sleep(1)  # the agent follows it: its experiment_output is waiting
    kill_engine(proc)
    assert alive(report), "the attempt died with the engine"

    resumed = forker.run(["resume", str(ws)])  # while the command still sleeps: followed again
    assert_recorded_once(ws, resumed)
    assert "attempt 2 runs on; the resume records it" in (ws / "STATE.md").read_text()
    assert any(r.is_error and "cut off" in r.content for r in outputs(ws)), "the call the kill cut off"
    assert not alive(report), "an attempt outlived its session"


def test_a_background_attempt_that_ends_while_no_engine_runs_is_recorded_by_the_resume(tmp_path, forker):
    """The first resume is killed as it re-attaches (`attempt-reattached`, in the thread that
    follows the attempt); the attempt ends with no engine; the second resume records it."""
    ws = tmp_path / "ws"
    proc, report = start_background_attempt(forker, ws)
    kill_engine(proc)
    again = forker.run(["resume", str(ws)], env={"LABRUN_CRASH_AT": "attempt-reattached:1"})
    assert again.returncode == KILLED, again.stderr[-3000:]
    wait_for(lambda: "ended" in json.loads((ws / ".labrun/attempts/attempt-002.supervisor.json").read_text()),
             timeout=30, what="the attempt to end with no engine")
    wait_for(lambda: not alive(report), what="its supervisor to exit")

    resumed = forker.run(["resume", str(ws)])
    assert_recorded_once(ws, resumed)
    assert "attempt 2 ended while no engine ran; the resume records it" in (ws / "STATE.md").read_text()
    assert not alive(report)


def test_a_background_attempt_whose_supervisor_is_killed_is_interrupted_and_the_model_is_told(tmp_path, forker):
    """The engine's follower sees the supervisor gone without an end: INTERRUPTED; the next
    experiment_output says so, and the scripted agent runs the attempt again (in the foreground)."""
    ws = tmp_path / "ws"
    proc, report = start_background_attempt(forker, ws)
    kill_attempt_supervisor(ws)
    out, err = proc.communicate(300)
    assert proc.returncode == 0, err[-3000:]
    attempts = session_status(ws)["attempts"]
    assert [a["status"] for a in attempts] == ["FAILED", "INTERRUPTED", "SUCCESS", "SUCCESS"], attempts
    assert "supervisor ended before its command did" in attempts[1]["error"]
    [told] = [r.content for r in outputs(ws) if r.content.startswith("Attempt 2: INTERRUPTED")]
    assert "supervisor ended before its command did" in told
    assert session_status(ws)["session"]["complete"]
    assert not alive(report)


def test_ctrl_c_stops_a_background_attempt_unless_asked_to_leave_it_running(tmp_path, forker):
    ws = tmp_path / "kept"
    proc, report = start_background_attempt(forker, ws, env={"LABRUN_KEEP_EXPERIMENTS": "on"})
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(60)
    assert proc.returncode == 130, err[-3000:]
    assert "attempt 2 keeps running (LABRUN_KEEP_EXPERIMENTS=on)" in out + err
    assert alive(report)
    assert_recorded_once(ws, forker.run(["resume", str(ws)]))

    ws = tmp_path / "stopped"
    proc, report = start_background_attempt(forker, ws)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(60)
    assert proc.returncode == 130, err[-3000:]
    assert "with LABRUN_KEEP_EXPERIMENTS=on, Ctrl-C leaves experiments running" in out + err
    assert not alive(report)
    assert session_status(ws)["attempts"][1]["status"] == "INTERRUPTED"


def test_a_session_that_stops_on_an_error_leaves_no_background_attempt_running_unless_asked(tmp_path, forker):
    """The model fails as the agent starts following its attempt (`raise` at turn 4): the
    phase's end stops the attempt, and nothing of the session runs once labrun exits; with
    LABRUN_KEEP_EXPERIMENTS=on the attempt runs on, and the resume records it once."""
    faults = f"{BACKGROUND},raise@experiments:4"

    def run_until_it_stops(ws: Path, env: dict | None = None):
        """The engine fails at turn 4, a second after turn 3 started the attempt (each reply
        takes 1 s), and the attempt is looked at once the run is over."""
        proc = forker.start(["run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted"],
                            env={"LABRUN_SCRIPTED_FAULTS": faults, "LABRUN_SCRIPTED_LATENCY_S": "1", **(env or {})})
        out, err = proc.communicate(120)
        assert proc.returncode != 0 and "injected failure at experiments turn 4" in out + err, err[-3000:]
        report = json.loads((ws / ".labrun/attempts/attempt-002.supervisor.json").read_text())
        assert report.get("pgid"), "its command never started"
        return report

    ws = tmp_path / "stopped"
    report = run_until_it_stops(ws)
    assert not alive(report), "an attempt outlived its session"
    attempt = session_status(ws)["attempts"][1]
    assert attempt["status"] == "INTERRUPTED" and attempt["error"] == "the phase ended while it ran", attempt

    ws = tmp_path / "kept"
    report = run_until_it_stops(ws, {"LABRUN_KEEP_EXPERIMENTS": "on"})
    assert session_status(ws)["attempts"][1]["status"] == "RUNNING"
    assert alive(report) or "ended" in json.loads((ws / ".labrun/attempts/attempt-002.supervisor.json").read_text())
    assert_recorded_once(ws, forker.run(["resume", str(ws)]))
    assert not alive(report)
