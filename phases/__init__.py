"""The six phases (DESIGN.md, contract): what each asks of the agent and what completes it."""

from __future__ import annotations

from dataclasses import dataclass, field

SECTION_TITLES = {
    "research_specification": "Research Specification",
    "files_and_resources": "Files and Resources",
    "workflow": "Workflow",
    "experiment_design": "Experiment Design",
    "experiment_results": "Experiment Results",
    "learnings": "Learnings",
}


@dataclass(frozen=True)
class Phase:
    number: int
    key: str
    title: str
    job: str
    sections: tuple[str, ...] = ()
    """STATE sections that `complete_phase` must give."""
    files: tuple[str, ...] = ()
    """Workspace files that must exist."""
    needs_success: bool = False
    """At least one experiment attempt must have succeeded."""
    max_turns: int = 40
    extra: dict = field(default_factory=dict)


PHASES: tuple[Phase, ...] = (
    Phase(1, "planning", "Planning", "motivation, research question, plan",
          sections=("research_specification",), files=("planning.md",), max_turns=30),
    Phase(2, "setup", "Setup", "isolated environment, data loaded and checked",
          sections=("files_and_resources", "workflow"), max_turns=40),
    Phase(3, "implementation", "Implementation", "code for baselines, method and evaluation",
          sections=("experiment_design",), max_turns=60),
    Phase(4, "experiments", "Experiments", "run the experiments, one attempt at a time",
          sections=("experiment_results",), needs_success=True, max_turns=60),
    Phase(5, "analysis", "Analysis", "statistics, comparisons, figures",
          sections=("learnings",), max_turns=40),
    Phase(6, "documentation", "Documentation", "final write-up",
          files=("REPORT.md", "README.md"), max_turns=30),
)

BY_KEY = {p.key: p for p in PHASES}
