"""How a session came out, decided once from its records: each claim's standing and each
criterion's verdict (`labrun.claims`), and the verdict in a line, "2 of 3 criteria met, 1
unmet; results reproduced".

REPORT.md's engine section and the paper's results file (`phases.report_header`), `labrun
status`, a run's closing lines, the flow run's state message, the Prefect UI's verdict
artifact and `labrun results` all show what `results` and `outcome` say here, so no two can
disagree. It reads only the session's files (no Prefect), so reading commands stay quick.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labrun.attempt_records import AttemptRecords
from labrun.claims import Standing, Verdict, standing, verdict
from labrun.evidence import is_source
from labrun.idea import Idea
from labrun.snapshot import entry_digest
from labrun.state import SessionState, StateStore
from labrun.workspace import Workspace

DEFAULT_SEALED_TOLERANCE = 0.05
DEFAULT_REPRODUCE_MINUTES = 60.0
DEFAULT_REPRODUCE_TOLERANCE = 1e-3


def reproduce_settings(idea: Idea) -> tuple[float, float]:
    """(minutes, relative tolerance) of the engine's reruns for this idea."""
    c = idea.constraints
    minutes = c.reproduce_minutes if c and c.reproduce_minutes is not None else DEFAULT_REPRODUCE_MINUTES
    tolerance = c.reproduce_tolerance if c and c.reproduce_tolerance is not None else DEFAULT_REPRODUCE_TOLERANCE
    return minutes, tolerance


def sealed_scores(state: SessionState) -> dict[str, Any]:
    sealed = state.sealed
    return dict(sealed.score.scores) if sealed and sealed.score and sealed.score.status == "SCORED" else {}


def code_changed(ws: Workspace, record: dict) -> list[str]:
    """The source files an attempt started from (`record`: its files) that the workspace no
    longer holds as they were."""
    return [rel for rel, digest in (record.get("before") or {}).items()
            if is_source(rel) and entry_digest(ws.root, rel) != digest]


def results(ws: Workspace, state: SessionState, idea: Idea) -> tuple[list[Standing], list[Verdict]]:
    """Each claim's standing and each criterion's verdict, from the records as they are now."""
    plan, attempts = state.plan, {a.n: a for a in state.live_attempts()}
    scores = sealed_scores(state)
    sealed = idea.sealed_evaluation
    tolerance = sealed.tolerance if sealed and sealed.tolerance is not None else DEFAULT_SEALED_TOLERANCE
    records = AttemptRecords(ws, StateStore(ws, state))  # read only: what each attempt found and wrote
    behind = {n for c in plan.claims for n in (*c.attempts, *c.baseline_attempts)}
    files = {n: records.files(n) or {} for n in behind}
    changed = {n: code_changed(ws, files[n]) for n in behind}
    # the sealed score judges the claims on what it scored: those whose attempts wrote the artifact,
    # by the metric's name, or, on a criterion the idea says it decides, whatever their name
    made = {n for n in behind if sealed and sealed.artifact in (files[n].get("wrote") or ())}
    bound = {}
    for cid in (sealed.criteria or ()) if sealed and scores else ():
        check = plan.check(cid)
        score = scores.get(check.metric) if check else None
        bound[cid] = score if score is not None else next(iter(scores.values())) if len(scores) == 1 else None

    def judged_by(claim) -> dict:
        if not made & set(claim.attempts):
            return {}
        return {claim.metric: bound[claim.criterion]} if bound.get(claim.criterion) is not None else scores

    rerun_tolerance = reproduce_settings(idea)[1]
    standings = [standing(c, attempts, judged_by(c), tolerance, rerun_tolerance, changed) for c in plan.claims]
    return standings, [verdict(c, plan.check(c.id), standings, bound.get(c.id)) for c in plan.criteria]


@dataclass(frozen=True)
class Outcome:
    """The session's verdict in counts: its criteria's verdicts and its reruns."""

    criteria: int
    met: int
    unmet: int
    unconfirmed: int
    not_judged: int
    reproduction: str
    """`reproduced` (every attempt behind a claim reran the same), `diverged`, `partly`
    (some could not be rerun), `skipped` (none could), `not yet`, `off`, or `nothing` (no
    claim to rerun)."""
    reruns: dict[str, int]
    """REPRODUCED, DIVERGED, SKIPPED → how many of the attempts behind claims."""
    contradicted: tuple[str, ...]
    """Claims the sealed evaluation contradicts."""
    standings: tuple[Standing, ...]
    verdicts: tuple[Verdict, ...]

    @property
    def reproduced(self) -> bool | None:
        """True when the results were reproduced, False when a rerun diverged, else None."""
        return {"reproduced": True, "diverged": False}.get(self.reproduction)

    def line(self) -> str:
        """"1 of 3 criteria met, 1 unmet, 1 unconfirmed; results reproduced"."""
        if self.criteria:
            counts = [f"{self.met} of {self.criteria} criteria met"]
            counts += [f"{n} {word}" for n, word in ((self.unmet, "unmet"), (self.unconfirmed, "unconfirmed"),
                                                     (self.not_judged, "not judged")) if n]
            head = ", ".join(counts)
        else:
            head = "the idea lists no evaluation criteria"
        r = self.reruns
        done = r["REPRODUCED"] + r["DIVERGED"] + r["SKIPPED"]
        rerun = {
            "reproduced": "results reproduced",
            "diverged": f"results not reproduced: {r['DIVERGED']} of {done} reruns diverged",
            "partly": f"results partly reproduced: {r['REPRODUCED']} of {done} attempts, {r['SKIPPED']} not rerun",
            "skipped": "results not reproduced: none could be rerun",
            "not yet": "results not rerun yet",
            "off": "reproduction turned off",
            "nothing": "no claim to reproduce",
        }[self.reproduction]
        sealed = f"; the sealed evaluation contradicts {', '.join(self.contradicted)}" if self.contradicted else ""
        return f"{head}; {rerun}{sealed}"

    def as_dict(self) -> dict[str, Any]:
        """`labrun status --json`'s `verdict`."""
        return {
            "line": self.line(), "criteria": self.criteria, "met": self.met, "unmet": self.unmet,
            "unconfirmed": self.unconfirmed, "not_judged": self.not_judged,
            "reproduction": self.reproduction, "reproduced": self.reproduced, "reruns": self.reruns,
            "contradicted": list(self.contradicted),
            "verdicts": [{"id": v.criterion.id, "text": v.criterion.text, "verdict": v.verdict, "by": v.by,
                          "basis": v.basis, "claims": list(v.claims)} for v in self.verdicts],
            "claims": [{"id": s.claim.id, "statement": s.claim.statement, "metric": s.claim.metric,
                        "value": s.value, "criterion": s.claim.criterion, "standing": s.status}
                       for s in self.standings],
        }


def outcome(ws: Workspace, state: SessionState, idea: Idea) -> Outcome:
    """The session's verdict, from `results`."""
    standings, verdicts = results(ws, state, idea)
    said = [v.verdict for v in verdicts]
    behind = {n for c in state.plan.claims for n in (*c.attempts, *c.baseline_attempts)}
    attempts = [a for a in state.live_attempts() if a.n in behind and a.status == "SUCCESS"]
    reruns = {s: sum(bool(a.reproduction and a.reproduction.status == s) for a in attempts)
              for s in ("REPRODUCED", "DIVERGED", "SKIPPED")}
    if reproduce_settings(idea)[0] == 0:
        reproduction = "off"
    elif not attempts:
        reproduction = "nothing"
    elif reruns["DIVERGED"]:
        reproduction = "diverged"
    elif reruns["REPRODUCED"] == len(attempts):
        reproduction = "reproduced"
    elif reruns["SKIPPED"] == len(attempts):
        reproduction = "skipped"
    elif reruns["REPRODUCED"] + reruns["SKIPPED"] == len(attempts):
        reproduction = "partly"
    else:
        reproduction = "not yet"
    return Outcome(len(verdicts), said.count("met"), said.count("unmet"), said.count("unconfirmed"),
                   said.count("not judged"), reproduction, reruns,
                   tuple(s.claim.id for s in standings if s.contradicted), tuple(standings), tuple(verdicts))
