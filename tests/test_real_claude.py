"""The Claude Code backend against the real `claude` CLI (`@anthropic-ai/claude-code`, pinned
and installed by `.ci/install-agent-clis`), pointed at the tests' own scripted Messages API
(`fake_messages_api.py` with `claude_responder.ClaudeResearcher` playing the model).

Each test runs `labrun` as a user would (a process of its own, forked warm by
`tests/engine_forker.py`), with ANTHROPIC_BASE_URL at the fake,
CLAUDE_CONFIG_DIR in a temporary directory, CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 and
IS_SANDBOX=1 (CI runs as root). Claude Code's own retries are cut to one
(CLAUDE_CODE_MAX_RETRIES=1) and labrun's back-off starts at 0.2 s, so storms stay short.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from agent_clis import INSTALL, CliSession, claude_executable  # noqa: E402
from claude_responder import ClaudeResearcher, phase_of, system_text  # noqa: E402
from fake_messages_api import FakeMessagesAPI  # noqa: E402
from support import assert_complete, assert_shell_contained, listening_ports, machine_listening_ports, processes_with_env, wait_for  # noqa: E402
from support import kill_attempt_supervisor  # noqa: E402

from labrun.egress import BRIDGE_PORT  # noqa: E402
from labrun.prices import cost_usd  # noqa: E402
from labrun.usage import Usage  # noqa: E402

MODEL = "claude-sonnet-4-5"  # priced alike in labrun's table and in Claude Code's
USAGE_FIELDS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
API_KEY = "sk-ant-api03-test-key-for-the-fake-api-0000"
OAUTH_TOKEN = "sk-ant-oat01-test-token-for-the-fake-api-0000"


pytestmark = pytest.mark.skipif(claude_executable() is None, reason=(
    f"the real Claude Code CLI is not installed: {INSTALL} (npm), or point LABRUN_TEST_CLAUDE at "
    "a `claude` binary"))


def unified(status: str, resets_at: int) -> dict[str, str]:
    """A subscription's rate-limit headers, as the API sends them with every response."""
    week = str(int(time.time()) + 3 * 86400)
    return {"anthropic-ratelimit-unified-status": status, "anthropic-ratelimit-unified-5h-status": status,
            "anthropic-ratelimit-unified-5h-reset": str(resets_at),
            "anthropic-ratelimit-unified-5h-utilization": "1.0" if status == "rejected" else "0.3",
            "anthropic-ratelimit-unified-7d-status": "allowed", "anthropic-ratelimit-unified-7d-reset": week,
            "anthropic-ratelimit-unified-7d-utilization": "0.1",
            "anthropic-ratelimit-unified-representative-claim": "five_hour",
            "anthropic-ratelimit-unified-reset": str(resets_at),
            "anthropic-ratelimit-unified-overage-status": "rejected",
            "anthropic-ratelimit-unified-overage-disabled-reason": "org_level_disabled"}


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def error(status: int, kind: str, message: str, headers: dict | None = None) -> dict:
    return {"status": status, "error": {"type": kind, "message": message}, "headers": headers or {}}


class Setup(CliSession):
    """The session's setup, with the test's Claude Code config dir."""

    agent, model, drop = "claude-code", MODEL, ("ANTHROPIC_", "CLAUDE_")

    def __init__(self, tmp_path: Path, responder: ClaudeResearcher, forker, login: str = "api-key"):
        self.config = tmp_path / "claude-config"
        self.config.mkdir()
        api = FakeMessagesAPI(default=responder, cache_accounting=True)
        super().__init__(tmp_path, forker, api, {
            "LABRUN_CLAUDE": claude_executable(), "LABRUN_CLAUDE_PERMISSIONS": "default",
            "ANTHROPIC_BASE_URL": api.url, "CLAUDE_CONFIG_DIR": str(self.config),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "IS_SANDBOX": "1", "CLAUDE_CODE_MAX_RETRIES": "1",
            "ANTHROPIC_API_KEY" if login == "api-key" else "CLAUDE_CODE_OAUTH_TOKEN":
                API_KEY if login == "api-key" else OAUTH_TOKEN,
        })

    def kill_during(self, engine, kill, ready, what: str) -> str:
        """Once `ready()`, SIGKILL the engine with `kill` (os.killpg: its process group;
        os.kill: its PID alone). Then no claude process, nor anything it started, may be left,
        and no request may reach the API. Returns the engine's stderr."""
        try:
            wait_for(ready, timeout=240, what=what)
            assert self.claudes(), "claude runs"
            killed_at = time.time()
            kill(engine.pid, signal.SIGKILL)
            _, stderr = engine.communicate(timeout=60)
        finally:
            if engine.poll() is None:
                os.killpg(engine.pid, signal.SIGKILL)
        wait_for(lambda: not self.claudes(), timeout=5, what="every claude process to end with the engine")
        time.sleep(1)
        assert not [r for r in self.api.requests if r["time"] >= killed_at], "a request reached the API after the kill"
        return stderr

    def claudes(self) -> list[int]:
        """claude and what it started (not the engine's own attempts: only labrun's environment
        for claude holds ENABLE_TOOL_SEARCH=false)."""
        return processes_with_env(f"CLAUDE_CONFIG_DIR={self.config}", "ENABLE_TOOL_SEARCH=false")

    def billed(self) -> dict:
        """What the fake API billed, tokens and dollars at the model's list prices."""
        total = {k: 0 for k in USAGE_FIELDS} | {"cost_usd": 0.0}
        for bill in self.api.billed:
            usage = Usage(**{k: bill["usage"][k] for k in USAGE_FIELDS})
            for k in USAGE_FIELDS:
                total[k] += getattr(usage, k)
            total["cost_usd"] += cost_usd(bill["model"], usage)
        return total

    def phases_asked(self, since: float = 0.0) -> list[str]:
        return [phase_of(r["body"]) for r in self.api.requests if r["time"] >= since and "messages" in r["body"]]


@pytest.fixture
def setup_for(tmp_path, forker):
    made = []

    def make(responder: ClaudeResearcher, login: str = "api-key") -> Setup:
        made.append(Setup(tmp_path, responder, forker, login))
        return made[-1]

    yield make
    for s in made:
        s.api.stop()


def test_six_phases_outlast_a_429_and_a_529_storm_and_cost_what_was_billed(setup_for, abstract_socket):
    """API-key login. Setup meets an API key's rate limit (429s with a retry-after Claude Code
    will not wait for) and analysis a 529 overload: Claude Code retries and gives up, labrun
    backs off and runs it again, and the session completes, counting neither as a failure.
    Its usage is exactly what the fake API billed."""
    rate_limited = error(429, "rate_limit_error", "This request would exceed your account's rate limit. "
                         "Please try again later.", {"retry-after": "3600"})
    overloaded = error(529, "overloaded_error", "Overloaded")
    s = setup_for(ClaudeResearcher(faults={("setup", 0): [rate_limited] * 3, ("analysis", 1): [overloaded] * 4}))
    s.env["SERVICE_ACCESS"] = key = "service-access-9e8d7c6b5a4f3e2d"  # for the experiments only
    result = s.run("--pass-env", "SERVICE_ACCESS")
    assert_complete(s.ws, result)
    said = " ".join(result.stderr.split())  # the terminal's lines are wrapped
    assert "login: API key (ANTHROPIC_API_KEY)" in said and "claude-code: 2.1." in said
    # the CLI's own retries are shown, and the runs that gave up were retried by labrun
    assert "API error 529 (overloaded): claude retries" in said
    assert "the API is busy or limiting (429)" in said and "(529)" in said
    assert "run failed" not in said

    report = s.status()
    billed = s.billed()
    for k in USAGE_FIELDS:
        assert report["usage"][k] == billed[k], k
    assert report["usage"]["cost_usd"] == pytest.approx(billed["cost_usd"], rel=1e-9)
    assert report["usage"]["estimated_usd"] == 0
    assert billed["cost_usd"] > 0

    requests = [r for r in s.api.requests if "messages" in r["body"]]
    assert all(r["headers"].get("x-api-key") == API_KEY for r in requests)
    # ENABLE_TOOL_SEARCH=false: labrun's tools are offered at once; no ToolSearch turn
    assert all({"mcp__labrun__run_experiment", "mcp__labrun__complete_phase"}
               <= {t["name"] for t in r["body"]["tools"]} for r in requests)
    # claude's Bash ran `env`: Claude Code's own credentials stay out of it, and so does a key
    # for the experiments (it reaches only run_experiment's commands, which labrun runs)
    bash_output = json.dumps([r["body"]["messages"] for r in requests if phase_of(r["body"]) == "setup"])
    assert "PATH=" in bash_output and API_KEY not in bash_output and "ANTHROPIC_API_KEY" not in bash_output
    assert "SERVICE_ACCESS" not in bash_output
    # ...and from a network namespace of labrun's, none of the machine's listeners (the fake
    # API's included): the bridge to labrun's egress proxy, and Claude Code's own sandbox proxy
    seen = listening_ports(bash_output)
    assert BRIDGE_PORT in seen and urlsplit(s.api.url).port not in seen, bash_output
    assert not (seen - {BRIDGE_PORT}) & machine_listening_ports(), bash_output
    assert_shell_contained(bash_output, s.ws, abstract_socket)  # nor an abstract socket, .labrun/, outside
    assert not [p for p in s.ws.rglob("*") if p.is_file() and key in p.read_text(errors="replace")]
    # its MCP config is labrun's relay: no URL, no token for a shell to read
    for config in s.ws.glob(".labrun/phases/*/claude-mcp.json"):
        assert set(json.loads(config.read_text())["mcpServers"]["labrun"]) == {"type", "command", "args"}
    assert not s.claudes()


def test_kill_9_during_an_attempt_leaves_no_claude_and_the_resume_asks_nothing_finished(setup_for):
    """Subscription login (CLAUDE_CODE_OAUTH_TOKEN): the five-hour window is spent in
    planning and waited out; then the engine's process group is killed with SIGKILL while an
    experiment attempt runs. No claude process is left and
    not one request reaches the API after the kill. The resume asks no finished phase again,
    continues the experiments conversation with labrun's current prompt (the attempt now
    INTERRUPTED in its digest), and completes."""
    resets_at = int(time.time()) + 3
    spent = error(429, "rate_limit_error", "Rate limited", {**unified("rejected", resets_at),
                                                           "retry-after": str(resets_at - int(time.time()))})
    s = setup_for(ClaudeResearcher(faults={("planning", 0): [spent]}, slow_experiment_s=600,
                                   headers=unified("allowed", int(time.time()) + 4 * 3600)), login="subscription")
    engine = s.start()
    stderr = s.kill_during(engine, os.killpg, lambda: (s.ws / "results" / ".slow").exists(),
                           "the experiment attempt's command to run")
    # The attempt outlives the engine under its supervisor (tests/test_outlive.py); this test's
    # attempt is the one a reboot would end: its supervisor killed too, it is INTERRUPTED.
    kill_attempt_supervisor(s.ws)
    assert "- Status: RUNNING" in (s.ws / "STATE.md").read_text()
    assert "login: Claude subscription (CLAUDE_CODE_OAUTH_TOKEN)" in " ".join(stderr.split())
    assert "usage window spent" in (s.ws / "STATE.md").read_text()
    planning = [r for r in s.api.requests if phase_of(r["body"]) == "planning"]
    after_window = [r for r in planning[1:]]
    assert after_window and after_window[0]["time"] >= resets_at - 0.05  # it waited for the reset
    assert all(r["headers"].get("authorization") == f"Bearer {OAUTH_TOKEN}" and "x-api-key" not in r["headers"]
               for r in s.api.requests)

    resumed_at = time.time()
    result = s.forker.run(["resume", str(s.ws)], env=s.env, whole_env=True)
    assert_complete(s.ws, result)
    asked = s.phases_asked(since=resumed_at)
    assert asked[0] == "experiments" and set(asked) == {"experiments", "analysis", "documentation"}
    first = next(r for r in s.api.requests if r["time"] >= resumed_at)
    assert "INTERRUPTED" in system_text(first["body"])  # labrun's current digest, despite --resume
    assert len(first["body"]["messages"]) > 2  # the same conversation, resumed
    report = s.status()
    assert [a["status"] for a in report["attempts"]] == ["INTERRUPTED", "SUCCESS"]
    billed = s.billed()
    for k in USAGE_FIELDS:  # what the killed run streamed counts, never more than was billed
        assert report["usage"][k] <= billed[k], k
    assert 0 < report["usage"]["cost_usd"] <= billed["cost_usd"] + 1e-12
    assert report["phases"][3]["usage"]["estimated_usd"] > 0
    assert not s.claudes()


def test_kill_9_of_the_engine_alone_ends_claude_and_all_it_started(setup_for):
    """SIGKILL to the engine's PID alone, while claude waits on the API and a process its Bash
    started in the background (in a session of its own) still runs: both end with the engine,
    and no request reaches the API after the kill."""
    background = {"content": [{"type": "tool_use", "id": "toolu_bg1", "name": "Bash", "input": {
        "command": "(python3 -c 'import time; time.sleep(600)' > /dev/null 2>&1 &) ; echo started",
        "description": "start a long job"}}]}
    s = setup_for(ClaudeResearcher(faults={("planning", 0): [background, {"hang": True}]}))
    # Claude Code's own sandbox would end the job with the command: without it the job
    # leaves claude's session, and only labrun's PID namespace can end it.
    s.env["CLAUDE_CODE_SUBPROCESS_ENV_SCRUB"] = "0"
    engine = s.start()
    s.kill_during(engine, os.kill, lambda: len(s.api.requests) >= 2 and any(
        "time.sleep(600)" in cmdline(p) for p in s.claudes()), "claude's second request and its background job")
