"""The Anthropic backend: one `ModelRequest` in, one streamed Messages API call, one `ModelReply` out.

It only translates. Retries, saving replies and budgets live in the turn loop (`labrun.turns`),
so the SDK's own retries are off and every failure becomes a `ModelError` that says whether a
retry can help. The SDK reads `ANTHROPIC_API_KEY` and `ANTHROPIC_BASE_URL` itself, so a proxy
or gateway works unchanged.
"""

from __future__ import annotations

import copy
import email.utils
import os
import re
import time
from typing import Any, Mapping

import anthropic
import httpx2

from labrun.agents.registry import model_of
from labrun.crashpoints import crashpoint
from labrun.model import FatalModelError, ModelError, ModelReply, ModelRequest, TransientModelError
from labrun.prices import cost_usd, load_prices, price_for
from labrun.secrets import redact
from labrun.settings import settings
from labrun.usage import Usage

EPHEMERAL = {"type": "ephemeral"}
CONTEXT_MANAGEMENT_BETA = "context-management-2025-06-27"
# Clear old tool results (oldest first, keeping the latest few) once the prompt passes
# 160k tokens: below the smallest current context window (200k) with room for a turn's
# tool results and reply. Clearing at least 40k at a time makes the cache rewrite it costs
# worth it. `LABRUN_CONTEXT_MANAGEMENT=off` turns it off.
DEFAULT_CONTEXT_MANAGEMENT: dict[str, Any] = {
    "edits": [
        {
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "input_tokens", "value": 160_000},
            "keep": {"type": "tool_uses", "value": 6},
            "clear_at_least": {"type": "input_tokens", "value": 40_000},
        }
    ]
}
# The Messages API's own web tools, run by Anthropic (`server_tool_use` blocks, then
# `web_search_tool_result` / `web_fetch_tool_result` in the same reply, saved and sent back
# as they came). The basic versions: the dynamic-filtering ones (2026-02-09 and later) run
# code in a container of their own and add its blocks, which this session needs none of.
# Web fetch reads only addresses already in the conversation (the idea's, search results);
# citations let the text point into what it fetched.
WEB_TOOLS: list[dict[str, Any]] = [
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 20},
    {"type": "web_fetch_20250910", "name": "web_fetch", "max_uses": 20,
     "citations": {"enabled": True}, "max_content_tokens": 50_000},
]
_UNCACHEABLE = {"thinking", "redacted_thinking"}
_TRANSIENT_TYPES = {"overloaded_error", "api_error", "rate_limit_error", "timeout_error"}
_FATAL = {  # status: (what happened, what to do)
    401: ("rejected the credentials", "check ANTHROPIC_API_KEY"),
    402: ("cannot bill this call", "add credits or raise the spend limit, then resume"),
    403: ("denied access", "check that this API key may use {model}"),
    404: ("found no such model or endpoint", "check --model / LABRUN_MODEL and ANTHROPIC_BASE_URL"),
    413: ("found the request too large", "shrink large tool results or files in the conversation, then resume"),
}
_CONTEXT_OVERFLOW_ADVICE = (
    "found the conversation too long for the context window",
    "keep context management on (unset LABRUN_CONTEXT_MANAGEMENT) or use a model with a larger window, then resume",
)
_CONTEXT_OVERFLOW = re.compile(
    r"prompt is too long|context (window|limit|length)|exceeds? .*context|too many (input )?tokens", re.I
)


def model_name(model: str | None = None) -> str:
    """The model a session asks for: `--model`, else LABRUN_MODEL, else the registry's default."""
    return model_of("anthropic", model) or ""  # never empty: the entry names a default


def check_credentials(environ: Mapping[str, str] | None = None) -> None:
    """Fail at once, in one line, when the SDK would find no credentials."""
    env = os.environ if environ is None else environ
    if not (env.get("ANTHROPIC_API_KEY") or env.get("ANTHROPIC_AUTH_TOKEN")):
        raise FatalModelError(
            "No Anthropic API key: export ANTHROPIC_API_KEY=... "
            "(or run `labrun demo` for the offline demo with the scripted agent)."
        )


def make(model: str | None, workspace: object = None) -> AnthropicModel:
    """The registry's factory: the Messages API needs no workspace."""
    return AnthropicModel(model)


class AnthropicModel:
    """A `labrun.model.Model` backed by the Anthropic Messages API."""

    def __init__(
        self,
        model: str | None = None,
        *,
        context_management: bool | dict[str, Any] | None = None,
        timeout: float | None = None,
    ):
        check_credentials()
        try:
            load_prices()  # a broken LABRUN_PRICES file fails here, not after a paid call
        except ValueError as err:
            raise FatalModelError(str(err)) from None
        self.name = model_name(model)
        self.context_management = _context_management_setting(context_management)
        self._timeout = timeout
        self._client: anthropic.Anthropic | None = None

    @property
    def client(self) -> anthropic.Anthropic:
        if self._client is None:
            options: dict[str, Any] = {"max_retries": 0}  # the turn loop retries, through Prefect
            if self._timeout is not None:
                options["timeout"] = self._timeout
            self._client = anthropic.Anthropic(**options)
        return self._client

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}

    def complete(self, request: ModelRequest) -> ModelReply:
        params = {
            "model": self.name,
            "max_tokens": request.max_tokens,
            **with_cache_breakpoints(request.system, request.tools + (WEB_TOOLS if request.web else []),
                                     request.messages),
        }
        try:
            if self.context_management:
                stream = self.client.beta.messages.stream(
                    **params, betas=[CONTEXT_MANAGEMENT_BETA], context_management=self.context_management
                )
            else:
                stream = self.client.messages.stream(**params)
            with stream as events:  # always stream: non-streaming calls refuse large max_tokens
                crashpoint("model-call")  # the request is out and its reply is coming
                message = events.get_final_message()
        except anthropic.APIError as err:
            raise model_error(err, self.name) from None
        except httpx2.TransportError as err:  # the connection broke while the reply streamed
            message = f"The connection to the Anthropic API broke mid-reply ({type(err).__name__})."
            raise TransientModelError(message) from None
        if message.stop_reason is None:
            raise TransientModelError("The Anthropic API's reply stream ended before the reply was complete.")
        served_by = message.model or self.name
        # A gateway may serve under a name of its own: priced as the model asked for, whose
        # price a budgeted session was checked to have (labrun.agents.backends.require_priced).
        priced_as = served_by if price_for(served_by) else self.name
        return ModelReply(
            content=[block.to_dict(mode="json", exclude_none=True) for block in message.content],
            stop_reason=message.stop_reason,
            stop_details=message.stop_details.to_dict() if message.stop_details else None,
            usage=usage_of(message.usage, priced_as),
            model=served_by,
        )


def prompt_ceiling() -> int | None:
    """The prompt tokens past which old tool results are cleared, as the settings have it."""
    edits = (_context_management_setting(None) or {}).get("edits") or [{}]
    return (edits[0].get("trigger") or {}).get("value")


def _context_management_setting(value: bool | dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        value = settings().context_management
    if value is True:
        return copy.deepcopy(DEFAULT_CONTEXT_MANAGEMENT)
    return copy.deepcopy(value) or None


def with_cache_breakpoints(system: str, tools: list[dict], messages: list[dict]) -> dict[str, Any]:
    """`system`, `tools` and `messages` request params with prompt-cache breakpoints (4 at most).

    The breakpoints sit on the last tool, on the system prompt, on the last message and on the
    message that was last in the previous turn's request (the user message before the last
    one), so each turn reads everything up to its previous request from the cache, however
    many blocks the turn added. The caller's objects are copied, never changed.
    """
    tools = copy.deepcopy(tools)
    messages = copy.deepcopy(messages)
    for block in tools + [b for m in messages if isinstance(m.get("content"), list) for b in m["content"]]:
        block.pop("cache_control", None)
    params: dict[str, Any] = {"messages": messages}
    if tools:
        tools[-1]["cache_control"] = dict(EPHEMERAL)
        params["tools"] = tools
    if system:
        params["system"] = [{"type": "text", "text": system, "cache_control": dict(EPHEMERAL)}]
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    marked = {len(messages) - 1} | ({users[-2]} if len(users) >= 2 else set())
    for index in sorted(marked):
        if index >= 0:
            _mark_last_block(messages[index])
    return params


def _mark_last_block(message: dict[str, Any]) -> None:
    content = message.get("content")
    if isinstance(content, str):
        if content:
            message["content"] = [{"type": "text", "text": content, "cache_control": dict(EPHEMERAL)}]
        return
    for block in reversed(content or []):
        if block.get("type") in _UNCACHEABLE or (block.get("type") == "text" and not block.get("text")):
            continue  # thinking blocks and empty text cannot carry a breakpoint
        block["cache_control"] = dict(EPHEMERAL)
        return


def usage_of(usage: Any, model: str) -> Usage:
    """The SDK's usage (None counts as 0) as a `Usage`, priced for `model`."""
    server_tools = getattr(usage, "server_tool_use", None)
    counted = Usage(
        input_tokens=usage.input_tokens or 0,
        output_tokens=usage.output_tokens or 0,
        cache_read_input_tokens=usage.cache_read_input_tokens or 0,
        cache_creation_input_tokens=usage.cache_creation_input_tokens or 0,
        web_search_requests=getattr(server_tools, "web_search_requests", None) or 0,
        web_fetch_requests=getattr(server_tools, "web_fetch_requests", None) or 0,
    )
    counted.cost_usd = cost_usd(model, counted)
    return counted


def model_error(err: anthropic.APIError, model: str) -> ModelError:
    """An SDK error as a one-line `ModelError` that says whether a retry can help and what to do."""
    if isinstance(err, anthropic.APIConnectionError):  # includes APITimeoutError
        kind = "timed out" if isinstance(err, anthropic.APITimeoutError) else "failed"
        return TransientModelError(f"The connection to the Anthropic API {kind}.")
    if not isinstance(err, anthropic.APIStatusError):
        return FatalModelError(_one_line(f"The Anthropic SDK failed: {err}"))

    status, kind = err.status_code, err.type or "error"
    detail = f"{status} {kind}" if status >= 400 else kind  # a mid-stream error event came with a 200
    detail += f": {err.api_message or err.message}"
    if err.request_id:
        detail += f"; request-id {err.request_id}"
    retry_after = retry_after_seconds(err.response.headers)
    should_retry = err.response.headers.get("x-should-retry")
    transient = status in (408, 409, 429) or status >= 500 or (status < 400 and kind in _TRANSIENT_TYPES)
    if should_retry in ("true", "false"):
        transient = should_retry == "true"

    if transient:
        message = _one_line(f"The Anthropic API is busy or failing ({detail}).")
        return TransientModelError(message, retry_after=retry_after)
    if status in _FATAL:
        what, todo = _FATAL[status]
    elif _CONTEXT_OVERFLOW.search(err.api_message or err.message or ""):
        what, todo = _CONTEXT_OVERFLOW_ADVICE
    else:
        what, todo = "refused the request", "a retry cannot fix it"
    return FatalModelError(_one_line(f"The Anthropic API {what} ({detail}): {todo.format(model=model)}."))


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait, from `retry-after-ms`, or `retry-after` in seconds or as an HTTP date."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) / scale)
        except ValueError:
            pass
    date = email.utils.parsedate_tz(headers.get("retry-after") or "")
    return None if date is None else max(0.0, email.utils.mktime_tz(date) - time.time())


def _one_line(text: str, limit: int = 600) -> str:
    text = redact(" ".join(str(text).split()))
    return text if len(text) <= limit else text[: limit - 1] + "…"
