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
the sealed score, where it scores what their attempts made); other criteria keep the agent's
verdict, shown as its judgement. Reproduction and the sealed evaluation then confirm, leave unconfirmed
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
                    description="Short id, unique in the session: K1, K2, … (the phase's later claim with the same id "
                    "replaces it).")
    statement: str = Field(min_length=1, description="The finding, in one sentence.")
    metric: str = Field(min_length=1, description="The metric's name, as the attempts' metrics files record it.")
    attempts: list[int] = Field(min_length=1, description="The attempts (#n) whose records hold the value.")
    value: float | str = Field(description="The value the write-up states: the metric in those attempts' records "
                               "(their mean when several), rounded as you like to 2 significant digits or more, or as "
                               "a percentage; as text (\"0.90\", \"89.8%\") it keeps the precision it is written with.")
    criterion: str | None = Field(default=None, description="The evaluation criterion it bears on (C1, …), if any.")
    baseline_attempts: list[int] = Field(default_factory=list, description="For a comparison: the baseline's "
                                         "attempts (the same ones when one attempt measured both).")
    baseline_metric: str | None = Field(default=None, description="For a comparison: the baseline's metric, when "
                                        "its name differs (`centroid.accuracy` against `knn.accuracy`).")
    direction: Literal["higher", "lower"] | None = Field(default=None, description="For a comparison: the claim's "
                                                         "value (the method's own number, not the difference) is "
                                                         "higher or lower than the baseline's.")
    set_aside: list[SetAside] = Field(default_factory=list, description="Attempts of the same runs that recorded "
                                      "this metric and are not cited, each with the reason.")

    @property
    def compared_metric(self) -> str:
        return self.baseline_metric or self.metric


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


def held(stated: float | str, recorded: float) -> bool:
    """The stated value is the recorded one, rounded at the precision it is written with (2
    significant digits at least), or the same as a percentage (a text ending in % is one)."""
    value, places, percent = written(stated)
    for scale in ((100.0,) if percent else (1.0, 100.0, 0.01)):
        target = recorded * scale
        if math.isclose(value, target, rel_tol=1e-9, abs_tol=1e-15):
            return True  # as the record holds it, however few its digits
        if target == 0:
            continue
        if abs(value - target) <= 0.5 * 10 ** -places + 1e-12 * abs(target) and _significant(target, places) >= 2:
            return True
        # a number's trailing zeros are lost in JSON: 0.90 arrives as 0.9, held by 0.8988 at 2 digits
        two = 1 - int(math.floor(math.log10(abs(target))))
        if places < two and math.isclose(value, round(target, two), rel_tol=1e-9, abs_tol=1e-15):
            return True
    return False


def written(value: float | str) -> tuple[float, int, bool]:
    """(number, decimal places, a percentage): a JSON number's places as Python writes it
    (0.97 → 2, 1e-05 → 5, 12.0 → 0: a trailing zero is lost), a text's as written ("0.90" → 2)."""
    text = value.strip().replace("\u2212", "-") if isinstance(value, str) else repr(float(value))
    percent = text.endswith("%")
    mantissa, _, exponent = text.rstrip("%").strip().lower().partition("e")
    try:
        parsed = float(text.rstrip("%"))
    except ValueError:
        raise ValueError(f"value {value!r} is not a number") from None
    decimals = len(mantissa.partition(".")[2]) if isinstance(value, str) else len(mantissa.partition(".")[2].rstrip("0"))
    return parsed, max(0, decimals - int(exponent or 0)), percent


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
    values: dict[tuple[int, str], float] = {}
    wanted = [(n, claim.metric) for n in claim.attempts] + [(n, claim.compared_metric) for n in claim.baseline_attempts]
    for n, metric in dict.fromkeys(wanted):
        attempt = by_n.get(n)
        if attempt is None:
            found.append(f"claims: {claim.id} cites #{n}, which is not an attempt of this branch")
        elif attempt.status != "SUCCESS":
            found.append(f"claims: {claim.id} cites #{n}, which is {attempt.status}: cite successful attempts")
        elif (value := measured(attempt, metric, evidence)) is None:
            found.append(f"claims: {claim.id} cites #{n}, whose record holds no measured {metric} "
                         f"({_what_it_holds(attempt, metric, evidence)}; a nested key is named with dots, `a.b`)")
        else:
            values[n, metric] = value
    if found:
        return found
    value = fmean(values[n, claim.metric] for n in dict.fromkeys(claim.attempts))
    try:
        stated = held(claim.value, value)
    except ValueError as e:
        return [f"claims: {claim.id}: {e}; give it as a number, or as text such as \"0.90\" or \"89.8%\""]
    if not stated:
        found.append(f"claims: {claim.id} states {claim.metric} = {_num(claim.value)}, but the record holds "
                     f"{_num(value)} ({_from(claim.attempts)}): state that value (the method's own, not a difference), "
                     "rounded to 2 significant digits or more, or as a percentage; as text (\"0.90\") it keeps its "
                     "trailing zeros")
    if claim.baseline_attempts:
        baseline = fmean(values[n, claim.compared_metric] for n in dict.fromkeys(claim.baseline_attempts))
        if claim.direction == "higher" and not value > baseline or claim.direction == "lower" and not value < baseline:
            found.append(f"claims: {claim.id} says its {claim.metric} is {claim.direction} than the baseline's "
                         f"{claim.compared_metric}, but the "
                         f"record holds {_num(value)} against {_num(baseline)} ({_from(claim.baseline_attempts)}): "
                         "state the comparison the numbers show")
    cited = {*claim.attempts, *claim.baseline_attempts, *(s.attempt for s in claim.set_aside)}
    for group, metric in ((claim.attempts, claim.metric), (claim.baseline_attempts, claim.compared_metric)):
        # every measurement of the same thing counts, not the one picked: the same runs' attempts,
        # and those of the same phases that named no run
        runs = {by_n[n].run_id for n in group if by_n[n].run_id}
        phases = {by_n[n].phase for n in group}
        left = [a.n for a in attempts if (a.run_id in runs or a.run_id is None and a.phase in phases)
                and a.n not in cited and a.status == "SUCCESS" and measured(a, metric, evidence) is not None]
        if left:
            what = f"run {', '.join(sorted(runs))}" if runs else "attempts that name no run"
            found.append(f"claims: {claim.id} cites {what}, and attempts "
                         f"{', '.join(f'#{n}' for n in left)} also measured {metric}: cite them too (the value "
                         "is then the mean of all) or give each in set_aside with the reason it does not count "
                         "(a smoke test, a bug fixed since)")
    return found


def _what_it_holds(attempt: Any, metric: str, evidence: Any) -> str:
    if not attempt.metrics:
        return "it recorded no metrics"
    if attempt.unmeasured:
        return f"its metrics are not evidence: {attempt.unmeasured}"
    if metric in attempt.echoed:
        return f"the value of {metric} is written in {attempt.echoed[metric]}, not computed"
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
    scored: str = ""
    """The sealed scores, when they score what this claim's attempts made (shown beside a
    claim of another name: the agent names its metrics)."""
    beside: str = ""
    """What ran beside one of its attempts (`Attempt.beside`), when one did: then only a rerun
    that reproduced it vouches for it."""

    @property
    def confirmed(self) -> bool:
        return not self.contradicted and not self.reproduced.startswith("diverged") \
            and not (self.beside and self.reproduced != "reproduced")

    @property
    def status(self) -> str:
        if self.contradicted:
            return "contradicted by the sealed evaluation"
        if self.reproduced.startswith("diverged"):
            return "unconfirmed: the rerun diverged"
        if self.beside and self.reproduced != "reproduced":
            return f"unconfirmed: {self.reproduced}, and {self.beside}, which could have written its files"
        return self.reproduced


def standing(claim: Claim, attempts: Mapping[int, Any], sealed: Mapping[str, Any], tolerance: float,
             rerun_tolerance: float, changed: Mapping[int, Sequence[str]] | None = None) -> Standing:
    """`attempts`: the session's, by number; `sealed`: the sealed evaluation's scores, when
    they score what this claim's attempts made (else none); `tolerance`: the relative
    difference a sealed score allows; `rerun_tolerance`: a rerun's (`reproduce_tolerance`);
    `changed`: attempt → the source files it started from that the workspace no longer holds
    as they were."""
    def mean(ns: Sequence[int], metric: str) -> float | None:
        values = [float(v) for n in dict.fromkeys(ns) if n in attempts and number(v := attempts[n].metrics.get(metric))]
        return fmean(values) if values else None

    behind = [(attempts[n], m) for n, m in dict.fromkeys([*((n, claim.metric) for n in claim.attempts),
                                                          *((n, claim.compared_metric) for n in claim.baseline_attempts)])
              if n in attempts]
    diverged, skipped, rerun = [], [], 0
    for a, metric in behind:  # the rerun judged on the claim's own metric: a run time that differs is no matter
        r = a.reproduction
        if r is None or r.status == "SKIPPED":
            skipped += [r.detail] if r else []
            continue
        rerun += 1
        was, again = a.metrics.get(metric), r.metrics.get(metric)
        if not (number(was) and number(again) and math.isclose(was, again, rel_tol=rerun_tolerance, abs_tol=1e-12)):
            diverged.append(f"#{a.n} {metric} {_num(was)} then {_num(again)}" if number(again) else f"#{a.n} {r.detail}")
    if diverged:
        reproduced = "diverged: " + "; ".join(diverged)
    elif behind and rerun == len(behind):
        reproduced = "reproduced"
    else:
        reproduced = "not rerun" + (f" ({skipped[0]})" if skipped else "")
    value = mean(claim.attempts, claim.metric)
    same = [v for k, v in sealed.items() if _name(k) == _name(claim.metric) and number(v)]
    score = float(same[0]) if same else None
    contradicted = score is not None and value is not None and not math.isclose(value, score, rel_tol=tolerance,
                                                                                   abs_tol=1e-12)
    gone = tuple(dict.fromkeys(f for a, _ in behind for f in (changed or {}).get(a.n, ())))
    baseline = mean(claim.baseline_attempts, claim.compared_metric) if claim.baseline_attempts else None
    scored = ", ".join(f"{k}={_num(v)}" for k, v in sealed.items())
    beside = "; ".join(f"#{a.n} ran beside {', '.join(a.beside)}" for a, _ in behind if getattr(a, "beside", None))
    return Standing(claim, value, baseline, reproduced, score, contradicted, gone, scored, beside)


def _name(metric: str) -> str:
    """A metric's name as the sealed score is matched to it: `Accuracy`, `accuracy_` and
    `ACCURACY` are one."""
    return "".join(c for c in metric.lower() if c.isalnum())


ENGINE = "engine, by the check planning gave"
"""Who decides a checked criterion: the engine, but by a threshold the agent chose in planning."""


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
            sealed: float | None = None) -> Verdict:
    """The criterion's verdict: the engine's where a check is planned (from the sealed score
    when one scores what its claims' attempts made, or `sealed`, the score the idea says
    decides it), else the agent's; a claim behind it that diverged or that the sealed score
    contradicts leaves it unconfirmed."""
    mine = [s for s in standings if s.claim.criterion == criterion.id]
    ids = tuple(s.claim.id for s in mine)
    if check is not None:
        on = [s for s in mine if s.claim.metric == check.metric and s.value is not None]
        if scored := [x for x in (sealed, *(s.sealed for s in on)) if x is not None]:
            met = check.holds(scored[0])
            return Verdict(criterion, "met" if met else "unmet", "engine, by the sealed score",
                           f"{check.describe()}: the sealed score is {_num(scored[0])}", ids)
        if not on:
            return Verdict(criterion, "unmet", ENGINE, f"{check.describe()}: no claim gives {check.metric}", ids)
        # every claim must hold (the worst of them decides): a mean of two could pass where neither does
        met = all(check.holds(s.value) for s in on)  # type: ignore[arg-type]  # `on`: those with a value
        basis = f"{check.describe()}: " + ", ".join(f"{_num(s.value)} ({s.claim.id})" for s in on)
        if met and not all(s.confirmed for s in on):
            return Verdict(criterion, "unconfirmed", ENGINE, basis + "; " + "; ".join(s.status for s in on
                                                                                    if not s.confirmed), ids)
        return Verdict(criterion, "met" if met else "unmet", ENGINE, basis, ids)
    if criterion.status is None:
        return Verdict(criterion, "not judged", "agent", "", ids)
    if criterion.status == "met" and not all(s.confirmed for s in mine):
        return Verdict(criterion, "unconfirmed", "agent", "the agent's judgement; " +
                       "; ".join(f"{s.claim.id} {s.status}" for s in mine if not s.confirmed), ids)
    return Verdict(criterion, criterion.status, "agent", "the agent's judgement: " + (criterion.note or ""), ids)

