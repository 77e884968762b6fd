"""The Gemini CLI backend against the real `gemini` CLI (`@google/gemini-cli`, pinned and
installed by `.ci/install-agent-clis`), pointed at the tests' own scripted Gemini API
(`fake_gemini_api.py` with `gemini_responder.GeminiResearcher` playing the model).

Each test runs `labrun` as a user would (a process of its own, forked warm by
`tests/engine_forker.py`), with `--agent gemini`: an API key in
GEMINI_API_KEY, GOOGLE_GEMINI_BASE_URL at the fake, Gemini CLI's own retries cut to two
attempts (`LABRUN_GEMINI_MAX_ATTEMPTS`; each waits at least 5 s) and labrun's back-off
starting at 0.2 s, so storms stay short.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from agent_clis import CliSession, launcher  # noqa: E402
from auto_responder import IDEA  # noqa: E402
from fake_gemini_api import FakeGeminiAPI, resource_exhausted  # noqa: E402
from gemini_responder import MODEL, GeminiResearcher, phase_of  # noqa: E402
from support import assert_billed_as_estimated, assert_complete, assert_shell_contained, labrun, listening_ports, processes_with_env, wait_for  # noqa: E402
from support import kill_attempt_supervisor  # noqa: E402

from labrun.egress import BRIDGE_PORT  # noqa: E402
from labrun.usage import Usage  # noqa: E402

API_KEY = "AIzaSy-test-key-for-the-fake-gemini-api-000"
GEMINI, pytestmark = launcher("gemini", "Gemini CLI")


class Setup(CliSession):
    agent, model, drop = "gemini", MODEL, ("GEMINI_", "GOOGLE_")

    def __init__(self, tmp_path: Path, responder: GeminiResearcher, forker):
        api = FakeGeminiAPI(default=responder)
        super().__init__(tmp_path, forker, api, {"LABRUN_GEMINI": str(GEMINI), "GEMINI_API_KEY": API_KEY,
                                                 "GOOGLE_GEMINI_BASE_URL": api.url, "LABRUN_GEMINI_MAX_ATTEMPTS": "2"})

    def geminis(self) -> list[int]:
        """gemini and what it started (they keep GEMINI_CLI_HOME, which only labrun's
        environment for gemini sets to the workspace's)."""
        return processes_with_env(f"GEMINI_CLI_HOME={self.ws / '.labrun' / 'gemini'}")

    def billed(self) -> list[tuple[str, Usage]]:
        """What the fake API billed, reply by reply, in labrun's token fields (thinking is
        billed as output)."""
        return [(bill["model"], Usage(input_tokens=u["promptTokenCount"] - u["cachedContentTokenCount"],
                                      output_tokens=u["candidatesTokenCount"] + u["thoughtsTokenCount"],
                                      cache_read_input_tokens=u["cachedContentTokenCount"]))
                for bill in self.api.billed for u in [bill["usage"]]]


@pytest.fixture
def setup_for(cli_setups, forker):
    return lambda responder: cli_setups(Setup, responder, forker)


def assert_billed(s: Setup, report: dict) -> None:
    assert {model for model, _ in s.billed()} == {MODEL}  # -m: no router or helper model
    assert_billed_as_estimated(s.billed(), report)


def shell_outputs(posts: list[dict], phase: str) -> str:
    return json.dumps([part["functionResponse"] for r in posts if phase_of(r["body"]) == phase
                       for c in r["body"]["contents"] for part in c.get("parts") or [] if "functionResponse" in part])


def test_gemini_outlasts_a_429_storm_and_a_kill_9_and_costs_exactly_what_was_billed(setup_for, abstract_socket):
    """One session (a real gemini run costs seconds, so the two checks share it).

    Setup meets a per-minute rate limit: four 429s with RetryInfo. Gemini CLI retries once
    itself (after 5 s, its least), gives up, and labrun backs off and resumes the session,
    twice, without counting a failure.

    Then the engine's process group is killed with SIGKILL while an experiment attempt runs.
    No gemini process is left (it ran in bubblewrap's PID namespace, which dies with the
    engine) and no request reaches the API after the kill. The resume asks no finished
    phase again, continues the experiments session with labrun's current prompt (the
    attempt now INTERRUPTED in its digest), and completes. Its usage is exactly what the
    fake billed (thinking tokens as output; the killed run counted from Gemini CLI's own
    session file), priced from labrun's table and marked estimated (Gemini CLI reports
    tokens only)."""
    thinking = {"text": "Thinking it over.", "usage": {"thoughtsTokenCount": 40}}
    s = setup_for(GeminiResearcher(faults={("setup", 0): [resource_exhausted("1s")] * 4,
                                           ("implementation", 0): [thinking]}, slow_experiment_s=600))
    engine = s.start()
    try:
        wait_for(lambda: (s.ws / "results" / ".slow").exists(), timeout=300, what="the experiment attempt to run")
        assert s.geminis(), "gemini runs"
        killed_at = time.time()
        os.killpg(engine.pid, signal.SIGKILL)
        _, stderr = engine.communicate(timeout=60)
    finally:
        if engine.poll() is None:
            os.killpg(engine.pid, signal.SIGKILL)
    wait_for(lambda: not s.geminis(), timeout=5, what="every gemini process to end with the engine")
    # The attempt outlives the engine under its supervisor (tests/test_outlive.py); this test's
    # attempt is the one a reboot would end: its supervisor killed too, it is INTERRUPTED.
    kill_attempt_supervisor(s.ws)
    said = " ".join(stderr.split())  # the terminal's lines are wrapped
    assert "gemini: Gemini CLI 0.61.0" in said and "login: API key (GEMINI_API_KEY)" in said
    assert said.count("the API is busy or limiting") == 2 and "run failed" not in said
    time.sleep(1)
    assert not s.posts(since=killed_at), "a request reached the API after the kill"
    assert "- Status: RUNNING" in (s.ws / "STATE.md").read_text()

    resumed_at = time.time()
    result = s.forker.run(["resume", str(s.ws)], env=s.env, whole_env=True)
    assert_complete(s.ws, result)
    asked = [phase_of(r["body"]) for r in s.posts(since=resumed_at)]
    assert asked[0] == "experiments" and set(asked) == {"experiments", "analysis", "documentation"}
    first = s.posts(since=resumed_at)[0]["body"]
    assert "INTERRUPTED" in json.dumps(first["systemInstruction"])  # labrun's current digest
    # the same session, resumed: the killed run's prompt and reply come first (its call cut
    # off by the kill is left out: Gemini CLI drops a call that has no response)
    texts = [p.get("text") or "" for c in first["contents"] for p in c.get("parts") or []]
    assert any(t.startswith("Start phase 4 of 6") for t in texts) and "Step 1 of experiments." in texts
    report = s.status()
    assert [a["status"] for a in report["attempts"]] == ["INTERRUPTED", "SUCCESS"]
    assert_billed(s, report)
    assert not s.geminis()

    posts = s.posts()
    assert all(r["headers"].get("x-goog-api-key") == API_KEY for r in posts)
    assert all(f"/models/{MODEL}:streamGenerateContent" in r["path"] for r in posts)
    assert not any("x-gemini-api-privileged-user-id" in r["headers"] for r in posts), "statistics are off"
    declared = {f["name"] for t in posts[0]["body"]["tools"] for f in t["functionDeclarations"]}
    assert {"mcp_labrun_run_experiment", "mcp_labrun_complete_phase", "run_shell_command"} <= declared
    # setup's shell ran `env`: the key stays out of its commands
    setup = shell_outputs(posts, "setup")
    assert "PATH=" in setup and API_KEY not in setup
    assert "GEMINI_API_KEY" not in setup
    assert listening_ports(setup) == {BRIDGE_PORT}, setup  # none of the machine's listeners: the sandbox's bridge
    assert_shell_contained(setup, s.ws, abstract_socket)  # nor an abstract socket, .labrun/, outside
    settings = (s.ws / ".labrun" / "gemini" / ".gemini" / "settings.json").read_text()
    assert API_KEY not in settings and set(json.loads(settings)["mcpServers"]["labrun"]) == {
        "command", "args", "trust", "timeout"}  # its relay: no URL, no token


def test_a_missing_or_logged_out_gemini_is_one_line_saying_what_to_do(tmp_path):
    """Before anything starts: no gemini on PATH says how to install it; no key and no
    Google login says how to log in."""
    (tmp_path / "idea.yaml").write_text(IDEA)
    (tmp_path / "home").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GEMINI_", "GOOGLE_"))}
    env.update({"HOME": str(tmp_path / "home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    run = ("run", str(tmp_path / "idea.yaml"), "--workspace", str(tmp_path / "ws"), "--agent", "gemini")
    for exe, says in [(str(tmp_path / "nowhere" / "gemini"), "npm install -g @google/gemini-cli"),
                      (str(GEMINI), "Gemini CLI is not logged in")]:
        result = labrun(*run, env={**env, "LABRUN_GEMINI": exe})
        assert result.returncode != 0
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0] and "Traceback" not in result.stderr, result.stderr
    assert "GEMINI_API_KEY" in lines[0] and "Login with Google" in lines[0]
    assert not (tmp_path / "ws").exists()
