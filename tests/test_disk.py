"""A full disk, on a real small filesystem (a tmpfs; mounting one needs root): the session
stops before its next step with one clear line, keeps its record whole, and goes on once
space is freed. An attempt that fills the disk itself is recorded FAILED, saying so."""

from __future__ import annotations

import json
import subprocess

import pytest

from support import DEMO_IDEA, labrun, tmpfs
from labrun import workspace
from labrun.session import Session
from labrun.state import phase_table
from labrun.phases.phase import toolbox
from labrun.workspace import DiskFull
from labrun.phase_registry import BY_KEY, DEFAULT

FLOOR_MB = 8


@pytest.fixture
def small_disk(tmp_path):
    with tmpfs(tmp_path / "disk", "size=32m") as mount:
        yield mount


def fill(disk, leave_mb: float):
    """A file that leaves about `leave_mb` free on `disk`."""
    filler = disk / "filler.bin"
    free = workspace.Workspace(disk).free_mb()
    subprocess.run(["fallocate", "-l", f"{int((free - leave_mb) * 2**20)}", str(filler)], check=True)
    return filler


def test_a_nearly_full_disk_stops_the_session_in_one_line_and_it_resumes_once_freed(small_disk, prefect_api):
    ws = small_disk / "ws"
    env = {"LABRUN_MIN_FREE_MB": str(FLOOR_MB)}
    filler = fill(small_disk, FLOOR_MB / 2)

    stopped = labrun("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted", env=env)
    assert stopped.returncode == 1, stopped.stderr
    assert "Traceback" not in stopped.stderr
    assert f"MB free on its disk, below labrun's floor of {FLOOR_MB} MB (LABRUN_MIN_FREE_MB)" in stopped.stderr
    assert f"labrun resume {ws}" in stopped.stderr
    table = phase_table((ws / "STATE.md").read_text())
    assert table["planning"] == "FAILED" and all(s == "pending" for k, s in table.items() if k != "planning")
    assert not list((ws / ".labrun/phases").glob("*/conversation-*.jsonl")), "a phase began on a full disk"

    filler.unlink()
    resumed = labrun("resume", str(ws), env=env)
    assert resumed.returncode == 0, resumed.stderr
    status = json.loads(labrun("status", str(ws), "--json").stdout)
    assert status["session"]["complete"]
    assert [(p["key"], p["runs"]) for p in status["phases"]] == [(k, 1) for k in DEFAULT]


def test_an_attempt_that_fills_the_disk_is_recorded_failed_and_the_next_step_waits(small_disk, prefect_api,
                                                                                  monkeypatch):
    monkeypatch.setenv("LABRUN_MIN_FREE_MB", str(FLOOR_MB))
    session = Session.open(small_disk / "ws", DEMO_IDEA, "scripted")
    try:
        assert session.ws.reserve.stat().st_size == workspace.RESERVE_BYTES
        box = toolbox(session, BY_KEY["experiments"])
        result = box.call("run_experiment", {"command": "head -c 100M /dev/zero > big.bin", "purpose": "fill"})
        assert "Attempt 1: FAILED" in result.content and "the disk filled up" in result.content
        [attempt] = session.state.attempts
        assert attempt.status == "FAILED" and "the disk filled up" in attempt.error
        # the record was written whole, on the room the reserve gave up
        assert not session.ws.reserve.exists()
        saved = json.loads(session.ws.state_file.read_text())
        assert saved["attempts"][0]["status"] == "FAILED"
        assert "### Attempt 1" in (session.ws.root / "STATE.md").read_text()
        with pytest.raises(DiskFull, match="free some space, then `labrun resume"):
            box.call("bash", {"command": "echo next"})
    finally:
        session.close()

    (small_disk / "ws" / "big.bin").unlink()
    session = Session.open(small_disk / "ws")
    try:
        assert session.ws.reserve.exists()  # taken back on the next open
        retry = toolbox(session, BY_KEY["experiments"]).call(
            "run_experiment", {"command": "head -c 1M /dev/zero > small.bin", "purpose": "fits",
                               "fix_applied": "write 1 MB, not 100"})
        assert "Attempt 2: SUCCESS" in retry.content
    finally:
        session.close()
