"""Keys for experiments: the environment variables (API keys, tokens) that an idea's runs need.

Agent commands run without the environment's secrets (`labrun.secrets.scrubbed_env`). The
keys a session's experiments need are named by the idea (`constraints.api_keys`) and with
`--pass-env NAME` (kept in the session's state, by name only). They reach the commands of
`run_experiment` and `bash`, and nothing else: not a coding CLI's own process, not Prefect.
Their values are declared secrets, so they are redacted from everything labrun writes,
whatever the variables are called. The agent is told which keys it has, by name only.

No Prefect here: `labrun check` uses this module.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping

if TYPE_CHECKING:
    from labrun.idea import Idea

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What in an idea's text says its runs call a hosted model or another paid API: a provider
# or hosted model's name, or talk of API calls and their cost.
API_WORDS = re.compile(
    r"\b(?:openai|anthropic|claude|chatgpt|gpt-?[345](?:\.\d)?o?(?:-turbo|-mini)?|gemini|cohere|mistral api"
    r"|together\.ai|groq|openrouter|replicate|bedrock|vertex ai|api (?:keys?|costs?|calls?|tokens?|budget)"
    r"|llm-as-(?:a-)?judge|via (?:the |an )?api|hosted (?:model|api)s?)\b",
    re.IGNORECASE,
)
# A variable the text itself names: AXLE_API_KEY, HF_TOKEN.
KEY_NAMES = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*_(?:API_KEY|KEY|TOKEN)\b")
API_DOMAINS = {"artificial_intelligence"}
"""Domains whose studies mostly evaluate hosted models."""


@dataclass(frozen=True)
class Key:
    name: str
    source: str
    """Where the session got it: `constraints.api_keys` or `--pass-env`."""


def pass_env_names(given: Iterable[str]) -> list[str]:
    """`--pass-env` values (each NAME or NAME,NAME), checked; a ValueError names a bad one."""
    names = [n.strip() for g in given for n in g.split(",") if n.strip()]
    for name in names:
        if not ENV_NAME.fullmatch(name):
            raise ValueError(f"--pass-env: {name!r} is not an environment variable's name "
                             "(letters, digits and _, such as OPENAI_API_KEY)")
    return list(dict.fromkeys(names))


def session_keys(idea_keys: Iterable[str], passed: Iterable[str]) -> list[Key]:
    """The keys a session's experiments get: the idea's, then those passed, once each."""
    keys: dict[str, Key] = {}
    for name in idea_keys:
        keys.setdefault(name, Key(name, "constraints.api_keys"))
    for name in passed:
        keys.setdefault(name, Key(name, "--pass-env"))
    return list(keys.values())


def unset(keys: Iterable[Key], environ: Mapping[str, str] | None = None) -> list[Key]:
    """The keys with no value in `environ` (default: this process's environment)."""
    env = os.environ if environ is None else environ
    return [k for k in keys if not env.get(k.name)]


def unset_line(keys: list[Key]) -> str:
    """One line on the keys that are not set; "" when every key is."""
    if not keys:
        return ""
    named = ", ".join(f"{k.name} ({k.source})" for k in keys)
    it = "it" if len(keys) == 1 else "them"
    return (f"keys for the experiments not set in this environment: {named}; their commands run "
            f"without {it} (export {it}, then resume)")


def api_hints(idea: "Idea") -> list[str]:
    """What in the idea says its runs call an API (empty when nothing does)."""
    text = " ".join(_strings(idea.model_dump(mode="json")))
    named = list(dict.fromkeys(KEY_NAMES.findall(text)))
    words = list(dict.fromkeys(m.group(0) for m in API_WORDS.finditer(text)))
    hints = [f"its text names {', '.join(named)}"] if named else []
    hints += [f"it mentions {', '.join(words[:5])}"] if words else []
    if not hints and idea.guidance_domain in API_DOMAINS:
        hints.append(f"its domain, {idea.guidance_domain}, mostly evaluates hosted models")
    return hints


def check_warnings(idea: "Idea", environ: Mapping[str, str] | None = None) -> list[str]:
    """What `labrun check` says about the idea's keys, one line each."""
    if idea.constraints.api_keys is None:  # an explicit `api_keys: []` says none is needed
        hints = api_hints(idea)
        if not hints:
            return []
        return [f"constraints.api_keys: none named, but the idea seems to call an API ({'; '.join(hints)}); "
                "name the variables its runs need (names only) or pass them with --pass-env NAME, "
                "or write `api_keys: []` if they need none"]
    missing = unset(session_keys(idea.api_keys, ()), environ)
    if not missing:
        return []
    names = ", ".join(k.name for k in missing)
    return [f"constraints.api_keys: {names} {'is' if len(missing) == 1 else 'are'} not set in this "
            "environment; the runs that need it cannot reach their API until it is exported"]


def _strings(value) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
