"""The Codex backend against the real `codex` CLI (`@openai/codex`, pinned and installed by
`.ci/install-agent-clis`), pointed at the tests' own scripted Responses API
(`fake_responses_api.py` with `codex_responder.CodexResearcher` playing the model).

Each test runs `labrun` as a user would (a process of its own, forked warm by
`tests/engine_forker.py`), with `--agent codex`: an API key in
CODEX_API_KEY, CODEX_HOME in a temporary directory (Codex keeps its sessions there),
OPENAI_BASE_URL at the fake (labrun gives it to Codex as `openai_base_url`). labrun's
back-off starts at 0.2 s, so storms stay short.
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
from codex_responder import MODEL, CodexResearcher, phase_of, texts  # noqa: E402
from fake_responses_api import FakeResponsesAPI  # noqa: E402
from support import assert_billed_as_estimated, assert_complete, assert_shell_contained, labrun, listening_ports, processes_with_env, wait_for  # noqa: E402
from support import kill_attempt_supervisor  # noqa: E402

from labrun.egress import BRIDGE_PORT  # noqa: E402
from labrun.usage import Usage  # noqa: E402

API_KEY = "sk-proj-test-key-for-the-fake-responses-api-0000"
LAUNCHER, pytestmark = launcher("codex", "Codex CLI")


class Setup(CliSession):
    """The session's setup, with the test's CODEX_HOME."""

    agent, model, drop = "codex", MODEL, ("OPENAI_", "CODEX_")

    def __init__(self, tmp_path: Path, responder: CodexResearcher, forker):
        self.home = tmp_path / "codex-home"
        self.home.mkdir()
        api = FakeResponsesAPI(default=responder)
        super().__init__(tmp_path, forker, api, {"LABRUN_CODEX": str(LAUNCHER), "CODEX_HOME": str(self.home),
                                                 "CODEX_API_KEY": API_KEY, "OPENAI_BASE_URL": f"{api.url}/v1"})

    def codexes(self) -> list[int]:
        """codex and what it started (its commands keep TMPDIR, which only labrun's
        environment for codex sets to the workspace's)."""
        return processes_with_env(f"TMPDIR={self.ws / '.labrun' / 'tmp'}")

    def phases_asked(self, since: float = 0.0) -> list[str]:
        return [phase_of(r["body"]) for r in self.posts(since)]

    def billed(self) -> list[tuple[str, Usage]]:
        """What the fake API billed, reply by reply, in labrun's token fields."""
        bills = []
        for bill in self.api.billed:
            u = bill["usage"]
            details = u["input_tokens_details"]
            cached, written = details["cached_tokens"], details["cache_write_tokens"]
            bills.append((bill["model"], Usage(input_tokens=u["input_tokens"] - cached - written,
                                               output_tokens=u["output_tokens"], cache_read_input_tokens=cached,
                                               cache_creation_input_tokens=written)))
        return bills


@pytest.fixture
def setup_for(cli_setups, forker):
    return lambda responder: cli_setups(Setup, responder, forker)


def assert_billed(s: Setup, report: dict) -> None:
    assert_billed_as_estimated(s.billed(), report)


def test_codex_six_phases_outlast_a_429_storm_and_cost_what_was_billed(setup_for, abstract_socket):
    """Setup meets an API key's rate limit: 429s without retry-after, which Codex does not
    retry. labrun backs off and runs it again, without counting a failure, and the session
    completes. Its usage is exactly what the fake billed, priced from labrun's table and
    marked estimated (Codex reports tokens only)."""
    limited = {"status": 429, "error": {"type": "requests", "code": "rate_limit_exceeded",
                                        "message": "Rate limit reached for requests per min."}}
    s = setup_for(CodexResearcher(faults={("setup", 0): [limited] * 3}))
    result = s.run()
    assert_complete(s.ws, result)
    said = " ".join(result.stderr.split())  # the terminal's lines are wrapped
    assert "codex: codex-cli 0.169.0" in said and "login: API key (CODEX_API_KEY)" in said
    assert "the API is busy or limiting" in said and "429" in said
    assert "run failed" not in said
    assert_billed(s, s.status())

    posts = s.posts()
    assert all(r["headers"].get("authorization") == f"Bearer {API_KEY}" for r in posts)
    assert all(r["body"]["model"] == MODEL for r in posts)
    # setup's shell ran `env`: Codex's key stays out of its commands
    setup_outputs = json.dumps([i for r in posts if phase_of(r["body"]) == "setup" for i in r["body"]["input"]
                                if i.get("type") == "function_call_output"])
    assert "PATH=" in setup_outputs and API_KEY not in setup_outputs
    assert "CODEX_API_KEY" not in setup_outputs
    # ...and from a network namespace of labrun's, none of the machine's listeners (its API's
    # included): only the bridge to labrun's egress proxy
    assert listening_ports(setup_outputs) == {BRIDGE_PORT}, setup_outputs
    assert_shell_contained(setup_outputs, s.ws, abstract_socket)  # nor an abstract socket, .labrun/, outside
    assert not s.codexes()


def usage_limit_reached() -> dict:
    """A ChatGPT plan's spent usage limit, resetting a second from now: Codex says so to the
    minute (`try again at 1:46 PM`), so labrun waits until that minute has passed."""
    return {"status": 429, "error": {"type": "usage_limit_reached", "message": "The usage limit has been reached",
                                     "resets_at": int(time.time()) + 1, "plan_type": "plus"}}


def test_codex_kill_9_during_an_attempt_leaves_no_codex_and_the_resume_asks_nothing_finished(setup_for):
    """Planning meets a spent usage limit, waited out until the minute Codex names has
    passed. Then the engine's process group is killed with SIGKILL while an experiment attempt runs.
    No codex process is left and no request reaches the API after the kill. The resume
    asks no finished phase again, continues the experiments thread with labrun's current
    instructions (the attempt now INTERRUPTED in its digest), and completes; the killed
    run's tokens are counted from Codex's own session record, so the session's usage is
    still exactly what was billed."""
    s = setup_for(CodexResearcher(faults={("planning", 0): [usage_limit_reached]}, slow_experiment_s=600))
    engine = s.start()
    try:
        wait_for(lambda: (s.ws / "results" / ".slow").exists(), timeout=300, what="the experiment attempt to run")
        assert s.codexes(), "codex runs"
        killed_at = time.time()
        os.killpg(engine.pid, signal.SIGKILL)
        engine.communicate(timeout=60)
    finally:
        if engine.poll() is None:
            os.killpg(engine.pid, signal.SIGKILL)
    wait_for(lambda: not s.codexes(), timeout=5, what="every codex process to end with the engine")
    # The attempt outlives the engine under its supervisor (tests/test_outlive.py); this test's
    # attempt is the one a reboot would end: its supervisor killed too, it is INTERRUPTED.
    kill_attempt_supervisor(s.ws)
    time.sleep(1)
    assert not s.posts(since=killed_at), "a request reached the API after the kill"
    assert "- Status: RUNNING" in (s.ws / "STATE.md").read_text()
    assert "usage window spent" in (s.ws / "STATE.md").read_text()
    limited, after = [r for r in s.posts() if phase_of(r["body"]) == "planning"][:2]
    minute_end = (int(limited["time"]) // 60 + 1) * 60  # Codex names the reset's minute; it ends here
    assert after["time"] >= minute_end - 0.05

    resumed_at = time.time()
    result = s.forker.run(["resume", str(s.ws)], env=s.env, whole_env=True)
    assert_complete(s.ws, result)
    asked = s.phases_asked(since=resumed_at)
    assert asked[0] == "experiments" and set(asked) == {"experiments", "analysis", "documentation"}
    first = s.posts(since=resumed_at)[0]["body"]
    assert "INTERRUPTED" in texts(first)[-1]  # labrun's current digest, in the resume prompt
    assert any(i.get("type") == "tool_search_output" for i in first["input"])  # the same thread, resumed
    report = s.status()
    assert [a["status"] for a in report["attempts"]] == ["INTERRUPTED", "SUCCESS"]
    assert_billed(s, report)
    assert not s.codexes()


def test_a_missing_or_logged_out_codex_is_one_line_saying_what_to_do(tmp_path):
    """Before anything starts: no codex on PATH says how to install it; a CODEX_HOME with no
    login and no key says how to log in."""
    (tmp_path / "idea.yaml").write_text(IDEA)
    (tmp_path / "codex-home").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    env.update({"CODEX_HOME": str(tmp_path / "codex-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    run = ("run", str(tmp_path / "idea.yaml"), "--workspace", str(tmp_path / "ws"), "--agent", "codex")
    for exe, says in [(str(tmp_path / "nowhere" / "codex"), "npm install -g @openai/codex"),
                      (str(LAUNCHER), "Codex is not logged in")]:
        result = labrun(*run, env={**env, "LABRUN_CODEX": exe})
        assert result.returncode != 0
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0] and "Traceback" not in result.stderr, result.stderr
    assert "codex login" in lines[0] and "CODEX_API_KEY" in lines[0]


def test_codex_past_the_phase_timeout_is_killed_and_the_session_stops_saying_so(setup_for):
    """Planning's second request never gets an answer (the API hangs; Codex would wait for
    its stream for minutes). At the phase's timeout labrun kills Codex: nothing of it is
    left, the session stops with one line naming the timeout and how to resume, STATE.md
    says why planning stopped, and the killed run still counts what it was billed (from
    Codex's session record)."""
    s = setup_for(CodexResearcher(faults={("planning", 1): [{"hang": True}]}))
    s.env["LABRUN_PHASE_TIMEOUT_S"] = "12"
    started = time.monotonic()
    result = s.run()
    assert result.returncode == 1, result.stdout + result.stderr
    assert 12 <= time.monotonic() - started < 120
    said = " ".join(result.stderr.split())
    assert "ran past its timeout of 12 s and codex was stopped" in said and "Traceback" not in said
    assert f"labrun resume {s.ws}" in said
    assert not s.codexes()
    (transcript,) = sorted((s.ws / ".labrun" / "phases" / "planning").glob("codex-run-*.jsonl"))
    end = json.loads(transcript.read_text().splitlines()[-1])
    assert end["stopped"] == "timeout" and "session records" in end["note"]
    assert s.phases_asked() == ["planning", "planning"]
    state = (s.ws / "STATE.md").read_text()
    assert "Phase 1 — planning: FAILED" in state
    assert "phase planning stopped: it ran past its timeout of 12 s and codex was stopped" in " ".join(state.split())
    assert_billed(s, s.status())
