"""The phase registry: every phase declared once, with what completes it.

A phase is one `Phase` declaration: its key, its title and job, the folder of its templates
(`<templates>/phases/<key>.md.j2`, domain guidance under `<templates>/domains/`), its
completion rule, its turn limit and the files it hands on to later phases. The flow, the
tools and STATE.md read everything from here, so adding a phase is a declaration and its
templates (`register`), nothing else.

A session's phases are fixed when it starts (`phase_list`) and kept in its state, in order;
the six research phases of docs/design.md are the default. Two optional phases take NeuriCo's
other stages: `resources` (literature, datasets and code, before planning) and `paper` (a
LaTeX paper, after documentation).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from labrun import paper, suggest
from labrun.phase_registry.rules import (AccountsForPlan, CitesFetchedSource, ClaimsHold, Compiled, CriteriaJudged, Files, LatexPaper,
                                 NamesCodeReferences, Outline, PinnedEnvironment, PlannedOutputs, PlannedRunsDone,
                                 Rule, RunList, SaysWhatFailed, Sections, SuccessfulAttempt, Work)
from labrun.resources import TEMPLATES

if TYPE_CHECKING:
    from labrun.session import Session

__all__ = ["Phase", "register", "phase_list", "phase_version", "review_after_phases", "BY_KEY", "PHASES", "DEFAULT", "SECTION_TITLES",
           "Files", "Sections", "SuccessfulAttempt", "CitesFetchedSource", "LatexPaper",
           "ClaimsHold", "Outline", "AccountsForPlan", "Compiled", "RunList", "PlannedRunsDone", "CriteriaJudged",
           "PlannedOutputs", "SaysWhatFailed", "NamesCodeReferences", "PinnedEnvironment", "Rule",
           "Work"]


@dataclass(frozen=True)
class Phase:
    key: str
    title: str
    job: str
    """What the agent does in this phase, in a few words (the kickoff says it)."""
    done_when: tuple[Rule, ...]
    """The completion rule: `complete_phase` succeeds once every part of it holds."""
    max_turns: int = 40
    hands_on: tuple[str, ...] = ()
    """Workspace files the later phases build on; their prompts point to them."""
    templates: Path = TEMPLATES
    default: bool = True
    """In every session unless left out; an optional phase is chosen with `--with`."""
    web: bool = False
    """The agent's backend offers its web search and fetch tools in this phase."""
    setup: Callable[["Session"], dict[str, Any]] | None = None
    """Run when the phase's conversation starts: may put the files the phase starts from
    into the workspace, and returns variables for its templates."""
    version: int = 1
    """What the phase's templates ask, as a number: raise it when they ask something new, and
    finished phases run again. A rewording leaves them finished (`labrun status` shows
    them as finished with an older prompt)."""

    @property
    def sections(self) -> tuple[str, ...]:
        """The STATE.md sections this phase gives through `complete_phase`."""
        return tuple(k for r in self.done_when if isinstance(r, Sections) for k in r.titles)

    @property
    def outline(self) -> tuple[str, ...]:
        """The headings its `Outline` rule asks of its main file (none for most phases)."""
        return next((r.headings for r in self.done_when if isinstance(r, Outline)), ())

    @property
    def fields(self) -> tuple[str, ...]:
        """The structured parts of `complete_phase` this phase takes (its rule reads them)."""
        return tuple(dict.fromkeys(f for rule in self.done_when for f in rule.fields))

    def missing(self, work: Work) -> list[str]:
        """What the completion rule still lacks, one item each; [] when it holds."""
        return [m for rule in self.done_when for m in rule.missing(work)]

    def rule_text(self) -> str:
        """The completion rule in words, for the prompts."""
        parts = [rule.describe() for rule in self.done_when]
        if len(parts) <= 2:
            return " and ".join(parts)
        return "; ".join(parts[:-1]) + "; and " + parts[-1]


BY_KEY: dict[str, Phase] = {}
"""Every known phase, by key, in the order they were registered (the default ones first)."""
_PIPELINE: list[str] = []
"""Every known phase's key, in the order phases run."""


def register(phase: Phase, *, before: str | None = None, after: str | None = None) -> Phase:
    """Add `phase` to the pipeline (at the end, or next to an existing phase)."""
    if phase.key in BY_KEY and BY_KEY[phase.key] != phase:
        raise ValueError(f"a different phase {phase.key!r} is registered already")
    anchor = before or after
    order = [k for k in _PIPELINE if k in BY_KEY and k != phase.key]
    if anchor is not None and anchor not in order:
        raise ValueError(f"cannot place phase {phase.key!r} next to unknown phase {anchor!r}")
    at = len(order) if anchor is None else order.index(anchor) + (1 if after else 0)
    order.insert(at, phase.key)
    _PIPELINE[:] = order
    BY_KEY[phase.key] = phase
    return phase


def phase_list(chosen: Iterable[str] = ()) -> tuple[str, ...]:
    """The keys of a new session's phases: the default ones plus the optional ones chosen,
    in pipeline order. An unknown name is a ValueError that lists the known ones."""
    chosen = [c.strip() for c in chosen if c.strip()]
    unknown = [c for c in chosen if c not in BY_KEY]
    if unknown:
        raise ValueError(suggest.unknown("phase", unknown[0], BY_KEY))
    return tuple(k for k in _PIPELINE if k in BY_KEY and (BY_KEY[k].default or k in chosen))


def review_after_phases(names: Iterable[str], phases: Iterable[str]) -> list[str]:
    """The phases named for review by a person (`labrun.review`), each one of the session's
    `phases`: a near miss is suggested, a phase the session does not run is named as such."""
    names, phases = [n.strip() for n in names if n.strip()], list(phases)
    for name in names:
        if name not in phases:
            raise ValueError(suggest.unknown("phase", name, phases) if name not in BY_KEY else
                             f"{name}: not one of this session's phases ({', '.join(phases)})")
    return list(dict.fromkeys(names))


PLANNING_OUTLINE = ("Motivation and related work", "Hypotheses and variables", "Alternative explanations",
                    "Design: data, baselines, method, ablations", "Metrics and statistical test",
                    "Sample size and power", "Run list", "Budget and cuts", "Risks and fallbacks",
                    "Changes to the idea's method")
"""The sections of `planning.md`, in order (its prompt lists them from here)."""

for _phase in (
    Phase("planning", "Planning", "motivation, research question, plan",
          (Files("planning.md"), Outline("planning.md", PLANNING_OUTLINE),
           Sections(research_specification="Research Specification"), RunList()),
          max_turns=30, hands_on=("planning.md",), web=True),
    Phase("setup", "Setup", "isolated environment, data loaded and checked",
          (Sections(files_and_resources="Files and Resources", workflow="Workflow"),
           NamesCodeReferences("files_and_resources"), PinnedEnvironment())),
    Phase("implementation", "Implementation", "code for baselines, method and evaluation",
          (Sections(experiment_design="Experiment Design"),), max_turns=60),
    Phase("experiments", "Experiments", "run the experiments, one attempt at a time",
          (PlannedRunsDone(), ClaimsHold(required=True), CriteriaJudged(),
           Sections(experiment_results="Experiment Results")),
          max_turns=60),
    Phase("analysis", "Analysis", "statistics, comparisons, figures",
          (PlannedOutputs(), ClaimsHold(), CriteriaJudged(every=False), Sections(learnings="Learnings"))),
    Phase("documentation", "Documentation", "final write-up",
          (Files("REPORT.md", "README.md"), SaysWhatFailed("REPORT.md"), AccountsForPlan("REPORT.md")),
          max_turns=30,
          hands_on=("REPORT.md",)),
):
    register(_phase)

register(Phase(
    "resources", "Resources", "literature review, datasets and code",
    (Files("literature_review.md", "resources.md"),
     Sections(literature="Literature and Resources"),
     CitesFetchedSource(("literature_review.md", "resources.md"), "literature")),
    max_turns=50, hands_on=("literature_review.md", "resources.md"), default=False, web=True,
), before="planning")
register(Phase(
    "paper", "Paper", "a LaTeX paper of the study",
    (Files(paper.MAIN, f"{paper.FOLDER}/references.bib"),
     LatexPaper(paper.MAIN, f"{paper.FOLDER}/references.bib"),
     Compiled(paper.MAIN, "paper"),
     Sections(paper="Paper")),
    max_turns=50, hands_on=(paper.MAIN,), default=False, setup=paper.setup,
), after="documentation")

PHASES: tuple[Phase, ...] = tuple(BY_KEY[k] for k in phase_list())
"""The six research phases of docs/design.md, in order: every session's phases by default."""
DEFAULT: tuple[str, ...] = tuple(p.key for p in PHASES)


def section_titles(keys: Iterable[str] | None = None) -> dict[str, str]:
    """Section key → title, in phase order, for the phases `keys` (default: every phase)."""
    phases = BY_KEY.values() if keys is None else [BY_KEY[k] for k in keys]
    return {k: t for p in phases for r in p.done_when if isinstance(r, Sections)
            for k, t in r.titles.items()}


SECTION_TITLES = section_titles(DEFAULT)


def phase_version(key: str) -> str:
    """The phase's cache version: what it asks of the agent (its declared version and its
    completion rule). Never the model, the agent's settings, labrun's own version or the
    wording of the templates: a finished phase stays finished when those change."""
    phase = BY_KEY[key]
    return hashlib.sha256(f"{key}\0{phase.version}\0{phase.rule_text()}".encode()).hexdigest()[:16]
