"""The real Codex and Gemini CLIs against the tests' scripted APIs in their own protocols, with
labrun's MCP tool server attached: what docs/agent-clis.md says of them, shown.

Skipped when `.ci/install-agent-clis` has not installed them. Each run is a few seconds.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from agent_clis import (INSTALL, EngineTools, bwrap_argv, codex_argv, codex_binary, codex_env,  # noqa: E402
                        gemini_argv, gemini_binary, gemini_env, run_cli)
from fake_gemini_api import FakeGeminiAPI, resource_exhausted  # noqa: E402
from fake_responses_api import FakeResponsesAPI  # noqa: E402

needs_codex = pytest.mark.skipif(codex_binary() is None, reason=f"no Codex CLI: {INSTALL}")
needs_gemini = pytest.mark.skipif(gemini_binary() is None, reason=f"no Gemini CLI: {INSTALL}")
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None,
                                 reason="no bubblewrap: install it with `apt-get install bubblewrap`")

PATCH = "*** Begin Patch\n*** Add File: notes.md\n+patched\n*** End Patch\n"
ATTEMPT = {"command": "python3 -c 'print(1)'", "purpose": "smoke"}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


def billed_openai(api: FakeResponsesAPI) -> dict[str, int]:
    usage = [b["usage"] for b in api.billed]
    return {"input_tokens": sum(u["input_tokens"] for u in usage),
            "cached_input_tokens": sum(u["input_tokens_details"]["cached_tokens"] for u in usage),
            "output_tokens": sum(u["output_tokens"] for u in usage)}


def billed_gemini(api: FakeGeminiAPI) -> dict[str, int]:
    usage = [b["usage"] for b in api.billed]
    return {"input_tokens": sum(u["promptTokenCount"] for u in usage),
            "cached": sum(u["cachedContentTokenCount"] for u in usage),
            "output_tokens": sum(u["candidatesTokenCount"] for u in usage)}


# -- Codex ---------------------------------------------------------------------------------


@needs_codex
@pytest.mark.parametrize("model", [None, "gpt-5.5"], ids=["code-mode", "function-tools"])
def test_codex_runs_shell_patch_and_mcp_tools_and_reports_what_was_billed(tmp_path, workspace, model):
    # The default model nests every tool in a JavaScript `exec`; gpt-5.5 gets function tools,
    # with MCP tools deferred behind `tool_search`. The fake calls each tool as offered.
    script = [{"text": "Starting.", "tool": "exec_command", "arguments": {"cmd": "echo hello > out.txt"}},
              {"tool": "apply_patch", "arguments": PATCH},
              {"tool": "mcp__labrun__run_experiment", "arguments": ATTEMPT},
              {"tool": "mcp__labrun__complete_phase", "arguments": {"summary": "done"}},
              {"text": "Finished."}]
    with FakeResponsesAPI(script) as api, EngineTools() as tools:
        run = run_cli(codex_argv(api.url, tools, model=model), codex_env(tmp_path), workspace)
    assert run.returncode == 0, run.stderr[-2000:]
    assert tools.calls == [("run_experiment", ATTEMPT), ("complete_phase", {"summary": "done"})]
    assert (workspace / "out.txt").read_text() == "hello\n" and (workspace / "notes.md").read_text() == "patched\n"
    assert [(i["server"], i["tool"], i["status"]) for i in run.items("mcp_tool_call")] == [
        ("labrun", "run_experiment", "completed"), ("labrun", "complete_phase", "completed")]
    assert [i["status"] for i in run.items("command_execution")] == ["completed"]
    assert [i["status"] for i in run.items("file_change")] == ["completed"]
    assert [i["text"] for i in run.items("agent_message")] == ["Starting.", "Finished."]
    (started,) = run.of_type("thread.started")
    assert started["thread_id"] in api.requests[-1]["headers"]["session-id"]
    (completed,) = run.of_type("turn.completed")
    assert {k: completed["usage"][k] for k in billed_openai(api)} == billed_openai(api)
    assert all(r["headers"]["authorization"] == "Bearer sk-test-labrun" for r in api.requests)
    assert json.loads(api.requests[-1]["headers"]["x-codex-turn-metadata"])["analytics_enabled"] is False


@needs_codex
def test_codex_resume_continues_the_thread_and_reports_its_running_total(tmp_path, workspace):
    env = codex_env(tmp_path)
    with FakeResponsesAPI([{"text": "first"}, {"text": "second"}]) as api:
        first = run_cli(codex_argv(api.url, model="gpt-5.5", prompt="one"), env, workspace)
        billed_first = billed_openai(api)
        thread = first.of_type("thread.started")[0]["thread_id"]
        second = run_cli(codex_argv(api.url, model="gpt-5.5", resume=thread, prompt="two"), env, workspace)
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.of_type("thread.started")[0]["thread_id"] == thread
    inputs = [json.dumps(item) for item in api.requests[-1]["body"]["input"]]
    assert any('"first"' in item for item in inputs), "the resumed request holds the earlier turn"
    usage = second.of_type("turn.completed")[0]["usage"]
    # turn.completed counts the whole thread, not the run: a run costs the change in it.
    assert {k: usage[k] for k in billed_first} == billed_openai(api)
    assert usage["input_tokens"] > billed_openai(api)["input_tokens"] - billed_first["input_tokens"]


@needs_codex
def test_codex_retries_rate_limits_only_when_told_when_and_cut_streams(tmp_path, workspace):
    limited = {"status": 429, "error": {"type": "requests", "code": "rate_limit_exceeded",
                                        "message": "Rate limit reached. Please try again in 1s."}}
    failed_in_stream = {"failed": {"code": "rate_limit_exceeded", "message": "Rate limit reached. Please try again in 0.5s."}}
    env = codex_env(tmp_path)
    script = [{**limited, "headers": {"retry-after": "1"}}, failed_in_stream, {"cut_after_events": 3, "text": "cut"},
              {"text": "after the wait"}]
    with FakeResponsesAPI(script) as api:
        waited = run_cli(codex_argv(api.url, model="gpt-5.5"), env, workspace)
        posts = [r["time"] for r in api.requests if r["method"] == "POST"]
    assert waited.returncode == 0 and [i["text"] for i in waited.items("agent_message")] == ["after the wait"]
    notices = [e["message"] for e in waited.of_type("error")]
    assert [n[:19] for n in notices] == ["Reconnecting... 1/5", "Reconnecting... 2/5", "Reconnecting... 3/5"]
    assert "429" in notices[0] and "rate limit exceeded" in notices[1] and "stream disconnected" in notices[2]
    assert posts[1] - posts[0] >= 0.9 and posts[2] - posts[1] >= 0.45
    assert len(api.billed) == 1  # the cut stream was not billed, nor counted by Codex:
    assert waited.of_type("turn.completed")[0]["usage"]["input_tokens"] == api.billed[0]["usage"]["input_tokens"]
    with FakeResponsesAPI([limited]) as api:  # no retry-after: no retry at all
        failed = run_cli(codex_argv(api.url, model="gpt-5.5"), env, workspace)
        assert len([r for r in api.requests if r["method"] == "POST"]) == 1
    assert failed.returncode == 1
    (turn_failed,) = failed.of_type("turn.failed")
    assert turn_failed["error"]["message"].startswith("exceeded retry limit, last status: 429")


@needs_codex
@needs_bwrap
def test_codex_sandbox_writes_only_the_workspace_and_hides_secrets(tmp_path, workspace):
    outside = tmp_path / "outside.txt"
    cmd = f"echo in > inside.txt; echo out > {outside}; env"
    with FakeResponsesAPI([{"tool": "exec_command", "arguments": {"cmd": cmd}}, {"text": "ok"}]) as api:
        run = run_cli(codex_argv(api.url, model="gpt-5.5"), codex_env(tmp_path), workspace)
    (command,) = run.items("command_execution")
    assert (workspace / "inside.txt").exists() and not outside.exists()
    assert "Read-only file system" in command["aggregated_output"]
    assert "sk-test-labrun" not in command["aggregated_output"]


# -- Gemini CLI ----------------------------------------------------------------------------


@needs_gemini
def test_gemini_runs_shell_file_and_mcp_tools_and_reports_what_was_billed(tmp_path, workspace):
    script = [{"text": "Starting.", "tool": "run_shell_command", "arguments": {"command": "echo hello > out.txt"}},
              {"tool": "write_file", "arguments": {"file_path": "notes.md", "content": "written\n"}},
              {"tool": "run_experiment", "arguments": ATTEMPT},
              {"tool": "complete_phase", "arguments": {"summary": "done"}},
              {"text": "Finished."}]
    with FakeGeminiAPI(script) as api, EngineTools() as tools:
        run = run_cli(gemini_argv(), gemini_env(tmp_path, api.url, tools), workspace)
        declared = [f["name"] for t in api.requests[0]["body"]["tools"] for f in t["functionDeclarations"]]
    assert run.returncode == 0, run.stderr[-2000:]
    assert {"mcp_labrun_run_experiment", "mcp_labrun_complete_phase"} <= set(declared)
    assert tools.calls == [("run_experiment", ATTEMPT), ("complete_phase", {"summary": "done"})]
    assert (workspace / "out.txt").read_text() == "hello\n" and (workspace / "notes.md").read_text() == "written\n"
    assert [e["tool_name"] for e in run.of_type("tool_use")] == [
        "run_shell_command", "write_file", "mcp_labrun_run_experiment", "mcp_labrun_complete_phase"]
    assert [e["status"] for e in run.of_type("tool_result")] == ["success"] * 4
    (init,) = run.of_type("init")
    assert init["session_id"] and init["model"] == "gemini-2.5-pro"
    (result,) = run.of_type("result")
    assert result["status"] == "success"
    assert {k: result["stats"][k] for k in billed_gemini(api)} == billed_gemini(api)
    assert all(r["headers"]["x-goog-api-key"] == "gemini-test-labrun" for r in api.requests)
    assert not any("x-gemini-api-privileged-user-id" in r["headers"] for r in api.requests), "statistics are off"


@needs_gemini
def test_gemini_resume_by_session_id_continues_and_reports_the_run_alone(tmp_path, workspace):
    env = gemini_env(tmp_path, "")
    with FakeGeminiAPI([{"text": "first"}, {"text": "second"}]) as api:
        env["GOOGLE_GEMINI_BASE_URL"] = api.url
        first = run_cli(gemini_argv("one"), env, workspace)
        session = first.of_type("init")[0]["session_id"]
        second = run_cli(gemini_argv("two", resume=session), env, workspace)
        contents = api.requests[-1]["body"]["contents"]
        billed_second = api.billed[-1]["usage"]
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.of_type("init")[0]["session_id"] == session
    assert [c["role"] for c in contents][-3:] == ["user", "model", "user"]
    assert contents[-2]["parts"][0]["text"] == "first"
    assert second.of_type("result")[0]["stats"]["input_tokens"] == billed_second["promptTokenCount"]
    missing = run_cli(gemini_argv("three", resume="00000000-0000-4000-8000-000000000000"), env, workspace)
    assert missing.returncode == 42 and "Invalid session identifier" in missing.stderr


@needs_gemini
def test_gemini_waits_out_a_429_and_gives_up_on_a_daily_quota(tmp_path, workspace):
    env = gemini_env(tmp_path, "")
    with FakeGeminiAPI([resource_exhausted("1s"), {"text": "after the wait"}]) as api:
        env["GOOGLE_GEMINI_BASE_URL"] = api.url
        start = time.monotonic()
        waited = run_cli(gemini_argv(), env, workspace)
        took = api.requests[1]["time"] - api.requests[0]["time"]
    assert waited.returncode == 0 and waited.of_type("result")[0]["status"] == "success"
    assert took >= 4.5, "its own back-off starts at 5 s, whatever RetryInfo says"
    assert "Retrying after" in waited.stderr and time.monotonic() - start < 60
    with FakeGeminiAPI([resource_exhausted("50000s", "GenerateRequestsPerDayPerProjectPerModel-FreeTier")]) as api:
        env["GOOGLE_GEMINI_BASE_URL"] = api.url
        spent = run_cli(gemini_argv(), env, workspace)
        assert len(api.requests) == 1
    assert spent.returncode == 429 % 256  # the HTTP status is the exit code
    (result,) = spent.of_type("result")
    assert result["status"] == "error" and "daily quota" in result["error"]["message"]


@needs_gemini
@needs_bwrap
def test_gemini_in_bubblewrap_writes_only_the_workspace_and_hides_secrets(tmp_path, workspace):
    outside = tmp_path / "outside.txt"
    command = f"echo in > inside.txt; echo out > {outside}; env"
    env = gemini_env(tmp_path, "")
    with FakeGeminiAPI([{"tool": "run_shell_command", "arguments": {"command": command}}, {"text": "ok"}]) as api:
        env["GOOGLE_GEMINI_BASE_URL"] = api.url
        argv = bwrap_argv(workspace, [Path(env["GEMINI_CLI_HOME"]), Path(env["TMPDIR"])]) + gemini_argv()
        run = run_cli(argv, env, workspace)
    assert run.returncode == 0, run.stderr[-2000:]
    (shell,) = run.of_type("tool_result")
    assert (workspace / "inside.txt").exists() and not outside.exists()
    assert "gemini-test-labrun" not in shell["output"] and "GEMINI_API_KEY" not in shell["output"]
