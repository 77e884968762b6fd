"""labrun's own settings: every `LABRUN_*` variable it reads, one typed field each.

`settings()` reads them from the environment as it is now, at each use (a test's
`monkeypatch.setenv`, a deployment run's environment; only the retry delays are read at
import, `labrun.turns`), cheaply: it builds them again only when
a `LABRUN_*` variable changed. A value that does not parse is `BadSetting`, one line naming the
variable; the command line checks them all before a command does anything.

An empty value is passed on as it is, as it always was (`LABRUN_PASS_ENV=""`: none), except in
the fields marked `EmptyIsUnset`, where it always meant the default. `python -m labrun.settings`
prints the table of docs/running.md's "Environment variables".
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PREFIX = "LABRUN_"
OFF = ("0", "off", "no", "false")

EmptyIsUnset = "empty is unset"
"""Field metadata: an empty value means the default, as for an unset variable."""
Switch = Annotated[bool, BeforeValidator(lambda v: v if isinstance(v, bool) else str(v).strip().lower() not in OFF)]
"""On unless 0, off, no or false."""
OnlyOn = Annotated[bool, BeforeValidator(lambda v: v if isinstance(v, bool) else v == "on")]
"""Off unless exactly `on`."""


class BadSetting(ValueError):
    """A `LABRUN_*` value that does not parse: one line naming the variable."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=PREFIX, use_attribute_docstrings=True, frozen=True)

    # -- the agents ---------------------------------------------------------------------------
    model: Annotated[str | None, EmptyIsUnset] = None
    """the model when --model is not given (default claude-opus-5-5)"""
    claude: str = "claude"
    """the claude executable of the claude-code agent (default claude)"""
    claude_permissions: str = "default"
    """skip: claude-code with --dangerously-skip-permissions"""
    claude_auth: str = "auto"
    """how claude-code logs in: auto (a subscription if there is one), subscription or api-key"""
    codex: str = "codex"
    """the codex executable of the codex agent (default codex)"""
    gemini: str = "gemini"
    """the gemini executable of the gemini agent (default gemini)"""
    gemini_max_attempts: str = ""
    """Gemini CLI's own attempts at each request, 1 to 10 (unset: its default, 10)"""
    phase_timeout_s: Annotated[float, EmptyIsUnset] = 21600.0
    """a coding-CLI phase's time limit in seconds (6 h; the idea's time_limit bounds each experiment attempt)"""
    cli_grace_s: float = 120.0
    """seconds a coding CLI may go on after complete_phase succeeded before it is stopped"""
    cli_pidns: Switch = True
    """off: no PID namespace of its own for a coding CLI's run (bubblewrap)"""
    cli_writable: str = ""
    """for tests: paths (separated by :) also writable for a coding CLI in labrun's sandbox"""
    pass_env: str = ""
    """NAME,... environment variables passed on to the agent's commands and to a coding CLI itself (--pass-env: to the experiments' commands only)"""
    context_management: Switch = True
    """off: no server-side context editing (anthropic agent)"""
    prices: str = ""
    """a JSON file of model prices (USD per million tokens)"""

    # -- a session ----------------------------------------------------------------------------
    min_free_mb: float = 100.0
    """free disk below which a session stops before its next step (100)"""
    hash_max_mb: float = 64.0
    """MB above which a workspace file's digest is its size and mtime, never read"""
    keep_max_mb: float = 16.0
    """MB up to which a file is kept as each attempt found it (for reproductions)"""
    min_window_wait_s: Annotated[float, EmptyIsUnset] = 60.0
    """the shortest wait for a spent usage window's reset, in seconds"""
    retry_base_s: float = 2.0
    """seconds before a transient model or CLI error's first retry, doubled each time (tests make it short)"""
    keep_experiments: OnlyOn = False
    """on: Ctrl-C and SIGTERM leave running experiment attempts running (`labrun resume` records them)"""
    tasks_in: Literal["here", "process"] = "here"
    """where the engine's tasks (attempts, reruns, sealed scoring) run: here, or process (one of their own each)"""
    pool_worker_wait_min: float = 10.0
    """minutes without a worker online after which a session's experiments pool (--experiments-pool) counts as unattended"""
    pool_no_worker: Literal["wait", "fail"] = "wait"
    """an experiments pool unattended that long: wait (warn and keep waiting for a worker) or fail (refuse the session, or end the waiting attempt INTERRUPTED)"""
    experiments_storage: Annotated[str | None, EmptyIsUnset] = None
    """where attempts on an experiments pool get their files by content when its workers cannot see the workspace (a path or fsspec URL; --experiments-storage)"""
    experiments_workdir: Annotated[str | None, EmptyIsUnset] = None
    """on a pool's worker: where attempts get a workspace of their own from the experiments storage (default: the system's temporary folder)"""

    # -- server mode and the Prefect API ------------------------------------------------------
    model_api_slots: int = 4
    """model calls at once over all sessions in server mode (4)"""
    model_api_limit: OnlyOn = False
    """on: model calls hold a slot of the labrun-model-api limit (prefect.yaml sets it for deployment runs)"""
    artifacts_interval_s: float = 2.0
    """seconds between a flow run's publications of its session's artifacts to the Prefect UI"""

    # -- for tests ----------------------------------------------------------------------------
    crash_at: str = ""
    """for tests: NAME:N kills the engine at the n-th arrival at crashpoint NAME (labrun.crashpoints)"""
    scripted_faults: str = ""
    """for tests: KIND@PHASE:TURN,... faults the scripted agent injects"""
    scripted_latency_s: float = 0.0
    """for tests: seconds each reply of the scripted agent takes"""

    @model_validator(mode="before")
    @classmethod
    def _empty_is_unset(cls, values: Any) -> Any:
        if not isinstance(values, dict):
            return values
        return {k: v for k, v in values.items()
                if not (v == "" and k in cls.model_fields and EmptyIsUnset in cls.model_fields[k].metadata)}


def variable(field: str) -> str:
    """The environment variable of a field."""
    return PREFIX + field.upper()


def described() -> dict[str, str]:
    """Every variable, with its line of help (the field's docstring)."""
    return {variable(name): f.description or "" for name, f in Settings.model_fields.items()}


def _default(value: Any) -> str:
    if value is None or value == "":
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def table() -> str:
    """The Markdown table of every variable: its name, its default, what it does."""
    rows = ["| variable | default | what it does |", "|---|---|---|"]
    rows += [f"| `{variable(name)}` | {_default(f.default)} | {f.description} |"
             for name, f in Settings.model_fields.items()]
    return "\n".join(rows) + "\n"


def _load() -> Settings:
    try:
        return Settings()
    except ValidationError as e:
        said = "; ".join(
            f"{variable(str(err['loc'][0]))}={err['input']!r}: {err['msg'][:1].lower()}{err['msg'][1:]}"
            for err in e.errors())
        raise BadSetting(f"{said}; fix or unset it") from None


_last: tuple[tuple[tuple[str, str], ...], Settings] | None = None


def settings() -> Settings:
    """The settings as the environment has them now (built again only when a `LABRUN_*`
    variable changed). Raises `BadSetting`."""
    global _last
    seen = tuple(sorted((k, v) for k, v in os.environ.items() if k[:len(PREFIX)].upper() == PREFIX))
    last = _last
    if last is None or last[0] != seen:
        last = _last = (seen, _load())
    return last[1]


if __name__ == "__main__":
    print(table(), end="")
