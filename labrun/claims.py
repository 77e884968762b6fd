"""Results the engine vouches for: the agent's claims, checked against the attempts' recorded
metrics, and the verdicts the engine decides.

A **claim** is a key result handed over as structure in `complete_phase` (experiments,
analysis): a metric, the attempts whose records hold it, the value the write-up states for it,
the criterion it bears on and, for a comparison, the baseline's attempts. The engine checks
each against the record (values from `Attempt.metrics`, never from text) and refuses what an
honest agent can mend: a value the record does not hold, an attempt that did not measure the
metric, attempts of the same run left out without a reason, a comparison the numbers deny.

A **criterion check** is what planning may give for a criterion: a metric, a comparison and a
threshold. For such a criterion the engine decides the verdict from the claims on it (or from
the sealed score, where one has that metric's name); other criteria keep the agent's verdict,
shown as its judgement. Reproduction and the sealed evaluation then confirm, leave unconfirmed
or contradict each claim (`standing`).

Everything here is pure: the phases' rules refuse with it, REPORT.md's engine section and the
paper's `labrun_results.tex` render it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import fmean
from typing import Any, Literal, Mapping, Sequence

from pydantic import BaseModel, Field

MAX_ID_CHARS = 40


class SetAside(BaseModel):
    attempt: int = Field(description="An attempt of the same run that recorded this metric and is not cited.")
    reason: str = Field(min_length=1, description="Why it does not count (a bug fixed since, a smoke test).")


class Claim(BaseModel):
    id: str = Field(pattern=r"^[A-Za-z][\w.-]*$", max_length=MAX_ID_CHARS,
                    description="Short id, unique in the session: K1, K2, … (a later claim with the same id replaces it).")
    statement: str = Field(min_length=1, description="The finding, in one sentence.")
    metric: str = Field(min_length=1, description="The metric's name, as the attempts' metrics files record it.")
    attempts: list[int] = Field(min_length=1, description="The attempts (#n) whose records hold the value.")
    value: float = Field(description="The value the write-up states: the metric in those attempts' records (their "
                         "mean when several), rounded as you like to 2 significant digits or more, or as a percentage.")
    criterion: str | None = Field(default=None, description="The evaluation criterion it bears on (C1, …), if any.")
    baseline_attempts: list[int] = Field(default_factory=list, description="For a comparison: the baseline's "
                                         "attempts, which record the same metric.")
    direction: Literal["higher", "lower"] | None = Field(default=None, description="For a comparison: the claim's "
                                                         "value is higher or lower than the baseline's.")
    set_aside: list[SetAside] = Field(default_factory=list, description="Attempts of the same runs that recorded "
                                      "this metric and are not cited, each with the reason.")


class CriterionCheck(BaseModel):
    id: str = Field(description="The criterion's id (C1, …).")
    metric: str = Field(min_length=1, description="The metric that decides it, as the metrics files will name it.")
    comparison: Literal[">", ">=", "<", "<=", "between"]
    threshold: float = Field(description="The value compared with (the lower end for `between`).")
    upper: float | None = Field(default=None, description="`between` only: the upper end.")

    def holds(self, value: float) -> bool:
        if self.comparison == "between":
            return self.threshold <= value <= (self.upper if self.upper is not None else math.inf)
        return {">": value > self.threshold, ">=": value >= self.threshold,
                "<": value < self.threshold, "<=": value <= self.threshold}[self.comparison]

    def describe(self) -> str:
        if self.comparison == "between":
            return f"{self.metric} between {_num(self.threshold)} and {_num(self.upper)}"
        words = {">": "above", ">=": "at least", "<": "below", "<=": "at most"}[self.comparison]
        return f"{self.metric} {words} {_num(self.threshold)}"


def _num(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# -- what the record holds ---------------------------------------------------------------------


def measured(attempt: Any, metric: str, evidence: Any) -> float | None:
    """The metric as attempt's record holds it, when the attempt measured it (`evidence`:
    `labrun.evidence.Evidence`, which knows what counts as measured)."""
    value = evidence.measured(attempt).get(metric)
    return float(value) if number(value) else None


def held(stated: float, recorded: float) -> bool:
    """The stated value is the recorded one, rounded at the precision it is written with (2
    significant digits at least), or the same as a percentage."""
    for scale in (1.0, 100.0):
        target = recorded * scale
        if math.isclose(stated, target, rel_tol=1e-12):  # the value itself is no rounding (1.0, 0.5, 50)
            return True
        if target == 0:
            if stated == 0:
                return True
            continue
        places = _places(stated)
        if abs(stated - target) <= 0.5 * 10 ** -places + 1e-12 * abs(target) and _significant(target, places) >= 2:
            return True
    return False


def _places(value: float) -> int:
    """Decimal places of a number as JSON writes it (0.97 → 2, 1e-05 → 5, 12.0 → 0)."""
    text = repr(float(value)).lower()
    mantissa, _, exponent = text.partition("e")
    decimals = len(mantissa.partition(".")[2].rstrip("0"))
    return max(0, decimals - int(exponent or 0))


def _significant(target: float, places: int) -> int:
    """Significant digits that `places` decimals keep of `target`."""
    return int(math.floor(math.log10(abs(target)))) + 1 + places


# -- checking claims (`complete_phase`) -------------------------------------------------------


def claim_problems(claim: Claim, attempts: Sequence[Any], evidence: Any, criteria: Sequence[str]) -> list[str]:
    """What is wrong with a claim against the record, each a line the agent can act on."""
    by_n = {a.n: a for a in attempts}
    found: list[str] = []
    if claim.criterion is not None and claim.criterion not in criteria:
        found.append(f"claims: {claim.id} bears on {claim.criterion}, which is not one of the idea's evaluation "
                     f"criteria ({', '.join(criteria) or 'it has none'})")
    values = {}
    for n in dict.fromkeys([*claim.attempts, *claim.baseline_attempts]):
        attempt = by_n.get(n)
        if attempt is None:
            found.append(f"claims: {claim.id} cites #{n}, which is not an attempt of this branch")
        elif attempt.status != "SUCCESS":
            found.append(f"claims: {claim.id} cites #{n}, which is {attempt.status}: cite successful attempts")
        elif (value := measured(attempt, claim.metric, evidence)) is None:
            found.append(f"claims: {claim.id} cites #{n}, whose record holds no measured {claim.metric} "
                         f"({_what_it_holds(attempt, evidence)})")
        else:
            values[n] = value
    if found:
        return found
    value = fmean(values[n] for n in dict.fromkeys(claim.attempts))
    if not held(claim.value, value):
        found.append(f"claims: {claim.id} states {claim.metric} = {_num(claim.value)}, but the record holds "
                     f"{_num(value)} ({_from(claim.attempts)}): state that value, rounded to 2 significant digits "
                     "or more, or as a percentage")
    if claim.baseline_attempts:
        baseline = fmean(values[n] for n in dict.fromkeys(claim.baseline_attempts))
        if claim.direction == "higher" and not value > baseline or claim.direction == "lower" and not value < baseline:
            found.append(f"claims: {claim.id} says its {claim.metric} is {claim.direction} than the baseline's, but the "
                         f"record holds {_num(value)} against {_num(baseline)} ({_from(claim.baseline_attempts)}): "
                         "state the comparison the numbers show")
    cited = {*claim.attempts, *claim.baseline_attempts, *(s.attempt for s in claim.set_aside)}
    for group in (claim.attempts, claim.baseline_attempts):
        runs = {by_n[n].run_id for n in group if by_n[n].run_id}
        left = [a.n for a in attempts if a.run_id in runs and a.n not in cited and a.status == "SUCCESS"
                and measured(a, claim.metric, evidence) is not None]
        if left:
            found.append(f"claims: {claim.id} cites run {', '.join(sorted(runs))}, whose attempts "
                         f"{', '.join(f'#{n}' for n in left)} also measured {claim.metric}: cite them too (the value "
                         "is then the mean of all) or give each in set_aside with the reason it does not count")
    return found


def _what_it_holds(attempt: Any, evidence: Any) -> str:
    if not attempt.metrics:
        return "it recorded no metrics"
    if not evidence.measured(attempt):
        return f"its metrics are not evidence: {getattr(attempt, 'unmeasured', None) or 'it ran no workspace code'}"
    names = [k for k, v in evidence.measured(attempt).items() if number(v)]
    return f"it measured: {', '.join(names[:12])}" if names else "it measured no number"


def _from(ns: Sequence[int]) -> str:
    ns = list(dict.fromkeys(ns))
    return f"attempt #{ns[0]}" if len(ns) == 1 else "mean of " + ", ".join(f"#{n}" for n in ns)


# -- standing and verdicts (after reproduction and the sealed evaluation) ---------------------


@dataclass(frozen=True)
class Standing:
    """A claim as the engine vouches for it."""

    claim: Claim
    value: float | None
    """The record's value (the mean over its attempts)."""
    baseline: float | None
    reproduced: str
    """`reproduced`, `diverged`, `not rerun` (with why)."""
    sealed: float | None
    """The sealed score of the same name, when there is one."""
    contradicted: bool
    """The sealed score differs beyond tolerance."""
    code_changed: tuple[str, ...] = ()

    @property
    def confirmed(self) -> bool:
        return not self.contradicted and not self.reproduced.startswith("diverged")

    @property
    def status(self) -> str:
        if self.contradicted:
            return "contradicted by the sealed evaluation"
        if self.reproduced.startswith("diverged"):
            return "unconfirmed: the rerun diverged"
        return self.reproduced


def standing(claim: Claim, attempts: Mapping[int, Any], sealed: Mapping[str, Any], tolerance: float,
             changed: Mapping[int, Sequence[str]] | None = None) -> Standing:
    """`attempts`: the session's, by number; `sealed`: the sealed evaluation's scores (none
    when it did not score); `tolerance`: the relative difference a sealed score allows;
    `changed`: attempt → the source files it started from that the workspace no longer holds
    as they were."""
    def mean(ns: Sequence[int]) -> float | None:
        values = [float(v) for n in dict.fromkeys(ns) if n in attempts and number(v := attempts[n].metrics.get(claim.metric))]
        return fmean(values) if values else None

    behind = [attempts[n] for n in dict.fromkeys([*claim.attempts, *claim.baseline_attempts]) if n in attempts]
    reruns = [a.reproduction for a in behind]
    if any(r is not None and r.status == "DIVERGED" for r in reruns):
        reproduced = "diverged: " + "; ".join(f"#{a.n} {a.reproduction.detail}" for a in behind
                                              if a.reproduction and a.reproduction.status == "DIVERGED")
    elif reruns and all(r is not None and r.status == "REPRODUCED" for r in reruns):
        reproduced = "reproduced"
    else:
        why = next((r.detail for r in reruns if r is not None and r.status == "SKIPPED"), "")
        reproduced = "not rerun" + (f" ({why})" if why else "")
    value = mean(claim.attempts)
    score = sealed.get(claim.metric)
    score = float(score) if number(score) else None
    contradicted = score is not None and value is not None and not math.isclose(value, score, rel_tol=tolerance,
                                                                                   abs_tol=1e-12)
    gone = tuple(dict.fromkeys(f for a in behind for f in (changed or {}).get(a.n, ())))
    return Standing(claim, value, mean(claim.baseline_attempts) if claim.baseline_attempts else None, reproduced,
                    score, contradicted, gone)


@dataclass(frozen=True)
class Verdict:
    criterion: Any
    """`labrun.plan.Criterion`."""
    verdict: str
    """met, unmet, unconfirmed, or not judged."""
    by: str
    """`engine`, `engine, from the sealed evaluation`, or `agent`."""
    basis: str
    claims: tuple[str, ...]


def verdict(criterion: Any, check: CriterionCheck | None, standings: Sequence[Standing],
            sealed: Mapping[str, Any]) -> Verdict:
    """The criterion's verdict: the engine's where a check is planned, else the agent's; a
    claim behind it that diverged or that the sealed score contradicts leaves it unconfirmed."""
    mine = [s for s in standings if s.claim.criterion == criterion.id]
    ids = tuple(s.claim.id for s in mine)
    if check is not None:
        score = sealed.get(check.metric)
        if number(score):
            met = check.holds(float(score))
            return Verdict(criterion, "met" if met else "unmet", "engine, from the sealed evaluation",
                           f"{check.describe()}: the sealed score is {_num(float(score))}", ids)
        on = [s for s in mine if s.claim.metric == check.metric and s.value is not None]
        if not on:
            return Verdict(criterion, "unmet", "engine", f"{check.describe()}: no claim gives {check.metric}", ids)
        value = fmean(s.value for s in on)
        met = check.holds(value)
        basis = f"{check.describe()}: {_num(value)}"
        if met and not all(s.confirmed for s in on):
            return Verdict(criterion, "unconfirmed", "engine", basis + ", " + "; ".join(s.status for s in on
                                                                                      if not s.confirmed), ids)
        return Verdict(criterion, "met" if met else "unmet", "engine", basis, ids)
    if criterion.status is None:
        return Verdict(criterion, "not judged", "agent", "", ids)
    if criterion.status == "met" and not all(s.confirmed for s in mine):
        return Verdict(criterion, "unconfirmed", "agent", "the agent's judgement; " +
                       "; ".join(f"{s.claim.id} {s.status}" for s in mine if not s.confirmed), ids)
    return Verdict(criterion, criterion.status, "agent", "the agent's judgement: " + (criterion.note or ""), ids)

