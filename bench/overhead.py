"""The engine's own overhead, with a zero-latency agent (the scripted one).

Prints one table, measured side by side in one run:
- a full six-phase session through the engine (Prefect tasks, journal, STATE.md, attempts)
  against the same work as plain Python calls (the same scripted replies, files written and
  commands run directly, each successful experiment run run again as the engine reruns the
  attempts behind the claims, nothing recorded);
- the resume of a finished session: a fresh flow run reading all six phases from the cache,
  and `labrun resume`'s no-op check;
- a flow run that does nothing: Prefect's own cost of starting and ending the session's one
  flow run, paid once a session (Prefect 3.9 ends a flow run when its heartbeat thread, which
  sleeps in steps of a second, has noticed: about a second), kept apart from the phases';
- one experiment attempt through `run_experiment` in an open session, from a task of a flow
  run as a phase calls it (RUNNING → Prefect subtask → FAILED or SUCCESS in STATE.md; the
  session's first command, which starts its egress proxy, is run before) against
  `subprocess.run` of the same command.

Run: `python bench/overhead.py [--repeat N]` (uses a throwaway Prefect home).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prefect_env import REPO  # sets Prefect's environment: import it before Prefect or labrun
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

IDEA = REPO / "examples" / "demo_noise_averaging.yaml"


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def engine_session(ws: Path) -> None:
    from labrun.flows.session import research_session

    state = research_session(str(IDEA), str(ws), "scripted", return_state=True)
    assert state.is_completed(), state.message


def engine_resume(ws: Path) -> None:
    from labrun.flows.session import research_session

    assert research_session(None, str(ws), return_state=True).is_completed()


def cli_noop_resume(ws: Path) -> None:
    from labrun.status import finished_and_intact

    assert finished_and_intact(ws)


def plain_session(ws: Path) -> None:
    """The same scripted work, as plain calls: no Prefect, no journal, no STATE.md."""
    from labrun import prompts
    from labrun.agents.scripted import SCRIPT, ScriptedModel
    from labrun.idea import load_idea
    from labrun.model import ModelRequest
    from labrun.tools import tool_specs

    idea = load_idea(IDEA)
    model = ScriptedModel(latency_s=0)
    ws.mkdir(parents=True)
    for key in prompts.DEFAULT:  # the six research phases, as the demo idea runs them
        steps = SCRIPT[key]
        system = prompts.system_prompt(key, idea.as_prompt_dict(), idea.guidance_domain, "")
        messages: list[dict] = [{"role": "user", "content": [{"type": "text", "text": prompts.kickoff(key)}]}]
        measured = []  # the commands of the phase's experiment runs that succeeded
        for _ in steps:
            reply = model.complete(ModelRequest(system=system, messages=messages, tools=tool_specs()))
            messages.append({"role": "assistant", "content": reply.content})
            results = []
            for block in reply.content:
                if block["type"] == "tool_use":
                    results.append({"type": "tool_result", "tool_use_id": block["id"],
                                    "content": plain_tool(ws, block["name"], block["input"], measured)})
            messages.append({"role": "user", "content": results})
        for command in measured:  # the engine reruns the attempts behind the claims: work, not overhead
            subprocess.run(["bash", "-c", command], cwd=ws, capture_output=True)


def plain_tool(ws: Path, name: str, inp: dict, measured: list[str]) -> str:
    if name == "str_replace_based_edit_tool":
        path = ws / inp["path"]
        if inp["command"] == "create":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(inp["file_text"])
        else:
            path.write_text(path.read_text().replace(inp["old_str"], inp["new_str"]))
        return "ok"
    if name in ("bash", "run_experiment"):
        done = subprocess.run(["bash", "-c", inp["command"]], cwd=ws, capture_output=True, text=True)
        if name == "run_experiment" and done.returncode == 0 and inp.get("metrics_file"):
            measured.append(inp["command"])
        metrics = (ws / inp["metrics_file"]).read_text() if done.returncode == 0 and inp.get("metrics_file") else "{}"
        return done.stdout + done.stderr + f"\nMetrics: {metrics}"
    return "ok"


def empty_flow_run() -> None:
    from prefect import flow

    assert flow(name="nothing")(lambda: None)(return_state=True).is_completed()


def engine_attempt(session, n: int | str) -> None:
    from labrun.phases.phase import toolbox
    from labrun.phase_registry import BY_KEY

    box = toolbox(session, BY_KEY["experiments"])
    result = box.call("run_experiment", {"command": "python3 -c 'print(1)'", "purpose": f"bench {n}"})
    assert "SUCCESS" in result.content, result.content


def plain_attempt(ws: Path) -> None:
    subprocess.run(["bash", "-c", "python3 -c 'print(1)'"], cwd=ws, capture_output=True, check=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    console = Console()
    root = Path(tempfile.mkdtemp(prefix="labrun-bench-ws-"))

    engine_session(root / "warm-up")  # starts the embedded Prefect server once
    rows: dict[str, tuple[list[float], list[float]]] = {
        "full six-phase session": ([], []),
        "resume of a finished session (flow run, all cached)": ([], []),
        "resume of a finished session (`labrun resume` check)": ([], []),
        "a flow run that does nothing (once a session)": ([], []),
        "one experiment attempt": ([], []),
    }
    for i in range(args.repeat):
        ws = root / f"engine-{i}"
        rows["full six-phase session"][0].append(timed(lambda: engine_session(ws)))
        rows["full six-phase session"][1].append(timed(lambda: plain_session(root / f"plain-{i}")))
        rows["resume of a finished session (flow run, all cached)"][0].append(timed(lambda: engine_resume(ws)))
        rows["resume of a finished session (flow run, all cached)"][1].append(0.0)
        rows["resume of a finished session (`labrun resume` check)"][0].append(timed(lambda: cli_noop_resume(ws)))
        rows["resume of a finished session (`labrun resume` check)"][1].append(0.0)

    from labrun.session import Session

    for _ in range(args.repeat):
        rows["a flow run that does nothing (once a session)"][0].append(timed(empty_flow_run))
        rows["a flow run that does nothing (once a session)"][1].append(0.0)

    from prefect import flow, task

    session = Session.open(ws)  # attempts run in an open session, from a phase's task

    @task
    def attempts() -> list[float]:
        engine_attempt(session, "warm-up")  # a session's first command starts its egress proxy
        return [timed(lambda: engine_attempt(session, i)) for i in range(args.repeat)]

    def session_flow() -> list[float]:
        return attempts()

    try:
        rows["one experiment attempt"][0].extend(flow(name="attempts")(session_flow)())
        rows["one experiment attempt"][1].extend(timed(lambda: plain_attempt(ws)) for _ in range(args.repeat))
    finally:
        session.close()

    table = Table(title=f"labrun engine overhead, scripted agent with zero latency (median of {args.repeat})")
    for col in ("work", "engine (s)", "plain Python (s)", "overhead (s)", "ratio"):
        table.add_column(col, justify="right" if col != "work" else "left")
    for name, (engine, plain) in rows.items():
        e, p = statistics.median(engine), statistics.median(plain)
        table.add_row(name, f"{e:.3f}", f"{p:.3f}", f"{e - p:.3f}", f"{e / p:.1f}×" if p else "—")
    console.print(table)
    session_row, attempt_row = rows["full six-phase session"], rows["one experiment attempt"]
    flow_run = statistics.median(rows["a flow run that does nothing (once a session)"][0])
    per_phase = (statistics.median(session_row[0]) - statistics.median(session_row[1]) - flow_run) / 6
    per_attempt = statistics.median(attempt_row[0]) - statistics.median(attempt_row[1])
    console.print(f"Engine overhead: {per_phase * 1000:.0f} ms a phase and {per_attempt * 1000:.0f} ms an attempt, "
                  f"besides Prefect's {flow_run:.2f} s to start and end the session's flow run.")
    console.print("Plain Python does the same scripted work (same replies, same files, same commands) "
                  "without Prefect, the journal or STATE.md; a finished session has no plain-Python "
                  "equivalent of a resume, so its overhead is its whole time.")


if __name__ == "__main__":
    main()
