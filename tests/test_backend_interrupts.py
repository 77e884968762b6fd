"""One Ctrl-C stops a session within 5 s whatever its backend: the Anthropic API backend and
the three coding CLIs, the real ones (skipped, saying why, where one is not installed), each
against the tests' scripted API in its own protocol.

One session per backend, typed into a terminal (`terminal.Terminal`: the Ctrl-C reaches the
whole foreground process group) with no PREFECT_API_URL, so that each `labrun` starts its
own Prefect API, as a new user's does. The session is interrupted three times, each time
resumed in a new terminal: while the model thinks (its request hangs), during a tool call of
the agent's own (a shell command that sleeps), and during an experiment attempt. After each
Ctrl-C: exit code 130 within 5 s, the resume command, no process left (the CLI and what it
started included), the phase INTERRUPTED in STATE.md. The last resume completes the session
and asks the model nothing about a phase that had finished.

The Ctrl-C of the scripted backend, SIGTERM, SIGHUP and a closed pipe are in
tests/test_interrupts.py.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from agent_clis import CliSession, claude_executable  # noqa: E402
from auto_responder import AutoResearcher  # noqa: E402
from claude_responder import ClaudeResearcher  # noqa: E402
from codex_responder import CodexResearcher  # noqa: E402
from fake_messages_api import FakeMessagesAPI  # noqa: E402
from gemini_responder import GeminiResearcher  # noqa: E402
from support import assert_complete, attempt_group, wait_for  # noqa: E402
from terminal import Terminal  # noqa: E402
import test_real_claude  # noqa: E402
import test_real_codex  # noqa: E402
import test_real_gemini  # noqa: E402

from labrun.state import phase_table  # noqa: E402

SLEEP = "touch tool-call.started; sleep 600"
"""The agent's own tool call that the second Ctrl-C cuts short."""


class AnthropicSetup(CliSession):
    """The Anthropic API backend: labrun's own turn loop and tools."""

    agent, model, drop = "anthropic", "claude-opus-5-5", ("ANTHROPIC_",)

    def __init__(self, tmp_path: Path, responder: AutoResearcher, forker):
        api = FakeMessagesAPI(default=responder, cache_accounting=True)
        super().__init__(tmp_path, forker, api, {"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url})

    def clis(self) -> list[int]:
        return []  # no CLI: its tools are labrun's, in labrun's process tree


def shell_call(researcher: CodexResearcher) -> dict[str, Any]:
    name, arguments = researcher.as_call("Bash", {"command": SLEEP})
    return {"text": "Waiting.", "tool": name, "arguments": arguments}


def claude_code(tmp_path, forker):
    call = {"content": [{"type": "tool_use", "id": "toolu_wait", "name": "Bash",
                         "input": {"command": SLEEP, "description": "wait"}}]}
    s = test_real_claude.Setup(tmp_path, ClaudeResearcher(
        faults={("planning", 0): [{"hang": True}], ("implementation", 0): [call]}, slow_experiment_s=600), forker)
    s.clis = s.claudes
    return s


def codex(tmp_path, forker):
    r = CodexResearcher(slow_experiment_s=600)
    r.faults = {("planning", 0): [{"hang": True}], ("implementation", 0): [shell_call(r)]}
    s = test_real_codex.Setup(tmp_path, r, forker)
    s.clis = s.codexes
    return s


def gemini(tmp_path, forker):
    r = GeminiResearcher(slow_experiment_s=600)
    r.faults = {("planning", 0): [{"hang": True}], ("implementation", 0): [shell_call(r)]}
    s = test_real_gemini.Setup(tmp_path, r, forker)
    s.clis = s.geminis
    return s


def anthropic(tmp_path, forker):
    call = {"content": [{"type": "tool_use", "id": "toolu_wait", "name": "bash", "input": {"command": SLEEP}}]}
    return AnthropicSetup(tmp_path, AutoResearcher(
        faults={("planning", 1): [{"hang": True}], ("implementation", 1): [call]}, slow_experiment_s=600), forker)


def installed(executable: Callable[[], Any], product: str):
    return pytest.mark.skipif(not executable(), reason=f"the real {product} is not installed: install it with "
                              "`.ci/install-agent-clis` (npm), or point LABRUN_AGENT_CLIS at their prefix")


BACKENDS = [
    pytest.param(anthropic, id="anthropic"),
    pytest.param(claude_code, id="claude-code", marks=installed(claude_executable, "Claude Code")),
    pytest.param(codex, id="codex", marks=installed(lambda: test_real_codex.LAUNCHER.exists(), "Codex CLI")),
    pytest.param(gemini, id="gemini", marks=installed(lambda: test_real_gemini.GEMINI.exists(), "Gemini CLI")),
]


@pytest.fixture(scope="module")
def own_api_home(tmp_path_factory) -> str:
    """The Prefect home of these runs, each starting its own API on it."""
    return str(tmp_path_factory.mktemp("backend-interrupts-prefect-home"))


def attempt_running(ws: Path) -> bool:
    """The experiment attempt's command has started (and sleeps: its first run is slow)."""
    return (ws / "results" / ".slow").exists() or attempt_group(ws) is not None


def thinking(s) -> bool:
    return any("planning" in json.dumps(r["body"])[:200000] for r in s.api.requests)


def interrupt(s, term: Terminal, phase: str) -> None:
    """One Ctrl-C, and what it must leave."""
    term.watch()
    started = time.monotonic()
    term.ctrl_c()
    code = term.wait(timeout=60)
    took = time.monotonic() - started
    out = term.output
    assert code == 130, out
    assert took < 5, f"{took:.1f} s to stop at {phase}:\n{out}"
    assert f"interrupted; resume with: labrun resume {s.ws}" in " ".join(out.split()), out
    assert "Traceback" not in out, out
    assert not term.survivors(), f"processes outlived labrun:\n{term.survivors()}\n{out}"
    assert not s.clis(), "the agent's CLI outlived labrun"
    assert phase_table((s.ws / "STATE.md").read_text())[phase] == "INTERRUPTED"


@pytest.mark.parametrize("make", BACKENDS)
def test_ctrl_c_stops_the_session_within_5_s_at_each_point_and_the_resume_redoes_nothing(
        make, tmp_path, forker, own_api_home):
    s = make(tmp_path, forker)
    env = {k: v for k, v in s.env.items() if k != "PREFECT_API_URL"} | {"PREFECT_HOME": own_api_home}
    points = [
        ("planning", s.run_args(), lambda: thinking(s), "the model's first request (it hangs)"),
        ("implementation", ["resume", str(s.ws)], lambda: (s.ws / "tool-call.started").exists(),
         "the agent's shell command"),
        ("experiments", ["resume", str(s.ws)], lambda: attempt_running(s.ws), "the experiment attempt"),
    ]
    try:
        for phase, args, reached, what in points:
            term = Terminal(*args, env=env)
            try:
                wait_for(lambda: term.watch() is not None and reached(), timeout=300,  # noqa: B023 (called here)
                         what=f"{what}:\n{term.output[-2000:]}")  # noqa: B023
                time.sleep(0.5)  # into the wait, not its first instant
                interrupt(s, term, phase)
            finally:
                term.close() if term.proc.poll() is None else os.close(term.master)
        resumed_at = time.time()
        result = s.forker.run(["resume", str(s.ws)], env=s.env, whole_env=True)  # on the shared test API
        assert_complete(s.ws, result)
        asked = [p for p in (phase_in(r["body"]) for r in s.api.requests if r["time"] >= resumed_at) if p]
        assert asked[0] == "experiments" and set(asked) == {"experiments", "analysis", "documentation"}, asked
        assert not s.clis()
    finally:
        s.api.stop()


def phase_in(body: dict) -> str | None:
    """The phase a model request belongs to, in any of the protocols (its newest heading)."""
    found = re.findall(r"# Phase \d+ of \d+: (\w+)", json.dumps(body))
    return found[-1] if found else None
