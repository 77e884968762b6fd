"""A local stand-in for the Anthropic Messages API, good enough for the real SDK.

It answers `POST /v1/messages` (plain JSON, or server-sent events when the body asks for
`stream: true`) from a script: a queue of responses, used in order. It records every request
it receives (path, headers, body), so tests can check what the client sent.

A scripted response is a dict (JSON, so a script file can hold it too):

    {"text": "Hello"}                                   one text block
    {"content": [{"type": "text", "text": "..."},        any blocks: text, tool_use (its input
                 {"type": "tool_use", "id": "toolu_1",   is streamed as input_json_delta),
                  "name": "bash", "input": {...}}],      thinking (with a signature)
     "stop_reason": "tool_use",                          default: tool_use if a tool_use block
     "usage": {"input_tokens": 10, "output_tokens": 5,   any of the four counts
               "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
     "model": "...", "headers": {...}}                   default model: the request's
    {"status": 429, "error": {"type": "rate_limit_error", "message": "..."},
     "headers": {"retry-after": "3"}}                    an error response
    {"stream_error": {"type": "overloaded_error", ...}}  an SSE `error` event after message_start
    {"cut_after_events": 2, "text": "..."}               drop the connection after 2 SSE events
    {"delay_seconds": 1.5, ...}                          wait before answering
    {"hang": true}                                       never answer (until the server stops)

In-process, an entry may also be a callable `f(body) -> dict`, and `default` (dict or
callable) answers whenever the queue is empty. Without one, an empty queue answers 400.

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

import argparse
import collections
import hashlib
import json
import math
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable

Scripted = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]


class FakeMessagesAPI:
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
        self.script: collections.deque[Scripted] = collections.deque(script)
        self.default = default
        self.record = record
        self.requests: list[dict[str, Any]] = []
        self.billed: list[dict[str, Any]] = []
        self.cache = PromptCache(min_cacheable_tokens, cache_ttl_s) if cache_accounting else None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._ids = iter(range(1, 1 << 62))
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def push(self, *responses: Scripted) -> None:
        with self._lock:
            self.script.extend(responses)

    def start(self) -> "FakeMessagesAPI":
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "FakeMessagesAPI":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- called from the handler's threads ------------------------------------------------

    def _take(self, path: str, headers: dict[str, str], body: dict[str, Any], *, answer: bool = True) -> tuple[int, dict[str, Any]]:
        """Record a request and, when `answer`, take the scripted response for it."""
        with self._lock:
            n = next(self._ids)
            entry = {"n": n, "path": path, "headers": headers, "body": body, "time": time.time()}
            self.requests.append(entry)
            if self.record:
                with open(self.record, "a") as f:
                    f.write(json.dumps(entry) + "\n")
            if not answer:
                return n, {}
            scripted = self.script.popleft() if self.script else self.default
        if scripted is None:
            scripted = _error(400, "invalid_request_error", "fake_messages_api: the script has no response left")
        return n, scripted(body) if callable(scripted) else scripted

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

    def _bill(self, n: int, message: dict[str, Any]) -> None:
        with self._lock:
            self.billed.append({"n": n, "model": message["model"], "usage": dict(message["usage"])})

    def _wait(self, seconds: float | None) -> bool:
        """Sleep (forever when None); False when the server is stopping."""
        return not self._stopping.wait(seconds)


def _handler(api: FakeMessagesAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = {"_raw": raw.decode(errors="replace")}
            headers = {k.lower(): v for k, v in self.headers.items()}
            if not self.path.split("?")[0].rstrip("/").endswith("/v1/messages"):
                api._take(self.path, headers, body, answer=False)
                error = {"type": "not_found_error", "message": f"fake_messages_api: no route {self.path}"}
                return self._json(404, {"type": "error", "error": error}, {})
            n, reply = api._take(self.path, headers, body)
            if reply.get("delay_seconds") and not api._wait(float(reply["delay_seconds"])):
                return
            if reply.get("hang"):
                api._wait(None)
                return
            extra = {"request-id": f"req_fake_{n}", **reply.get("headers", {})}
            if "status" in reply:
                return self._json(reply["status"], {"type": "error", "error": reply["error"]}, extra)
            message = _message(n, reply, body, api._usage(body, reply))
            if body.get("stream"):
                if self._stream(message, reply, extra):
                    api._bill(n, message)
                return
            self._json(200, message, extra)
            api._bill(n, message)

        def _json(self, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for key, value in headers.items():
                self.send_header(key, str(value))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, message: dict[str, Any], reply: dict[str, Any], headers: dict[str, str]) -> bool:
            """Send the reply as server-sent events; True when it was sent whole."""
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            self.send_header("connection", "close")
            for key, value in headers.items():
                self.send_header(key, str(value))
            self.end_headers()
            self.close_connection = True
            cut = reply.get("cut_after_events")
            for count, (event, data) in enumerate(_events(message, reply), start=1):
                self.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()
                if cut is not None and count >= cut:
                    self.connection.shutdown(2)  # the peer sees the stream end mid-reply
                    return False
            return not reply.get("stream_error")

    return Handler


def _error(status: int, kind: str, message: str) -> dict[str, Any]:
    return {"status": status, "error": {"type": kind, "message": message}}


def _message(n: int, reply: dict[str, Any], body: dict[str, Any], usage: dict[str, int]) -> dict[str, Any]:
    content = reply.get("content") or [{"type": "text", "text": reply.get("text", "")}]
    has_tool_use = any(b.get("type") == "tool_use" for b in content)
    return {
        "id": f"msg_fake_{n}",
        "type": "message",
        "role": "assistant",
        "model": reply.get("model") or body.get("model", "claude-fake"),
        "content": content,
        "stop_reason": reply.get("stop_reason") or ("tool_use" if has_tool_use else "end_turn"),
        "stop_sequence": None,
        "usage": usage,
    }


def _events(message: dict[str, Any], reply: dict[str, Any]) -> Iterable[tuple[str, dict[str, Any]]]:
    """The Messages API's event sequence for `message`, deltas split in two to be realistic."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    yield "message_start", {"type": "message_start", "message": start}
    if reply.get("stream_error"):
        yield "error", {"type": "error", "error": reply["stream_error"]}
        return
    yield "ping", {"type": "ping"}
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        if kind == "text":
            first, deltas = {"type": "text", "text": ""}, [{"type": "text_delta", "text": t} for t in _halves(block["text"])]
        elif kind == "tool_use":
            first = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": t} for t in _halves(json.dumps(block["input"]))]
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
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
        "usage": usage,
    }
    yield "message_stop", {"type": "message_stop"}


def count_tokens(text: str) -> int:
    """The fake's token count: a token is 4 characters (rounded up)."""
    return math.ceil(len(text) / 4)


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


def _halves(text: str) -> list[str]:
    middle = len(text) // 2
    return [part for part in (text[:middle], text[middle:]) if part]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--script", help="JSON file: a list of responses, or {responses, default}")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--record", help="append each request here as a JSON line")
    parser.add_argument("--cache-accounting", action="store_true", help="compute usage with a prompt-cache model")
    args = parser.parse_args(argv)
    script: Any = []
    if args.script:
        with open(args.script) as f:
            script = json.load(f)
    if isinstance(script, list):
        script = {"responses": script}
    api = FakeMessagesAPI(script.get("responses", []), default=script.get("default"), record=args.record, port=args.port,
                          cache_accounting=args.cache_accounting)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(api.url, flush=True)
    try:
        api._server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
