"""Making an agent backend by name, from its registry entry (`labrun.agents.registry`): a model
API behind labrun's durable turn loop, or a coding CLI with its own; checking, before a session
starts, that it can run here; and refusing a budget labrun could not count."""

from __future__ import annotations

from pathlib import Path

from labrun.agents import Agent
from labrun.agents.registry import AgentUnavailable, backend, load, model_of
from labrun.model import FatalModelError, Model


class ModelAgent:
    """An agent made of a model API and labrun's durable turn loop."""

    def __init__(self, model: Model):
        self.model = model

    def run_phase(self, toolbox, convo, system, max_turns, budget) -> None:
        # Here, not at the top: the turn loop imports Prefect (seconds), and `labrun run` checks
        # the agent, importing this module, before it starts anything.
        from labrun.turns import run_turns

        run_turns(self.model, toolbox, convo, system, max_turns, budget)


def check_agent(agent: str) -> None:
    """AgentUnavailable, in one line, when `agent` is unknown or cannot run here (its
    credentials, its executable, its login), before any server starts."""
    b = backend(agent)
    if b.check is None:
        return
    try:
        load(b.check)()
    except FatalModelError as e:  # a model API's own refusal of its credentials
        raise AgentUnavailable(str(e)) from None


def require_priced(agent: str | None, model: str | None, budget_usd: float | None) -> None:
    """With a budget set, refuse an agent whose costs labrun cannot count (`PriceUnknown`):
    one labrun prices itself, on `model` or the agent's default."""
    if budget_usd is None or agent is None or not backend(agent).priced:
        return  # a free agent costs nothing; a billed one reports its own cost
    from labrun.prices import require_price

    require_price(model_of(agent, model))


def _model_agent(model: Model) -> ModelAgent:
    """In a deployment's run every model call takes a slot of the model API's limit."""
    from labrun.model_api_limit import LimitedModel, limited

    return ModelAgent(LimitedModel(model) if limited() else model)


def make_agent(agent: str, model: str | None = None, workspace: str | Path | None = None) -> Agent:
    b = backend(agent)
    made = load(b.factory)(model, workspace)
    return made if b.own_shell else _model_agent(made)
