"""What a model call costs: USD per million tokens, per model, and `cost_usd(model, usage)`.

Built-in prices are Anthropic's list prices (https://platform.claude.com/docs/en/about-claude/pricing
and each model's overview page), checked in November 2026, OpenAI's for the models
Codex runs (https://developers.openai.com/api/docs/pricing, standard tier, as of November
2026) and Google's for those Gemini CLI runs (below). `cache_write` is the 5-minute
cache write, the only kind labrun asks for. A file named by `LABRUN_PRICES` (YAML or JSON,
`{model: {input, output, cache_write, cache_read}}`) is merged over them, model by model,
for new models, negotiated prices or a gateway's own. A model with no price costs 0, with one
warning; so with a budget set, a session on such a model refuses to start (`require_price`).
"""

from __future__ import annotations

import json
import logging
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from labrun.settings import settings
from labrun.usage import Usage

log = logging.getLogger(__name__)

FIELDS = ("input", "output", "cache_write", "cache_read")
WEB_SEARCH_USD = 0.01  # the web search server tool: $10 per 1,000 searches, on top of tokens
# (a web fetch costs only the tokens of what it fetched)


def _p(input: float, output: float, cache_write: float, cache_read: float, **extra: Any) -> dict:
    return {"input": input, "output": output, "cache_write": cache_write, "cache_read": cache_read, **extra}


BUILTIN_PRICES: dict[str, dict[str, Any]] = {
    "claude-fable-5-2": _p(8, 40, 10, 0.20),
    "claude-fable-5-1": _p(10, 50, 12.50, 0.25),
    "claude-mythos-5-1": _p(10, 50, 12.50, 0.25),
    "claude-fable-5": _p(10, 50, 12.50, 1.00),
    "claude-mythos-5": _p(10, 50, 12.50, 1.00),
    "claude-opus-5-5": _p(4, 20, 5, 0.20),
    "claude-opus-5": _p(5, 25, 6.25, 0.50),
    "claude-opus-4-8": _p(5, 25, 6.25, 0.50),
    "claude-opus-4-7": _p(5, 25, 6.25, 0.50),
    "claude-opus-4-6": _p(5, 25, 6.25, 0.50),
    "claude-opus-4-5": _p(5, 25, 6.25, 0.50),
    "claude-sonnet-5-5": _p(2, 10, 2.50, 0.10),  # cache reads cut from 0.20 on 2026-10-07
    "claude-sonnet-5": _p(2, 10, 2.50, 0.20),
    "claude-sonnet-4-6": _p(3, 15, 3.75, 0.30),
    "claude-sonnet-4-5": _p(3, 15, 3.75, 0.30),
    "claude-haiku-4-5": _p(1, 5, 1.25, 0.10),
    # Haiku 5.5 is priced by prompt length: a prompt (input + cache reads + cache writes)
    # over 100k tokens pays the higher rates on every token of that request.
    "claude-haiku-5-5": _p(
        0.10, 0.50, 0.125, 0.01,
        long_prompt={"threshold": 100_000, **_p(0.50, 2.50, 0.625, 0.05)},
    ),
    # OpenAI: cached input is a tenth of input; writing the cache costs nothing extra (it is
    # billed as input). Prompts over 272k tokens pay 2x input and 1.5x output for the whole
    # request; not modelled here, since Codex reports a run's tokens summed over its requests.
    "gpt-5.5": _p(5, 30, 5, 0.50),
    # Google's, for the models Gemini CLI runs (https://ai.google.dev/gemini-api/docs/pricing,
    # paid tier, prompts up to 200k tokens): thinking is billed as output; implicit caching
    # bills cached input at a tenth and charges nothing to write. Prompts over 200k tokens pay
    # 2x input and 1.5x output; not modelled, since Gemini CLI reports a run's tokens summed
    # over its requests.
    "gemini-2.5-pro": _p(1.25, 10, 1.25, 0.125),
    "gemini-2.5-flash": _p(0.30, 2.50, 0.30, 0.03),
}

_DATE_SUFFIX = re.compile(r"-\d{8}$")
_warned: set[str] = set()


def load_prices(path: str | None = None) -> dict[str, dict[str, Any]]:
    """The built-in table with the `LABRUN_PRICES` file (or `path`) merged over it."""
    path = path if path is not None else settings().prices
    return _load(path)


@lru_cache(maxsize=8)
def _load(path: str) -> dict[str, dict[str, Any]]:
    prices = {model: dict(table) for model, table in BUILTIN_PRICES.items()}
    if not path:
        return prices
    try:
        text = Path(path).read_text()
        data = json.loads(text) if path.endswith(".json") else _yaml(text)
    except (OSError, ValueError) as err:
        raise ValueError(f"LABRUN_PRICES={path}: cannot read it ({err}); fix or unset it") from None
    if not isinstance(data, dict):
        raise ValueError(f"LABRUN_PRICES={path}: expected {{model: {{input, output, cache_write, cache_read}}}}")
    for model, table in data.items():
        if not isinstance(table, dict) or not all(isinstance(table.get(f), (int, float)) for f in FIELDS):
            raise ValueError(f"LABRUN_PRICES={path}: {model}: give numbers for {', '.join(FIELDS)}")
        prices[str(model)] = {f: float(table[f]) for f in FIELDS}
    return prices


def _yaml(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(str(err).replace("\n", " ")) from None


def price_for(model: str) -> dict[str, Any] | None:
    """The price table of `model`, also found under its name without a date suffix."""
    prices = load_prices()
    return prices.get(model) or prices.get(_DATE_SUFFIX.sub("", model))


class PriceUnknown(ValueError):
    """No price for the model, so a budget could not be kept."""


def require_price(model: str) -> None:
    if price_for(model) is None:
        raise PriceUnknown(
            f"no price is known for model {model!r}, so its budget cannot be kept: give its price in USD "
            f"per million tokens in a YAML or JSON file named by LABRUN_PRICES, for example "
            f"`{model}: {{input: 3, output: 15, cache_write: 3.75, cache_read: 0.3}}`, or run without a budget"
        )


def cost_usd(model: str, usage: Usage) -> float:
    """USD for one reply's usage; 0 (and one warning) when the model has no price."""
    table = price_for(model)
    if table is None:
        if model not in _warned:
            _warned.add(model)
            log.warning("No price known for model %r: its cost counts as 0. "
                        "Add it to a LABRUN_PRICES file to count it.", model)
        return 0.0
    long_prompt = table.get("long_prompt")
    prompt = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    if long_prompt and prompt > long_prompt["threshold"]:
        table = long_prompt
    total = (
        usage.input_tokens * table["input"]
        + usage.output_tokens * table["output"]
        + usage.cache_creation_input_tokens * table["cache_write"]
        + usage.cache_read_input_tokens * table["cache_read"]
    )
    return total / 1_000_000 + usage.web_search_requests * WEB_SEARCH_USD  # unrounded: round only for display
