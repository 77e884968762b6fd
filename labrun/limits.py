"""What a session may spend: the agent's budget, checked before every model call, with what
it spent so far (from the journals, this branch's and the archived ones), and the time and
turns its work may take."""

from __future__ import annotations

import os
from typing import Any

from labrun.idea import Idea
from labrun.journal import phase_usage
from labrun.phase_registry import Phase
from labrun.state import DEFAULT_TIME_LIMIT_S, SessionState, StateStore, session_clock
from labrun.usage import Budget, Usage
from labrun.workspace import Workspace


DEFAULT_PARALLEL_ATTEMPTS = 4


class Limits:
    def __init__(self, ws: Workspace, idea: Idea, store: StateStore):
        self.ws = ws
        self.idea = idea
        self.store = store

    def usage(self) -> Usage:
        return total_usage(self.ws, self.store.state)

    def budget(self) -> Budget:
        """The agent's budget; what it spends is noted in the state as it goes (STATE.md and
        the next prompts show it)."""
        budget = Budget(self.store.state.budget_usd, self.usage(), str(self.ws.root), on_spend=self._note_spend)
        self._note_spend(budget.used)
        return budget

    def _note_spend(self, used: Usage) -> None:
        self.store.note_spend(used.cost_usd)

    def clock(self) -> dict[str, Any]:
        """Time and money so far, against the idea's limits and the agent's budget."""
        return session_clock(self.store.state, self.usage().cost_usd)

    def max_turns(self, phase: Phase) -> int:
        return self.store.state.max_turns or phase.max_turns

    @property
    def parallel_attempts(self) -> int:
        """Experiment attempts that may run at once: the session's `--parallel-attempts`, else the
        idea's constraints.parallel_attempts, else 4; never more than the CPUs."""
        constraints = self.idea.constraints
        asked = (self.store.state.parallel_attempts or (constraints.parallel_attempts if constraints else None)
                 or DEFAULT_PARALLEL_ATTEMPTS)
        return max(1, min(asked, os.cpu_count() or 1))

    @property
    def time_limit_s(self) -> int:
        constraints = self.idea.constraints
        return (constraints.time_limit if constraints and constraints.time_limit else None) or DEFAULT_TIME_LIMIT_S


def budget_source(option: float | None, idea: Idea) -> str:
    """Where a new session's agent budget comes from."""
    if option is not None:
        return "--budget-usd"
    return "constraints.agent_budget" if idea.agent_budget_usd is not None else "none"


def session_usage(ws: Workspace, keys) -> Usage:
    total = Usage()
    for key in keys:
        total += phase_usage(ws.phase_dir(key))
    return total


def total_usage(ws: Workspace, state: SessionState) -> Usage:
    """What the whole session spent: the workspace's journals and the archived ones of
    earlier branches."""
    return sum((b.archived for b in state.branches), session_usage(ws, state.phases))
