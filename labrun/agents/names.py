"""What is known of the agent backends without importing one: their names, their web tools,
and the error of a backend that cannot run here."""

from __future__ import annotations

AGENTS = ("anthropic", "claude-code", "codex", "gemini", "scripted")
DEFAULT_AGENT = "anthropic"
"""The agent of a new session that names none, whichever way it starts (`labrun run`,
`labrun queue`, a deployment run without the parameter)."""
CLI_AGENTS = ("claude-code", "codex", "gemini")
"""The coding-CLI backends (`labrun.agents.cli_agent`)."""
WEB_TOOLS = {"anthropic": ("web_search", "web_fetch"), "claude-code": ("WebSearch", "WebFetch")}
"""The web search and fetch tools each backend has (the Messages API's server tools, Claude
Code's own); a phase declared `web` offers them."""


def web_tools(agent: str) -> tuple[str, ...]:
    return WEB_TOOLS.get(agent, ())


class AgentUnavailable(Exception):
    pass
