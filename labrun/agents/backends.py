"""Making an agent backend by name: a model API behind labrun's durable turn loop, or a coding
CLI with its own; and refusing, before a session starts, a budget labrun could not count."""

from __future__ import annotations

from pathlib import Path

from labrun import suggest
from labrun.agents import Agent
from labrun.agents.names import AGENTS, AgentUnavailable
from labrun.model import Model


class ModelAgent:
    """An agent made of a model API and labrun's durable turn loop."""

    def __init__(self, model: Model):
        self.model = model

    def run_phase(self, toolbox, convo, system, max_turns, budget) -> None:
        # Here, not at the top: the turn loop imports Prefect, and `labrun run` checks the agent
        # (importing this module) before it has chosen its Prefect API; a Prefect imported that
        # early leaves a Ctrl-C in a terminal hanging (tests/test_interrupts.py).
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
