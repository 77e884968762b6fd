"""Agent backends. Each offers the tools of DESIGN.md; the scripted one is an offline
stand-in for demos and tests."""

from __future__ import annotations

from pathlib import Path

from labrun.model import Model

AGENTS = ("anthropic", "claude-code", "scripted")


class AgentUnavailable(Exception):
    pass


def make_model(agent: str, model: str | None = None, workspace: str | Path | None = None) -> Model:
    if agent == "scripted":
        from labrun.agents.scripted import ScriptedModel

        return ScriptedModel(workspace)
    if agent == "anthropic":
        from labrun.agents.anthropic import AnthropicModel

        return AnthropicModel(model)
    if agent == "claude-code":
        raise AgentUnavailable("the claude-code agent is not available in this version yet; use --agent anthropic or scripted")
    raise AgentUnavailable(f"unknown agent {agent!r}; choose one of {', '.join(AGENTS)}")
