"""The parts a phase's completion rule is made of.

Each part says what it still misses in the session's work so far (`Work`) and describes
itself in words for the prompts. A phase needing something new declares a new part here
(or in its own module): the tools and the turn loop only ever ask `phase.missing(work)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence


@dataclass(frozen=True)
class Work:
    """What a phase has to show for itself when it asks to complete."""

    root: Path
    sections: dict[str, str]
    """STATE sections given so far, this call's included."""
    attempts: Sequence[Any]
    """The session's experiment attempts (`labrun.state.Attempt`)."""


class Rule(Protocol):
    def missing(self, work: Work) -> list[str]: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class Files:
    """Workspace files that must exist."""

    paths: tuple[str, ...]

    def __init__(self, *paths: str):
        object.__setattr__(self, "paths", paths)

    def missing(self, work: Work) -> list[str]:
        return [f"file {p}" for p in self.paths if not (work.root / p).is_file()]

    def describe(self) -> str:
        return " and ".join(f"`{p}` exists" for p in self.paths)


@dataclass(frozen=True)
class Sections:
    """STATE.md sections that `complete_phase` must give, key → title."""

    titles: dict[str, str]

    def __init__(self, **titles: str):
        object.__setattr__(self, "titles", titles)

    def __hash__(self) -> int:
        return hash(tuple(self.titles.items()))

    def missing(self, work: Work) -> list[str]:
        return [f"section {k}" for k in self.titles if not (work.sections.get(k) or "").strip()]

    def describe(self) -> str:
        return " and ".join(f"the section `{k}` is given" for k in self.titles)


@dataclass(frozen=True)
class SuccessfulAttempt:
    """At least one experiment attempt succeeded."""

    def missing(self, work: Work) -> list[str]:
        if any(a.status == "SUCCESS" for a in work.attempts):
            return []
        return ["a run_experiment attempt with status SUCCESS"]

    def describe(self) -> str:
        return "at least one `run_experiment` attempt has succeeded"
