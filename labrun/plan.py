"""The plan that binds: the run list planning records, and how far the session has covered it.

Planning gives the run list (each run's id, purpose, conditions, seeds and the idea's
evaluation criteria it serves) and the files the analysis must produce, as structured parts
of `complete_phase`; the engine keeps them in the session's state (`Plan`). Experiment
attempts name the run they serve (`run_experiment`'s `run_id`), so the engine can tell
which planned runs have a successful attempt, which were set aside with a stated reason
(a deviation), and which are still open. The phases' completion rules
(`labrun.phase_registry.rules`) read this; STATE.md, the prompts' digest and `labrun status` show it.

The idea's evaluation criteria are numbered C1, C2, … in the order the idea lists them.
"""

from __future__ import annotations

import re
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Literal, Sequence

from pydantic import BaseModel, Field

from labrun.claims import Claim, CriterionCheck
from labrun.wsfs import Beneath, Refused

CRITERION_PREFIX = "C"
MAX_ID_CHARS = 40
NUMBER_WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}
SEEDS_ASKED = re.compile(r"\b(\d+|" + "|".join(NUMBER_WORDS) + r")\s+(?:(?:random|different|independent)\s+)*"
                         r"(?:seeds|runs with different (?:random )?seeds)", re.I)


def seeds_asked(idea_text: str) -> int:
    """How many seeds an idea asks a run to repeat over ("3 seeds", "three runs with
    different random seeds"); 0 when it names no number (at most ten is read as one)."""
    asked = [int(n) if n.isdigit() else NUMBER_WORDS[n.lower()] for n in SEEDS_ASKED.findall(idea_text)]
    return max([0, *[n for n in asked if n <= 10]])


# -- what complete_phase takes (part of the tool schema: a contract) -----------------------


class PlannedRun(BaseModel):
    id: str = Field(description="Short id of the run, unique in the list: R1, R2, …",
                    min_length=1, max_length=MAX_ID_CHARS)
    purpose: str = Field(description="What the run tests or measures, in one sentence.")
    conditions: str = Field(description="The method or baseline and the settings it runs with.")
    seeds: list[int] = Field(default_factory=list,
                             description="The seeds (or repeat numbers) it runs; [] for a deterministic run.")
    criteria: list[str] = Field(default_factory=list,
                                description="Ids of the idea's evaluation criteria it serves (C1, C2, …).")


class CriterionVerdict(BaseModel):
    id: str = Field(description="The criterion's id (C1, C2, …).")
    status: Literal["met", "unmet"]
    note: str = Field(min_length=1, description="The evidence (runs, attempts, numbers), or why it is unmet.")


class Deviation(BaseModel):
    id: str = Field(description="A planned run's id, or the path of a planned analysis output.")
    reason: str = Field(min_length=1, description="Why it was not done as planned.")


PLAN_FIELDS: dict[str, Any] = {
    "run_list": (list[PlannedRun] | None, Field(
        default=None, description="Planning: every planned run, in priority order.")),
    "analysis_outputs": (list[str] | None, Field(
        default=None, description="Planning: the files the analysis must produce (figures, a "
        "summary such as results/summary.json), as workspace paths.")),
    "criterion_checks": (list[CriterionCheck] | None, Field(
        default=None, description="Planning: for each criterion that a number decides, the metric, the "
        "comparison and the threshold; the engine then decides its verdict from the claims.")),
    "criteria": (list[CriterionVerdict] | None, Field(
        default=None, description="The idea's evaluation criteria judged: in planning the ones no "
        "run can serve (unmet, with the reason); in experiments every criterion, met or unmet "
        "(analysis may judge one again).")),
    "claims": (list[Claim] | None, Field(
        default=None, description="Experiments and analysis: the key results, each checked against the "
        "records of the attempts it cites.")),
    "deviations": (list[Deviation] | None, Field(
        default=None, description="Planned runs (experiments) or planned outputs (analysis) not "
        "done as planned, each with its reason.")),
    "negative_outcome": (str | None, Field(
        default=None, description="Experiments only, after an honest effort: close the phase "
        "although the planned runs could not succeed; say what failed and why.")),
}
"""`complete_phase`'s optional structured parts, beside `summary` and `sections`."""


# -- what the engine keeps ------------------------------------------------------------------


class Criterion(BaseModel):
    id: str
    text: str
    status: Literal["met", "unmet"] | None = None
    note: str | None = None
    phase: str | None = None
    """The phase that judged it."""


class Recorded(Deviation):
    phase: str


class RecordedClaim(Claim):
    phase: str


class Plan(BaseModel):
    criteria: list[Criterion] = Field(default_factory=list)
    """The idea's evaluation criteria, numbered, with their verdicts once given."""
    runs: list[PlannedRun] = Field(default_factory=list)
    outputs: list[str] = Field(default_factory=list)
    """What the analysis must produce."""
    deviations: list[Recorded] = Field(default_factory=list)
    negative_outcome: str | None = None
    checks: list[CriterionCheck] = Field(default_factory=list)
    """The criteria whose verdict the engine decides (`labrun.claims`)."""
    claims: list[RecordedClaim] = Field(default_factory=list)
    given_by: dict[str, str] = Field(default_factory=dict)
    """Part (`run_list`, `analysis_outputs`, `negative_outcome`, `criterion_checks`) → the phase that gave it."""

    @classmethod
    def for_criteria(cls, texts: Iterable[str] | None) -> "Plan":
        return cls(criteria=[Criterion(id=f"{CRITERION_PREFIX}{i}", text=t)
                             for i, t in enumerate(texts or (), 1)])

    def criterion_ids(self) -> list[str]:
        return [c.id for c in self.criteria]

    def run_ids(self) -> list[str]:
        return [r.id for r in self.runs]

    def check(self, criterion: str) -> CriterionCheck | None:
        return next((c for c in self.checks if c.id == criterion), None)

    def deviation(self, item: str) -> Recorded | None:
        return next((d for d in reversed(self.deviations) if d.id == item), None)

    def merged(self, parts: dict[str, Any], phase: str) -> "Plan":
        """A copy with this `complete_phase` call's parts applied: a run list and outputs
        replace the earlier ones, a verdict or deviation replaces one for the same item."""
        plan = self.model_copy(deep=True)
        plan.given_by.update({k: phase for k in ("run_list", "analysis_outputs", "negative_outcome", "criterion_checks")
                              if parts.get(k) is not None})
        if parts.get("criterion_checks") is not None:
            plan.checks = [CriterionCheck.model_validate(c) for c in parts["criterion_checks"]]
        for claim in parts.get("claims") or ():  # a phase replaces its own claim; another phase's stays
            c = Claim.model_validate(claim)
            plan.claims = [x for x in plan.claims if (x.id, x.phase) != (c.id, phase)]
            plan.claims.append(RecordedClaim(**c.model_dump(), phase=phase))
        if parts.get("run_list") is not None:
            plan.runs = [PlannedRun.model_validate(r) for r in parts["run_list"]]
        if parts.get("analysis_outputs") is not None:
            plan.outputs = [normal_path(p) for p in parts["analysis_outputs"]]
        for verdict in parts.get("criteria") or ():
            v = CriterionVerdict.model_validate(verdict)
            for criterion in plan.criteria:
                if criterion.id == v.id:
                    criterion.status, criterion.note, criterion.phase = v.status, v.note, phase
        for deviation in parts.get("deviations") or ():
            d = Deviation.model_validate(deviation)
            d.id = normal_path(d.id) if d.id not in plan.run_ids() else d.id
            plan.deviations = [x for x in plan.deviations if x.id != d.id]
            plan.deviations.append(Recorded(id=d.id, reason=d.reason, phase=phase))
        if parts.get("negative_outcome") is not None:
            plan.negative_outcome = parts["negative_outcome"].strip() or None
        return plan


    def forget(self, phases: Iterable[str]) -> "Plan":
        """A copy without what `phases` gave (a rerun from a phase replaces them)."""
        phases = set(phases)
        plan = self.model_copy(deep=True)
        dropped = {k for k, by in plan.given_by.items() if by in phases}
        if "run_list" in dropped:
            plan.runs = []
        if "analysis_outputs" in dropped:
            plan.outputs = []
        if "negative_outcome" in dropped:
            plan.negative_outcome = None
        if "criterion_checks" in dropped:
            plan.checks = []
        plan.claims = [c for c in plan.claims if c.phase not in phases]
        plan.given_by = {k: by for k, by in plan.given_by.items() if k not in dropped}
        for c in plan.criteria:
            if c.phase in phases:
                c.status = c.note = c.phase = None
        plan.deviations = [d for d in plan.deviations if d.phase not in phases]
        return plan


def normal_path(path: str) -> str:
    """A workspace path as the plan keeps it: relative, no `./`."""
    return str(PurePosixPath(path.strip())).removeprefix("./")


# -- coverage -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunCoverage:
    run: PlannedRun
    succeeded: tuple[int, ...]
    """Numbers of the SUCCESS attempts that served it."""
    tried: tuple[int, ...]
    """Numbers of every attempt that served it."""
    deviation: Recorded | None

    @property
    def state(self) -> str:
        """`done` (a SUCCESS attempt), `deviated` (a stated reason instead), or `open`."""
        if self.succeeded:
            return "done"
        return "deviated" if self.deviation else "open"

    def describe(self) -> str:
        if self.succeeded:
            shown = "done: attempt " + ", ".join(f"#{n}" for n in self.succeeded)
            return shown + (f" (deviation: {self.deviation.reason})" if self.deviation else "")
        tried = f"; tried in {', '.join(f'#{n}' for n in self.tried)}" if self.tried else ""
        if self.deviation:
            return f"deviation: {self.deviation.reason}{tried}"
        return "not done yet" + tried


def coverage(plan: Plan | None, attempts: Sequence[Any]) -> list[RunCoverage]:
    """Each planned run with the attempts that served it (`attempts`: `labrun.state.Attempt`)."""
    if plan is None:
        return []
    found = []
    for run in plan.runs:
        mine = [a for a in attempts if getattr(a, "run_id", None) == run.id]
        found.append(RunCoverage(run, tuple(a.n for a in mine if _status(a) == "SUCCESS"),
                                 tuple(a.n for a in mine), plan.deviation(run.id)))
    return found


def summary(plan: Plan | None, attempts: Sequence[Any], root: Path) -> dict[str, Any]:
    """The plan and its coverage as plain data (`labrun status --json`'s `plan`); `root`:
    the workspace the planned outputs are in."""
    if plan is None:
        plan = Plan()
    runs = coverage(plan, attempts)
    served = {c: [r.run.id for r in runs if c in r.run.criteria] for c in plan.criterion_ids()}
    return {
        "runs": [{**r.run.model_dump(), "state": r.state, "succeeded": list(r.succeeded),
                  "attempts": list(r.tried), "deviation": r.deviation.reason if r.deviation else None}
                 for r in runs],
        "coverage": {"runs": len(runs), "done": sum(r.state == "done" for r in runs),
                     "deviated": sum(r.state == "deviated" for r in runs),
                     "open": sum(r.state == "open" for r in runs)},
        "criteria": [{**c.model_dump(), "runs": served[c.id],
                      "check": (check.model_dump() if (check := plan.check(c.id)) else None)} for c in plan.criteria],
        "claims": [c.model_dump() for c in plan.claims],
        "outputs": [{"path": p, "exists": output_exists(root, p),
                     "deviation": (d.reason if (d := plan.deviation(p)) else None)}
                    for p in plan.outputs],
        "negative_outcome": plan.negative_outcome,
    }


def output_exists(root: Path, path: str) -> bool:
    """A planned output counts once it is a file with something in it."""
    try:
        st = Beneath(root).lstat(path)
    except Refused:
        return False
    return st is not None and stat.S_ISREG(st.st_mode) and st.st_size > 0


def _status(attempt: Any) -> str:
    status = attempt.status
    return getattr(status, "value", status)
