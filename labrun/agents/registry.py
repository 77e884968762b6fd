"""The agent backends, one entry each: what the rest of labrun knows of a backend without
importing it. A new backend is one module and one entry here.

An entry names its factory and its checks by import path (`module:callable`), so that reading
the registry imports no backend, no SDK and no Prefect: `--help`, `labrun status` and the
phase registry read it freely. Every other module asks the registry; none names a backend.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal

from labrun import suggest


class AgentUnavailable(Exception):
    """A backend that cannot run here (unknown, not installed, not logged in): one line."""


@dataclass(frozen=True)
class Backend:
    name: str
    """`--agent NAME`, and the session's `agent`."""
    factory: str
    """`module:callable`, called `(model, workspace)`: a coding CLI's agent (`own_shell`), else a
    `labrun.model.Model` that labrun's durable turn loop drives."""
    cost: Literal["priced", "billed", "free"]
    """Where its cost comes from: `priced`, labrun prices its tokens from `labrun.prices` (so a
    budgeted session needs a price for its model); `billed`, it reports its own cost; `free`."""
    default_model: str | None = None
    """The model of a session that names none; None: the backend's own choice."""
    model_variable: bool = False
    """LABRUN_MODEL names its model when `--model` does not."""
    own_shell: bool = False
    """A coding CLI, with its own loop and its own shell tool (which runs without the keys)."""
    check: str | None = None
    """`module:callable`, called with no arguments before a session starts: raises with one
    line saying what is missing here (credentials, the executable, its login) and how to get it."""
    variables: dict[str, str] = field(default_factory=dict)
    """The environment variables it reads, in the order `--help` lists them, each with its line
    of help; a LABRUN_* one's is "" (its line is its `labrun.settings` field's docstring)."""
    web_tools: tuple[str, ...] = ()
    """Its web search and fetch tools, offered in a phase declared `web`."""
    tool_runs: str | None = None
    """`module:callable`, called `(phase_dir)`: the `labrun.toollog.ToolRun`s its own
    transcripts there show (the calls that may have reached the network), for the rules that
    ask what a phase fetched; None: its calls are all in labrun's journal."""
    stand_in: bool = False
    """An offline stand-in for demos and tests, named so wherever a session's work is shown."""
    prompt_ceiling: str | None = None
    """`module:callable`, called with no arguments: the prompt tokens past which labrun's loop
    clears old tool results for it (None, or None returned: nothing labrun sets bounds a prompt)."""

    @property
    def priced(self) -> bool:
        return self.cost == "priced"


ENTRIES = (
    Backend("anthropic", "labrun.agents.anthropic:make", "priced", default_model="claude-opus-5-5",
            # the docs' "start here for most workloads", Nov 2026
            model_variable=True, check="labrun.agents.anthropic:check_credentials",
            prompt_ceiling="labrun.agents.anthropic:prompt_ceiling",
            variables={"ANTHROPIC_API_KEY": "the anthropic agent's key (or ANTHROPIC_AUTH_TOKEN)",
                       "ANTHROPIC_BASE_URL": "another endpoint for the Messages API (a proxy, a gateway)",
                       "LABRUN_MODEL": "", "LABRUN_CONTEXT_MANAGEMENT": ""},
            web_tools=("web_search", "web_fetch")),
    Backend("claude-code", "labrun.agents.claude_code:ClaudeCodeAgent", "billed", own_shell=True,
            check="labrun.agents.claude_code:ClaudeCodeAgent",
            variables={"LABRUN_CLAUDE": "", "LABRUN_CLAUDE_PERMISSIONS": ""},
            web_tools=("WebSearch", "WebFetch"), tool_runs="labrun.agents.claude_code:tool_runs"),
    Backend("codex", "labrun.agents.codex:CodexAgent", "priced", own_shell=True,
            default_model="gpt-5.5",  # priced in labrun's table; Codex's own default (gpt-6.1-sol) has no published price
            check="labrun.agents.codex:CodexAgent",
            variables={"LABRUN_CODEX": "",
                       "CODEX_HOME": "Codex's login and sessions (default ~/.codex); CODEX_API_KEY an API key"}),
    Backend("gemini", "labrun.agents.gemini:GeminiAgent", "priced", default_model="gemini-2.5-pro", own_shell=True,
            check="labrun.agents.gemini:GeminiAgent",
            variables={"LABRUN_GEMINI": "",
                       "GEMINI_API_KEY": "the gemini agent's API key (else the Google login of `gemini`)"}),
    Backend("scripted", "labrun.agents.scripted:make", "free", stand_in=True),
)
BACKENDS: dict[str, Backend] = {b.name: b for b in ENTRIES}
"""The backends by name, in the order `--help` lists them."""
DEFAULT_AGENT = "anthropic"
"""The agent of a new session that names none, whichever way it starts (`labrun run`,
`labrun queue`, a deployment run without the parameter)."""
DEMO_AGENT = "scripted"
"""The agent of `labrun demo`: the offline stand-in."""


def names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def backend(name: str) -> Backend:
    """The entry of `name`; AgentUnavailable, naming the known ones, when there is none."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise AgentUnavailable(suggest.unknown("agent", name, names())) from None


def model_of(agent: str, model: str | None) -> str | None:
    """The model a session of `agent` runs: `model`, else LABRUN_MODEL where the backend reads
    it, else its default (None: the backend's own choice)."""
    b = backend(agent)
    if model is None and b.model_variable:
        from labrun.settings import settings

        model = settings().model
    return model or b.default_model


def web_tools(agent: str) -> tuple[str, ...]:
    b = BACKENDS.get(agent)
    return b.web_tools if b else ()


def own_shell(agent: str) -> bool:
    b = BACKENDS.get(agent)
    return b.own_shell if b else False


def stand_in(agent: str) -> bool:
    b = BACKENDS.get(agent)
    return b.stand_in if b else False


def tool_runs(phase_dir: Path) -> Iterator[Any]:
    """The tool calls that the backends' own transcripts in `phase_dir` show (a branch may have
    run another backend in it), each backend's read by that backend."""
    for b in BACKENDS.values():
        if b.tool_runs:
            yield from load(b.tool_runs)(phase_dir)


def load(path: str) -> Any:
    """The object that `module:name` names, its module imported now."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
