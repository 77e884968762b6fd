"""What one run of a session is given, declared once: the command line builds it, the flow
takes its fields as its parameters (so the Prefect UI's form and a deployment run's
parameters are these), `labrun queue` and the queue flow submit it, and `Session.open`
opens the session with it."""

from __future__ import annotations

import hashlib
import inspect
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from labrun import suggest
from labrun.agents.registry import names
from labrun.phase_registry import BY_KEY, phase_list

# Choices in the UI's form, refused by the server when a run is created: the backends and the
# phases known at import (one registered later is checked by `_known`, or by the session).
PHASES = list(phase_list(BY_KEY))


class RunParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    idea_path: str | None = Field(None, description=(
        "The idea file (YAML) of a new session, a path on the worker; leave it out to resume the "
        "session in `workspace`."))
    workspace: str = Field(description=(
        "The session's folder on the worker: a new session is made there, an existing one resumed."))
    agent: str | None = Field(None, description=(
        "The agent backend; a new session without one gets labrun's default, a resumed one keeps its own."),
        json_schema_extra={"enum": [*names(), None]})
    model: str | None = Field(None, description="The model; else the backend's default, or the session's.")
    budget_usd: float | None = Field(None, ge=0, description=(
        "The agent's own spending limit in US dollars; else the session's, or the idea's "
        "constraints.agent_budget."))
    max_turns: int | None = Field(None, ge=1, description="Turns a phase may take; else each phase's own.")
    parallel_attempts: int | None = Field(None, ge=1, description=(
        "Experiment attempts that may run at once; else the session's, the idea's "
        "constraints.parallel_attempts, or 4 (never more than the worker's CPUs)."))
    with_phases: list[Annotated[str, Field(json_schema_extra={"enum": PHASES})]] | None = Field(None, description=(
        "Optional phases a new session runs too (e.g. resources, paper), besides those its idea asks "
        "for; a session keeps the phases it started with."))
    paper_style: str | None = Field(None, description=(
        "The paper phase's LaTeX style (plain by default); fixed when the session starts."))
    network: bool | None = Field(None, description=(
        "False: the agent's commands run without network from now on."))
    from_phase: str | None = Field(None, description=(
        "Start a new branch of the session at this finished phase: the phases before it are reused, "
        "it and the later ones run again with `agent` and `model` (`labrun rerun`)."),
        json_schema_extra={"enum": [*PHASES, None]})
    note: str | None = Field(None, description="Why the branch of `from_phase` was started.")
    pass_env: list[str] | None = Field(None, description=(
        "Names of keys (API keys, tokens) the experiments' commands get besides the idea's "
        "constraints.api_keys; their values come from the worker's environment, and a resume adds to them."))
    experiments_pool: str | None = Field(None, description=(
        "The Prefect work pool every experiment attempt runs on, as a flow run of its own (e.g. a pool of "
        "GPU machines); else the idea's constraints.experiments_pool, or the session's; unset: where the session runs."))
    experiments_storage: str | None = Field(None, description=(
        "Where the pool's attempts get their files by content when its workers cannot see the workspace: a path "
        "on storage both sides reach or an fsspec URL (s3://bucket/prefix); else LABRUN_EXPERIMENTS_STORAGE, or the "
        "session's; unset: the workers see the workspace's path."))
    review_after: list[Annotated[str, Field(json_schema_extra={"enum": PHASES})]] | None = Field(None, description=(
        "Phases a person reviews once they complete; a new session takes them, else the idea's "
        "metadata.review_after; a later run's list replaces the session's."))

    @field_validator("agent")
    @classmethod
    def _known(cls, agent: str | None) -> str | None:
        """Checked when it is given, against the backends registered then."""
        if agent is not None and agent not in names():
            raise ValueError(suggest.unknown("agent", agent, names()))
        return agent

    def parameters(self) -> dict[str, Any]:
        """The flow run's parameters: only what was given, so that a resume keeps the rest."""
        return self.model_dump(include=set(RunParams.model_fields), exclude_none=True)


def session_run_name(workspace: str | os.PathLike[str]) -> str:
    """The name of every flow run of the session in `workspace`: the folder's name, and a
    short digest of its whole path, so that two workspaces of one name (one idea queued
    under two roots) never share a name."""
    path = Path(workspace).resolve()
    return f"{path.name}-{hashlib.sha256(str(path).encode()).hexdigest()[:6]}"


def flow_parameters(*, before: dict[str, tuple[Any, Any, str]] | None = None, only: tuple[str, ...] | None = None):
    """A decorator that gives a flow function `RunParams`' fields (or `only` those) as its
    parameters, after `before` (name → annotation, default, description), and their
    descriptions in its docstring's Args, where Prefect reads them for the UI's form. A
    required field's default is its `Field`: Prefect's schema then marks it required (and
    Prefect refuses a run without it), where Python would refuse a parameter without a
    default after those with one."""
    before = before or {}
    fields = {n: f for n, f in RunParams.model_fields.items() if only is None or n in only}
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD

    def give(fn):
        fn.__signature__ = inspect.Signature([
            *(inspect.Parameter(n, kind, default=d, annotation=a) for n, (a, d, _) in before.items()),
            *(inspect.Parameter(n, kind, default=f if f.is_required() else None,
                                annotation=Annotated[f.annotation, f]) for n, f in fields.items())])
        described = {**{n: d for n, (_, _, d) in before.items()}, **{n: f.description for n, f in fields.items()}}
        fn.__doc__ = (fn.__doc__ or "").rstrip() + "\n\nArgs:\n" + "".join(
            f"    {n}: {d}\n" for n, d in described.items())
        return fn
    return give
