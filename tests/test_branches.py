"""`labrun rerun DIR --from PHASE`: branches of a session on a real (embedded) Prefect, with
the scripted agent.

One finished session is made once and copied for each test (a copy is the same session:
same id, its own cached results). The checks: which phases really ran (Prefect's task
states, the provider's bill), what the archive of the earlier branch holds, that kills at
every step of a rerun resume on its branch, that the retry rule sees the earlier branch's
failed attempt, and `labrun diff` of two branches whose metrics differ.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from support import DEMO_IDEA, labrun, status, wait_for
from labrun.agents.scripted import BUG, FIX
from labrun.state import parse_state_md, phase_table

EARLIER = ("planning", "setup", "implementation", "experiments")


@pytest.fixture(scope="module")
def finished(tmp_path_factory, prefect_api) -> Path:
    from labrun.flows.session import research_session

    ws = tmp_path_factory.mktemp("finished") / "ws"
    assert research_session(str(DEMO_IDEA), str(ws), "scripted", return_state=True).is_completed()
    return ws


@pytest.fixture
def ws(finished, tmp_path) -> Path:
    copy = tmp_path / "ws"
    shutil.copytree(finished, copy, symlinks=True)
    return copy


def rerun_flow(ws: Path, from_phase: str, **kwargs):
    from labrun.flows.session import research_session

    return research_session(None, str(ws), from_phase=from_phase, return_state=True, **kwargs)


def billed_phases(ws: Path) -> list[str]:
    """The phase of every model call the stand-in provider billed, in order."""
    lines = (ws / ".labrun/faults/billed.jsonl").read_text().splitlines()
    return [json.loads(line)["phase"] for line in lines]


def task_state_names(flow_state) -> dict[str, str]:
    """Phase key → the name of its task run's final state in this flow run ("Cached", ...).
    Task run states reach the server as events, a moment after the flow run ends: wait."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    def read() -> dict[str, str]:
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[flow_state.state_details.flow_run_id])))
        return {t.name.split("-", 1)[1]: t.state.name if t.state and t.state.is_final() else ""
                for t in runs if t.name[0].isdigit() and "-" in t.name}

    wait_for(lambda: len(found := read()) == 6 and all(found.values()), timeout=30,
             what="the phase task runs' final states")
    return read()


def one_line_error(result, *needles: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


def test_a_rerun_from_analysis_reuses_the_earlier_phases_and_keeps_the_first_branch(ws):
    before = billed_phases(ws)
    state_md_before = (ws / "STATE.md").read_text()
    learnings = parse_state_md(state_md_before)["Learnings"]
    state = rerun_flow(ws, "analysis", note="the analysis again")
    assert state.is_completed(), state.message

    tasks = task_state_names(state)
    assert [tasks[k] for k in EARLIER] == ["Cached"] * 4, tasks
    assert tasks["analysis"] == tasks["documentation"] == "Completed", tasks
    assert billed_phases(ws)[: len(before)] == before
    assert set(billed_phases(ws)[len(before):]) == {"analysis", "documentation"}

    report = status(ws)
    assert report["session"]["branch"] == 2 and report["session"]["complete"]
    assert [p["runs"] for p in report["phases"]] == [1] * 6  # analysis and documentation: once on branch 2
    rows = report["branches"]
    assert [(b["n"], b["from_phase"], b["current"], b["note"]) for b in rows] == [
        (1, "planning", False, ""), (2, "analysis", True, "the analysis again")]
    assert rows[0]["ended_at"] and rows[1]["ended_at"] is None
    # The session's usage is everything billed, both branches; each branch's is its own.
    assert report["usage"]["input_tokens"] == sum(
        json.loads(line)["input_tokens"] for line in (ws / ".labrun/faults/billed.jsonl").read_text().splitlines())
    assert rows[0]["usage"]["input_tokens"] + rows[1]["usage"]["input_tokens"] == report["usage"]["input_tokens"]
    assert rows[1]["usage"]["input_tokens"] == sum(p["usage"]["input_tokens"] for p in report["phases"][4:])

    # Branch 1 is kept whole: its journals, outputs, sections, STATE.md and status.
    kept = ws / ".labrun/branches/1"
    for phase in ("analysis", "documentation"):
        assert (kept / "phases" / phase / "conversation-001.jsonl").is_file()
        assert not (kept / "phases" / phase / "conversation-002.jsonl").exists()
    assert (kept / "STATE.md").read_text() == state_md_before
    assert (kept / "files/REPORT.md").is_file() and (kept / "files/results/analysis.md").is_file()
    assert json.loads((kept / "branch.json").read_text())["sections"] == {"learnings": learnings}
    old = status(ws, "--branch", "1")
    assert old["session"]["branch"] == 1 and old["session"]["model"] is None
    assert [p["runs"] for p in old["phases"]] == [1] * 6
    # The workspace shows branch 2: its own journals, and STATE.md's Branches section.
    for phase in ("analysis", "documentation"):
        assert len(list((ws / ".labrun/phases" / phase).glob("conversation-*.jsonl"))) == 1
    text = (ws / "STATE.md").read_text()
    assert list(parse_state_md(text))[:4] == ["Session Title", "Current State", "Branches", "Worklog"]
    lines = parse_state_md(text)["Branches"].splitlines()
    assert lines[0].startswith("- Branch 1: from planning") and "ended" in lines[0]
    assert lines[1].startswith("- Branch 2 (current): from analysis") and lines[1].endswith("note: the analysis again")
    assert "- Branch: 1" in text  # attempts are marked with their branch
    assert "branch 2 started from phase analysis" in parse_state_md(text)["Worklog"]

    listing = labrun("branches", str(ws))
    assert listing.returncode == 0, listing.stderr
    current = [line for line in listing.stdout.splitlines() if "│ 2 *" in line]
    assert len(current) == 1 and "│ analysis" in current[0], listing.stdout

    # The same request again continues branch 2 (all cached); another note is a new branch.
    again = rerun_flow(ws, "analysis", note="the analysis again")
    assert again.is_completed() and set(task_state_names(again).values()) == {"Cached"}
    assert status(ws)["session"]["branch"] == 2
    third = rerun_flow(ws, "documentation", note="the write-up once more")
    assert third.is_completed()
    rows = status(ws)["branches"]
    assert [b["from_phase"] for b in rows] == ["planning", "analysis", "documentation"]
    assert task_state_names(third)["analysis"] == "Cached"  # branch 2's analysis, reused


def _kill(proc) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.mark.parametrize("where", ["branch-archived", "branch-recorded", "analysis-turn"])
def test_a_rerun_killed_at_any_step_resumes_on_its_branch(ws, where, forker, cli):
    billed_before = billed_phases(ws)
    args = ("rerun", str(ws), "--from", "experiments", "--note", "killed")
    if where == "analysis-turn":
        proc = forker.start(list(args), env={**os.environ, "LABRUN_SCRIPTED_FAULTS": "hang@analysis:1"}, whole_env=True)
        wait_for((ws / ".labrun/faults/analysis-1.reached").exists, what="the rerun to hang in analysis")
        _kill(proc)
        assert phase_table((ws / "STATE.md").read_text())["analysis"] == "IN PROGRESS"
        # A rerun from a phase that never finished is refused, saying what to do instead.
        refused = labrun("rerun", str(ws), "--from", "analysis")
        one_line_error(refused, "phase analysis has not finished", f"labrun resume {ws}")
    else:
        killed = forker.run(list(args), env={"LABRUN_CRASH_AT": f"{where}:1"})
        assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (ws / ".labrun/branches/1/branch.json").is_file()

    result = cli("resume", str(ws))
    assert result.returncode == 0, result.stderr
    report = status(ws)
    assert report["session"]["complete"] and report["session"]["branch"] == 2
    assert [b["note"] for b in report["branches"]] == ["", "killed"]
    runs = {p["key"]: p["runs"] for p in report["phases"]}
    assert runs == {"planning": 1, "setup": 1, "implementation": 1, "experiments": 1,
                    "analysis": 2 if where == "analysis-turn" else 1, "documentation": 1}
    billed = billed_phases(ws)
    assert billed[: len(billed_before)] == billed_before
    assert not set(billed[len(billed_before):]) & {"planning", "setup", "implementation"}
    assert billed[len(billed_before):].count("experiments") == 4  # the rerun's turns, each once
    assert [a["branch"] for a in report["attempts"]][:3] == [1, 1, 1]  # two experiments, one analysis
    assert {a["branch"] for a in report["attempts"][3:]} == {2}
    # Branch 1 was archived once and whole; the workspace holds branch 2's journals only.
    assert not list((ws / ".labrun/branches").glob(".new-*"))
    assert len(list((ws / ".labrun/branches/1/phases/experiments").glob("conversation-*.jsonl"))) == 1
    assert len(list((ws / ".labrun/phases/experiments").glob("conversation-*.jsonl"))) == 1
    assert report["usage"]["input_tokens"] == sum(
        json.loads(line)["input_tokens"] for line in (ws / ".labrun/faults/billed.jsonl").read_text().splitlines())


def test_a_rerun_from_experiments_sees_the_failed_attempt_of_the_earlier_branch(ws):
    # Put the bug back by hand: the rerun takes the code as it stands, so its first command
    # is the one attempt 1 ran, on the same sources.
    code = ws / "src/experiment.py"
    code.write_text(code.read_text().replace(FIX, BUG))
    assert rerun_flow(ws, "experiments").is_completed()
    report = status(ws)
    assert [(a["n"], a["status"], a["branch"]) for a in report["attempts"]] == [
        (1, "FAILED", 1), (2, "SUCCESS", 1), (3, "SUCCESS", 1), (4, "SUCCESS", 2), (5, "SUCCESS", 2)]  # 3, 5: analysis
    worklog = parse_state_md((ws / "STATE.md").read_text())["Worklog"]
    assert "src/experiment.py" in worklog.split("taken as they stand for branch 2:")[1].splitlines()[0]
    assert ("run_experiment refused: attempt 1 (branch 1) already ran this command on these same "
            "files and failed") in worklog
    assert report["attempts"][3]["fix_applied"]
    # The run list counts branch 2's own attempt: branch 1's were made in a phase it reran.
    assert [(r["id"], r["succeeded"], r["attempts"]) for r in report["plan"]["runs"]] == [("R1", [4], [4])]
    assert all(c["status"] == "met" for c in report["plan"]["criteria"])
    # The archive holds the code as it stood when the rerun began; branch 2 fixed it again.
    assert BUG in (ws / ".labrun/branches/1/files/src/experiment.py").read_text()
    assert FIX in code.read_text()


def test_an_environment_a_replaced_phase_created_is_archived_whole_and_leaves_the_workspace(ws):
    # A snapshot holds a virtual environment as one entry, `env/` (labrun.snapshot).
    env = ws / "env"
    (env / "lib/python3.11/site-packages/pkg").mkdir(parents=True)
    (env / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (env / "lib/python3.11/site-packages/pkg/__init__.py").write_text("VALUE = 1\n")
    (env / "bin").mkdir()
    (env / "bin/python").symlink_to("/usr/bin/python3")
    manifest_file = ws / ".labrun/phases/experiments/manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["files"]["env/"] = "env:made-by-experiments"
    manifest_file.write_text(json.dumps(manifest))
    inode = os.stat(env / "pyvenv.cfg").st_ino

    assert rerun_flow(ws, "experiments").is_completed()
    kept = ws / ".labrun/branches/1/files/env"
    assert os.stat(kept / "pyvenv.cfg").st_ino != inode  # copied: a link the agent kept cannot change the archive
    assert (kept / "lib/python3.11/site-packages/pkg/__init__.py").read_text() == "VALUE = 1\n"
    assert os.readlink(kept / "bin/python") == "/usr/bin/python3"
    assert not env.exists()


def test_diff_of_two_branches_with_different_metrics(ws):
    code = ws / "src/experiment.py"
    code.write_text(code.read_text().replace("TRIALS = 1000", "TRIALS = 300"))
    assert rerun_flow(ws, "experiments", note="fewer trials").is_completed()

    result = labrun("diff", str(ws), "1", "2", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    metrics = {m["metric"]: (m["a"], m["b"]) for m in report["metrics"] if m["file"] == "results/metrics.json"}
    assert metrics["trials"] == (1000, 300)
    assert metrics["seed"] == (0, 0)
    assert metrics["slope_gaussian"][0] != metrics["slope_gaussian"][1]
    files = {f["path"]: f for f in report["files"]}
    assert files["planning.md"]["status"] == "same"
    assert files["REPORT.md"]["status"] == "changed"
    assert any(line.startswith("-") and str(metrics["slope_gaussian"][0]) in line for line in files["REPORT.md"]["diff"])
    assert any(line.startswith("+") and str(metrics["slope_gaussian"][1]) in line for line in files["REPORT.md"]["diff"])

    shown = labrun("diff", str(ws), "1", "2")
    assert shown.returncode == 0, shown.stderr
    row = next(line for line in shown.stdout.splitlines() if " trials " in line)
    assert "1000" in row and "300" in row and "-700" in row

    one_line_error(labrun("diff", str(ws), "1", "7"), "there is no branch 7", "branches 1 to 2")
    one_line_error(labrun("status", str(ws), "--branch", "3"), "there is no branch 3")


def test_bad_rerun_requests_get_one_line_each(ws):
    from labrun.workspace import Workspace

    one_line_error(labrun("rerun", str(ws), "--from", "analyis"), "unknown phase 'analyis' (did you mean 'analysis'?)",
                   "planning, setup, implementation, experiments, analysis, documentation")
    holder = Workspace(ws)
    holder.lock()
    try:
        one_line_error(labrun("rerun", str(ws), "--from", "analysis"), "another labrun process")
    finally:
        holder.unlock()
    one_line_error(labrun("branches", str(ws / "nowhere")), "no labrun session here")
    assert not (ws / ".labrun/branches").exists()
    assert status(ws)["session"]["branch"] == 1


def test_diff_reads_what_an_earlier_branch_had_from_phases_it_kept(ws):
    """Branch 1 ran every phase; branch 2 reran from analysis (branch 1's archive keeps the
    analysis's and documentation's files); branch 3 reran from experiments. What experiments
    made in branch 1 was there too: `labrun diff 1 3` compares it, not "only in branch 3"."""
    assert rerun_flow(ws, "analysis", note="the analysis again").is_completed()
    assert rerun_flow(ws, "experiments", note="the experiments again").is_completed()

    result = labrun("diff", str(ws), "1", "3", "--json")
    assert result.returncode == 0, result.stderr
    files = {f["path"]: f["status"] for f in json.loads(result.stdout)["files"]}
    assert files and not [p for p, s in files.items() if s.startswith("only in")], files
