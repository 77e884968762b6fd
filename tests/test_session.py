"""The durable six-phase session on a real (embedded) Prefect: complete, interrupt, resume.

Interruptions are done for real: an exception raised mid-phase, `kill -9` of the engine
mid-turn and mid-attempt; then the session is resumed and the journal, STATE.md and the
Prefect task states are checked for what was and was not redone.
"""

from __future__ import annotations

import json
import os
import signal
import shutil
from pathlib import Path

from support import attempt_group, DEMO_IDEA, group_alive, kill_attempt_supervisor, labrun, start_labrun, wait_for
from labrun.agents import scripted
from labrun.sandbox import bubblewrap
from labrun.journal import Conversation, ReplyRecord, ToolResultRecord, UserRecord
from labrun.state import parse_state_md, phase_table
from labrun.status import session_status
from labrun.phase_registry import PHASES

SCRIPT_TURNS = {"planning": 2, "setup": 2, "implementation": 2, "experiments": 4,
                "analysis": 2, "documentation": 3}


def run_flow(workspace: Path, **kwargs):
    from labrun.flows.session import research_session

    return research_session(str(DEMO_IDEA), str(workspace), "scripted", return_state=True, **kwargs)


def resume_flow(workspace: Path):
    from labrun.flows.session import research_session

    return research_session(None, str(workspace), return_state=True)


def runs(workspace: Path) -> dict[str, int]:
    return {p["key"]: p["runs"] for p in session_status(workspace)["phases"]}


def replies(workspace: Path, phase: str) -> list[ReplyRecord]:
    """Every model reply saved for a phase, across its conversations."""
    found = []
    for f in Conversation.files(workspace / ".labrun" / "phases" / phase):
        found += Conversation(f).of(ReplyRecord)
    return found


def task_states(flow_state) -> dict[str, str]:
    """Final Prefect state of each phase task in the flow run, by phase key. The server
    records task runs from events, a moment after they happen: wait for every one to be final."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    flow_run_id = flow_state.state_details.flow_run_id
    deadline = time.monotonic() + 30
    with get_client(sync_client=True) as client:
        while True:
            task_runs = [tr for tr in client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
                if tr.name[:2] in {f"{n}-" for n in range(1, len(PHASES) + 1)} or tr.task_key.startswith("run_phase")]
            if all(tr.state and tr.state.is_final() for tr in task_runs) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    return {tr.name.split("-", 1)[1]: tr.state.type.value for tr in task_runs}


def assert_table_matches_tasks(workspace: Path, flow_state) -> None:
    table = phase_table((workspace / "STATE.md").read_text())
    expected = {"COMPLETED": "DONE", "FAILED": "FAILED", "CRASHED": "FAILED"}
    tasks = task_states(flow_state)
    for p in PHASES:
        if p.key in tasks:
            assert table[p.key] == expected[tasks[p.key]], (p.key, table, tasks)
        else:
            assert table[p.key] == "pending", (p.key, table, tasks)


def test_demo_session_completes_with_a_real_experiment(tmp_path, prefect_api):
    ws = tmp_path / "ws"
    state = run_flow(ws)
    assert state.is_completed(), state.message
    report = session_status(ws)
    assert report["session"]["complete"]
    assert runs(ws) == {p.key: 1 for p in PHASES}
    assert [(a["n"], a["status"]) for a in report["attempts"]] == [(1, "FAILED"), (2, "SUCCESS"), (3, "SUCCESS")]
    assert "NameError" in report["attempts"][0]["error"]
    assert report["attempts"][1]["fix_applied"]
    metrics = json.loads((ws / "results/metrics.json").read_text())
    assert report["attempts"][1]["metrics"]["slope_gaussian"] == metrics["slope_gaussian"]
    assert abs(metrics["slope_gaussian"] + 0.5) < 0.05
    report_md = (ws / "REPORT.md").read_text()
    assert str(metrics["slope_gaussian"]) in report_md
    assert report_md.startswith("# Report: Averaging noisy measurements")
    assert "The results above are those of attempt 2." in report_md
    for phase, turns in SCRIPT_TURNS.items():
        assert len(replies(ws, phase)) == turns, phase
    text = (ws / "STATE.md").read_text()
    assert list(parse_state_md(text)) == [
        "Session Title", "Current State", "Worklog", "Research Specification", "Files and Resources",
        "Workflow", "Experiment Design", "Experiment Attempts", "Experiment Results", "Learnings"]
    assert "### Attempt 1\n- Status: FAILED" in text
    assert_table_matches_tasks(ws, state)
    usage = report["usage"]
    assert usage["input_tokens"] == sum(p["usage"]["input_tokens"] for p in report["phases"]) > 0


def test_resuming_a_finished_session_does_nothing(tmp_path, prefect_api):
    ws = tmp_path / "ws"
    assert run_flow(ws).is_completed()
    before = (ws / "STATE.md").read_text()
    result = labrun("resume", str(ws))
    assert result.returncode == 0, result.stderr
    assert "already complete" in result.stdout and "nothing to do" in result.stdout
    assert (ws / "STATE.md").read_text() == before
    # A fresh flow run (a deployment re-run, a scheduled run) finds nothing to do and writes nothing.
    again = resume_flow(ws)
    assert again.is_completed()
    assert task_states(again) == {}
    assert runs(ws) == {p.key: 1 for p in PHASES}
    assert (ws / "STATE.md").read_text() == before


def test_exception_mid_phase_then_resume_redoes_nothing_finished(tmp_path, prefect_api, monkeypatch):
    ws = tmp_path / "ws"
    monkeypatch.setenv("LABRUN_SCRIPTED_FAULTS", "raise@implementation:2")
    failed = run_flow(ws)
    assert failed.is_failed()
    table = phase_table((ws / "STATE.md").read_text())
    assert table == {"planning": "DONE", "setup": "DONE", "implementation": "FAILED",
                     "experiments": "pending", "analysis": "pending", "documentation": "pending"}
    assert_table_matches_tasks(ws, failed)
    assert "injected failure" in session_status(ws)["phases"][2]["error"]
    assert len(replies(ws, "implementation")) == 1  # turn 1 was saved; turn 2 never answered

    resumed = resume_flow(ws)
    assert resumed.is_completed()
    assert runs(ws) == {"planning": 1, "setup": 1, "implementation": 2, "experiments": 1,
                        "analysis": 1, "documentation": 1}
    for phase, turns in SCRIPT_TURNS.items():
        assert len(replies(ws, phase)) == turns, phase  # no completed turn repeated
    convo = Conversation.latest(ws / ".labrun/phases/implementation")
    assert len(Conversation.files(ws / ".labrun/phases/implementation")) == 1
    notes = convo.of(UserRecord)
    assert "interrupted" in notes[-1].texts()[0].lower()
    assert_table_matches_tasks(ws, resumed)


def _kill(proc) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def test_kill_9_mid_turn_then_resume(tmp_path, prefect_api, cli):
    ws = tmp_path / "ws"
    marker = ws / ".labrun/faults/experiments-3.reached"
    proc = start_labrun("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted",
                        env={"LABRUN_SCRIPTED_FAULTS": "hang@experiments:3"})
    wait_for(marker.exists, what="the scripted agent to hang in experiments turn 3")
    _kill(proc)
    table = phase_table((ws / "STATE.md").read_text())
    assert table["implementation"] == "DONE" and table["experiments"] == "IN PROGRESS"
    assert [a["status"] for a in session_status(ws)["attempts"]] == ["FAILED"]
    assert len(replies(ws, "experiments")) == 2

    result = cli("resume", str(ws))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert runs(ws) == {"planning": 1, "setup": 1, "implementation": 1, "experiments": 2,
                        "analysis": 1, "documentation": 1}
    for phase, turns in SCRIPT_TURNS.items():
        assert len(replies(ws, phase)) == turns, phase
    assert [(a["n"], a["status"]) for a in session_status(ws)["attempts"]] == [(1, "FAILED"), (2, "SUCCESS"), (3, "SUCCESS")]


def test_kill_9_mid_attempt_marks_it_interrupted_and_kills_its_processes(tmp_path, prefect_api, cli):
    ws = tmp_path / "ws"
    marker = ws / ".labrun/faults/experiments-1.reached"
    proc = start_labrun("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted",
                        env={"LABRUN_SCRIPTED_FAULTS": "hang-attempt@experiments:1"})
    wait_for(marker.exists, what="the first attempt to start")
    wait_for(lambda: attempt_group(ws), what="the attempt's pgid")
    _kill(proc)
    pgid = attempt_group(ws)
    assert group_alive(pgid)  # the attempt outlives the engine (tests/test_outlive.py)...
    kill_attempt_supervisor(ws)  # ...but not its supervisor, as a reboot would end it
    if bubblewrap():  # the sandbox dies with its supervisor (its lifeline)
        wait_for(lambda: not group_alive(pgid), timeout=10, what="the attempt's command to die with its supervisor")
    assert "- Status: RUNNING" in (ws / "STATE.md").read_text()

    result = cli("resume", str(ws))
    assert result.returncode == 0, result.stderr
    assert not group_alive(pgid)
    attempts = session_status(ws)["attempts"]
    # The interrupted attempt is not a failure: the agent runs it again, unfixed, and it fails.
    assert [(a["n"], a["status"]) for a in attempts] == [(1, "INTERRUPTED"), (2, "FAILED"), (3, "SUCCESS"),
                                                          (4, "SUCCESS")]  # 4: the analysis's figures
    assert "- Status: RUNNING" not in (ws / "STATE.md").read_text()
    # Its task run, left Running by the killed engine, is Crashed in Prefect too.
    from prefect.client.orchestration import get_client

    killed = json.loads((ws / ".labrun/state.json").read_text())["attempts"][0]["task_run"]
    with get_client(sync_client=True) as client:
        assert client.read_task_run(killed).state.type.value == "CRASHED"
    convo = Conversation.latest(ws / ".labrun/phases/experiments")
    first_result = convo.of(ToolResultRecord)[0]
    assert first_result.is_error and "cut off" in first_result.content
    # The model was not asked turn 1 again: one reply per turn, plus the redone run.
    assert len(replies(ws, "experiments")) == SCRIPT_TURNS["experiments"] + 1
    assert replies(ws, "experiments")[0].content[1]["input"]["command"].endswith(scripted.COMMAND)
    assert runs(ws)["implementation"] == 1
    assert "The results above are those of attempt 3." in (ws / "REPORT.md").read_text()


def test_a_deleted_output_makes_its_phase_and_the_later_ones_run_again(tmp_path, prefect_api):
    ws = tmp_path / "ws"
    assert run_flow(ws).is_completed()
    (ws / "src/analyze.py").unlink()  # written by implementation
    again = resume_flow(ws)
    assert again.is_completed()
    assert runs(ws) == {"planning": 1, "setup": 1, "implementation": 2, "experiments": 2,
                        "analysis": 2, "documentation": 2}
    assert (ws / "src/analyze.py").exists()
    attempts = session_status(ws)["attempts"]
    # The rerun's first attempt repeats attempt 1's failed command, but the workspace is not as
    # attempt 1 found it (analysis and documentation wrote files since): it runs, and fails
    # (3 and 6 draw the analysis's figures).
    assert [(a["n"], a["status"]) for a in attempts] == [(1, "FAILED"), (2, "SUCCESS"), (3, "SUCCESS"),
                                                          (4, "FAILED"), (5, "SUCCESS"), (6, "SUCCESS")]


def test_a_changed_output_reruns_only_from_its_phase(tmp_path, prefect_api):
    ws = tmp_path / "ws"
    assert run_flow(ws).is_completed()
    (ws / "REPORT.md").write_text("edited by hand\n")
    assert resume_flow(ws).is_completed()
    assert runs(ws) == {"planning": 1, "setup": 1, "implementation": 1, "experiments": 1,
                        "analysis": 1, "documentation": 2}
    assert "edited by hand" not in (ws / "REPORT.md").read_text()


def test_a_second_engine_on_one_workspace_is_refused(tmp_path, prefect_api):
    from labrun.workspace import Workspace

    ws = tmp_path / "ws"
    assert run_flow(ws).is_completed()
    (ws / "REPORT.md").unlink()
    holder = Workspace(ws)
    holder.lock()
    try:
        result = labrun("resume", str(ws))
    finally:
        holder.unlock()
    assert result.returncode != 0
    assert "another labrun process" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_invalid_idea_is_refused_before_anything_runs(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("idea:\n  title: short\n  domain: x\n  hypothesis: too short\n")
    ws = tmp_path / "ws"
    result = labrun("run", str(bad), "--workspace", str(ws))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert f"{bad}:2: idea.title" in result.stderr.replace("\n", "")
    assert not ws.exists()
    check = labrun("check", str(bad))
    assert check.returncode == 2 and "idea.hypothesis" in check.stderr


def test_another_idea_in_a_used_workspace_is_refused(tmp_path, prefect_api, cli):
    ws = tmp_path / "ws"
    assert run_flow(ws).is_completed()
    other = tmp_path / "other.yaml"
    shutil.copy(DEMO_IDEA, other)
    with open(other, "a") as f:
        f.write("\n# a different idea file\n")
    result = cli("run", str(other), "--workspace", str(ws))
    assert result.returncode == 2
    assert "already holds a session of another idea" in result.stderr
    # The same idea on its finished session: answered from the files, as `labrun resume` does.
    same = cli("run", str(DEMO_IDEA), "--workspace", str(ws))
    assert same.returncode == 0 and "nothing to do" in same.stdout
    (ws / "REPORT.md").unlink()
    again = cli("run", str(DEMO_IDEA), "--workspace", str(ws))
    assert again.returncode == 0 and "resuming" in again.stdout, again.stderr
    assert (ws / "REPORT.md").is_file()
