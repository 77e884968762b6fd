"""A local stand-in for the Gemini API, as the real `gemini` CLI (Gemini CLI) calls it.

Gemini CLI 0.61 with an API key (`GEMINI_API_KEY`, auth type `gemini-api-key` selected in
its settings) sends its requests to `GOOGLE_GEMINI_BASE_URL` when that is set:
`POST /v1beta/models/<model>:streamGenerateContent?alt=sse` for the agent's turns (server-
sent events, one `GenerateContentResponse` each, no event names) and
`POST /v1beta/models/<model>:generateContent` for its own helper calls (with `-m` unset, a
model router asks a small model to rate the task first), key in `x-goog-api-key`. Both are
answered from the script (`scripted_api`: a queue, recorded requests, delays, hangs, cut
streams). A scripted reply is a dict (JSON):

    {"text": "Hello"}                               one text part
    {"parts": [{"text": "..."}, {"functionCall": {"name": "...", "args": {...}}}]}
    {"tool": "run_experiment", "arguments": {...}, "text": "..."}
                                                    a function call to the declared tool of
                                                    that name, or else the one whose name ends
                                                    in `_<name>` (MCP tools get their server's
                                                    name put before theirs); `text` first
    {"json": {...}}                                 a JSON text (a helper call's answer)
    {"finish_reason": "MAX_TOKENS"}                 default STOP
    {"usage": {"promptTokenCount": 10, "candidatesTokenCount": 5,
               "cachedContentTokenCount": 0, "thoughtsTokenCount": 0}}   counts that win
    {"status": 429, "error": resource_exhausted("2s")["error"]}          an error response
    {"cut_after_events": 1, ...}, {"delay_seconds": 1.5, ...}, {"hang": true}

`resource_exhausted(retry_delay, quota_id)` builds the API's 429: status RESOURCE_EXHAUSTED
with `google.rpc.QuotaFailure` and `google.rpc.RetryInfo` details. An error is sent in the
API's shape, `{"error": {"code", "message", "status", "details"}}`.

Usage, unless scripted: the request's system instruction, tools and each content are
len(JSON)/4 tokens; `cachedContentTokenCount` is the part that repeats the start of an
earlier request to the same model (implicit caching, from `min_cached_tokens` on); the
reply's parts are the candidates' tokens. The last event of a stream carries
`usageMetadata` and the finish reason. Each reply sent whole is appended to `api.billed`
as `{"n", "model", "usage"}` with `usage` the `usageMetadata` sent.

    with FakeGeminiAPI([{"text": "hi"}]) as api:
        env = {"GOOGLE_GEMINI_BASE_URL": api.url, "GEMINI_API_KEY": "test-key", ...}

Standalone: `python tests/fake_gemini_api.py --script script.json [--port 0] [--record F]`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Iterator

from scripted_api import Handler, PrefixCache, Scripted, ScriptedAPI, count_tokens, halves

ROUTE = re.compile(r"/v1(?:beta|alpha)?/models/(?P<model>[^/:]+):(?P<method>streamGenerateContent|generateContent)$")


def resource_exhausted(retry_delay: str | None = "2s",
                       quota_id: str = "GenerateRequestsPerMinutePerProjectPerModel") -> dict[str, Any]:
    """The Gemini API's 429 reply, as a scripted reply."""
    details: list[dict[str, Any]] = [{
        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
        "violations": [{"quotaMetric": "generativelanguage.googleapis.com/generate_content_requests",
                        "quotaId": quota_id, "quotaValue": "10"}],
    }]
    if retry_delay is not None:
        details.append({"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay})
    return {"status": 429, "error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": details,
                                     "message": "You exceeded your current quota, please check your plan and "
                                                "billing details."}}


class FakeGeminiAPI(ScriptedAPI):
    def __init__(self, script: Iterable[Scripted] = (), *, default: Scripted | None = None,
                 record: str | None = None, port: int = 0, min_cached_tokens: int = 1024):
        super().__init__(script, default=default, record=record, port=port)
        self.cache = PrefixCache(min_cached_tokens)

    def route(self, method: str, path: str) -> bool:
        return method == "POST" and ROUTE.search(path.split("?")[0]) is not None

    def not_found(self, method: str, path: str) -> tuple[int, dict[str, Any]]:
        return 404, {"error": {"code": 404, "status": "NOT_FOUND",
                               "message": f"fake_gemini_api: no route {method} {path}"}}

    def empty_script(self) -> dict[str, Any]:
        return {"status": 400, "error": {"code": 400, "status": "INVALID_ARGUMENT",
                                         "message": "fake_gemini_api: the script has no response left"}}

    def handle(self, handler: Handler, n: int, reply: dict[str, Any], body: dict[str, Any]) -> None:
        route = ROUTE.search(handler.path.split("?")[0])
        model = route["model"]
        parts = reply_parts(reply, body)
        usage = self._usage(model, body, parts, reply)
        response = {"candidates": [{"content": {"role": "model", "parts": parts},
                                    "finishReason": reply.get("finish_reason", "STOP"), "index": 0}],
                    "usageMetadata": usage, "modelVersion": model, "responseId": f"fake-{n}"}
        if route["method"] == "generateContent":
            handler.send_json(200, response, reply.get("headers"))
            self._bill(n, model, usage)
        elif handler.sse(((None, chunk) for chunk in _chunks(response)), reply.get("headers"),
                         reply.get("cut_after_events")):
            self._bill(n, model, usage)

    def _usage(self, model: str, body: dict[str, Any], parts: list[dict[str, Any]],
               reply: dict[str, Any]) -> dict[str, Any]:
        prompt = [json.dumps(body.get("systemInstruction") or {}, sort_keys=True),
                  json.dumps(body.get("tools") or [], sort_keys=True)]
        prompt += [json.dumps(c, sort_keys=True) for c in body.get("contents") or []]
        total, cached = self.cache.account(model, prompt)
        usage = {"promptTokenCount": total, "candidatesTokenCount": count_tokens(json.dumps(parts)),
                 "cachedContentTokenCount": cached, "thoughtsTokenCount": 0}
        usage.update(reply.get("usage", {}))
        usage["totalTokenCount"] = usage["promptTokenCount"] + usage["candidatesTokenCount"] + usage["thoughtsTokenCount"]
        return usage


def declared_functions(body: dict[str, Any]) -> list[str]:
    return [f["name"] for tool in body.get("tools") or [] for f in tool.get("functionDeclarations") or []]


def reply_parts(reply: dict[str, Any], body: dict[str, Any]) -> list[dict[str, Any]]:
    if "parts" in reply:
        return list(reply["parts"])
    if "json" in reply:
        return [{"text": json.dumps(reply["json"])}]
    parts = [{"text": reply["text"]}] if reply.get("text") else []
    if "tool" in reply:
        parts.append({"functionCall": {"name": function_name(body, reply["tool"]), "args": reply.get("arguments", {})}})
    return parts or [{"text": ""}]


def function_name(body: dict[str, Any], name: str) -> str:
    """The declared function that tool `name` is: itself, or an MCP tool's prefixed name."""
    declared = declared_functions(body)
    if name in declared:
        return name
    prefixed = [d for d in declared if d.endswith("_" + name)]
    if len(prefixed) == 1:
        return prefixed[0]
    raise ValueError(f"the request declares no function {name!r} (it declares {declared})")


def _chunks(response: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A streamed reply: text parts in two halves, each part its own chunk; the last chunk
    has the finish reason and the usage."""
    candidate = response["candidates"][0]
    pieces: list[dict[str, Any]] = []
    for part in candidate["content"]["parts"]:
        if "text" in part and len(part) == 1:
            pieces += [{"text": t} for t in halves(part["text"])] or [part]
        else:
            pieces.append(part)
    for i, piece in enumerate(pieces):
        chunk: dict[str, Any] = {"candidates": [{"content": {"role": "model", "parts": [piece]}, "index": 0}],
                                 "modelVersion": response["modelVersion"], "responseId": response["responseId"]}
        if i == len(pieces) - 1:
            chunk["candidates"][0]["finishReason"] = candidate["finishReason"]
            chunk["usageMetadata"] = response["usageMetadata"]
        yield chunk


def main(argv: list[str] | None = None) -> None:
    FakeGeminiAPI.main(argv, __doc__.split("\n")[0])


if __name__ == "__main__":
    main()
