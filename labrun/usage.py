"""Token usage and its price, with the SDK's field names."""

from __future__ import annotations

from decimal import Decimal

from pydantic import BaseModel


def add_usd(a: float, b: float) -> float:
    """a + b as decimals: sums of prices carry no binary rounding drift, in any order."""
    return float(Decimal(repr(a)) + Decimal(repr(b)))


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
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
    """The session's spending limit in USD, checked before every model call."""

    def __init__(self, limit_usd: float | None, used: Usage, workspace: str):
        self.limit_usd = limit_usd
        self.used = used
        self.workspace = workspace

    def check(self) -> None:
        # A zero budget still allows calls that cost nothing (the scripted agent's).
        if self.limit_usd is not None and 0 < self.limit_usd <= self.used.cost_usd or (
            self.limit_usd == 0 and self.used.cost_usd > 0
        ):
            raise BudgetSpent(
                f"the session budget of ${self.limit_usd:.2f} is spent (${self.used.cost_usd:.2f} "
                f"used); raise it with `labrun resume {self.workspace} --budget-usd "
                f"{max(self.limit_usd * 2, 1):.0f}`"
            )

    def spend(self, usage: Usage) -> None:
        self.used = self.used + usage
