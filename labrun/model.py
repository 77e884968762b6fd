"""The seam between the turn loop and a model backend.

A backend turns one request (system prompt, tools, conversation so far) into one reply.
Everything durable (saving replies, running tools, retries, budgets) lives in the turn loop
(`labrun.turns`), so a backend stays a thin translation of one API call.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, Field

from labrun.usage import Usage


class ModelRequest(BaseModel):
    """One call: what the model sees. `messages` are Messages-API dicts (role, content)."""

    system: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    max_tokens: int = 16000
    web: bool = False
    """Offer the backend's own web search and fetch tools too (run by the provider)."""


class ModelReply(BaseModel):
    """One reply. `content` holds Messages-API blocks as plain dicts, `None` fields dropped,
    so that the conversation can be saved and sent again unchanged."""

    content: list[dict[str, Any]]
    stop_reason: str | None = None
    stop_details: dict[str, Any] | None = None
    """Why a refusal refused (the API's `category` and `explanation`), when it says."""
    usage: Usage = Field(default_factory=Usage)
    model: str = ""


class Model(Protocol):
    name: str

    def complete(self, request: ModelRequest) -> ModelReply: ...


class ModelError(Exception):
    """A model call failed. `transient` errors are retried by the turn loop's Prefect task."""

    transient: bool = False

    def __init__(self, message: str, *, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class TransientModelError(ModelError):
    """429, 529, 5xx, a lost connection: worth retrying after `retry_after` seconds."""

    transient = True


class FatalModelError(ModelError):
    """400, 401, 403, context overflow: a retry cannot fix it; the message says what to do."""


class UsageWindowSpent(ModelError):
    """The provider's usage window is spent until `resets_at` (epoch seconds)."""

    def __init__(self, message: str, *, resets_at: float):
        super().__init__(message)
        self.resets_at = resets_at
