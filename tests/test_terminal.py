"""What a person sees of a session: at a terminal, the phase as N of M and what runs under a
spinner, statuses in colour and a closing summary; in a pipe, the same lines plain; commands
printed as they can be typed; near-miss names answered with the near name, and bad limits
refused before anything is written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support import DEMO_IDEA, labrun
from terminal import Terminal

from labrun.flows.session import research_session
from labrun.session import Session

SUMMARY = re.compile(r"Session complete · phases 6 of 6 done · attempts 3 \(1 failed\) · [\d.]+ min · "
                     r"[\d,]+ tokens · \$0\.0000")
RED, GREEN = "\x1b[31m", "\x1b[32m"


def test_at_a_terminal_the_phase_and_what_runs_show_under_a_spinner_and_the_run_ends_with_a_summary(
        tmp_path, prefect_api):
    ws = tmp_path / "ws"
    term = Terminal("demo", str(ws), env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "160"})
    try:
        assert term.wait(timeout=240) == 0, term.output
    finally:
        term.close() if term.proc.poll() is None else os.close(term.master)
    out = term.output
    assert "phase 4 of 6 · experiments · attempt 1: python3 src/experiment.py" in out  # the spinner's line
    assert "phase 6 of 6 · documentation · the model's turn" in out
    assert f"attempt 1 {RED}FAILED" in out and f"attempt 2 {GREEN}SUCCESS" in out
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out)
    assert SUMMARY.search(plain), plain[-600:]
    assert plain.count("REPORT.md") == 1  # one closing line says where to read, not two


def test_in_a_pipe_the_lines_are_plain_and_commands_are_printed_as_they_can_be_typed(tmp_path, prefect_api):
    ws = tmp_path / "ws"
    done = labrun("demo", str(ws))
    assert done.returncode == 0, done.stderr
    assert "\x1b[" not in done.stdout + done.stderr
    assert re.search(r"^\d\d:\d\d:\d\d phase 1 of 6 planning started \(run 1\)$", done.stderr, re.M), done.stderr
    assert SUMMARY.search(done.stdout) and f"`labrun status {ws}`" in done.stdout
    # Its flow run is named after the workspace, as `labrun queue` names them, not at random.
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    # Another session in a folder of the same name gets another name.
    other = tmp_path / "elsewhere" / "ws"
    assert labrun("demo", str(other)).returncode == 0
    names = []
    for folder in (ws, other):
        run_id = json.loads((folder / ".labrun/state.json").read_text())["last_run"]["id"]
        with get_client(sync_client=True) as client:
            names.append(client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))[0].name)
    assert names[0].startswith("ws-") and names[1].startswith("ws-") and names[0] != names[1], names

    # Run by its path, with no labrun on PATH (the README's venv quick start): the hint is that path.
    script = Path(sys.executable).parent / "labrun"
    without = {**os.environ, "PATH": "/usr/bin:/bin"}
    said = subprocess.run([str(script), "status", str(tmp_path / "none")], env=without, capture_output=True,
                          text=True, timeout=60)
    assert said.returncode == 2 and f"start one with `{script} run IDEA.yaml" in said.stderr, said.stderr
    on_path = {**os.environ, "PATH": f"{script.parent}:/usr/bin:/bin"}
    said = subprocess.run([str(script), "status", str(tmp_path / "none")], env=on_path, capture_output=True,
                          text=True, timeout=60)
    assert "start one with `labrun run IDEA.yaml" in said.stderr, said.stderr


@pytest.mark.parametrize("args, says", [
    (("--agent", "codx"), "unknown agent 'codx' (did you mean 'codex'?); the agents are: anthropic"),
    (("--budget-usd", "-5"), "argument --budget-usd: -5: must be 0 or more"),
    (("--max-turns", "0"), "argument --max-turns: 0: must be 1 or more"),
    (("--with", "paperr"), "unknown phase 'paperr' (did you mean 'paper'?)"),
    (("--paper-style", "neurip"), "unknown paper style 'neurip' (did you mean 'neurips'?)"),
], ids=["agent", "budget", "turns", "phase", "style"])
def test_a_bad_name_or_limit_is_refused_in_one_line_before_a_workspace_exists(tmp_path, args, says):
    ws = tmp_path / "ws"
    result = labrun("run", str(DEMO_IDEA), "--workspace", str(ws), *args)
    assert result.returncode == 2 and says in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not ws.exists()


def test_a_near_miss_domain_is_named(tmp_path):
    idea = tmp_path / "idea.yaml"
    idea.write_text(DEMO_IDEA.read_text().replace("domain: ", "domain: machine_learnin  # ", 1))
    result = labrun("check", str(idea))
    assert result.returncode == 0, result.stderr
    assert "unknown domain 'machine_learnin' (did you mean 'machine_learning'?): using general guidance" in \
        " ".join(result.stderr.split())


def test_what_a_deployment_run_can_pass_is_refused_before_anything_is_written(tmp_path, prefect_api):
    """A deployment run comes without the command line's checks: Prefect refuses what its
    parameter types rule out, and the session what they cannot."""
    ws = tmp_path / "ws"
    for bad in ({"budget_usd": -5.0}, {"max_turns": 0}, {"agent": "bogus"}):
        state = research_session(str(DEMO_IDEA), str(ws), return_state=True, **bad)
        assert state.is_failed() and not ws.exists(), state.message
    with pytest.raises(ValueError, match=r"unknown agent 'codx' \(did you mean 'codex'\?\)"):
        Session.open(ws, DEMO_IDEA, agent="codx")
    with pytest.raises(ValueError, match="budget_usd -1.0: a budget is zero or more"):
        Session.open(ws, DEMO_IDEA, budget_usd=-1.0)
    assert not ws.exists()
    # A rerun of a session that is not there.
    state = research_session(str(DEMO_IDEA), str(ws), "scripted", from_phase="analysis", return_state=True)
    assert state.is_failed() and "no labrun session here to rerun" in state.message and not ws.exists()


def test_labrun_examples_copies_the_bundled_ideas_and_keeps_a_changed_one(tmp_path):
    folder = tmp_path / "ideas"
    done = labrun("examples", str(folder))
    assert done.returncode == 0, done.stderr
    copied = sorted(p.name for p in folder.iterdir())
    assert copied == sorted(p.name for p in DEMO_IDEA.parent.glob("*.yaml"))
    assert labrun("check", str(folder / DEMO_IDEA.name)).returncode == 0
    (folder / DEMO_IDEA.name).write_text("changed by the user\n")
    again = labrun("examples", str(folder))
    assert again.returncode == 0 and "not overwritten" in again.stderr
    assert (folder / DEMO_IDEA.name).read_text() == "changed by the user\n"


def test_no_telemetry_notice_at_a_terminal_in_a_new_prefect_home(tmp_path):
    """Prefect's client prints a telemetry notice on its first import at a terminal in a new
    PREFECT_HOME unless told there is no telemetry (DO_NOT_TRACK); labrun tells it, so the
    notice never shows (`labrun queue` imports Prefect and stops: no server answers)."""
    from labrun.prefect_processes import free_port
    from prefect._internal.analytics.ci_detection import CI_ENV_VARS
    from prefect._internal.analytics.notice import NOTICE_TEXT

    env = {k: v for k, v in os.environ.items()
           if k not in CI_ENV_VARS and k != "DO_NOT_TRACK" and not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / "new-home"), PREFECT_API_URL=f"http://127.0.0.1:{free_port()}/api")
    term = Terminal("queue", str(DEMO_IDEA), env=env)
    assert term.wait(60) == 2, term.output
    assert "does not answer" in term.output, term.output
    assert NOTICE_TEXT.strip().splitlines()[0] not in term.output, term.output
