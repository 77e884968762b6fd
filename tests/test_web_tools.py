"""The Messages API's web tools through the real SDK: offered only where a phase asks for
them, their blocks saved as they came and sent back unchanged, a paused turn continued, and
what a phase really fetched read back from its tool log."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fake_messages_api import web_fetch, web_search, web_search_citation  # noqa: E402

from labrun import toollog  # noqa: E402
from labrun.agents.anthropic import AnthropicModel  # noqa: E402
from labrun.journal import Conversation  # noqa: E402
from labrun.model import FatalModelError, ModelRequest  # noqa: E402
from labrun.prices import WEB_SEARCH_USD, cost_usd  # noqa: E402
from labrun.state import Attempt  # noqa: E402
from labrun.usage import Usage  # noqa: E402

PAPER = "https://arxiv.org/abs/2201.11903"
PAGE = "Chain-of-thought prompting elicits reasoning in large language models."
TOOLS = [{"name": "complete_phase", "description": "End the phase.",
          "input_schema": {"type": "object", "properties": {"summary": {"type": "string"}}}}]


def without_cache_control(value):
    if isinstance(value, dict):
        return {k: without_cache_control(v) for k, v in value.items() if k != "cache_control"}
    return [without_cache_control(v) for v in value] if isinstance(value, list) else value


def ask(messages, web=True) -> ModelRequest:
    return ModelRequest(system="# Phase 1 of 8: resources", tools=TOOLS, messages=messages, web=web)


def searched_and_paused() -> dict:
    return {"content": [{"type": "text", "text": "Searching first."},
                        *web_search("chain of thought prompting", [(PAPER, "Chain-of-Thought", PAGE)])],
            "stop_reason": "pause_turn"}


def fetched_and_cited() -> dict:
    return {"content": [*web_fetch(PAPER, PAGE),
                        {"type": "text", "text": "It says reasoning improves.",
                         "citations": [web_search_citation(PAPER, "Chain-of-Thought", PAGE[:40])]}],
            "stop_reason": "end_turn"}


def test_web_tools_are_offered_only_when_asked_and_cached_with_the_tools(api):
    api.push({"text": "a"}, {"text": "b"})
    model = AnthropicModel()
    model.complete(ask([{"role": "user", "content": "Go."}], web=False))
    model.complete(ask([{"role": "user", "content": "Go."}], web=True))
    without, with_web = (r["body"]["tools"] for r in api.requests)
    assert [t["name"] for t in without] == ["complete_phase"]
    assert [t.get("type") for t in with_web[1:]] == ["web_search_20250305", "web_fetch_20250910"]
    assert [t["name"] for t in with_web] == ["complete_phase", "web_search", "web_fetch"]
    assert "cache_control" in with_web[-1] and "cache_control" not in with_web[0]
    assert not any(h.startswith("web-") for r in api.requests for h in r["headers"].get("anthropic-beta", "").split(","))


def test_server_tool_blocks_come_back_unchanged_and_a_paused_turn_goes_on(api):
    api.push(searched_and_paused(), fetched_and_cited())
    model = AnthropicModel()
    messages = [{"role": "user", "content": "Find the paper."}]
    first = model.complete(ask(messages))
    assert first.stop_reason == "pause_turn"
    # The SDK's blocks, None fields dropped, are exactly what the API sent.
    assert first.content == searched_and_paused()["content"]
    assert first.usage.web_search_requests == 1 and first.usage.web_fetch_requests == 0
    assert first.usage.cost_usd == pytest.approx(cost_usd(model.name, Usage()) + WEB_SEARCH_USD)

    # Continuing the paused turn: its content goes back as the assistant's, nothing added.
    second = model.complete(ask(messages + [{"role": "assistant", "content": first.content}]))
    sent = api.requests[1]["body"]["messages"][-1]
    assert sent["role"] == "assistant" and without_cache_control(sent["content"]) == first.content
    assert second.content == fetched_and_cited()["content"]
    assert second.usage.web_fetch_requests == 1

    # Both replies sent back in a later turn pass the API's checks...
    api.push({"text": "ok"})
    later = messages + [{"role": "assistant", "content": first.content},
                        {"role": "assistant", "content": second.content},
                        {"role": "user", "content": "Go on."}]
    assert model.complete(ask(later)).content == [{"type": "text", "text": "ok"}]
    # ...and an encrypted field changed on the way (as a careless redaction would) does not.
    tampered = json.loads(json.dumps(later))
    tampered[1]["content"][2]["content"][0]["encrypted_content"] = "x" + first.content[2]["content"][0]["encrypted_content"]
    api.push({"text": "never sent"})
    with pytest.raises(FatalModelError, match="encrypted_content"):
        model.complete(ask(tampered))


def test_a_journal_rebuilds_the_server_tool_blocks_byte_for_byte(api, tmp_path):
    api.push(searched_and_paused(), fetched_and_cited())
    model = AnthropicModel()
    convo = Conversation.start(tmp_path)
    convo.add_user_text("Find the paper.")
    for _ in range(2):
        reply = model.complete(ask(convo.messages()))
        convo.add_reply(reply.content, reply.usage, reply.stop_reason)
    again = Conversation(convo.path)
    assert again.messages() == convo.messages()
    assert [m["role"] for m in again.messages()] == ["user", "assistant", "assistant"]
    assert again.unanswered_tool_uses() == []  # server tool calls are the API's to answer
    assert toollog.fetched(tmp_path) == {"arxiv:2201.11903"}


# -- the tool log -------------------------------------------------------------------------


def test_cited_sources_are_compared_by_key():
    text = ("See [CoT](https://arxiv.org/pdf/2201.11903v6.pdf), arXiv:2005.14165, "
            "https://doi.org/10.1000/XYZ.1, doi:10.5555/abc and <http://www.example.org/data/>.")
    assert toollog.cited(text) == {"arxiv:2201.11903", "arxiv:2005.14165", "doi:10.1000/xyz.1",
                                   "doi:10.5555/abc", "example.org/data"}
    assert toollog.source_key("https://arxiv.org/abs/2201.11903") == "arxiv:2201.11903"


def test_only_fetches_that_succeeded_count(tmp_path):
    convo = Conversation.start(tmp_path)
    convo.add_user_text("Go.")
    calls = [("ok", "curl -fsSL -o papers/a.pdf https://example.org/a.pdf", "(no output)"),
             ("failed", "curl -fsSL -o papers/b.pdf https://example.org/b.pdf", "curl: (6)\n[exit code: 6]"),
             ("no-download", "echo https://example.org/c", "https://example.org/c")]
    convo.add_reply([{"type": "tool_use", "id": i, "name": "bash", "input": {"command": c}} for i, c, _ in calls]
                    + web_fetch("https://example.org/d", None, error="url_not_accessible")
                    + web_fetch("https://example.org/e", "page"), Usage(), "tool_use")
    for i, _, out in calls:
        convo.add_tool_result(i, "bash", out, False)
    (tmp_path / "claude-run-001.jsonl").write_text("\n".join(json.dumps(e) for e in [
        {"type": "assistant", "message": {"content": [
            {"type": "tool_use", "id": "t1", "name": "WebFetch", "input": {"url": "https://example.org/f", "prompt": "?"}},
            {"type": "tool_use", "id": "t2", "name": "WebFetch", "input": {"url": "https://example.org/g", "prompt": "?"}}]}},
        {"type": "user", "message": {"content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "text"},
            {"type": "tool_result", "tool_use_id": "t2", "content": "error", "is_error": True}]}},
    ]) + "\n")
    attempts = [Attempt(n=1, phase="resources", status="SUCCESS", command="wget -q https://example.org/h.csv"),
                Attempt(n=2, phase="resources", status="FAILED", command="wget -q https://example.org/i.csv")]
    assert toollog.fetched(tmp_path, attempts) == {"example.org/a.pdf", "example.org/e", "example.org/f",
                                                   "example.org/h.csv"}


# -- planning, a web phase --------------------------------------------------------------------


def test_planning_searches_fetches_and_cites_through_the_messages_api(tmp_path, serve, cli):
    """Planning offers the API's web tools and asks to cite what was found: the stand-in
    searches (the API pauses its turn), fetches the paper found and cites it in
    planning.md; the phases after it are offered no web tool."""
    from auto_responder import IDEA, SOURCE, SOURCE_TEXT, SOURCE_TITLE, AutoResearcher
    from labrun.status import session_status
    from auto_responder import PLAN
    from test_anthropic_session import turn_of

    class WebPlanner(AutoResearcher):
        def planning(self, body, turn):
            if turn == 1:
                return {"content": [{"type": "text", "text": "What is known about averaging?"},
                                    *web_search("rmse of the mean of k measurements", [(SOURCE, SOURCE_TITLE, SOURCE_TEXT)])],
                        "stop_reason": "pause_turn"}
            if turn == 2:
                plan = (f"# Plan\n\n## Motivation and related work\n\n{SOURCE_TITLE} ({SOURCE}) derives "
                        "sigma/sqrt(k) for the RMSE of a k-sample mean; the baseline is that curve.\n\n"
                        "## 2." + PLAN.partition("## 2.")[2])
                write = {"type": "tool_use", "id": "toolu_plan020", "name": "str_replace_based_edit_tool",
                         "input": {"command": "create", "path": "planning.md", "file_text": plan}}
                return {"content": [*web_fetch(SOURCE, SOURCE_TEXT),
                                    {"type": "text", "text": "The source gives the baseline curve.",
                                     "citations": [web_search_citation(SOURCE, SOURCE_TITLE, SOURCE_TEXT[:30])]},
                                    write]}
            return super().planning(body, 2)

    idea = tmp_path / "idea.yaml"
    idea.write_text(IDEA)
    api = serve(WebPlanner())
    ws = tmp_path / "ws"
    result = cli("run", str(idea), "--workspace", str(ws), "--agent", "anthropic")
    assert result.returncode == 0, result.stderr

    asked = {}
    for r in api.requests:
        asked.setdefault(turn_of(r)[0], []).append(r["body"])
    first, paused, last = asked["planning"]
    assert [t["name"] for t in first["tools"]][-2:] == ["web_search", "web_fetch"]
    system = first["system"][0]["text"]
    assert "Search with `web_search`" in system and "open with `web_fetch`" in system
    assert "put the link of the page you opened" in system  # cite what was found
    assert [b["type"] for b in paused["messages"][-1]["content"]] == ["text", "server_tool_use", "web_search_tool_result"]
    for phase in ("setup", "implementation", "experiments", "analysis", "documentation"):
        assert not {"web_search", "web_fetch"} & {t["name"] for b in asked[phase] for t in b["tools"]}, phase

    assert SOURCE in (ws / "planning.md").read_text()
    assert toollog.source_key(SOURCE) in toollog.fetched(ws / ".labrun/phases/planning")
    report = session_status(ws)
    assert report["session"]["complete"]
    assert report["usage"]["web_search_requests"] == 1 and report["usage"]["web_fetch_requests"] == 1
