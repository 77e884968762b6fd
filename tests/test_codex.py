"""The Codex backend's reading of what Codex says, with no CLI: its `turn.failed` messages
(each captured from the real `codex exec` 0.169 against `fake_responses_api.py`), its token
counts and its rollout files. The real CLI through labrun: `tests/test_real_codex.py`."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from labrun.agents.cli_agent import Finished, Outcome
from labrun.agents.codex import CodexAgent, reset_from_text, rollout_totals, tokens
from labrun.usage import Usage

NOW = datetime(2026, 12, 1, 13, 50, 21, tzinfo=timezone.utc).timestamp()
UPGRADE = ("You’ve hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro), visit "
           "https://chatgpt.com/settings/usage to purchase more credits or try again at ")


def failed(message: str) -> Outcome:
    event = {"type": "turn.failed", "error": {"message": message}}
    return Outcome(finished=Finished("t", Usage(), None, 0, "error", True, event=event), exit_code=1)


def judge(out: Outcome):
    agent = object.__new__(CodexAgent)  # judging needs no executable
    agent.workspace = "ws"
    return agent.judge(out)


@pytest.mark.parametrize("message, kind", [
    (UPGRADE + "2:52 PM.", "window"),
    ("You’ve hit your usage limit. Try again later.", "transient"),
    ("Quota exceeded. Check your plan and billing details.", "unusable"),
    ("unexpected status 401 Unauthorized: Incorrect API key provided, url: http://127.0.0.1:1/v1/responses, "
     "request id: req_fake_7", "logged_out"),
    ("exceeded retry limit, last status: 429 Too Many Requests, request id: req_fake_1", "transient"),
    ("stream disconnected before completion: stream closed before response.completed", "transient"),
    ("We’re currently experiencing high demand, which may cause temporary errors.", "transient"),
    ("Invalid schema for function 'x'", "failed"),
], ids=["usage-limit", "usage-limit-no-time", "quota", "401", "429", "cut-stream", "5xx", "other"])
def test_how_a_failed_turn_is_judged(message, kind):
    verdict = judge(failed(message))
    assert verdict.kind == kind, verdict
    if kind == "logged_out":
        assert "codex login" in verdict.message and "labrun resume ws" in verdict.message


def test_a_run_without_its_result_is_judged_from_stderr():
    lost = Outcome(exit_code=1, stderr="Error: thread/resume: thread/resume failed: no rollout found for thread id "
                                       "01a231a0-15a3-7811-adec-000000000000 (code -32600)")
    assert judge(lost).kind == "lost_session"
    assert judge(Outcome(exit_code=137, stderr="")).kind == "failed"


def utc(*when: int) -> float:
    return datetime(*when, tzinfo=timezone.utc).timestamp()


def test_the_reset_time_is_read_to_the_end_of_its_minute_in_utc():
    assert reset_from_text(UPGRADE + "2:52 PM.", now=NOW) == utc(2026, 12, 1, 14, 53)
    assert reset_from_text(UPGRADE + "1:10 PM.", now=NOW) == utc(2026, 12, 2, 13, 11)  # past today: tomorrow
    assert reset_from_text(UPGRADE + "Dec 4th, 2026 1:50 PM.", now=NOW) == utc(2026, 12, 4, 13, 51)
    assert reset_from_text(UPGRADE + "12:05 AM.", now=NOW) == utc(2026, 12, 2, 0, 6)
    assert reset_from_text("Try again later.", now=NOW) is None


def test_openai_counts_become_labruns_fields():
    assert tokens({"input_tokens": 51328, "cached_input_tokens": 33984, "cache_write_input_tokens": 100,
                   "output_tokens": 240, "reasoning_output_tokens": 7}) == Usage(
        input_tokens=17244, output_tokens=240, cache_read_input_tokens=33984, cache_creation_input_tokens=100)


def test_a_killed_runs_rollout_gives_what_was_billed_and_what_codex_restores(tmp_path: Path):
    """Codex writes each response's `token_usage_record` and then a `token_count`; killed
    between the two, it has billed more than it will restore on resume."""
    def usage(i: int, c: int, o: int) -> dict:
        return {"input_tokens": i, "cached_input_tokens": c, "cache_write_input_tokens": 0, "output_tokens": o,
                "reasoning_output_tokens": 0, "total_tokens": i + o}

    thread = "01a231d7-78fe-7b31-8f3b-902dae031308"
    lines = [
        {"type": "token_usage_record", "payload": {"thread_id": thread, "usage": usage(13009, 0, 84),
                                                   "thread_token_usage": usage(13009, 0, 84)}},
        {"type": "event_msg", "payload": {"type": "token_count", "info": {"total_token_usage": usage(13009, 0, 84)}}},
        {"type": "token_usage_record", "payload": {"thread_id": thread, "usage": usage(13920, 13009, 102),
                                                   "thread_token_usage": usage(26929, 13009, 186)}},
    ]
    day = tmp_path / "sessions" / "2026" / "12" / "01"
    day.mkdir(parents=True)
    (day / f"rollout-2026-12-01T13-42-14-{thread}.jsonl").write_text(
        "\n".join(json.dumps(x) for x in lines) + "\n" + '{"type": "event_msg", "payload": {"type": "token_co')
    billed, restored = rollout_totals(tmp_path, thread)
    assert billed == tokens(usage(26929, 13009, 186)) and restored == tokens(usage(13009, 0, 84))
    assert rollout_totals(tmp_path, "another-thread") is None


def test_labrun_queue_agent_codex_gives_the_deployment_run_its_agent_and_model(tmp_path, prefect_api):
    """`labrun queue --agent codex --model ...` against a real server: the session run it
    creates carries the agent and the model as flow parameters (tests/e2e/test_codex_window.py
    runs such a run, with the real Codex, on a worker)."""
    import sys

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    from labrun.flows.session import research_session

    sys.path.insert(0, str(Path(__file__).parent))
    from support import DEMO_IDEA, labrun

    with get_client(sync_client=True) as client:
        flow_id = client.create_flow(research_session)
        deployment_id = client.create_deployment(flow_id, "codex-params", entrypoint="flows/session.py:research_session")
    try:
        result = labrun("queue", str(DEMO_IDEA), "--agent", "codex", "--model", "gpt-5.5",
                        "--workspaces", str(tmp_path / "workspaces"), "--deployment", "research-session/codex-params")
        assert result.returncode == 0, result.stderr
        with get_client(sync_client=True) as client:
            (run,) = client.read_flow_runs(limit=1, deployment_filter=DeploymentFilter(
                id=DeploymentFilterId(any_=[deployment_id])))
            assert (run.parameters["agent"], run.parameters["model"]) == ("codex", "gpt-5.5")
            client.delete_flow_run(run.id)
    finally:
        with get_client(sync_client=True) as client:
            client.delete_deployment(deployment_id)


def test_its_mcp_server_is_labruns_relay_with_no_token(tmp_path: Path):
    from dataclasses import dataclass

    from labrun.agents.cli_agent import RunPlan
    from labrun.mcp_tools import relay

    @dataclass
    class Server:
        socket: Path = Path("/tmp/labrun-mcp-unit/mcp.sock")

    agent = object.__new__(CodexAgent)
    agent.executable, agent.model, agent.workspace = "codex", "gpt-5.5", tmp_path
    (tmp_path / "system.md").write_text("the phase prompt")
    plan = RunPlan(tmp_path / "system.md", None, None, 7, timeout_s=600, workspace=tmp_path, server=Server())
    argv = agent.argv(plan)
    config = dict(a.split("=", 1) for a in argv[argv.index("-c") + 1::2] if "=" in a and a.startswith("mcp_"))
    command, *args = relay(Server.socket)
    assert json.loads(config["mcp_servers.labrun.command"]) == command
    assert json.loads(config["mcp_servers.labrun.args"]) == args
    assert not any("url" in k or "token" in k or "header" in k for k in config), config
