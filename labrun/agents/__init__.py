"""Agent backends. Each offers the tools of docs/design.md and runs one phase at a time; the
scripted one is an offline stand-in for demos and tests.

`registry` holds one entry per backend (its name, default model, cost, checks, factory) and
imports none of them; `backends` makes one (`make_agent`), so that importing this package
imports no backend. The seam is `Agent.run_phase`: drive the phase's conversation until
`complete_phase` succeeds (then `toolbox.completed` is set), saving every completed step in
`convo` as it goes, so that a later call with the same journal continues where this one
stopped. A model API backend only translates one call (`labrun.model.Model`) and gets the
durable turn loop from `backends.ModelAgent`; an agent with its own loop (a coding CLI)
implements `run_phase` itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from labrun.agents.registry import AgentUnavailable

__all__ = ["AgentUnavailable", "Agent"]

if TYPE_CHECKING:
    from labrun.journal import Conversation
    from labrun.tools import ToolBox
    from labrun.usage import Budget


class Agent(Protocol):
    def run_phase(self, toolbox: "ToolBox", convo: "Conversation", system: str, max_turns: int,
                  budget: "Budget") -> None: ...
