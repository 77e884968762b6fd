"""STATE.md's phase table follows Prefect's task states: it has one writer, called in the
order the flow walks its phases, and the engine is killed at every one of its transitions
(a phase's task started but not yet IN PROGRESS in the table; its task finished but not yet
DONE; failed but not yet FAILED). After each resume the table is compared with the Prefect
task states of that flow run."""

from __future__ import annotations

from pathlib import Path

from support import DEMO_IDEA, state_md_sections
from test_session import assert_table_matches_tasks, resume_flow, run_flow
from labrun.phase_registry import PHASES
from labrun.state import parse_state_md, phase_table
from labrun.status import session_status

KILLED = -9


def kill_at(forker, ws: Path, crash_at: str, faults: str = "") -> None:
    result = forker.run(["run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted"],
                        env={"LABRUN_CRASH_AT": crash_at, "LABRUN_SCRIPTED_FAULTS": faults})
    assert result.returncode == KILLED, f"{crash_at}: {result.returncode} {result.stderr[-2000:]}"
    assert list(parse_state_md((ws / "STATE.md").read_text())) == state_md_sections()


def test_killed_at_every_phase_table_transition_the_table_follows_the_task_states(tmp_path, forker, monkeypatch):
    ws = tmp_path / "ws"
    keys = [p.key for p in PHASES]
    kills = 0
    for i, key in enumerate(keys):
        kill_at(forker, ws, "phase-start:1")  # the finished phases are cache hits: this is phase i starting
        kill_at(forker, ws, f"phase-done:{i + 1}")  # after i cache hits, phase i's task finished
        kills += 2
        if i + 1 == len(keys):
            resumed = resume_flow(ws)
            assert resumed.is_completed(), resumed.message
        else:  # the resume finishes phase i, then the next one fails: DONE, FAILED and pending
            following = keys[i + 1]
            if following == "experiments":  # and once, killed before its FAILED is written
                kill_at(forker, ws, "phase-failed:1", faults=f"raise@{following}:1")
                kills += 1
            monkeypatch.setenv("LABRUN_SCRIPTED_FAULTS", f"raise@{following}:{2 if following == 'experiments' else 1}")
            resumed = resume_flow(ws)
            monkeypatch.delenv("LABRUN_SCRIPTED_FAULTS")
            assert resumed.is_failed()
            table = phase_table((ws / "STATE.md").read_text())
            assert table == {k: "DONE" if j <= i else "FAILED" if j == i + 1 else "pending"
                             for j, k in enumerate(keys)}, table
        assert_table_matches_tasks(ws, resumed)
    assert kills == 13
    assert session_status(ws)["session"]["complete"]


def test_a_phase_run_again_makes_the_ones_after_it_pending(tmp_path, prefect_api, monkeypatch):
    ws = tmp_path / "ws"
    assert run_flow(ws).is_completed()
    (ws / "src/analyze.py").unlink()  # implementation runs again, and every phase after it
    monkeypatch.setenv("LABRUN_SCRIPTED_FAULTS", "raise@experiments:1")
    resumed = resume_flow(ws)
    assert resumed.is_failed()
    table = phase_table((ws / "STATE.md").read_text())
    assert table == {"planning": "DONE", "setup": "DONE", "implementation": "DONE", "experiments": "FAILED",
                     "analysis": "pending", "documentation": "pending"}
    assert_table_matches_tasks(ws, resumed)
