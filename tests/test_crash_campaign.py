"""The crash campaign: sessions of both model backends, killed with SIGKILL again and again
at seeded random instants and resumed each time, must end exactly as uninterrupted runs.

Each round picks a crash point and an arrival number at random (the seed fixes both):
inside a model call (the request out, its reply coming), after a reply arrived and before
its journal record (the one window where a billed reply can be lost), between a reply and
its tool results, during an attempt (its command runs on under its supervisor), while a resume re-attaches
to one, after one ended and before its engine judged it, during the engine's rerun of one (reproduction), while the engine checks
a claim, while it renders REPORT.md's engine section,
during an atomic write (STATE.md, state.json, a manifest: between the temp file and its
rename), at every phase-table write, at the end of a phase before Prefect commits its cached
result, and inside that commit (Prefect's own write of a result record, torn halfway). The scripted agent is one backend; the Anthropic
backend, the real SDK against the fake Messages API with `tests/auto_responder.py` playing
the model, is the other. Every other scripted session runs its successful attempt in the
background (the scripted agent's `background-attempt` mode: it follows the attempt over
several turns), so the same points land while that attempt runs, and the test itself kills the
engine once at a seeded instant while it runs; its command notes each of its starts, none twice.

After every kill: STATE.md parses, every attempt appears once and only the last may read
RUNNING, no process of the engine's outlives it but an attempt's command, which runs to its end, no finished phase is redone, usage never
goes down, and labrun's usage is what the API billed, less the replies lost in a kill (at
most one per kill, and only in those two windows; each one counted, printed, and noted in
the Worklog by the resume). Kills are cheap: one shared Prefect server, and every engine a
fork of one process that imported labrun once (`tests/engine_forker.py`).
`LABRUN_CRASH_SEEDS` sets the sessions per backend (2 in CI, at least 26 kills each;
`LABRUN_CRASH_SEEDS=30 pytest tests/test_crash_campaign.py -s` is the long run).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from auto_responder import IDEA, AutoResearcher  # noqa: E402
from engine_forker import ForkedRun  # noqa: E402
from fake_messages_api import FakeMessagesAPI  # noqa: E402
from support import DEMO_IDEA, running, state_md_sections, wait_for  # noqa: E402

from labrun.agents.scripted import SLOW_ATTEMPT_S, SLOW_ATTEMPT_STARTS  # noqa: E402
from labrun.journal import Conversation, ReplyRecord  # noqa: E402
from labrun.snapshot import workspace_files  # noqa: E402
from labrun.state import parse_state_md, phase_table  # noqa: E402
from labrun.status import session_status  # noqa: E402

POINTS = {"model-call": 4, "reply-received": 4, "reply-saved": 4, "attempt": 1, "attempt-ended": 2,
          "reproduction": 1, "atomic-write": 24,
          "phase-start": 2, "phase-done": 4, "phase-end": 2, "result-write": 3, "claims": 2, "rendering": 2}
"""Crash point → the largest arrival number drawn (small, so that most rounds kill). Not
`attempt-reattached`, which only a resume after a kill mid-attempt reaches: drawn at random,
it ended most sessions unkilled (tests/test_outlive.py kills there on purpose)."""
OUTSIDE = "outside, the attempt in the background"
"""The test's own kill, from outside, at a seeded instant while a background attempt runs:
whatever the engine does then (a model call, a write, following the attempt)."""
LOSSY = {"model-call", "reply-received", OUTSIDE}
BACKGROUND = {"LABRUN_SCRIPTED_FAULTS": "background-attempt@experiments:3"}
SEEDS = int(os.environ.get("LABRUN_CRASH_SEEDS", "2"))
KILLS_PER_SESSION = 13
KILLED = -9
TOKENS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
HISTORY = "## How the run went"
"""The scripted REPORT.md's account of the attempts as they went: after a kill it rightly
names the interrupted ones, so it is the one part that differs from an uninterrupted run."""


class Backend:
    """How to run, and what the provider billed, for one backend."""

    name: str

    def __init__(self, tmp: Path):
        self.tmp = tmp

    def idea(self) -> Path: ...

    def env(self) -> dict[str, str]:
        return {}

    def billed(self, ws: Path) -> list[tuple[int, ...]]: ...

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class Scripted(Backend):
    name = "scripted"

    def idea(self) -> Path:
        return DEMO_IDEA

    def billed(self, ws: Path) -> list[tuple[int, ...]]:
        path = ws / ".labrun/faults/billed.jsonl"
        lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return [tuple(line[k] for k in TOKENS) for line in lines]


class Anthropic(Backend):
    name = "anthropic"

    def idea(self) -> Path:
        path = self.tmp / "idea.yaml"
        path.write_text(IDEA)
        return path

    def start(self) -> None:
        self.api = FakeMessagesAPI(default=AutoResearcher(), cache_accounting=True).start()

    def stop(self) -> None:
        self.api.stop()

    def env(self) -> dict[str, str]:
        return {"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": self.api.url}

    def billed(self, ws: Path) -> list[tuple[int, ...]]:
        return [tuple(b["usage"][k] for k in TOKENS) for b in self.api.billed]


def journaled(ws: Path) -> list[tuple[int, ...]]:
    """The usage of every reply in the session's journals."""
    found = []
    for phase_dir in (ws / ".labrun/phases").glob("*"):
        for f in Conversation.files(phase_dir):
            found += [tuple(getattr(r.usage, k) for k in TOKENS) for r in Conversation(f, repair=False).of(ReplyRecord)]
    return found


def lost_replies(ws: Path, backend: Backend) -> int:
    """Billed replies that no journal holds; and nothing journaled that was not billed."""
    billed, kept = Counter(backend.billed(ws)), Counter(journaled(ws))
    assert not kept - billed, "a journaled reply was never billed"
    return sum((billed - kept).values())


def assert_started_once(ws: Path, attempts: list[dict], seed: int) -> None:
    """Each attempt of the lingering command whose supervisor started it noted one start in
    the workspace: none was started again, by a resume or anyone."""
    lingering = [a["n"] for a in attempts if SLOW_ATTEMPT_STARTS in a["command"]]
    started = [n for n in lingering if "started" in json.loads(
        (ws / f".labrun/attempts/attempt-{n:03d}.supervisor.json").read_text() or "{}")]
    assert started, f"seed {seed}: the background attempt never ran"
    assert (ws / SLOW_ATTEMPT_STARTS).read_text() == "started\n" * len(started), \
        f"seed {seed}: a command was started twice (attempts {lingering}, started {started})"


def assert_same_work(ws: Path, reference: Path, attempts: list[dict], seed: int) -> None:
    """The workspace holds what an uninterrupted run produced (but the notes of the background
    attempt's starts, `assert_started_once`); REPORT.md's history names this session's own attempts."""
    files, expected = workspace_files(ws), workspace_files(reference)
    files.pop(SLOW_ATTEMPT_STARTS, None)
    assert {k: v for k, v in files.items() if k != "REPORT.md"} == {k: v for k, v in expected.items() if k != "REPORT.md"}, \
        f"seed {seed}: the workspace differs from an uninterrupted run"
    report, wanted = ((root / "REPORT.md").read_text().partition(HISTORY) for root in (ws, reference))
    # an interruption numbers the attempts differently, and may leave a run with two that
    # succeeded (one whose reply a kill lost): the findings, the claims' values and the
    # verdicts are the same
    assert same_findings(report[0]) == same_findings(wanted[0]), \
        f"seed {seed}: REPORT.md's findings differ from an uninterrupted run's"
    if report[1]:
        told = [int(n) for n in re.findall(r"^- Attempt (\d+) ", report[2], flags=re.M)]
        ran = [a["n"] for a in attempts if a["run_id"] == "R1"]  # R1's, not the analysis's figures
        assert told == ran, f"seed {seed}: REPORT.md does not name the attempts as they went"


def same_findings(report: str) -> str:
    """REPORT.md with its attempts' numbers and counts taken out: in the engine's section, the
    claims' and the verdicts' rows (their values), not which attempts or how many."""
    engine = re.search(r"<!-- labrun:results -->.*?<!-- /labrun:results -->", report, re.S)
    rows = [line for line in (engine.group(0) if engine else "").splitlines() if re.match(r"\| (K|C)\d", line)]
    rows = [re.sub(r"\((?:mean of )?#[\d, #]+\)", "(#n)", row) for row in rows]
    prose = report.replace(engine.group(0), "") if engine else report
    return re.sub(r"(?<=#)\d+|(?<=attempt )\d+", "n", prose + "\n".join(rows))


def check_after_kill(ws: Path, seen: dict, point: str, backend: Backend) -> None:
    if not (ws / ".labrun/state.json").exists():
        return  # killed before the session's first save: nothing was promised yet
    # An attempt's command runs on to its end (the demo's take a few seconds); nothing else outlives the engine.
    wait_for(lambda: not running(str(ws)), timeout=30, what="the engine's commands to end")
    state = json.loads((ws / ".labrun/state.json").read_text())
    text = (ws / "STATE.md").read_text()
    assert list(parse_state_md(text)) == state_md_sections()
    assert set(phase_table(text).values()) <= {"pending", "IN PROGRESS", "DONE", "FAILED"}
    numbers = [int(n) for n in re.findall(r"^### Attempt (\d+)$", text, flags=re.M)]
    counts = {len(state["attempts"])}
    if point in ("atomic-write", OUTSIDE) and (ws / ".labrun/state.json.prev").exists():
        # killed between state.json's rename and STATE.md's: STATE.md shows the change before
        # (the previous copy's) until the engine starts again and writes it first thing
        counts.add(len(json.loads((ws / ".labrun/state.json.prev").read_text())["attempts"]))
    assert numbers in [list(range(1, n + 1)) for n in counts], "an attempt is duplicated or lost"
    running_now = [a["n"] for a in state["attempts"] if a["status"] == "RUNNING"]
    assert running_now in ([], [len(state["attempts"])]), "only an attempt cut off by this kill may read RUNNING"
    seen["in_background"] = seen.get("in_background", 0) + any(
        a["status"] == "RUNNING" and a.get("background") for a in state["attempts"])

    lost = lost_replies(ws, backend)
    assert lost - seen.get("lost", 0) in ((0, 1) if point in LOSSY else (0,)), f"{point}: replies lost"
    seen["lost"] = lost
    report = session_status(ws)
    kept = journaled(ws)
    assert tuple(report["usage"][k] for k in TOKENS) == tuple(sum(u[i] for u in kept) for i in range(len(TOKENS)))
    assert report["usage"]["input_tokens"] >= seen.get("input_tokens", 0), "usage went down"
    seen["input_tokens"] = report["usage"]["input_tokens"]
    for p in report["phases"]:
        if seen.get(("done", p["key"])) is not None:
            assert p["runs"] == seen[("done", p["key"])], f"finished phase {p['key']} was redone"
        if p["status"] == "DONE":
            seen.setdefault(("done", p["key"]), p["runs"])


@pytest.mark.parametrize("backend_class", [Scripted, Anthropic], ids=["scripted", "anthropic"])
def test_crash_campaign(tmp_path, forker, backend_class):
    backend = backend_class(tmp_path)
    idea = backend.idea()

    def run(ws: Path, crash_at: str | None = None, env: dict | None = None, kill_after: float | None = None):
        """`labrun run` to its end, or its crash point; `kill_after`: killed from outside that
        long after the background attempt's command started, if it still runs."""
        proc = forker.start(["run", str(idea), "--workspace", str(ws), "--agent", backend.name],
                            env={**backend.env(), "LABRUN_CRASH_AT": crash_at or "", **(env or {})})
        outside = kill_after is not None and kill_in_background(proc, ws, kill_after)
        out, err = proc.communicate(300)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), outside

    backend.start()
    try:
        done, _ = run(tmp_path / "reference")
        assert done.returncode == 0, done.stderr
        kills = lost = background_kills = 0
        seed = 0
        # A session that ends before its share of kills leaves the rest to another one.
        while seed < SEEDS or (kills < KILLS_PER_SESSION * SEEDS and seed < 4 * SEEDS):
            backend.stop()
            backend.start()  # a fresh provider: its bill is this session's
            rng = random.Random(f"{backend.name}-{seed}")
            ws = tmp_path / f"seed-{seed}"
            in_background = backend.name == "scripted" and seed % 2 == 1
            seen: dict = {}
            for round_ in range(60):
                point = rng.choice(sorted(POINTS))
                crash_at = f"{point}:{rng.randint(1, POINTS[point])}" if round_ < KILLS_PER_SESSION else None
                # until the background attempt has started: killed from outside while it runs
                kill_after = rng.uniform(0, SLOW_ATTEMPT_S - 1) \
                    if in_background and not (ws / SLOW_ATTEMPT_STARTS).exists() else None
                result, outside = run(ws, crash_at, BACKGROUND if in_background else None, kill_after)
                point = OUTSIDE if outside else point
                assert result.returncode in (0, KILLED), f"seed {seed}, {crash_at}: {result.stderr[-3000:]}"
                assert "Traceback" not in result.stderr, result.stderr
                if result.returncode == 0:
                    break
                kills += 1
                check_after_kill(ws, seen, point, backend)
            else:
                raise AssertionError(f"seed {seed}: the session never completed")
            report = session_status(ws)
            assert report["session"]["complete"]
            assert all(a["status"] != "RUNNING" for a in report["attempts"])
            assert [a["status"] for a in report["attempts"] if a["status"] != "INTERRUPTED"][-1] == "SUCCESS"
            assert_same_work(ws, tmp_path / "reference", report["attempts"], seed)
            if in_background:
                assert_started_once(ws, report["attempts"], seed)
                assert seen.get("in_background"), f"seed {seed}: no kill while the attempt ran in the background"
                background_kills += seen["in_background"]
            session_lost = lost_replies(ws, backend)
            notes = (ws / "STATE.md").read_text().count("if the API had answered it, that reply is lost")
            assert notes >= session_lost, "a lost reply went unreported"
            lost += session_lost
            again = forker.run(["resume", str(ws)], env={**backend.env(), **(BACKGROUND if in_background else {})})
            assert again.returncode == 0 and "nothing to do" in again.stdout
            seed += 1
    finally:
        backend.stop()
    print(f"\ncrash campaign, {backend.name}: {kills} kills survived over {seed} sessions "
          f"({background_kills} while an attempt ran in the background); "
          f"{lost} billed replies lost between the API's answer and the journal, each in one kill")
    assert kills >= KILLS_PER_SESSION * SEEDS


def kill_in_background(proc: ForkedRun, ws: Path, after_s: float) -> bool:
    """SIGKILL of the engine's process `after_s` after its background attempt's command
    started, if it still runs then (it may have reached its own crash point first): whether
    this killed it."""
    wait_for(lambda: (ws / SLOW_ATTEMPT_STARTS).exists() or proc.poll() is not None, timeout=300,
             what="the background attempt to start, or the engine to end")
    time.sleep(after_s)
    if proc.poll() is not None:
        return False
    try:
        proc.send_signal(signal.SIGKILL)
    except ProcessLookupError:  # it reached its crash point meanwhile
        return False
    return True


def test_a_kill_inside_prefects_result_write_leaves_a_torn_record_that_costs_nothing(tmp_path, forker):
    """The first record Prefect writes is planning's cached result: torn halfway, the process
    killed. Prefect reads a torn record as no record; the phase's journal says it finished,
    so the resume takes its result from there without asking the model again."""
    ws = tmp_path / "ws"
    args = ["run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted"]
    killed = forker.run(args, env={"LABRUN_CRASH_AT": "result-write:1"})
    assert killed.returncode == KILLED, killed.stderr
    [record] = (ws / ".labrun/results").iterdir()
    try:
        json.loads(record.read_bytes())
        raise AssertionError(f"{record.name} was written whole")
    except ValueError:
        pass  # torn
    planning_calls = billed_calls(ws, "planning")
    resumed = forker.run(["resume", str(ws)])
    assert resumed.returncode == 0, resumed.stderr
    report = session_status(ws)
    assert report["session"]["complete"]
    assert [p["runs"] for p in report["phases"]] == [2, 1, 1, 1, 1, 1]  # planning's 2nd found it done
    assert billed_calls(ws, "planning") == planning_calls, "planning asked the model again"
    assert lost_replies(ws, Scripted(tmp_path)) == 0
    json.loads(record.read_bytes())  # written again, whole


def billed_calls(ws: Path, phase: str) -> int:
    lines = (ws / ".labrun/faults/billed.jsonl").read_text().splitlines()
    return sum(json.loads(line)["phase"] == phase for line in lines)


def test_a_kill_during_reproduction_leaves_no_rerun_running_and_the_resume_reruns_it_from_a_fresh_copy(
        tmp_path, forker):
    """Killed as the engine's rerun of the demo's attempt starts: nothing of the rerun lives
    on; the resume finds the experiments complete in their journal (the agent is not asked
    again), reruns the attempt from a new copy, and records it once."""
    import psutil

    ws = tmp_path / "ws"
    killed = forker.run(["run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted"],
                        env={"LABRUN_CRASH_AT": "reproduction:1"})
    assert killed.returncode == KILLED, killed.stderr
    assert [p.name for p in (ws / ".labrun/reproductions").iterdir()] == ["attempt-002"]
    wait_for(lambda: not [p for p in psutil.process_iter(["cmdline", "cwd"])
                          if str(ws) in " ".join(p.info["cmdline"] or []) + (p.info["cwd"] or "")],
             timeout=10, what="the rerun's processes to end with the engine")
    experiments_calls = billed_calls(ws, "experiments")
    resumed = forker.run(["resume", str(ws)])
    assert resumed.returncode == 0, resumed.stderr
    report = session_status(ws)
    assert report["session"]["complete"]
    [backing] = [a for a in report["attempts"] if a["reproduction"]]
    assert backing["reproduction"]["status"] == "REPRODUCED", backing["reproduction"]
    assert billed_calls(ws, "experiments") == experiments_calls, "the agent was asked again"
    assert (ws / "STATE.md").read_text().count(f"attempt {backing['n']} REPRODUCED by the engine's rerun") == 1
    assert f"attempt {backing['n']} (R1): **REPRODUCED**" in (ws / "REPORT.md").read_text()
