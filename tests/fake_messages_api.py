"""A local stand-in for the Anthropic Messages API, good enough for the real SDK.

It answers `POST /v1/messages` (plain JSON, or server-sent events when the body asks for
`stream: true`) from a script: a queue of responses, used in order. It records every request
it receives (path, headers, body), so tests can check what the client sent.

A scripted response is a dict (JSON, so a script file can hold it too):

    {"text": "Hello"}                                   one text block
    {"content": [{"type": "text", "text": "..."},        any blocks: text, tool_use (its input
                 {"type": "tool_use", "id": "toolu_1",   is streamed as input_json_delta; or
                  "name": "bash", "input": {...}}],      "partial_json": a raw string, streamed
                                                         as it is: a call cut off mid-input),
                                                         thinking (with a signature)
     "stop_reason": "tool_use",                          default: tool_use if a tool_use block
     "stop_details": {...},                              sent with the stop reason (a refusal's)
     "usage": {"input_tokens": 10, "output_tokens": 5,   any of the four counts
               "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
     "model": "...", "headers": {...}}                   default model: the request's
    {"status": 429, "error": {"type": "rate_limit_error", "message": "..."},
     "headers": {"retry-after": "3"}}                    an error response
    {"stream_error": {"type": "overloaded_error", ...}}  an SSE `error` event after message_start
    {"content": [*web_search("query", [(url, title, page_text)]),   the Messages API's own
                 *web_fetch(url, page_text),         web tools: `server_tool_use` blocks, each
                 {"type": "text", ...}],             with its result block (see those helpers)
     "stop_reason": "pause_turn"}                    the server paused its tool loop
    {"cut_after_events": 2, "text": "..."}               drop the connection after 2 SSE events
    {"delay_seconds": 1.5, ...}                          wait before answering
    {"hang": true}                                       never answer (until the server stops)

In-process, an entry may also be a callable `f(body) -> dict`, and `default` (dict or
callable) answers whenever the queue is empty. Without one, an empty queue answers 400.

Server tool blocks are checked as the real API checks them when a conversation comes back:
each `web_search_tool_result` / `web_fetch_tool_result` must follow its `server_tool_use` in
the same assistant turn (consecutive assistant messages are one turn), and every
`encrypted_content` / `encrypted_index` must be one this server sent, unchanged; a request
that breaks either is answered 400. A reply's usage counts its `server_tool_use` blocks
(`server_tool_use.web_search_requests`, `.web_fetch_requests`).

Every reply sent whole (the last SSE event written, or the JSON body) is appended to
`api.billed` as `{"n", "model", "usage"}`: what a real API would have charged. A request
that hung, failed, or whose stream was cut is not billed.

`cache_accounting=True` makes the input side of `usage` realistic: a prompt is the sequence
tools, system blocks, message blocks, each counted as len(JSON)/4 tokens (rounded up). Each
`cache_control` breakpoint of a reply writes its prefix to a prompt cache (5-minute TTL,
prefixes under `min_cacheable_tokens` are not cached); a later request reads from the cache
the longest cached prefix that ends at one of its breakpoints or up to 20 blocks before one,
as the real API does. So `cache_read_input_tokens` is that prefix, `cache_creation_input_tokens`
the rest up to the request's last breakpoint, `input_tokens` what follows it. The output side
is len(JSON of the content)/4. Counts a scripted reply gives explicitly win.

    with FakeMessagesAPI([{"text": "hi"}]) as api:
        os.environ["ANTHROPIC_BASE_URL"] = api.url
        ...
        api.requests[0]["body"]["messages"]

Standalone, for a test that runs `labrun` as another process (and may kill it mid-call):

    python tests/fake_messages_api.py --script script.json [--port 0] [--record requests.jsonl]

prints its URL as the first line of stdout, then serves until killed. The script file holds a
list of responses, or `{"responses": [...], "default": {...}}`. Each request is appended to
the record file (one JSON object a line) the moment it arrives.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import json
import time
from typing import Any, Iterable

from scripted_api import Handler, Scripted, ScriptedAPI, count_tokens, halves as _halves


class FakeMessagesAPI(ScriptedAPI):
    def __init__(
        self,
        script: Iterable[Scripted] = (),
        *,
        default: Scripted | None = None,
        record: str | None = None,
        port: int = 0,
        cache_accounting: bool = False,
        min_cacheable_tokens: int = 1024,
        cache_ttl_s: float = 300.0,
    ):
        super().__init__(script, default=default, record=record, port=port)
        self.cache = PromptCache(min_cacheable_tokens, cache_ttl_s) if cache_accounting else None
        self.issued: set[str] = set()
        """The encrypted fields of every reply sent, which must come back unchanged."""

    def route(self, method: str, path: str) -> bool:
        return method == "POST" and path.split("?")[0].rstrip("/").endswith("/v1/messages")

    def not_found(self, method: str, path: str) -> tuple[int, dict[str, Any]]:
        error = {"type": "not_found_error", "message": f"fake_messages_api: no route {path}"}
        return 404, {"type": "error", "error": error}

    def empty_script(self) -> dict[str, Any]:
        return _error(400, "invalid_request_error", "fake_messages_api: the script has no response left")

    def error_body(self, reply: dict[str, Any]) -> dict[str, Any]:
        return {"type": "error", "error": reply["error"]}

    def response_headers(self, n: int) -> dict[str, str]:
        return {"request-id": f"req_fake_{n}"}

    def handle(self, handler: Handler, n: int, reply: dict[str, Any], body: dict[str, Any]) -> None:
        extra = {**self.response_headers(n), **reply.get("headers", {})}
        if (problem := server_tool_problem(body, self.issued)) is not None:
            error = _error(400, "invalid_request_error", problem)
            return handler.send_json(400, self.error_body(error), self.response_headers(n))
        message = _message(n, reply, body, self._usage(body, reply))
        with self._lock:
            self.issued |= sealed_fields(message["content"])
        if body.get("stream"):
            events = _events(message, reply)
            if handler.sse(events, extra, reply.get("cut_after_events")) and not reply.get("stream_error"):
                self._bill(n, message["model"], message["usage"])
            return
        handler.send_json(200, message, extra)
        self._bill(n, message["model"], message["usage"])

    def _usage(self, body: dict[str, Any], reply: dict[str, Any]) -> dict[str, int]:
        """The usage of a reply about to be sent (prompt-cache accounting when it is on)."""
        usage = {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        if self.cache is not None:
            with self._lock:
                usage.update(self.cache.account(body))
            content = reply.get("content") or [{"type": "text", "text": reply.get("text", "")}]
            usage["output_tokens"] = count_tokens(json.dumps(content))
        usage.update(reply.get("usage", {}))
        return usage


def _error(status: int, kind: str, message: str) -> dict[str, Any]:
    return {"status": status, "error": {"type": kind, "message": message}}


def _message(n: int, reply: dict[str, Any], body: dict[str, Any], usage: dict[str, int]) -> dict[str, Any]:
    content = reply.get("content") or [{"type": "text", "text": reply.get("text", "")}]
    content = [_whole(b) for b in content]
    has_tool_use = any(b.get("type") == "tool_use" for b in content)
    calls = collections.Counter(b.get("name") for b in content if b.get("type") == "server_tool_use")
    if calls:
        usage = {**usage, "server_tool_use": {"web_search_requests": calls["web_search"],
                                              "web_fetch_requests": calls["web_fetch"]}}
    return {
        "id": f"msg_fake_{n}",
        "type": "message",
        "role": "assistant",
        "model": reply.get("model") or body.get("model", "claude-fake"),
        "content": content,
        "stop_reason": reply.get("stop_reason") or ("tool_use" if has_tool_use else "end_turn"),
        "stop_sequence": None,
        "stop_details": reply.get("stop_details"),
        "usage": usage,
    }


def _whole(block: dict[str, Any]) -> dict[str, Any]:
    """A block as the final message holds it; a cut-off tool call's input as far as it got."""
    if "partial_json" not in block:
        return block
    return {**{k: v for k, v in block.items() if k != "partial_json"}, "input": block.get("input", {})}


def _events(message: dict[str, Any], reply: dict[str, Any]) -> Iterable[tuple[str, dict[str, Any]]]:
    """The Messages API's event sequence for `message`, deltas split in two to be realistic."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "stop_details": None,
             "usage": {**usage, "output_tokens": 1}}
    yield "message_start", {"type": "message_start", "message": start}
    if reply.get("stream_error"):
        yield "error", {"type": "error", "error": reply["stream_error"]}
        return
    yield "ping", {"type": "ping"}
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        if kind == "text":
            first, deltas = {"type": "text", "text": ""}, [{"type": "text_delta", "text": t} for t in _halves(block["text"])]
            deltas += [{"type": "citations_delta", "citation": c} for c in block.get("citations") or []]
        elif kind in ("tool_use", "server_tool_use"):
            raw = (reply.get("content") or [{}])[index].get("partial_json")
            first = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": t}
                      for t in _halves(raw if raw is not None else json.dumps(block["input"]))]
        elif kind == "thinking":
            first = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": t} for t in _halves(block["thinking"])]
            deltas.append({"type": "signature_delta", "signature": block.get("signature", "")})
        else:
            first, deltas = block, []
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": first}
        for delta in deltas:
            yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield "message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None,
                  **({"stop_details": message["stop_details"]} if message.get("stop_details") else {})},
        "usage": usage,
    }
    yield "message_stop", {"type": "message_stop"}


# -- the Messages API's web tools, as a scripted reply gives them -----------------------------

def _sealed(*parts: str) -> str:
    """An opaque token like the API's encrypted fields."""
    return base64.b64encode(hashlib.sha256("\0".join(parts).encode()).digest() * 3).decode()


def sealed_fields(content: list[dict[str, Any]]) -> set[str]:
    """The encrypted fields of a reply's blocks (which must come back unchanged)."""
    found = set()
    for block in content:
        results = block.get("content") if block.get("type") == "web_search_tool_result" else None
        found |= {r.get("encrypted_content") for r in results if isinstance(r, dict)} if isinstance(results, list) else set()
        found |= {c.get("encrypted_index") for c in block.get("citations") or [] if isinstance(c, dict)}
    return found - {None}


def server_tool_id(name: str, key: str) -> str:
    return "srvtoolu_" + hashlib.sha256(f"{name}\0{key}".encode()).hexdigest()[:24]


def web_search(query: str, results: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """A `web_search` call and its result blocks; `results`: (url, title, page text)."""
    call = {"type": "server_tool_use", "id": server_tool_id("web_search", query),
            "name": "web_search", "input": {"query": query}}
    found = [{"type": "web_search_result", "url": url, "title": title, "page_age": "March 3, 2026",
              "encrypted_content": _sealed("content", url, text)} for url, title, text in results]
    return [call, {"type": "web_search_tool_result", "tool_use_id": call["id"], "content": found}]


def web_search_citation(url: str, title: str, cited: str) -> dict[str, Any]:
    """A text block's citation of a search result."""
    return {"type": "web_search_result_location", "url": url, "title": title, "cited_text": cited,
            "encrypted_index": _sealed("index", url, cited)}


def web_fetch(url: str, text: str | None, error: str | None = None) -> list[dict[str, Any]]:
    """A `web_fetch` call and its result block: the page as a plain-text document, or the
    error code (`url_not_accessible`, `unavailable`, ...) when `error` is given."""
    call = {"type": "server_tool_use", "id": server_tool_id("web_fetch", url), "name": "web_fetch",
            "input": {"url": url}}
    if error is not None:
        content: dict[str, Any] = {"type": "web_fetch_tool_result_error", "error_code": error}
    else:
        content = {"type": "web_fetch_result", "url": url, "retrieved_at": "2026-11-30T10:00:00Z",
                   "content": {"type": "document", "title": url, "citations": {"enabled": True},
                               "source": {"type": "text", "media_type": "text/plain", "data": text}}}
    return [call, {"type": "web_fetch_tool_result", "tool_use_id": call["id"], "content": content}]


def server_tool_problem(body: dict[str, Any], issued: set[str]) -> str | None:
    """Why the API would refuse the server tool blocks sent back in `body`, or None."""
    messages = body.get("messages") or []
    turn_calls: set[str] = set()
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            turn_calls = set()
            continue
        content = message.get("content")
        for j, block in enumerate(content if isinstance(content, list) else []):
            where = f"messages.{i}.content.{j}"
            kind = block.get("type")
            if kind == "server_tool_use":
                turn_calls.add(block.get("id"))
            elif kind in ("web_search_tool_result", "web_fetch_tool_result"):
                if block.get("tool_use_id") not in turn_calls:
                    return f"{where}: `{kind}` block has no matching `server_tool_use` before it in this turn"
                results = block.get("content")
                for r in results if isinstance(results, list) else []:
                    if r.get("encrypted_content") not in issued:
                        return f"{where}: invalid `encrypted_content` in a web search result"
            elif kind == "text":
                for c in block.get("citations") or []:
                    if c.get("type") == "web_search_result_location" and c.get("encrypted_index") not in issued:
                        return f"{where}: invalid `encrypted_index` in a citation"
    return None


def prompt_blocks(body: dict[str, Any]) -> list[tuple[str, bool]]:
    """A request's prompt in cache order (tools, system, messages), one entry a block: its
    JSON without `cache_control`, and whether it carries a breakpoint."""

    def entry(block: dict[str, Any]) -> tuple[str, bool]:
        bare = {k: v for k, v in block.items() if k != "cache_control"}
        return json.dumps(bare, separators=(",", ":")), "cache_control" in block

    blocks = [entry(t) for t in body.get("tools") or []]
    system = body.get("system") or []
    blocks += [entry({"type": "text", "text": system})] if isinstance(system, str) else [entry(b) for b in system]
    for message in body.get("messages") or []:
        content = message.get("content")
        content = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        for i, block in enumerate(content):
            text, marked = entry(block)
            blocks.append(((message.get("role", "") + ":" if i == 0 else "") + text, marked))
    return blocks


class PromptCache:
    """A model of the API's prompt cache (see the module docstring)."""

    LOOKBACK = 20

    def __init__(self, min_tokens: int = 1024, ttl_s: float = 300.0):
        self.min_tokens = min_tokens
        self.ttl_s = ttl_s
        self.entries: dict[str, float] = {}  # prefix hash -> expiry time

    def account(self, body: dict[str, Any], now: float | None = None) -> dict[str, int]:
        now = time.time() if now is None else now
        blocks = prompt_blocks(body)
        tokens, hashes = [0], []
        h = hashlib.sha256(json.dumps(body.get("model", "")).encode())
        for text, _ in blocks:
            tokens.append(tokens[-1] + count_tokens(text))
            h.update(text.encode() + b"\0")
            hashes.append(h.copy().hexdigest())
        marks = [i for i, (_, marked) in enumerate(blocks) if marked]
        hit = 0  # blocks read from the cache
        for b in marks:
            for j in range(b, max(-1, b - self.LOOKBACK), -1):
                if self.entries.get(hashes[j], 0) > now:
                    hit = max(hit, j + 1)
                    self.entries[hashes[j]] = now + self.ttl_s  # a hit refreshes the entry
                    break
        end = marks[-1] + 1 if marks else 0  # blocks up to the last breakpoint
        cacheable = end if tokens[end] >= self.min_tokens else 0
        for b in marks:
            if tokens[b + 1] >= self.min_tokens:
                self.entries[hashes[b]] = now + self.ttl_s
        read = tokens[hit] if hit else 0
        written = max(0, tokens[cacheable] - read) if cacheable > hit else 0
        return {
            "input_tokens": tokens[-1] - read - written,
            "cache_read_input_tokens": read,
            "cache_creation_input_tokens": written,
        }


def main(argv: list[str] | None = None) -> None:
    FakeMessagesAPI.main(argv, __doc__.split("\n")[0], cache_accounting="compute usage with a prompt-cache model")


if __name__ == "__main__":
    main()
