"""What a session may cost and take, said before it runs (`labrun check`, a new run's first
lines), from what labrun itself enforces: the agent's budget, the phases' turn limits, the
reply and prompt sizes it asks for, the model's price (`labrun.prices`) and the idea's time
limits. Each line says how rough it is; nothing here is a forecast of what the agent will do.
"""

from __future__ import annotations

from labrun.agents.registry import backend, load, model_of
from labrun.idea import Idea
from labrun.model import ModelRequest
from labrun.phase_registry import BY_KEY, phase_list
from labrun.prices import price_for
from labrun.settings import settings
from labrun.state import DEFAULT_TIME_LIMIT_S
from labrun.verdicts import reproduce_settings


def turns(idea: Idea, with_phases: tuple[str, ...] = (), max_turns: int | None = None) -> int:
    """The most model turns the session's phases allow, all together."""
    return sum(max_turns or BY_KEY[k].max_turns for k in phase_list([*with_phases, *idea.with_phases]))


def prompt_ceiling(agent: str) -> int | None:
    """The prompt tokens past which labrun's own loop clears old tool results for `agent`;
    None where nothing labrun sets bounds a prompt."""
    ceiling = backend(agent).prompt_ceiling
    return load(ceiling)() if ceiling else None


def cost_lines(idea: Idea, agent: str, model: str | None, budget_usd: float | None,
               with_phases: tuple[str, ...] = (), max_turns: int | None = None) -> list[str]:
    """The model's cost: the budget when there is one, and the ceiling the turn limits set."""
    b = backend(agent)
    if b.cost == "free":
        return [f"model cost: none ({agent} plays no model)"]
    model = model_of(agent, model)
    budget = budget_usd if budget_usd is not None else idea.agent_budget_usd
    lines = []
    if budget is not None:
        lines.append(f"model cost: at most about ${budget:,.2f}, the agent's budget (checked before every model "
                     "call, so the last reply may pass it a little)")
    else:
        lines.append("model cost: no budget set, so only the turn limits stop the spending "
                     "(--budget-usd or constraints.agent_budget sets one)")
    n, prompt, price = turns(idea, with_phases, max_turns), prompt_ceiling(agent), price_for(model) if model else None
    if prompt is not None and price is not None:
        reply = ModelRequest.model_fields["max_tokens"].default
        per_turn = (prompt * max(price["input"], price["cache_write"]) + reply * price["output"]) / 1e6
        lines.append(f"  ceiling from the turn limits: {n} turns, each with a prompt of about {prompt // 1000}k tokens "
                     f"and a reply of {reply // 1000}k, at {model}'s prices: ${n * per_turn:,.0f}, a bound that has every "
                     "turn run with a full prompt and none of it cached (labrun caches prompts), not a forecast")
    elif b.own_shell:
        lines.append(f"  {agent} runs its own loop: labrun bounds its time, not its turns, so no ceiling follows "
                     "from them" + ("" if b.priced else f"; {agent} reports its own cost as it goes"))
    elif price is None:
        lines.append(f"  no price is known for {model}: labrun cannot say more (LABRUN_PRICES gives one)")
    return lines


def time_lines(idea: Idea, agent: str, with_phases: tuple[str, ...] = ()) -> list[str]:
    """The time limits labrun enforces, and the one it only shows the agent."""
    c = idea.constraints
    limit = (c.time_limit if c and c.time_limit else None) or DEFAULT_TIME_LIMIT_S
    minutes = reproduce_settings(idea)[0]
    lines = [f"time: the idea's limit of {_duration(limit)} is the agent's clock, shown in every prompt; labrun "
             f"does not stop a session there. It does stop each experiment attempt at {_duration(limit)}"
             + (f" and the engine's reruns after {_duration(minutes * 60)} in all" if minutes else "")]
    if backend(agent).own_shell:
        phase = settings().phase_timeout_s or limit
        lines.append(f"  and each phase of {agent} at {_duration(phase)} (LABRUN_PHASE_TIMEOUT_S), so the session "
                     f"at {_duration(phase * len(phase_list([*with_phases, *idea.with_phases])))} at most, reruns aside")
    return lines


def estimate_lines(idea: Idea, agent: str, model: str | None = None, budget_usd: float | None = None,
                   with_phases: tuple[str, ...] = (), max_turns: int | None = None) -> list[str]:
    return [*cost_lines(idea, agent, model, budget_usd, with_phases, max_turns),
            *time_lines(idea, agent, with_phases)]


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"
