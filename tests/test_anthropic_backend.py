"""The Anthropic backend, with the real SDK talking to a local fake of the Messages API."""

from __future__ import annotations

import email.utils
import json
import logging
import pickle
import subprocess
import sys
import time
from pathlib import Path

import anthropic
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from labrun.agents.anthropic import (  # noqa: E402
    CONTEXT_MANAGEMENT_BETA,
    AnthropicModel,
    check_credentials,
    retry_after_seconds,
    with_cache_breakpoints,
)
from labrun.agents.registry import BACKENDS  # noqa: E402
from labrun.model import FatalModelError, ModelRequest, TransientModelError  # noqa: E402
from labrun.prices import BUILTIN_PRICES, cost_usd  # noqa: E402
from labrun.usage import Usage  # noqa: E402

DEFAULT_MODEL = BACKENDS["anthropic"].default_model

TOOLS = [
    {"type": "bash_20250124", "name": "bash"},
    {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
    {
        "name": "complete_phase",
        "description": "End the phase.",
        "input_schema": {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]},
    },
]


def request(messages=None, **kw) -> ModelRequest:
    return ModelRequest(
        system="# Phase 1 of 6: planning", tools=TOOLS, messages=messages or [{"role": "user", "content": "Begin."}], **kw
    )


def no_none(value) -> bool:
    if isinstance(value, dict):
        return all(v is not None and no_none(v) for v in value.values())
    if isinstance(value, list):
        return all(no_none(v) for v in value)
    return True


def breakpoints(body: dict) -> list[str]:
    """Where the request's cache_control markers are, as readable paths."""
    found = [f"tools[{i}]" for i, t in enumerate(body.get("tools", [])) if "cache_control" in t]
    found += [f"system[{i}]" for i, b in enumerate(body.get("system", [])) if "cache_control" in b]
    for i, message in enumerate(body["messages"]):
        if isinstance(message["content"], list):
            found += [f"messages[{i}][{j}]" for j, b in enumerate(message["content"]) if "cache_control" in b]
    return found


# -- replies -----------------------------------------------------------------------------


def test_a_text_reply_is_streamed_and_comes_back_as_plain_dicts(api):
    api.push({"text": "Hello there.", "usage": {"input_tokens": 12, "output_tokens": 4}})
    reply = AnthropicModel().complete(request())

    assert reply.content == [{"type": "text", "text": "Hello there."}]
    assert reply.stop_reason == "end_turn"
    assert reply.model == DEFAULT_MODEL
    (sent,) = api.requests
    assert sent["body"]["stream"] is True
    assert sent["body"]["model"] == DEFAULT_MODEL and sent["body"]["max_tokens"] == 16000
    assert "test-key" in (sent["headers"].get("x-api-key", "") + sent["headers"].get("authorization", ""))


def test_the_fake_also_answers_plain_json_to_the_sdk(api):
    api.push({"text": "plain", "usage": {"input_tokens": 3, "output_tokens": 1}})
    client = anthropic.Anthropic(max_retries=0)
    message = client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert message.content[0].text == "plain" and message.usage.input_tokens == 3
    assert "stream" not in api.requests[0]["body"]


def test_tool_use_blocks_have_their_input_parsed_and_no_none_fields(api):
    api.push(
        {
            "content": [
                {"type": "thinking", "thinking": "First look around.", "signature": "sig-abc"},
                {"type": "text", "text": "Listing files."},
                {"type": "tool_use", "id": "toolu_01", "name": "bash", "input": {"command": "ls -la", "n": [1, 2]}},
            ]
        }
    )
    reply = AnthropicModel().complete(request())

    assert reply.stop_reason == "tool_use"
    assert reply.content == [
        {"type": "thinking", "thinking": "First look around.", "signature": "sig-abc"},
        {"type": "text", "text": "Listing files."},
        {"type": "tool_use", "id": "toolu_01", "name": "bash", "input": {"command": "ls -la", "n": [1, 2]}},
    ]
    assert no_none(reply.content)
    assert json.loads(json.dumps(reply.content)) == reply.content


def test_a_reply_is_sent_back_unchanged_on_the_next_turn(api):
    api.push({"content": [{"type": "tool_use", "id": "toolu_9", "name": "bash", "input": {"command": "pwd"}}]})
    api.push({"text": "Done."})
    model = AnthropicModel()
    first = model.complete(request())
    conversation = [
        {"role": "user", "content": "Begin."},
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "/work"}]},
    ]
    model.complete(request(conversation))

    assert api.requests[1]["body"]["messages"][1]["content"] == first.content


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "scripted, retry_after",
    [
        ({"status": 429, "error": {"type": "rate_limit_error", "message": "slow"}, "headers": {"retry-after": "7"}}, 7.0),
        ({"status": 429, "error": {"type": "rate_limit_error", "message": "slow"},
          "headers": {"retry-after": "7", "retry-after-ms": "1500"}}, 1.5),
        ({"status": 529, "error": {"type": "overloaded_error", "message": "Overloaded"}}, None),
        ({"status": 500, "error": {"type": "api_error", "message": "Internal server error"}}, None),
        ({"status": 503, "error": {"type": "api_error", "message": "unavailable"}, "headers": {"retry-after": "2"}}, 2.0),
        ({"stream_error": {"type": "overloaded_error", "message": "Overloaded"}}, None),
        ({"cut_after_events": 4, "text": "a reply cut short"}, None),
    ],
    ids=["429", "429-ms", "529", "500", "503", "error-event", "cut-stream"],
)
def test_transient_errors_make_one_request_and_say_when_to_retry(api, scripted, retry_after):
    api.push(scripted)
    with pytest.raises(TransientModelError) as caught:
        AnthropicModel().complete(request())
    assert caught.value.transient and caught.value.retry_after == retry_after
    assert "\n" not in str(caught.value)
    assert len(api.requests) == 1  # the SDK's own retries are off


def test_a_lost_connection_and_a_timeout_are_transient(api, monkeypatch):
    api.push({"hang": True})
    with pytest.raises(TransientModelError, match="timed out"):
        AnthropicModel(timeout=0.5).complete(request())
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(TransientModelError, match="connection"):
        AnthropicModel().complete(request())


@pytest.mark.parametrize(
    "status, kind, api_message, says",
    [
        (400, "invalid_request_error", "messages: roles must alternate", "a retry cannot fix it"),
        (400, "invalid_request_error", "prompt is too long: 1000123 tokens > 1000000 maximum", "context window"),
        (401, "authentication_error", "invalid x-api-key", "check ANTHROPIC_API_KEY"),
        (403, "permission_error", "not allowed", "may use"),
        (404, "not_found_error", "model: claude-nope", "LABRUN_MODEL"),
        (413, "request_too_large", "Request exceeds the maximum size", "too large"),
    ],
)
def test_errors_a_retry_cannot_fix_are_fatal_and_say_what_to_do(api, status, kind, api_message, says):
    api.push({"status": status, "error": {"type": kind, "message": api_message}})
    with pytest.raises(FatalModelError) as caught:
        AnthropicModel().complete(request())
    message = str(caught.value)
    assert not caught.value.transient
    assert says in message and str(status) in message and "\n" not in message
    assert len(api.requests) == 1


def test_error_messages_never_hold_the_api_key(api, monkeypatch):
    key = "sk-ant-api03-secretsecretsecret"
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    api.push({"status": 401, "error": {"type": "authentication_error", "message": f"invalid key {key}"}})
    with pytest.raises(FatalModelError) as caught:
        AnthropicModel().complete(request())
    assert key not in str(caught.value) and "ANTHROPIC_API_KEY" in str(caught.value)


def test_the_server_can_say_not_to_retry(api):
    api.push({"status": 500, "error": {"type": "api_error", "message": "no"}, "headers": {"x-should-retry": "false"}})
    with pytest.raises(FatalModelError):
        AnthropicModel().complete(request())


def test_retry_after_reads_seconds_milliseconds_and_http_dates():
    in_30s = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert retry_after_seconds({"retry-after": "12"}) == 12.0
    assert retry_after_seconds({"retry-after-ms": "250", "retry-after": "12"}) == 0.25
    assert 28 <= retry_after_seconds({"retry-after": in_30s}) <= 30
    assert retry_after_seconds({}) is None and retry_after_seconds({"retry-after": "soon"}) is None


def test_a_missing_api_key_gives_one_line_that_says_what_to_do(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    with pytest.raises(FatalModelError) as caught:
        AnthropicModel()
    message = str(caught.value)
    assert "export ANTHROPIC_API_KEY=" in message and "labrun demo" in message and "\n" not in message
    check_credentials({"ANTHROPIC_API_KEY": "k"})  # no error


# -- prompt caching ------------------------------------------------------------------------


def test_breakpoints_sit_on_tools_system_and_the_last_two_user_turns(api):
    api.push({"text": "ok"})
    conversation = [
        {"role": "user", "content": "Begin."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a b"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Two at once."},
            {"type": "tool_use", "id": "t2", "name": "bash", "input": {"command": "pwd"}},
            {"type": "tool_use", "id": "t3", "name": "bash", "input": {"command": "id"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t2", "content": "/w"},
            {"type": "tool_result", "tool_use_id": "t3", "content": "root", "cache_control": {"type": "ephemeral"}},
        ]},
    ]
    sent_request = request(conversation)
    before = sent_request.model_dump()
    AnthropicModel().complete(sent_request)

    body = api.requests[0]["body"]
    assert breakpoints(body) == ["tools[2]", "system[0]", "messages[2][0]", "messages[4][1]"]
    assert body["system"] == [{"type": "text", "text": "# Phase 1 of 6: planning", "cache_control": {"type": "ephemeral"}}]
    assert sent_request.model_dump() == before  # the caller's request is untouched


def test_breakpoints_skip_thinking_and_empty_text_and_wrap_string_content():
    params = with_cache_breakpoints(
        "",
        [],
        [
            {"role": "user", "content": "Begin."},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
            {"role": "user", "content": "Go on."},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Prefilled"},
                {"type": "text", "text": ""},
                {"type": "thinking", "thinking": "t", "signature": "s"},
            ]},
        ],
    )
    assert "system" not in params and "tools" not in params
    assert params["messages"][0]["content"] == [{"type": "text", "text": "Begin.", "cache_control": {"type": "ephemeral"}}]
    assert params["messages"][2]["content"] == "Go on."
    assert breakpoints(params) == ["messages[0][0]", "messages[3][0]"]


# -- usage and cost --------------------------------------------------------------------------


def test_usage_and_cost_are_exact_for_a_known_model(api):
    api.push({"text": "ok", "usage": {"input_tokens": 1000, "output_tokens": 500,
                                      "cache_read_input_tokens": 20000, "cache_creation_input_tokens": 3000}})
    reply = AnthropicModel("claude-opus-5-5").complete(request())
    # Opus 5.5: $4 input, $20 output, $5 cache write, $0.20 cache read per million tokens
    assert reply.usage == Usage(input_tokens=1000, output_tokens=500, cache_read_input_tokens=20000,
                                cache_creation_input_tokens=3000, cost_usd=0.033)


def test_the_model_that_served_the_reply_is_priced_even_under_a_dated_name(api):
    api.push({"text": "ok", "model": "claude-haiku-4-5-20251001", "usage": {"input_tokens": 1_000_000}})
    reply = AnthropicModel("claude-haiku-4-5").complete(request())
    assert reply.model == "claude-haiku-4-5-20251001" and reply.usage.cost_usd == 1.0


def test_an_unknown_model_costs_zero_with_one_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="labrun.prices"):
        assert cost_usd("claude-unheard-of-9", Usage(input_tokens=10**6)) == 0.0
        assert cost_usd("claude-unheard-of-9", Usage(input_tokens=10**6)) == 0.0
    assert len([r for r in caplog.records if "claude-unheard-of-9" in r.getMessage()]) == 1


def test_haiku_5_5_long_prompts_pay_the_higher_rates():
    assert cost_usd("claude-haiku-5-5", Usage(input_tokens=100_000, output_tokens=1_000_000)) == 0.51
    assert cost_usd("claude-haiku-5-5", Usage(input_tokens=100_001)) == 100_001 * 0.50 / 1e6


@pytest.mark.parametrize("suffix", ["json", "yaml"])
def test_a_prices_file_is_merged_over_the_built_in_table(tmp_path, monkeypatch, suffix):
    table = {"my-gateway-model": {"input": 1, "output": 2, "cache_write": 3, "cache_read": 4},
             "claude-opus-5-5": {"input": 0, "output": 0, "cache_write": 0, "cache_read": 0}}
    path = tmp_path / f"prices.{suffix}"
    path.write_text(json.dumps(table))  # JSON is YAML too
    monkeypatch.setenv("LABRUN_PRICES", str(path))
    assert cost_usd("my-gateway-model", Usage(input_tokens=10**6, cache_read_input_tokens=10**6)) == 5.0
    assert cost_usd("claude-opus-5-5", Usage(input_tokens=10**6)) == 0.0
    assert cost_usd("claude-sonnet-5", Usage(input_tokens=10**6)) == BUILTIN_PRICES["claude-sonnet-5"]["input"]


def test_a_broken_prices_file_fails_before_any_call(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    path = tmp_path / "prices.yaml"
    path.write_text("claude-opus-5-5: {input: cheap}\n")
    monkeypatch.setenv("LABRUN_PRICES", str(path))
    with pytest.raises(FatalModelError, match="LABRUN_PRICES"):
        AnthropicModel()


# -- settings and context management ---------------------------------------------------------


def test_context_management_is_on_by_default_with_its_beta(api):
    api.push({"text": "ok"})
    model = AnthropicModel()
    model.complete(request())
    (sent,) = api.requests
    assert CONTEXT_MANAGEMENT_BETA in sent["headers"]["anthropic-beta"]
    (edit,) = sent["body"]["context_management"]["edits"]
    assert edit["type"] == "clear_tool_uses_20250919" and edit["trigger"]["type"] == "input_tokens"
    assert model.context_management == sent["body"]["context_management"]


def test_context_management_can_be_turned_off(api, monkeypatch):
    monkeypatch.setenv("LABRUN_CONTEXT_MANAGEMENT", "off")
    api.push({"text": "ok"})
    model = AnthropicModel()
    model.complete(request())
    (sent,) = api.requests
    assert "context_management" not in sent["body"] and "anthropic-beta" not in sent["headers"]
    assert sent["path"] == "/v1/messages" and model.context_management is None


def test_the_model_comes_from_the_argument_then_labrun_model_then_the_default(api, monkeypatch):
    assert AnthropicModel().name == DEFAULT_MODEL in BUILTIN_PRICES
    monkeypatch.setenv("LABRUN_MODEL", "claude-sonnet-5-5")
    assert AnthropicModel().name == "claude-sonnet-5-5"
    model = AnthropicModel("claude-haiku-5-5")
    assert model.name == "claude-haiku-5-5"


def test_a_model_pickles_without_its_client(api):
    api.push({"text": "ok"}, {"text": "again"})
    model = AnthropicModel()
    model.complete(request())
    copy = pickle.loads(pickle.dumps(model))
    assert copy.complete(request()).content == [{"type": "text", "text": "again"}]


def test_the_fake_can_answer_with_a_function_of_the_request(api):
    def echo(body):
        return {"text": "you said " + body["messages"][-1]["content"][-1]["text"], "delay_seconds": 0.1}

    api.push(echo)
    api.default = lambda body: {"text": f"default for {body['model']}"}
    model = AnthropicModel()
    assert model.complete(request()).content == [{"type": "text", "text": "you said Begin."}]
    assert model.complete(request()).content == [{"type": "text", "text": f"default for {DEFAULT_MODEL}"}]


# -- the fake server as its own process ------------------------------------------------------


def test_the_fake_server_runs_standalone_from_a_script_file(tmp_path, monkeypatch):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "from a file"}], "default": {"text": "again and again"}}))
    record = tmp_path / "requests.jsonl"
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "fake_messages_api.py"), "--script", str(script),
         "--port", "0", "--record", str(record)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        url = server.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        model = AnthropicModel()
        assert model.complete(request()).content == [{"type": "text", "text": "from a file"}]
        assert model.complete(request()).content == [{"type": "text", "text": "again and again"}]
        assert model.complete(request()).content == [{"type": "text", "text": "again and again"}]
    finally:
        server.terminate()
        server.wait(timeout=10)
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(lines) == 3 and lines[0]["body"]["messages"][0]["role"] == "user"


def test_a_reply_served_under_a_name_with_no_price_is_priced_as_the_model_asked_for(api):
    api.push({"text": "ok", "model": "gateway-alias-of-opus", "usage": {"input_tokens": 1_000_000}})
    reply = AnthropicModel("claude-opus-5-5").complete(request())
    assert reply.model == "gateway-alias-of-opus"
    assert reply.usage.cost_usd == BUILTIN_PRICES["claude-opus-5-5"]["input"]
