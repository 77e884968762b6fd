"""The Gemini CLI backend's command line, environment, settings and reading of what Gemini
CLI says, with no CLI (the events and messages as the real `gemini` 0.61 printed them
against `fake_gemini_api.py`). The real CLI through labrun: `tests/test_real_gemini.py`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest

from labrun.agents import AgentUnavailable
from labrun.agents.cli_agent import Finished, Outcome, RunPlan, Started, ToolUsed
from labrun.agents.gemini import CONTEXT_FILE, MCP_SOCKET, GeminiAgent, next_quota_reset, tokens
from labrun.mcp_tools import relay
from labrun.sandbox import Sandbox, bubblewrap
from labrun.usage import Usage

SESSION = "6b749610-1d53-463d-801c-436615efe96f"
DAILY = ("[API Error: You have exhausted your daily quota on this model.]\nPlease wait and try again later. To "
         "increase your limits, request a quota increase through AI Studio, or switch to another /auth method")
PER_MINUTE = ("[API Error: You exceeded your current quota, please check your plan and billing details.\nSuggested "
              "retry after 1s.]\nPlease wait and try again later.")
BAD_KEY = '[API Error: {"error":{"code":400,"message":"API key not valid. Please pass a valid API key.",' \
          '"status":"INVALID_ARGUMENT","details":[{"reason":"API_KEY_INVALID"}]}}]'


@dataclass
class Server:
    socket: Path = Path("/tmp/labrun-mcp-unit/mcp.sock")


@pytest.fixture
def agent(tmp_path, monkeypatch) -> GeminiAgent:
    exe = tmp_path / "bin" / "gemini"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    for name in ("GOOGLE_GEMINI_BASE_URL", "LABRUN_GEMINI_MAX_ATTEMPTS", "GEMINI_CLI_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LABRUN_GEMINI", str(exe))
    monkeypatch.setenv("GEMINI_API_KEY", "AIza-unit-key")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-not-for-gemini")
    return GeminiAgent("gemini-2.5-pro", tmp_path / "ws")


def plan(tmp_path: Path, session: str | None = None, network: bool = True) -> RunPlan:
    ws = tmp_path / "ws"
    (ws / ".labrun").mkdir(parents=True, exist_ok=True)
    (tmp_path / "system.md").write_text("# Phase 1 of 6: planning\nthe phase prompt\n")
    sandbox = Sandbox(ws, ws / ".labrun" / "sandbox" / "tmp", (ws / ".labrun",), network)
    return RunPlan(tmp_path / "system.md", None, session, 7, timeout_s=600, workspace=ws, server=Server(),
                   sandbox=sandbox, lifeline=9 if bubblewrap() else None)


def test_the_command_line_runs_gemini_headless_in_the_sessions_sandbox(agent, tmp_path):
    argv = agent.argv(plan(tmp_path, SESSION, network=False))
    cli = argv[argv.index(agent.executable):]
    assert cli == [agent.executable, "--output-format", "stream-json", "--skip-trust", "--approval-mode", "yolo",
                   "-m", "gemini-2.5-pro", "--resume", SESSION]
    if bubblewrap() is None:
        pytest.skip("no working bubblewrap here: install it with `apt-get install bubblewrap`")
    sandbox = argv[:argv.index(agent.executable)]
    assert {"--unshare-pid", "--unshare-net", "--die-with-parent"} <= set(sandbox)
    assert "labrun-lifeline" in sandbox and "read -r -u 9" in " ".join(sandbox)  # its watcher of the engine
    ws = tmp_path / "ws"
    home, data = str(ws / ".labrun" / "gemini"), str(ws / ".labrun")
    binds = [sandbox[i:i + 3] for i in range(len(sandbox) - 2) if sandbox[i] in ("--bind", "--ro-bind")]
    # its home writable, bound after the read-only .labrun it lies in
    assert binds.index(["--ro-bind", data, data]) < binds.index(["--bind", home, home])
    assert ["--bind", str(ws), str(ws)] in binds
    assert ["--ro-bind", str(Server.socket), MCP_SOCKET] in binds  # the engine's MCP socket, for its relay
    assert "--resume" not in agent.argv(plan(tmp_path))


def test_settings_and_the_phase_prompt_are_in_its_home_and_no_token(agent, tmp_path, monkeypatch):
    monkeypatch.setenv("LABRUN_GEMINI_MAX_ATTEMPTS", "2")
    agent = GeminiAgent("gemini-2.5-pro", tmp_path / "ws")
    agent.argv(plan(tmp_path))
    config = tmp_path / "ws" / ".labrun" / "gemini" / ".gemini"
    settings = json.loads((config / "settings.json").read_text())
    assert settings["security"] == {"auth": {"selectedType": "gemini-api-key"},
                                    "environmentVariableRedaction": {"enabled": True}}
    assert settings["general"] == {"enableAutoUpdate": False, "enableAutoUpdateNotification": False, "maxAttempts": 2}
    assert settings["privacy"] == {"usageStatisticsEnabled": False}
    # its relay, to the socket where the sandbox binds it (where the CLI runs unsandboxed, the engine's path)
    where = MCP_SOCKET if bubblewrap() else str(Server.socket)
    command, *args = relay(where)
    assert settings["mcpServers"] == {"labrun": {"command": command, "args": args, "trust": True, "timeout": 900_000}}
    assert "$" not in "".join(args)  # Gemini CLI expands variables in its settings
    assert settings["context"] == {"fileName": CONTEXT_FILE}
    assert (config / CONTEXT_FILE).read_text() == "# Phase 1 of 6: planning\nthe phase prompt\n"
    assert "token" not in json.dumps(settings["mcpServers"]).lower()


def test_a_bad_max_attempts_is_one_line(agent, monkeypatch):
    monkeypatch.setenv("LABRUN_GEMINI_MAX_ATTEMPTS", "11")
    with pytest.raises(AgentUnavailable, match="LABRUN_GEMINI_MAX_ATTEMPTS=11: give a whole number from 1 to 10"):
        GeminiAgent()


def test_the_environment_has_its_key_its_home_and_nothing_else_secret(agent, tmp_path):
    env = agent.environment(plan(tmp_path))
    assert env["GEMINI_API_KEY"] == "AIza-unit-key" and "LABRUN_MCP_TOKEN" not in env
    assert env["GEMINI_CLI_HOME"] == str(tmp_path / "ws" / ".labrun" / "gemini")
    assert env["GEMINI_CLI_NO_RELAUNCH"] == "true"
    assert "ANTHROPIC_API_KEY" not in env


def test_its_events_give_the_session_progress_turns_and_the_runs_tokens(agent):
    events = [
        {"type": "init", "session_id": SESSION, "model": "gemini-2.5-pro"},
        {"type": "message", "role": "user", "content": "Start phase 4 of 6"},
        {"type": "message", "role": "assistant", "content": "Step 1", "delta": True},
        {"type": "tool_use", "tool_name": "run_shell_command", "tool_id": "a", "parameters": {"command": "ls  -la"}},
        {"type": "tool_result", "tool_id": "a", "status": "success", "output": ""},
        {"type": "tool_use", "tool_name": "write_file", "tool_id": "b",
         "parameters": {"file_path": "src/x.py", "content": "1"}},
        {"type": "tool_result", "tool_id": "b", "status": "success"},
        {"type": "tool_use", "tool_name": "mcp_labrun_complete_phase", "tool_id": "c", "parameters": {}},
        {"type": "tool_result", "tool_id": "c", "status": "success", "output": "Phase x complete"},
        {"type": "message", "role": "assistant", "content": "Done.", "delta": True},
        {"type": "result", "status": "success", "stats": {
            "total_tokens": 12516, "input_tokens": 12504, "output_tokens": 5, "cached": 4000, "input": 8504,
            "duration_ms": 176, "tool_calls": 3, "models": {"gemini-2.5-pro": {}}}},
    ]
    said = [x for e in events for x in agent.read(e)]
    assert said[0] == Started(SESSION)
    assert [x.name for x in said if isinstance(x, ToolUsed)] == ["$ ls -la", "write_file x.py"]
    (finished,) = [x for x in said if isinstance(x, Finished)]
    assert finished.session_id == SESSION and finished.turns == 4 and not finished.is_error
    assert finished.usage == Usage(input_tokens=8504, output_tokens=12, cache_read_input_tokens=4000)  # 7 thinking
    assert finished.model == "gemini-2.5-pro" and not finished.usage_total


def failed(message: str, exit_code: int) -> Outcome:
    event = {"type": "result", "status": "error", "error": {"type": "unknown", "message": message}, "stats": {}}
    return Outcome(finished=Finished(SESSION, Usage(), None, 0, "error", True, event=event), exit_code=exit_code)


@pytest.mark.parametrize("out, kind", [
    (failed(DAILY, 173), "window"),
    (failed(PER_MINUTE, 173), "transient"),
    (failed("[API Error: The model is overloaded. Please try again later.]", 247), "transient"),
    (failed(BAD_KEY, 144), "logged_out"),
    (failed("[API Error: Request contains an invalid argument.]", 144), "failed"),
    (Outcome(exit_code=42, stderr="Error resuming session: Invalid session identifier \"x\""), "lost_session"),
    (Outcome(exit_code=41, stderr="When using Gemini API, you must specify the GEMINI_API_KEY environment "
                                  "variable."), "logged_out"),
    (Outcome(exit_code=137, stderr=""), "failed"),
], ids=["daily-quota", "per-minute-429", "503", "bad-key", "400", "unknown-session", "no-key", "killed"])
def test_how_a_run_that_failed_is_judged(agent, out, kind):
    verdict = agent.judge(out)
    assert verdict.kind == kind, verdict
    if kind == "logged_out":
        assert "GEMINI_API_KEY" in verdict.message and "labrun resume" in verdict.message
    if kind == "window":
        assert verdict.resets_at == pytest.approx(next_quota_reset(), abs=5)


def test_a_daily_quota_resets_at_midnight_pacific():
    noon_utc = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc).timestamp()  # 4 AM in California (PST)
    assert next_quota_reset(noon_utc) == datetime(2026, 12, 2, 8, 0, tzinfo=timezone.utc).timestamp()
    july = datetime(2026, 7, 1, 6, 59, tzinfo=timezone.utc).timestamp()  # 11:59 PM PDT
    assert next_quota_reset(july) == datetime(2026, 7, 1, 7, 0, tzinfo=timezone.utc).timestamp()


def test_a_killed_run_is_counted_from_its_session_file(agent, tmp_path):
    """Gemini CLI records each response's tokens in the session's file as it ends; a run
    killed before its `result` is counted from the responses it recorded after its start."""
    chats = tmp_path / "ws" / ".labrun" / "gemini" / ".gemini" / "tmp" / "ws" / "chats"
    chats.mkdir(parents=True)

    def reply(at: str, n: int) -> dict:
        return {"id": f"r{n}", "timestamp": at, "type": "gemini", "content": "", "model": "gemini-2.5-pro",
                "tokens": {"input": 1000 * n, "output": 10 * n, "cached": 100 * n, "thoughts": n, "tool": 0,
                           "total": 1011 * n}}

    lines = [{"sessionId": SESSION, "startTime": "2026-12-01T16:47:00.000Z", "kind": "main"},
             {"$set": {"messages": [reply("2026-12-01T16:47:01.000Z", 1)]}},
             {"id": "u", "timestamp": "2026-12-01T16:48:04.000Z", "type": "user", "content": [{"text": "go"}]},
             reply("2026-12-01T16:48:05.000Z", 2), {"$set": {"lastUpdated": "2026-12-01T16:48:05.000Z"}},
             reply("2026-12-01T16:48:06.000Z", 3)]
    (chats / f"session-2026-12-01T16-47-{SESSION[:8]}.jsonl").write_text(
        "\n".join(json.dumps(x) for x in lines) + '\n{"id": "r4", "timestamp": "2026-12-01T16:48:0')
    since = datetime(2026, 12, 1, 16, 48, 4, tzinfo=timezone.utc).timestamp()
    found = agent.recover(SESSION, since)
    assert found.usage == Usage(input_tokens=4500, output_tokens=55, cache_read_input_tokens=500)
    assert found.session_id == SESSION and found.turns == 2 and found.model == "gemini-2.5-pro"
    assert agent.recover("another-session", since) is None


def test_gemini_counts_become_labruns_fields():
    assert tokens({"total_tokens": 71592, "input_tokens": 71485, "output_tokens": 107, "cached": 56955}) == Usage(
        input_tokens=14530, output_tokens=107, cache_read_input_tokens=56955)


def test_a_budget_on_a_model_labrun_has_no_price_for_is_refused_in_one_line(agent, tmp_path):
    """Gemini CLI reports tokens only: labrun prices them, so a budget on a model missing from
    its table could not be kept, and the session does not start."""
    import os
    import subprocess
    import sys

    idea = tmp_path / "idea.yaml"
    idea.write_text((Path(__file__).parent.parent / "examples" / "demo_noise_averaging.yaml").read_text())
    run = subprocess.run([sys.executable, "-m", "labrun.cli", "run", str(idea), "--workspace", str(tmp_path / "w"),
                          "--agent", "gemini", "--model", "gemini-9-ultra", "--budget-usd", "5"],
                         capture_output=True, text=True, env={**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    assert run.returncode == 2, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert "no price is known for model 'gemini-9-ultra'" in line and "LABRUN_PRICES" in line
    assert not (tmp_path / "w").exists()
