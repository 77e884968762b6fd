"""The crash campaign: the same session, killed with SIGKILL again and again at seeded random
instants, and resumed each time, must end exactly as an uninterrupted run.

Each round picks a crash point and an arrival number at random (the seed fixes both):
in a model call, between a model reply and its tool results, during an attempt, during an
atomic write (STATE.md, state.json, a manifest: between the temp file and its rename), at
the end of a phase before Prefect commits its cached result, and inside that commit (Prefect's
own write of a phase's or attempt's result record, torn halfway). LABRUN_CRASH_SEEDS sets the
number of seeds (3 in CI; `LABRUN_CRASH_SEEDS=30 pytest tests/test_crash_campaign.py -s`
is the long run).
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

from support import DEMO_IDEA, labrun
from labrun.snapshot import workspace_files
from labrun.state import STATE_SECTIONS, parse_state_md, phase_table
from labrun.status import session_status

POINTS = {"model-call": 17, "reply-saved": 17, "attempt": 2, "atomic-write": 120, "phase-end": 6,
          "result-write": 8}
SEEDS = int(os.environ.get("LABRUN_CRASH_SEEDS", "3"))
KILLED = -9


def billed(ws: Path) -> tuple[int, int]:
    """What the stand-in provider billed: (input, output) tokens."""
    path = ws / ".labrun/faults/billed.jsonl"
    lines = [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []
    return sum(l["input_tokens"] for l in lines), sum(l["output_tokens"] for l in lines)


def check_invariants(ws: Path, seen: dict) -> None:
    if not (ws / ".labrun/state.json").exists():
        return  # killed before the session's first save: nothing was promised yet
    state = json.loads((ws / ".labrun/state.json").read_text())
    text = (ws / "STATE.md").read_text()
    assert list(parse_state_md(text)) == list(STATE_SECTIONS)
    table = phase_table(text)
    assert set(table.values()) <= {"pending", "IN PROGRESS", "DONE", "FAILED"}
    numbers = [int(n) for n in re.findall(r"^### Attempt (\d+)$", text, flags=re.M)]
    assert numbers == list(range(1, len(state["attempts"]) + 1)), "an attempt is duplicated or lost"
    running = [a["n"] for a in state["attempts"] if a["status"] == "RUNNING"]
    assert running in ([], [len(state["attempts"])]), "only an attempt cut off by this kill may read RUNNING"
    report = session_status(ws)
    usage = report["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == billed(ws)
    assert usage["input_tokens"] >= seen.get("input_tokens", 0), "usage went down"
    seen["input_tokens"] = usage["input_tokens"]
    for p in report["phases"]:
        if seen.get(("done", p["key"])) is not None:
            assert p["runs"] == seen[("done", p["key"])], f"finished phase {p['key']} was redone"
        if p["status"] == "DONE":
            seen.setdefault(("done", p["key"]), p["runs"])


def test_crash_campaign(tmp_path, prefect_api):
    reference = tmp_path / "reference"
    done = labrun("run", str(DEMO_IDEA), "--workspace", str(reference), "--agent", "scripted")
    assert done.returncode == 0, done.stderr
    expected = workspace_files(reference)

    kills = 0
    for seed in range(SEEDS):
        rng = random.Random(seed)
        ws = tmp_path / f"seed-{seed}"
        seen: dict = {}
        for _ in range(40):
            point = rng.choice(sorted(POINTS))
            crash_at = f"{point}:{rng.randint(1, POINTS[point])}"
            result = labrun("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted", env={"LABRUN_CRASH_AT": crash_at})
            assert result.returncode in (0, KILLED), f"seed {seed}, {crash_at}: {result.stderr}"
            assert "Traceback" not in result.stderr
            kills += result.returncode == KILLED
            check_invariants(ws, seen)
            if result.returncode == 0:
                break
        else:
            raise AssertionError(f"seed {seed}: the session never completed")
        report = session_status(ws)
        assert report["session"]["complete"]
        assert all(a["status"] != "RUNNING" for a in report["attempts"])
        assert [a["status"] for a in report["attempts"] if a["status"] != "INTERRUPTED"][-1] == "SUCCESS"
        assert workspace_files(ws) == expected, f"seed {seed}: the workspace differs from an uninterrupted run"
        again = labrun("resume", str(ws))
        assert again.returncode == 0 and "nothing to do" in again.stdout
    print(f"\ncrash campaign: {kills} kills survived over {SEEDS} seeds")
    assert kills >= SEEDS


def test_a_kill_inside_prefects_result_write_leaves_a_torn_record_that_costs_nothing(tmp_path, prefect_api):
    """The first record Prefect writes is planning's cached result: torn halfway, the process
    killed. Prefect reads a torn record as no record; the phase's journal says it finished,
    so the resume takes its result from there without asking the model again."""
    ws = tmp_path / "ws"
    killed = labrun("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted",
                    env={"LABRUN_CRASH_AT": "result-write:1"})
    assert killed.returncode == KILLED, killed.stderr
    [record] = (ws / ".labrun/results").iterdir()
    try:
        json.loads(record.read_bytes())
        raise AssertionError(f"{record.name} was written whole")
    except ValueError:
        pass  # torn
    planning_calls = billed_calls(ws, "planning")
    resumed = labrun("resume", str(ws))
    assert resumed.returncode == 0, resumed.stderr
    report = session_status(ws)
    assert report["session"]["complete"]
    assert [p["runs"] for p in report["phases"]] == [2, 1, 1, 1, 1, 1]  # planning's 2nd found it done
    assert billed_calls(ws, "planning") == planning_calls, "planning asked the model again"
    assert billed(ws) == tuple(report["usage"][k] for k in ("input_tokens", "output_tokens"))
    json.loads(record.read_bytes())  # written again, whole


def billed_calls(ws: Path, phase: str) -> int:
    lines = (ws / ".labrun/faults/billed.jsonl").read_text().splitlines()
    return sum(json.loads(line)["phase"] == phase for line in lines)
