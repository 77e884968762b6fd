"""What the tests' scripted model APIs share: a local HTTP server that answers from a script.

`fake_messages_api` (Anthropic), `fake_responses_api` (OpenAI, as Codex calls it) and
`fake_gemini_api` (Gemini, as Gemini CLI calls it) each subclass `ScriptedAPI` and say only
how their protocol answers one request (`handle`). Here is the rest:

- a script: a queue of replies used in order; in-process an entry may also be a callable
  `f(body) -> dict`, and `default` (dict or callable) answers whenever the queue is empty;
- every request recorded (`requests`: n, method, path, headers, body, time), and appended to
  a record file the moment it arrives when `record` is given;
- `billed`: what a real API would have charged, one entry a reply sent whole (`_bill`);
- faults common to every protocol: `{"delay_seconds": s}` before answering, `{"hang": true}`
  (never answer, until the server stops), `{"status": 429, ..., "headers": {...}}` (an error
  response, in the protocol's own error shape), and `cut_after_events` (drop the connection
  in the middle of a stream, which the handler's `sse` honours);
- a standalone mode for a test that runs the client as another process and may kill it:
  `python tests/fake_X_api.py --script script.json [--port 0] [--record requests.jsonl]`
  prints its URL as the first line of stdout, then serves until killed. The script file holds
  a list of replies, or `{"responses": [...], "default": {...}}`.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable

Scripted = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]


class ScriptedAPI:
    """Subclasses define `route(method, path)` (True for the requests answered from the
    script), `handle(handler, n, reply, body)` (send reply `reply` to request `n`),
    `empty_script()` (the reply when the script is spent), and may define `error_body(reply)`
    (a scripted error in the protocol's shape) and `response_headers(n)`."""

    def __init__(self, script: Iterable[Scripted] = (), *, default: Scripted | None = None,
                 record: str | None = None, port: int = 0):
        self.script: collections.deque[Scripted] = collections.deque(script)
        self.default = default
        self.record = record
        self.requests: list[dict[str, Any]] = []
        self.billed: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._ids = iter(range(1, 1 << 62))
        self._server = _Server(("127.0.0.1", port), _handler(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def push(self, *responses: Scripted) -> None:
        with self._lock:
            self.script.extend(responses)

    def start(self) -> "ScriptedAPI":
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- for subclasses ------------------------------------------------------------------

    def route(self, method: str, path: str) -> bool:
        raise NotImplementedError

    def handle(self, handler: "Handler", n: int, reply: dict[str, Any], body: dict[str, Any]) -> None:
        raise NotImplementedError

    def empty_script(self) -> dict[str, Any]:
        raise NotImplementedError

    def error_body(self, reply: dict[str, Any]) -> dict[str, Any]:
        return {"error": reply["error"]}

    def response_headers(self, n: int) -> dict[str, str]:
        """Headers every reply to request `n` carries (a scripted reply's own are added)."""
        return {}

    def not_found(self, method: str, path: str) -> tuple[int, dict[str, Any]]:
        return 404, {"error": {"message": f"{type(self).__name__}: no route {method} {path}"}}

    # -- called from the handler's threads ------------------------------------------------

    def _take(self, method: str, path: str, headers: dict[str, str], body: dict[str, Any], *,
              answer: bool = True) -> tuple[int, dict[str, Any]]:
        """Record a request and, when `answer`, take the scripted reply for it."""
        with self._lock:
            n = next(self._ids)
            entry = {"n": n, "method": method, "path": path, "headers": headers, "body": body, "time": time.time()}
            self.requests.append(entry)
            if self.record:
                with open(self.record, "a") as f:
                    f.write(json.dumps(entry) + "\n")
            if not answer:
                return n, {}
            scripted = self.next_reply(body)
        if scripted is None:
            scripted = self.empty_script()
        return n, scripted(body) if callable(scripted) else scripted

    def next_reply(self, body: dict[str, Any]) -> Scripted | None:
        """The script's next entry (called with the lock held)."""
        return self.script.popleft() if self.script else self.default

    def _bill(self, n: int, model: str, usage: dict[str, Any]) -> None:
        with self._lock:
            self.billed.append({"n": n, "model": model, "usage": dict(usage)})

    def _wait(self, seconds: float | None) -> bool:
        """Sleep (forever when None); False when the server is stopping."""
        return not self._stopping.wait(seconds)

    def _serve(self, handler: "Handler", method: str) -> None:
        raw = handler.rfile.read(int(handler.headers.get("content-length") or 0))
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_raw": raw.decode(errors="replace")}
        headers = {k.lower(): v for k, v in handler.headers.items()}
        if not self.route(method, handler.path):
            self._take(method, handler.path, headers, body, answer=False)
            return handler.send_json(*self.not_found(method, handler.path))
        n, reply = self._take(method, handler.path, headers, body)
        if reply.get("delay_seconds") and not self._wait(float(reply["delay_seconds"])):
            return
        if reply.get("hang"):
            self._wait(None)
            return
        if "status" in reply:
            headers = {**self.response_headers(n), **reply.get("headers", {})}
            return handler.send_json(reply["status"], self.error_body(reply), headers)
        try:
            self.handle(handler, n, reply, body)
        except Exception as e:  # a script that does not fit the request: say so, to the client too
            print(f"{type(self).__name__}: request {n}: {e}", file=sys.stderr, flush=True)
            handler.send_json(500, {"error": {"code": "bad_script", "message": f"{type(self).__name__}: {e}"}})

    # -- standalone ------------------------------------------------------------------------

    @classmethod
    def main(cls, argv: list[str] | None = None, description: str = "", **options: Any) -> None:
        parser = argparse.ArgumentParser(description=description)
        parser.add_argument("--script", help="JSON file: a list of replies, or {responses, default}")
        parser.add_argument("--port", type=int, default=0)
        parser.add_argument("--record", help="append each request here as a JSON line")
        for flag, help_text in options.items():
            parser.add_argument(f"--{flag.replace('_', '-')}", action="store_true", help=help_text)
        args = parser.parse_args(argv)
        script: Any = []
        if args.script:
            with open(args.script) as f:
                script = json.load(f)
        if isinstance(script, list):
            script = {"responses": script}
        flags = {flag: getattr(args, flag) for flag in options}
        api = cls(script.get("responses", []), default=script.get("default"), record=args.record,
                  port=args.port, **flags)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        print(api.url, flush=True)
        try:
            api._server.serve_forever()
        except KeyboardInterrupt:
            pass


class Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 with the two ways a model API answers: one JSON body, or server-sent events."""

    protocol_version = "HTTP/1.1"
    api: ScriptedAPI

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        self.api._serve(self, "POST")

    def do_GET(self) -> None:
        self.api._serve(self, "GET")

    def send_json(self, status: int, payload: Any, headers: dict[str, Any] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, str(value))
        self.end_headers()
        self.wfile.write(data)

    def sse(self, events: Iterable[tuple[str | None, Any]], headers: dict[str, Any] | None = None,
            cut_after: int | None = None) -> bool:
        """Send `(event name or None, data)` pairs as server-sent events; True when all were
        sent, False when the stream was cut after `cut_after` of them."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        for key, value in (headers or {}).items():
            self.send_header(key, str(value))
        self.end_headers()
        self.close_connection = True
        for count, (event, data) in enumerate(events, start=1):
            head = f"event: {event}\n" if event else ""
            self.wfile.write(f"{head}data: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()
            if cut_after is not None and count >= cut_after:
                self.connection.shutdown(2)  # the peer sees the stream end mid-reply
                return False
        return True


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # a client hanging up is normal
            super().handle_error(request, client_address)


def _handler(api: ScriptedAPI) -> type[Handler]:
    return type("BoundHandler", (Handler,), {"api": api})


def count_tokens(text: str) -> int:
    """The fakes' token count: a token is 4 characters (rounded up)."""
    return math.ceil(len(text) / 4)


def halves(text: str) -> list[str]:
    """A streamed text in two deltas, as real APIs split it."""
    middle = len(text) // 2
    return [part for part in (text[:middle], text[middle:]) if part]


class PrefixCache:
    """Implicit prompt caching as the OpenAI and Gemini APIs do it (no breakpoints): a prompt
    is a list of items (JSON strings); the cached part of one is the longest run of items,
    from the start, that an earlier prompt under the same key began with, counted only from
    `min_tokens` on."""

    def __init__(self, min_tokens: int = 1024):
        self.min_tokens = min_tokens
        self.prompts: dict[str, list[list[str]]] = {}
        self._lock = threading.Lock()

    def account(self, key: str, prompt: list[str]) -> tuple[int, int]:
        """(tokens in `prompt`, of which cached)."""
        tokens = [count_tokens(item) for item in prompt]
        with self._lock:
            earlier = self.prompts.setdefault(key, [])
            shared = max((_common_prefix(prompt, e) for e in earlier), default=0)
            earlier.append(prompt)
        cached = sum(tokens[:shared])
        return sum(tokens), cached if cached >= self.min_tokens else 0


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
