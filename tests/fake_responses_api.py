"""A local stand-in for the OpenAI Responses API, as the real `codex` CLI calls it.

Codex 0.169 (`codex exec`, the built-in `openai` provider pointed here with
`-c openai_base_url="<url>/v1"`, a key in `CODEX_API_KEY`) first asks for a WebSocket
(`GET /v1/responses`, `Upgrade: websocket`); this server answers 426 Upgrade Required, as
Codex's own test servers do, and Codex then `POST`s `/v1/responses` with `stream: true`
and reads server-sent events. Its answer is scripted (`scripted_api`: a queue, recorded
requests, delays, hangs, cut streams). A scripted reply is a dict (JSON):

    {"text": "Hello"}                               one assistant message
    {"output": [item, ...]}                         any output items, completed with ids:
        {"type": "message", "text": "..."}              (or "content": [output_text parts])
        {"type": "function_call", "name": "exec_command", "arguments": {...} or "..."}
        {"type": "custom_tool_call", "name": "apply_patch", "input": "*** Begin Patch ..."}
        {"type": "reasoning", "summary": "..."}
    {"tool": "mcp__labrun__complete_phase", "arguments": {...}, "text": "..."}
                                                    a call to a tool as the request offers it:
                                                    a function (or freeform custom) tool of
                                                    that name, or else a nested tool of code
                                                    mode's `exec` (JavaScript that awaits
                                                    `tools.<name>(arguments)`); `text` adds a
                                                    message before it
    {"usage": {"input_tokens": 10, "cached_tokens": 0, "output_tokens": 5,
               "reasoning_tokens": 0}}              counts that win over the computed ones
    {"failed": {"code": "rate_limit_exceeded", "message": "... try again in 2s."}}
                                                    `response.failed` after `response.created`
    {"stream_error": {"code": "server_error", "message": "..."}}   an SSE `error` event
    {"status": 429, "error": {"type": "usage_limit_reached", "message": "...",
                              "resets_at": 1790000000, "plan_type": "plus"},
     "headers": {"retry-after": "2"}}               an error response
    {"cut_after_events": 3, ...}, {"delay_seconds": 1.5, ...}, {"hang": true}

Usage, unless scripted: the request's instructions, tools and input are counted as
len(JSON)/4 tokens each item; `cached_tokens` is the part of that which repeats, item for
item, the start of an earlier request with the same `prompt_cache_key` (the API caches
prompt prefixes by itself, from `min_cached_tokens` on); output is len(JSON of the output
items)/4. Each reply sent whole, up to its `response.completed`, is appended to `api.billed`
as `{"n", "model", "usage"}` with `usage` exactly as sent.

    with FakeResponsesAPI([{"tool": "exec_command", "arguments": {"cmd": "ls"}}, {"text": "done"}]) as api:
        argv = ["codex", "exec", "--json", "-c", f'openai_base_url="{api.url}/v1"', ...]

Standalone: `python tests/fake_responses_api.py --script script.json [--port 0] [--record F]`.
"""

from __future__ import annotations

import json
import time
from typing import Any, Iterable, Iterator

from scripted_api import Handler, PrefixCache, Scripted, ScriptedAPI, count_tokens, halves


class FakeResponsesAPI(ScriptedAPI):
    def __init__(self, script: Iterable[Scripted] = (), *, default: Scripted | None = None,
                 record: str | None = None, port: int = 0, min_cached_tokens: int = 1024):
        super().__init__(script, default=default, record=record, port=port)
        self.cache = PrefixCache(min_cached_tokens)
        self._searching: dict[str, dict[str, Any]] = {}  # tool_search call id -> the reply it serves

    def next_reply(self, body: dict[str, Any]) -> Scripted | None:
        """A reply whose tool had to be searched for first answers the search's output."""
        for item in reversed(body.get("input") or []):
            if item.get("type") == "tool_search_output" and item.get("call_id") in self._searching:
                return self._searching.pop(item["call_id"])
        return super().next_reply(body)

    def route(self, method: str, path: str) -> bool:
        return method == "POST" and path.split("?")[0].rstrip("/").endswith("/responses")

    def not_found(self, method: str, path: str) -> tuple[int, dict[str, Any]]:
        if method == "GET" and path.split("?")[0].rstrip("/").endswith("/responses"):
            return 426, {"error": {"type": "invalid_request_error", "code": "upgrade_required",
                                   "message": "fake_responses_api: no WebSocket here; POST with stream: true"}}
        return 404, {"error": {"type": "invalid_request_error", "code": "not_found",
                               "message": f"fake_responses_api: no route {method} {path}"}}

    def empty_script(self) -> dict[str, Any]:
        return {"status": 400, "error": {"type": "invalid_request_error", "code": "script_exhausted",
                                         "message": "fake_responses_api: the script has no response left"}}

    def response_headers(self, n: int) -> dict[str, str]:
        return {"x-request-id": f"req_fake_{n}"}

    def handle(self, handler: Handler, n: int, reply: dict[str, Any], body: dict[str, Any]) -> None:
        response = {"id": f"resp_fake_{n}", "object": "response", "created_at": int(time.time()),
                    "status": "in_progress", "model": reply.get("model") or body.get("model", "gpt-fake"),
                    "output": [], "usage": None}
        headers = {**self.response_headers(n), **reply.get("headers", {})}
        if not body.get("stream"):
            return handler.send_json(400, {"error": {"type": "invalid_request_error", "code": "stream_required",
                                                     "message": "fake_responses_api answers only stream: true"}})
        if "failed" in reply or "stream_error" in reply:
            handler.sse(_failed(response, reply), headers)
            return
        output = [_item(n, i, item) for i, item in enumerate(output_items(reply, body))]
        for item in output:
            if item["type"] == "tool_search_call" and "tool" in reply:
                with self._lock:
                    self._searching[item["call_id"]] = {k: v for k, v in reply.items() if k != "text"}
        completed = {**response, "status": "completed", "output": output, "usage": self._usage(body, output, reply)}
        if handler.sse(_events(response, completed), headers, reply.get("cut_after_events")):
            self._bill(n, completed["model"], completed["usage"])

    def _usage(self, body: dict[str, Any], output: list[dict[str, Any]], reply: dict[str, Any]) -> dict[str, Any]:
        prompt = [json.dumps(body.get("instructions") or ""), json.dumps(body.get("tools") or [])]
        prompt += [json.dumps(item, sort_keys=True) for item in body.get("input") or []]
        total, cached = self.cache.account(str(body.get("prompt_cache_key")), prompt)
        counts = {"input_tokens": total, "cached_tokens": cached, "cache_write_tokens": 0,
                  "output_tokens": count_tokens(json.dumps(output)), "reasoning_tokens": 0}
        counts.update(reply.get("usage", {}))
        return {"input_tokens": counts["input_tokens"],
                "input_tokens_details": {"cached_tokens": counts["cached_tokens"],
                                         "cache_write_tokens": counts["cache_write_tokens"]},
                "output_tokens": counts["output_tokens"],
                "output_tokens_details": {"reasoning_tokens": counts["reasoning_tokens"]},
                "total_tokens": counts["input_tokens"] + counts["output_tokens"]}


# -- what a reply puts out ------------------------------------------------------------------


def offered_tools(body: dict[str, Any]) -> dict[str, tuple[dict[str, Any], str | None]]:
    """Every tool a request offers, by the name a model calls it (`namespace__name` inside a
    namespace other than `functions`), with its namespace: the request's `tools`, the
    `additional_tools` input items of Codex's "responses-lite" models, and the tools that
    earlier `tool_search` calls loaded (`tool_search_output` items)."""
    found: dict[str, tuple[dict[str, Any], str | None]] = {}

    def walk(tools: list[dict[str, Any]], namespace: str | None = None) -> None:
        for tool in tools:
            if tool.get("type") == "namespace":
                walk(tool.get("tools") or [], tool.get("name"))
            else:
                name = tool.get("name") or tool.get("type")
                full = f"{namespace}__{name}" if namespace not in (None, "functions") else name
                found[full] = (tool, namespace)

    walk(body.get("tools") or [])
    for item in body.get("input") or []:
        if item.get("type") in ("additional_tools", "tool_search_output"):
            walk(item.get("tools") or [])
    return found


def output_items(reply: dict[str, Any], body: dict[str, Any]) -> list[dict[str, Any]]:
    if "output" in reply:
        return list(reply["output"])
    items = [{"type": "message", "text": reply["text"]}] if reply.get("text") else []
    if "tool" in reply:
        items.append(tool_call(body, reply["tool"], reply.get("arguments", {})))
    return items or [{"type": "message", "text": ""}]


def tool_call(body: dict[str, Any], name: str, arguments: Any) -> dict[str, Any]:
    """A call to tool `name` in the form this request offers it: a function or freeform call;
    in code mode, JavaScript for `exec` that awaits the nested tool; a deferred tool (Codex
    defers MCP tools) first through `tool_search`, as a model finds it."""
    tools = offered_tools(body)
    if name in tools:
        tool, namespace = tools[name]
        if tool.get("type") == "custom":
            return {"type": "custom_tool_call", "name": tool["name"], "input": arguments}
        call = {"type": "function_call", "name": tool["name"], "arguments": arguments}
        return {**call, "namespace": namespace} if namespace not in (None, "functions") else call
    if tools.get("exec", ({}, None))[0].get("type") == "custom":  # code mode: every tool is nested in `exec`
        given = json.dumps(arguments)
        script = (f"const result = await tools.{name}({given});\n"
                  "text(typeof result === 'string' ? result : JSON.stringify(result));\n")
        return {"type": "custom_tool_call", "name": "exec", "input": script}
    if "tool_search" in tools:
        return {"type": "tool_search_call", "execution": "client", "arguments": {"query": name.replace("__", " ")}}
    raise ValueError(f"the request offers no tool {name!r} (it offers {sorted(tools)})")


def _item(n: int, index: int, item: dict[str, Any]) -> dict[str, Any]:
    """A scripted item as the API completes it: ids, status, the JSON-string arguments."""
    kind = item["type"]
    done = {"id": item.get("id") or f"{kind[:2]}_fake_{n}_{index}", **item}
    if kind == "message":
        text = done.pop("text", None)
        done.setdefault("content", [{"type": "output_text", "text": text or "", "annotations": []}])
        done.setdefault("role", "assistant")
        done.setdefault("status", "completed")
    elif kind in ("function_call", "custom_tool_call", "tool_search_call"):
        done.setdefault("call_id", f"call_fake_{n}_{index}")
        if kind != "tool_search_call":
            done.setdefault("status", "completed")
        if kind == "function_call" and not isinstance(done.get("arguments"), str):
            done["arguments"] = json.dumps(done.get("arguments") or {})
    elif kind == "reasoning":
        summary = done.get("summary") or []
        done["summary"] = [{"type": "summary_text", "text": summary}] if isinstance(summary, str) else summary
    return done


def _events(response: dict[str, Any], completed: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The Responses API's streaming events for `completed`, deltas split in two."""
    seq = iter(range(1 << 30))

    def event(kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
        return kind, {"type": kind, "sequence_number": next(seq), **fields}

    yield event("response.created", response=response)
    yield event("response.in_progress", response=response)
    for i, item in enumerate(completed["output"]):
        at = {"item_id": item["id"], "output_index": i}
        kind = item["type"]
        if kind == "message":
            yield event("response.output_item.added", output_index=i, item={**item, "content": [], "status": "in_progress"})
            for c, part in enumerate(item["content"]):
                yield event("response.content_part.added", **at, content_index=c, part={**part, "text": ""})
                for delta in halves(part.get("text", "")):
                    yield event("response.output_text.delta", **at, content_index=c, delta=delta, logprobs=[])
                yield event("response.output_text.done", **at, content_index=c, text=part.get("text", ""), logprobs=[])
                yield event("response.content_part.done", **at, content_index=c, part=part)
        elif kind == "function_call":
            yield event("response.output_item.added", output_index=i, item={**item, "arguments": "", "status": "in_progress"})
            for delta in halves(item["arguments"]):
                yield event("response.function_call_arguments.delta", **at, delta=delta)
            yield event("response.function_call_arguments.done", **at, arguments=item["arguments"])
        elif kind == "custom_tool_call":
            yield event("response.output_item.added", output_index=i, item={**item, "input": "", "status": "in_progress"})
            for delta in halves(item["input"]):
                yield event("response.custom_tool_call_input.delta", **at, delta=delta)
            yield event("response.custom_tool_call_input.done", **at, input=item["input"])
        elif kind == "reasoning":
            yield event("response.output_item.added", output_index=i, item={**item, "summary": []})
            for s, part in enumerate(item["summary"]):
                yield event("response.reasoning_summary_part.added", **at, summary_index=s, part={**part, "text": ""})
                for delta in halves(part["text"]):
                    yield event("response.reasoning_summary_text.delta", **at, summary_index=s, delta=delta)
                yield event("response.reasoning_summary_text.done", **at, summary_index=s, text=part["text"])
                yield event("response.reasoning_summary_part.done", **at, summary_index=s, part=part)
        else:
            yield event("response.output_item.added", output_index=i, item=item)
        yield event("response.output_item.done", output_index=i, item=item)
    yield event("response.completed", response=completed)


def _failed(response: dict[str, Any], reply: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    yield "response.created", {"type": "response.created", "sequence_number": 0, "response": response}
    if "stream_error" in reply:
        yield "error", {"type": "error", "sequence_number": 1, "param": None, **reply["stream_error"]}
        return
    failed = {**response, "status": "failed", "error": reply["failed"]}
    yield "response.failed", {"type": "response.failed", "sequence_number": 1, "response": failed}


def main(argv: list[str] | None = None) -> None:
    FakeResponsesAPI.main(argv, __doc__.split("\n")[0])


if __name__ == "__main__":
    main()
