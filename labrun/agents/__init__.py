"""Agent backends. Each offers the tools of docs/design.md and runs one phase at a time; the
scripted one is an offline stand-in for demos and tests.

Their names and web tools are in `names`, which imports none of them. The seam is
`Agent.run_phase`: drive the phase's conversation until `complete_phase` succeeds (then
`toolbox.completed` is set), saving every completed step in `convo` as it goes, so that a
later call with the same journal continues where this one stopped. A model API backend only
translates one call (`labrun.model.Model`) and gets the durable turn loop from
`ModelAgent`; an agent with its own loop (a coding CLI) implements `run_phase` itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from labrun import suggest
from labrun.agents.names import AGENTS, CLI_AGENTS, AgentUnavailable
from labrun.model import Model

__all__ = ["AGENTS", "CLI_AGENTS", "AgentUnavailable", "Agent", "ModelAgent", "make_agent", "require_priced"]

if TYPE_CHECKING:
    from labrun.journal import Conversation
    from labrun.tools import ToolBox
    from labrun.usage import Budget

class Agent(Protocol):
    def run_phase(self, toolbox: "ToolBox", convo: "Conversation", system: str, max_turns: int,
                  budget: "Budget") -> None: ...


class ModelAgent:
    """An agent made of a model API and labrun's durable turn loop."""

    def __init__(self, model: Model):
        self.model = model

    def run_phase(self, toolbox, convo, system, max_turns, budget) -> None:
        from labrun.turns import run_turns

        run_turns(self.model, toolbox, convo, system, max_turns, budget)


def require_priced(agent: str | None, model: str | None, budget_usd: float | None) -> None:
    """With a budget set, refuse an agent whose costs labrun cannot count (`PriceUnknown`):
    those labrun prices itself (the Messages API's tokens; Codex and Gemini CLI report
    tokens only), on `model` or the agent's default."""
    if budget_usd is None or agent not in ("anthropic", "codex", "gemini"):
        return  # the scripted agent costs nothing; Claude Code reports its own cost
    from labrun.prices import require_price

    if agent == "anthropic":
        from labrun.agents.anthropic import model_name

        model = model_name(model)
    elif agent == "codex":
        from labrun.agents.codex import DEFAULT_MODEL

        model = model or DEFAULT_MODEL
    else:
        from labrun.agents.gemini import DEFAULT_MODEL

        model = model or DEFAULT_MODEL
    require_price(model)


def _model_agent(model: Model) -> ModelAgent:
    """In a deployment's run every model call takes a slot of the model API's limit."""
    from labrun.model_api_limit import LimitedModel, limited

    return ModelAgent(LimitedModel(model) if limited() else model)


def make_agent(agent: str, model: str | None = None, workspace: str | Path | None = None) -> Agent:
    if agent == "scripted":
        from labrun.agents.scripted import ScriptedModel

        return _model_agent(ScriptedModel(workspace))
    if agent == "anthropic":
        from labrun.agents.anthropic import AnthropicModel

        return _model_agent(AnthropicModel(model))
    if agent == "claude-code":
        from labrun.agents.claude_code import ClaudeCodeAgent

        return ClaudeCodeAgent(model, workspace)
    if agent == "codex":
        from labrun.agents.codex import CodexAgent

        return CodexAgent(model, workspace)
    if agent == "gemini":
        from labrun.agents.gemini import GeminiAgent

        return GeminiAgent(model, workspace)
    raise AgentUnavailable(suggest.unknown("agent", agent, AGENTS))
