"""Token usage and its price, with the SDK's field names."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Callable, Sequence

from pydantic import BaseModel


def add_usd(a: float, b: float) -> float:
    """a + b as decimals: sums of prices carry no binary rounding drift, in any order."""
    return float(Decimal(repr(a)) + Decimal(repr(b)))


def count(value: object) -> int:
    """A count read from a coding CLI's records, which its shell may write: a whole number,
    never below 0 (a forged record cannot refund the budget); 0 when it is no number."""
    try:
        return max(0, int(value or 0))  # type: ignore[call-overload]  # what int() refuses is caught
    except (TypeError, ValueError, OverflowError):
        return 0


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    web_search_requests: int = 0
    """Searches by the Messages API's web search tool (billed apiece)."""
    web_fetch_requests: int = 0
    cost_usd: float = 0.0
    estimated_usd: float = 0.0
    """The part of `cost_usd` that labrun priced itself from streamed replies because no
    bill for them came (an agent CLI killed before its result); 0 when all was billed."""

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_input_tokens=self.cache_read_input_tokens + other.cache_read_input_tokens,
            cache_creation_input_tokens=self.cache_creation_input_tokens
            + other.cache_creation_input_tokens,
            web_search_requests=self.web_search_requests + other.web_search_requests,
            web_fetch_requests=self.web_fetch_requests + other.web_fetch_requests,
            cost_usd=add_usd(self.cost_usd, other.cost_usd),
            estimated_usd=add_usd(self.estimated_usd, other.estimated_usd),
        )

    def __sub__(self, other: "Usage") -> "Usage":
        return self + Usage(**{k: -v for k, v in other.model_dump().items()})

    @property
    def total_tokens(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_input_tokens
            + self.cache_creation_input_tokens
        )


class BudgetSpent(Exception):
    pass


class Budget:
    """The agent's spending limit in USD (its own model use), checked before every model call."""

    def __init__(self, limit_usd: float | None, used: Usage, workspace: str,
                 on_spend: Callable[[Usage], None] | None = None):
        self.limit_usd = limit_usd
        self.used = used
        self.workspace = workspace
        self.on_spend = on_spend

    def check(self) -> None:
        # A zero budget still allows calls that cost nothing (the scripted agent's).
        if self.limit_usd is not None and 0 < self.limit_usd <= self.used.cost_usd or (
            self.limit_usd == 0 and self.used.cost_usd > 0
        ):
            raise BudgetSpent(
                f"the agent's budget of ${self.limit_usd:.2f} is spent (${self.used.cost_usd:.2f} "
                f"used); raise it with `labrun resume {self.workspace} --budget-usd "
                f"{max(self.limit_usd * 2, 1):.0f}`"
            )

    def spend(self, usage: Usage) -> None:
        self.used = self.used + usage
        if self.on_spend is not None:
            self.on_spend(self.used)


SPEND_METRIC = "cost_usd"
"""The metric in which an experiment reports the money it spent (API calls, paid compute)."""


def reported_spend(attempts: Sequence[Any]) -> tuple[float, int]:
    """What the experiments say they spent: the sum of the `cost_usd` metric over every
    attempt that reports it, and how many do. Money a run spent without saying so is not
    in it."""
    values = [a.metrics[SPEND_METRIC] for a in attempts
              if isinstance(a.metrics.get(SPEND_METRIC), (int, float)) and not isinstance(a.metrics[SPEND_METRIC], bool)]
    return round(sum(values), 6), len(values)
