"""The parts a phase's completion rule is made of.

Each part says what it still misses in the session's work so far (`Work`) and describes
itself in words for the prompts. A phase needing something new declares a new part here
(or in its own module): the tools and the turn loop only ever ask `phase.missing(work)`.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import stat
import tokenize
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar, Mapping, Protocol, Sequence

import yaml

from labrun import latex, toollog
from labrun.crashpoints import crashpoint
from labrun.claims import Claim, claim_problems, standing, verdict
from labrun.evidence import ENGINE_BLOCK, Evidence
from labrun.plan import Plan, coverage, normal_path, output_exists, seeds_asked
from labrun.workspace import Workspace
from labrun.wsfs import Beneath, Refused

"""The session's copy of its idea, in the workspace."""

PROSE = (".md", ".txt", ".rst")
"""Planned outputs the agent may write itself (a summary); any other holds what an attempt computed."""

HONEST_EFFORT = 3
"""Attempts of the experiments phase that did not succeed before it may close as a negative
outcome."""


@dataclass(frozen=True)
class Work:
    """What a phase has to show for itself when it asks to complete."""

    root: Path
    sections: dict[str, str]
    """STATE sections given so far, this call's included."""
    attempts: Sequence[Any]
    """The session's experiment attempts (`labrun.state.Attempt`)."""
    phase: str = ""
    """The key of the phase asking."""
    log: Path | None = None
    """The phase's folder of journals: its tool log."""
    plan: Plan = field(default_factory=Plan)
    """The session's plan with this call's parts applied (`labrun.plan`)."""
    given: Mapping[str, Any] = field(default_factory=dict)
    """The structured parts of this `complete_phase` call (run_list, deviations, …)."""
    code_references: tuple[str, ...] = ()
    """The repositories the idea's `background.code_references` name."""
    files: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    """Attempt n → the files it found and wrote (`AttemptRecords.files`)."""
    network: bool = True
    """The agent's commands have the network (off: `--no-network`, `constraints.network: false`)."""

    def own_attempts(self) -> list[Any]:
        return [a for a in self.attempts if a.phase == self.phase]

    def idea_text(self) -> str:
        return self.text_of(Workspace(self.root).idea_copy) or ""

    @cached_property
    def fs(self) -> Beneath:
        """The workspace, read without following the agent's links (`labrun.wsfs`)."""
        return Beneath(self.root)

    def text_of(self, path: str | Path) -> str | None:
        """The text of the workspace's file `path`, or None when there is none (or only a
        link to one)."""
        try:
            return self.fs.read_text(path, errors="replace")
        except (OSError, Refused):
            return None

    @cached_property
    def evidence(self) -> Evidence:
        """Built once per completion check (it reads the idea), however many rules ask."""
        runs = "\n".join(f"{r.purpose}\n{r.conditions}\n{r.seeds}" for r in self.plan.runs)
        return Evidence(self.root, self.attempts, self.files, (self.idea_text(), runs))


class Rule(Protocol):
    fields: ClassVar[tuple[str, ...]]
    """The structured parts of `complete_phase` this part reads (none for most); a phase
    takes only the parts its rule reads."""

    def missing(self, work: Work) -> list[str]: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class Files:
    """Workspace files that must exist."""

    paths: tuple[str, ...]
    fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *paths: str):
        object.__setattr__(self, "paths", paths)

    def missing(self, work: Work) -> list[str]:
        return [f"file {p}" for p in self.paths if not work.fs.is_file(p)]

    def describe(self) -> str:
        return " and ".join(f"`{p}` exists" for p in self.paths)


@dataclass(frozen=True)
class Outline:
    """A Markdown file holds each heading of its outline, each with something under it."""

    path: str
    headings: tuple[str, ...]
    fields: ClassVar[tuple[str, ...]] = ()
    MIN_WORDS: ClassVar[int] = 5

    def missing(self, work: Work) -> list[str]:
        text = work.text_of(self.path)
        if text is None:
            return []  # `Files` says so
        parts = re.split(r"^#{1,6}[ \t]+(.*)$", text, flags=re.M)
        found = {_heading_key(h): _words(body) for h, body in zip(parts[1::2], parts[2::2])}
        lacking = [h for h in self.headings if found.get(_heading_key(h), 0) < self.MIN_WORDS]
        if not lacking:
            return []
        return [f"{self.path}: the section{'s' * (len(lacking) > 1)} {'; '.join(lacking)}, each a heading "
                "with its content under it"]

    def describe(self) -> str:
        return f"`{self.path}` has a section under each heading of its outline"


def _words(text: str) -> int:
    return len(re.findall(r"\w+", text))


def _heading_key(heading: str) -> str:
    """A heading as the outline rule compares it: its words, without numbering or case."""
    return " ".join(re.findall(r"[a-z]+", heading.lower().split(":")[0]))


@dataclass(frozen=True)
class Sections:
    """STATE.md sections that `complete_phase` must give, key → title."""

    titles: dict[str, str]
    fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **titles: str):
        object.__setattr__(self, "titles", titles)

    def __hash__(self) -> int:
        return hash(tuple(self.titles.items()))

    MIN_WORDS: ClassVar[int] = 3

    def missing(self, work: Work) -> list[str]:
        found = []
        for k in self.titles:
            given = (work.sections.get(k) or "").strip()
            words = _words(given)
            if not given:
                found.append(f"section {k}")
            elif words < self.MIN_WORDS:
                found.append(f"section {k} with what it must say ({words} word{'s' * (words != 1)} given)")
        return found

    def describe(self) -> str:
        return " and ".join(f"the section `{k}` is given" for k in self.titles)


@dataclass(frozen=True)
class SuccessfulAttempt:
    """At least one experiment attempt succeeded."""

    fields: ClassVar[tuple[str, ...]] = ()

    def missing(self, work: Work) -> list[str]:
        if any(a.status == "SUCCESS" for a in work.attempts):
            return []
        return ["a run_experiment attempt with status SUCCESS"]

    def describe(self) -> str:
        return "at least one `run_experiment` attempt has succeeded"


@dataclass(frozen=True)
class CitesFetchedSource:
    """The files cite at least one source that a tool really fetched in this phase (its tool
    log shows the fetch), or the section states why the network gave nothing: after fetches
    that failed (in the tool log too), or with the network off."""

    files: tuple[str, ...]
    section: str
    fields: ClassVar[tuple[str, ...]] = ()
    MARKER: ClassVar[str] = "No source could be fetched:"

    def missing(self, work: Work) -> list[str]:
        texts = [t for f in self.files if (t := work.text_of(f)) is not None]
        cited = set().union(*(toollog.cited(t) for t in texts))
        if work.log is not None and cited & toollog.fetched(work.log, work.own_attempts()):
            return []
        reason = (work.sections.get(self.section) or "").partition(self.MARKER)[2]
        if len(reason.strip()) >= 15:
            if not work.network or (work.log is not None and toollog.failed(work.log, work.own_attempts())):
                return []
            return [f"`{self.MARKER}` stands only after fetches that failed, and this phase's tool log shows "
                    "none while the network is on: fetch the sources first (the idea's references, a search's "
                    f"results), then cite in {' or '.join(self.files)} what came"]
        return [f"a source cited in {' or '.join(self.files)} that a tool fetched in this phase "
                f"(cited: {len(cited)}, none of them fetched), or a line `{self.MARKER} <why>` "
                f"in the section {self.section} after fetches that failed"]

    def describe(self) -> str:
        files = " or ".join(f"`{f}`" for f in self.files)
        return (f"{files} cites at least one source (its URL, `arXiv:` id or `doi:`) that a tool "
                f"fetched in this phase, or, after fetches that failed or with the network off, the "
                f"section `{self.section}` has a line `{self.MARKER} <why>`")


@dataclass(frozen=True)
class LatexPaper:
    """A LaTeX paper whose inputs, figures and citations all resolve, with no placeholder."""

    main: str
    bib: str
    fields: ClassVar[tuple[str, ...]] = ()

    def missing(self, work: Work) -> list[str]:
        tex = lambda path: latex.uncommented(work.text_of(path) or "")  # noqa: E731
        if not work.fs.is_file(self.main):
            return []  # `Files` says so
        folder = os.path.dirname(self.main)
        problems = []
        if "\\begin{document}" not in tex(self.main):
            problems.append(f"{self.main} has no \\begin{{document}}")
        sources, queue = [self.main], [self.main]
        while queue:  # the files \input, as TeX finds them from the main file's folder
            for name in latex.inputs(tex(queue.pop(0))):
                path = os.path.normpath(os.path.join(folder, name if name.endswith(".tex") else f"{name}.tex"))
                if path.startswith("..") or not work.fs.is_file(path) or not tex(path).strip():
                    problems.append(f"{path} (\\input by the paper) is missing or empty")
                elif path not in sources and len(sources) < 200:
                    sources.append(path)
                    queue.append(path)
        used = "".join(tex(p) for p in sources)
        for name in latex.graphics(used):
            if not any(work.fs.is_file(os.path.normpath(os.path.join(folder, f"{name}{ext}")))
                       for ext in ("", ".pdf", ".png", ".jpg")):
                problems.append(f"figure {name} (in \\includegraphics) is not there")
        known = latex.bib_keys(work.text_of(self.bib) or "")
        unknown = sorted(latex.cite_keys(used) - known)
        if unknown:
            problems.append(f"citation keys not in {self.bib}: {', '.join(unknown[:8])}")
        if "TODO" in used:
            problems.append("a TODO left in the paper's text")
        return problems

    def describe(self) -> str:
        return (f"`{self.main}` is a whole document whose `\\input` files, figures and "
                f"`\\cite` keys (in `{self.bib}`) all exist, with no TODO left")


@dataclass(frozen=True)
class Compiled:
    """With TeX installed here: a `latexmk` attempt of this phase succeeded after the last
    edit of the paper's sources. Without TeX: the section says the paper was not compiled."""

    main: str
    section: str
    fields: ClassVar[tuple[str, ...]] = ()

    def missing(self, work: Work) -> list[str]:
        if latex.toolchain() is None:
            if "not compiled" in (work.sections.get(self.section) or "").lower():
                return []
            return [f"the section {self.section} saying the paper was not compiled (no TeX is installed here)"]
        pdf = str(Path(self.main).with_suffix(".pdf"))
        runs = [a for a in work.own_attempts() if "latexmk" in a.command]
        if not runs or runs[-1].status != "SUCCESS":
            return [f"a successful `latexmk` run of {self.main} through run_experiment"]
        edited = max((st.st_mtime for f, st in work.fs.files(os.path.dirname(self.main))
                      if Path(f).suffix in (".tex", ".bib", ".sty", ".cls")), default=0)
        try:
            made = work.fs.lstat(pdf) if work.fs.is_file(pdf) else None
        except Refused:
            made = None
        if made is None or made.st_mtime < edited:
            return [f"{Path(pdf).name} compiled after the last edit of the paper's sources (compile again)"]
        return []

    def describe(self) -> str:
        if latex.toolchain() is None:
            return (f"the section `{self.section}` says the paper was not compiled (no TeX is "
                    "installed here)")
        return (f"the last `latexmk` run of `{self.main}` through `run_experiment` succeeded, "
                "after the paper's last edit")


def sealed_criteria(idea_text: str) -> list[str]:
    """The criteria the idea's sealed evaluation decides (its copy in the workspace names them)."""
    try:
        idea = yaml.safe_load(idea_text) or {}
        return list(((idea.get("idea") or idea).get("sealed_evaluation") or {}).get("criteria") or ())
    except (yaml.YAMLError, AttributeError):
        return []


def _clip(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _unknown_verdicts(work: Work) -> list[str]:
    known = work.plan.criterion_ids()
    return [f"criteria: {v.id} is not one of the idea's evaluation criteria ({', '.join(known) or 'it has none'})"
            for v in _given(work, "criteria") if v.id not in known]


def _given(work: Work, name: str) -> list[Any]:
    from labrun.plan import CriterionVerdict, Deviation

    kind = {"criteria": CriterionVerdict, "deviations": Deviation}[name]
    return [kind.model_validate(x) for x in work.given.get(name) or ()]


@dataclass(frozen=True)
class RunList:
    """Planning's run list: runs with unique ids, each naming the evaluation criteria it
    serves; every criterion served by a run or stated unmet with the reason; and the files
    the analysis must produce."""

    fields: ClassVar[tuple[str, ...]] = ("run_list", "analysis_outputs", "criteria", "criterion_checks")

    def missing(self, work: Work) -> list[str]:
        plan, found = work.plan, _unknown_verdicts(work)
        if not plan.runs:
            found.append("a run_list (each run with its id, purpose, conditions, seeds and the criteria it serves)")
        ids = plan.run_ids()
        found += [f"run_list: the id {i} is given twice; ids must be unique" for i in sorted(set(ids)) if ids.count(i) > 1]
        known = plan.criterion_ids()
        for run in plan.runs:
            found += [f"run_list: run {run.id} serves {c}, which is not one of the idea's evaluation criteria "
                      f"({', '.join(known) or 'it has none'})" for c in run.criteria if c not in known]
        found += [f"criteria: {v.id} cannot be met before anything has run; in planning give only the unmet ones"
                  for v in _given(work, "criteria") if v.status == "met"]
        checked = [c.id for c in plan.checks]
        found += [f"criterion_checks: {i} is not one of the idea's evaluation criteria ({', '.join(known) or 'it has none'})"
                  for i in checked if i not in known]
        found += [f"criterion_checks: {i} is given twice" for i in sorted(set(checked)) if checked.count(i) > 1]
        found += [f"criterion_checks: {c.id} compares `between` and needs `upper`, above its threshold"
                  for c in plan.checks if c.comparison == "between" and (c.upper is None or c.upper < c.threshold)]
        found += [f"criterion_checks: {c} is decided by the sealed evaluation (the idea says so): give its check, "
                  "on the score the scorer reports" for c in sealed_criteria(work.idea_text()) if plan.check(c) is None]
        for c in plan.criteria:
            if c.status != "unmet" and not any(c.id in r.criteria for r in plan.runs):
                found.append(f"criterion {c.id} (\"{_clip(c.text)}\") served by a run of the run_list, "
                             "or given in criteria as unmet with the reason")
        asked = seeds_asked(work.idea_text())
        if asked and plan.runs and max(len(set(r.seeds)) for r in plan.runs) < asked:
            most = max(len(set(r.seeds)) for r in plan.runs)
            found.append(f"run_list: the idea asks for {asked} seeds and no run names that many (the most is "
                         f"{most}); list in seeds every seed a run repeats over")
        if not plan.outputs:
            found.append("analysis_outputs (the figures and the summary file the analysis must produce)")
        found += [f"analysis_outputs: {p} must be a path inside the workspace" for p in plan.outputs
                  if p.startswith("/") or ".." in Path(p).parts]
        return found

    def describe(self) -> str:
        return ("the `run_list` is given (every run with its id, purpose, conditions, seeds and the "
                "evaluation criteria it serves; each criterion served by a run or stated unmet) with "
                "the `analysis_outputs`, and any `criterion_checks` name known criteria")


@dataclass(frozen=True)
class PlannedRunsDone:
    """Every planned run has a SUCCESS attempt that names it, or a deviation with its reason;
    or, after an honest effort, the phase closes as a documented negative outcome. Without a
    run list (a session planned before run lists), one SUCCESS attempt."""

    fields: ClassVar[tuple[str, ...]] = ("deviations", "negative_outcome")
    honest_effort: int = HONEST_EFFORT

    def missing(self, work: Work) -> list[str]:
        plan = work.plan
        ids = plan.run_ids()
        found = [f"deviations: {d.id} is not a run of the run list ({', '.join(ids) or 'it is empty'})"
                 for d in _given(work, "deviations") if d.id not in ids]
        if plan.negative_outcome:
            # the primary run's success is a result, not a failure; another run's is one to hand over
            runs = coverage(plan, work.attempts)
            cited = {n for c in plan.claims for n in (*c.attempts, *c.baseline_attempts)}
            for i, r in enumerate(runs):
                tried = ', '.join(f'#{n}' for n in r.succeeded)
                if r.state == "done" and i == 0:
                    found.append(f"negative_outcome: run {r.run.id}, the primary run, succeeded ({tried}); a result "
                                 "that does not support the hypothesis is a result: hand it over as claims, with the "
                                 "criteria it leaves unmet, instead of a negative outcome")
                elif r.state == "done" and not cited & set(r.succeeded):
                    found.append(f"claims: run {r.run.id} succeeded ({tried}) beside the negative outcome: hand its "
                                 "result over as a claim")
            return found + self.honest_effort_missing(work)
        if not plan.runs:
            if not any(a.status == "SUCCESS" for a in work.attempts):
                found.append("a run_experiment attempt with status SUCCESS")
            return found
        runs = coverage(plan, work.attempts)
        for run in runs:
            if run.state == "open":
                found.append(f"run {run.run.id} (\"{_clip(run.run.purpose)}\"): a SUCCESS attempt with "
                             f"run_id {run.run.id}, or a deviation with the reason")
        if runs[0].state == "deviated":
            found.append(f"run {runs[0].run.id}, the primary run (the first of the run list), cannot be set aside: "
                         "a SUCCESS attempt of it, or a negative_outcome after an honest effort")
        elif not any(r.state == "done" for r in runs):
            found.append("a SUCCESS attempt of a planned run: with every run set aside nothing was measured "
                         "(or a negative_outcome after an honest effort)")
        return found

    def honest_effort_missing(self, work: Work) -> list[str]:
        """A negative outcome stands on failed attempts that tried different things: each
        with its fix, and between them different errors or changed sources."""
        tried = [a for a in work.own_attempts() if a.status in ("FAILED", "INTERRUPTED")]
        if len(tried) < self.honest_effort:
            return [f"an honest effort before a negative outcome: at least {self.honest_effort} failed attempts "
                    f"in this phase, each with its fix ({len(tried)} so far)"]
        unfixed = [a.n for a in tried[1:] if _words(a.fix_applied or "") < Sections.MIN_WORDS]
        errors = {failure_kind(a.error or "") for a in tried}
        wrote = {rel for a in tried for rel in (work.files.get(a.n) or {}).get("wrote") or ()}
        kept = Workspace(work.root).kept
        sources = {json.dumps(_sources(work.files.get(a.n) or {}, wrote, kept), sort_keys=True) for a in tried}
        problems = []
        if unfixed:
            problems.append(f"what was changed before attempt{'s' * (len(unfixed) > 1)} "
                            f"{', '.join(f'#{n}' for n in unfixed)}, in a few words of fix_applied")
        if len(errors) < 2 and len(sources) < 2:
            problems.append("failed attempts that tried different things: they all met the same error on the "
                            "same sources")
        return [f"an honest effort before a negative outcome: {p}" for p in problems]

    def describe(self) -> str:
        return ("every run of the run list has a `run_experiment` attempt with its `run_id` that "
                "succeeded, or a deviation with the reason, the first (primary) run always succeeding "
                f"(or, after at least {self.honest_effort} failed attempts that tried different "
                "fixes, the phase closes with a `negative_outcome`)")


def _sources(record: Mapping[str, Any], wrote: set[str], kept: Path) -> dict[str, str]:
    """The workspace as an attempt found it, without what the failed attempts wrote
    themselves (`wrote`): a source file as its code (`source_code`, read from its kept copy),
    any other by its digest."""
    found = {}
    for rel, digest in (record.get("before") or {}).items():
        if rel in wrote:
            continue
        try:
            text = Beneath(kept).read_bytes(digest, 2_000_000).decode()
        except (OSError, Refused, UnicodeDecodeError):
            text = None
        found[rel] = digest if text is None else hashlib.sha256(source_code(rel, text).encode()).hexdigest()
    return found


FAILURE_DETAILS = re.compile(
    r"(?:[\w.~-]*/)+[\w.-]+"  # paths
    r"|\b0x[0-9a-f]+\b|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{6,}\b"  # addresses, hex ids
    r"|\d+(?:\.\d+)?(?:e[-+]?\d+)?", re.I)  # numbers, durations, line numbers


def failure_kind(error: str) -> str:
    """An error without what differs between two runs of the same failure: paths, addresses,
    hex ids, numbers (line numbers, durations, sizes)."""
    return " ".join(FAILURE_DETAILS.sub("#", error).split())


C_LIKE = {".c", ".h", ".cc", ".cpp", ".hpp", ".cu", ".js", ".ts", ".java", ".rs", ".go", ".scala", ".kt", ".swift"}
HASH_COMMENTS = {".sh", ".bash", ".zsh", ".r", ".jl", ".pl", ".rb", ".yaml", ".yml", ".toml", ".cfg", ".ini", ""}


def source_code(rel: str, text: str) -> str:
    """A source file as code: without comments (Python's docstrings too), blank lines and
    indentation, so that two files that differ only there compare equal."""
    suffix = Path(rel).suffix.lower()
    if suffix == ".py":
        try:
            return _python_code(text)
        except (tokenize.TokenError, IndentationError, SyntaxError):
            suffix = ".sh"
    if suffix in C_LIKE:
        text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)
    elif suffix in HASH_COMMENTS:
        text = re.sub(r"(?:^|(?<=\s))#[^\n]*", "", text)
    elif suffix == ".tex":
        text = re.sub(r"(?<!\\)%[^\n]*", "", text)
    elif suffix == ".lean":
        text = re.sub(r"/-.*?-/|--[^\n]*", " ", text, flags=re.S)
    return "\n".join(" ".join(line.split()) for line in text.splitlines() if line.strip())


def _python_code(text: str) -> str:
    """Python's tokens without comments, blank lines, docstrings (a string that is a statement of
    its own) and the width of indentation."""
    kept: list[str] = []
    statement_start = True
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING):
            continue
        if tok.type in (tokenize.INDENT, tokenize.DEDENT):  # a block begins or ends, however wide
            kept.append(tokenize.tok_name[tok.type])
            continue
        if tok.type == tokenize.NEWLINE:
            kept += [] if statement_start else ["\n"]
            statement_start = True
            continue
        if tok.type == tokenize.STRING and statement_start:
            continue  # a docstring (or a string on a line of its own, which does nothing)
        statement_start = False
        kept.append(tok.string)
    return " ".join(kept)


@dataclass(frozen=True)
class CriteriaJudged:
    """Every evaluation criterion of the idea is met or unmet, with a note; met only when a
    run that serves it has a SUCCESS attempt and a claim bears on it; and where planning gave
    the criterion a check, the verdict is the one the claims' numbers give (`labrun.claims`)."""

    every: bool = True
    """Every criterion needs a verdict (experiments); else only those given are checked (analysis)."""
    fields: ClassVar[tuple[str, ...]] = ("criteria",)

    def missing(self, work: Work) -> list[str]:
        plan, found = work.plan, _unknown_verdicts(work)
        done = {r.run.id for r in coverage(plan, work.attempts) if r.state == "done"}
        attempts = {a.n: a for a in work.attempts}
        for c in plan.criteria:
            serving = [r.id for r in plan.runs if c.id in r.criteria]
            claims = [k for k in plan.claims if k.criterion == c.id]
            check = plan.check(c.id)
            if c.status is None:
                if check is None and self.every:  # a checked one the engine decides from the claims
                    found.append(f"a verdict on criterion {c.id} (\"{_clip(c.text)}\") in criteria: met or unmet, "
                                 "with a note")
            elif c.phase != work.phase:
                continue  # judged in an earlier phase; the engine's section shows how it stands now
            elif c.status == "met" and plan.runs and not done & set(serving):
                found.append(f"criteria: {c.id} is met only when a run that serves it "
                             f"({', '.join(serving) or 'none does'}) has a SUCCESS attempt; otherwise it is unmet")
            elif c.status == "met" and not claims:
                found.append(f"criteria: {c.id} is met only with a claim that bears on it (claims: {{criterion: "
                             f"\"{c.id}\", metric, attempts, value, …}}{f', giving {check.metric}' if check else ''}); "
                             "otherwise it is unmet")
            elif check is not None and claims:
                # met or unmet by the numbers alone (whether they reproduce is the engine's section's to show)
                engine = verdict(c, check, [standing(k, attempts, {}, 0, math.inf) for k in claims])
                if not any(k.metric == check.metric for k in claims):
                    if c.status == "met":
                        found.append(f"criteria: {c.id} has a planned check on {check.metric}, which no claim gives "
                                     f"yet: leave its verdict out, and the engine decides it once a claim gives "
                                     f"{check.metric} (here or in the analysis)")
                elif engine.verdict in ("met", "unmet") and engine.verdict != c.status:
                    found.append(f"criteria: {c.id} is {engine.verdict} by the planned check ({engine.basis}); "
                                 f"give that verdict, or leave it out and the engine gives it")
        return found

    def describe(self) -> str:
        if not self.every:
            return ("a criterion judged again in `criteria` is met only with a claim that bears on it, and a checked "
                    "one gets the verdict its claims' numbers give")
        return ("every evaluation criterion of the idea without a planned check is judged met or unmet in "
                "`criteria`, with a note; a met one has a successful attempt of a run that serves it and a claim that "
                "bears on it; the engine decides a checked criterion from its claims, and a verdict given for one "
                "must agree")


@dataclass(frozen=True)
class ClaimsHold:
    """Each claim given agrees with the record of the attempts it cites (`labrun.claims`);
    `required`: the phase hands over at least one (unless it closes as a negative outcome)."""

    required: bool = False
    fields: ClassVar[tuple[str, ...]] = ("claims",)

    def missing(self, work: Work) -> list[str]:
        given = [Claim.model_validate(c) for c in work.given.get("claims") or ()]
        ids = [c.id for c in given]
        found = [f"claims: the id {i} is given twice; ids must be unique" for i in sorted(set(ids)) if ids.count(i) > 1]
        earlier = {c.id: c.phase for c in work.plan.claims if c.phase != work.phase}
        found += [f"claims: {c.id} was given by the {earlier[c.id]} phase; give this one an id of its own (a claim "
                  "of an earlier phase stands as it was)" for c in given if c.id in earlier]
        for claim in given:
            crashpoint("claims")  # a kill while the engine checks a claim: the resumed phase calls again
            found += claim_problems(claim, work.attempts, work.evidence, work.plan.criterion_ids())
        if self.required and not work.plan.claims and not work.plan.negative_outcome:
            found.append("claims: the key results, each with the metric, the attempts (#n) whose records hold it "
                         "and the value you state for it")
        return found

    def describe(self) -> str:
        said = "the key results are handed over as `claims`, each" if self.required else "each claim given is"
        return (f"{said} checked against the records of the attempts it cites: the value is the metric they "
                "measured (their mean), a comparison is the one their numbers show, and every attempt of the same "
                "run that measured it is cited or set aside with a reason")


@dataclass(frozen=True)
class PlannedOutputs:
    """Each file the plan's `analysis_outputs` name exists (and is not empty), or a deviation
    says why not; one that is not prose holds what a computing attempt wrote
    (`Evidence.computed_file`)."""

    fields: ClassVar[tuple[str, ...]] = ("deviations",)

    def missing(self, work: Work) -> list[str]:
        plan = work.plan
        found = [f"deviations: {d.id} is not one of the planned analysis_outputs ({', '.join(plan.outputs) or 'none'})"
                 for d in _given(work, "deviations") if normal_path(d.id) not in plan.outputs]
        for p in plan.outputs:
            if plan.deviation(p) is not None:
                continue
            if not output_exists(work.root, p):
                found.append(f"file {p} (planned in analysis_outputs), or a deviation with the reason")
            elif Path(p).suffix.lower() not in PROSE and not work.evidence.computed_file(p):
                found.append(f"{p} holds what no computing run_experiment attempt wrote (made by hand, copied or "
                             "edited since, or written while other commands ran beside its attempt): produce it "
                             "with the run_experiment attempt that computes it, run with nothing else running")
        return found

    def describe(self) -> str:
        return ("every file the plan's `analysis_outputs` name exists, or a deviation says why not; one that is "
                "not prose (.md, .txt, .rst) holds what the `run_experiment` attempt that computed it wrote")


@dataclass(frozen=True)
class SaysWhatFailed:
    """After a negative outcome, the report has a section on what failed and why."""

    path: str
    fields: ClassVar[tuple[str, ...]] = ()
    HEADING: ClassVar[re.Pattern[str]] = re.compile(r"^#{1,6}\s*what failed", re.I | re.M)

    def missing(self, work: Work) -> list[str]:
        if not work.plan.negative_outcome:
            return []
        if self.HEADING.search(work.text_of(self.path) or ""):
            return []
        return [f"a section of {self.path} headed \"What failed and why\" (the experiments closed as a negative outcome)"]

    def describe(self) -> str:
        return (f"after a negative outcome, `{self.path}` has a section headed \"What failed and "
                "why\"")


@dataclass(frozen=True)
class AccountsForPlan:
    """The report names every run of the run list, and every evaluation criterion on a line
    that gives the verdict recorded for it (met or unmet)."""

    path: str
    fields: ClassVar[tuple[str, ...]] = ()

    def missing(self, work: Work) -> list[str]:
        text = work.text_of(self.path)
        if text is None:
            return []  # `Files` says so
        text = ENGINE_BLOCK.sub("", text)  # the engine's own section names every run and criterion
        named = lambda item, t: re.search(rf"(?<![\w-]){re.escape(item)}(?![\w-])", t)  # noqa: E731
        found = [f"run {r.id} of the run list named in {self.path}, done (with its attempts) or set aside (with "
                 "the reason)" for r in work.plan.runs if not named(r.id, text)]
        for c in work.plan.criteria:
            lines = [line for line in text.splitlines() if named(c.id, line)]
            if c.status and not any(named(c.status, line) for line in lines):
                found.append(f"criterion {c.id} in {self.path} with its recorded verdict, {c.status}, on its line")
        return found

    def describe(self) -> str:
        return (f"`{self.path}` names every run of the run list, and every criterion with its recorded "
                "verdict (met or unmet)")


LOCK_FILES = ("uv.lock", "poetry.lock", "Pipfile.lock", "pdm.lock", "conda-lock.yml", "renv.lock", "Manifest.toml",
              "package-lock.json", "pnpm-lock.yaml", "yarn.lock", "Cargo.lock", "go.sum")
"""Files that pin an environment by what they are, written by the tools that resolve it."""
PINNED = re.compile(r"===?|\s@\s|^\S+\s*@\s*\S+://")
"""A requirement at its exact version: `pkg==1.2.3`, `pkg===x`, `pkg @ https://…`."""


@dataclass(frozen=True)
class PinnedEnvironment:
    """Setup leaves the environment pinned: a lock file, or requirements files (`requirements*.txt`,
    `environment.yml`) whose every package names its exact version; a study that needs no
    package says so in a comment of its requirements.txt."""

    fields: ClassVar[tuple[str, ...]] = ()
    HOW: ClassVar[str] = ("a pinned environment file: requirements.txt with each package at its exact version "
                          "(`pip freeze > requirements.txt` in the environment), an environment.yml with versions, "
                          "or a lock file (uv.lock, poetry.lock, ...); when no package is needed, a requirements.txt "
                          "whose comment says so and names the Python version")

    def missing(self, work: Work) -> list[str]:
        regular = {name: st.st_size for name, st in work.fs.entries() if stat.S_ISREG(st.st_mode)}
        if any(regular.get(name) for name in LOCK_FILES):
            return []
        names = sorted(regular)
        files = [n for n in names if re.fullmatch(r"requirements.*\.txt", n)] + \
            [n for n in names if re.fullmatch(r"environment\.ya?ml", n)]
        if not files:
            return [self.HOW]
        problems = [p for f in files for p in self._loose(f, work.text_of(f) or "")]
        return [f"{'; '.join(problems[:3])}: {self.HOW}"] if problems else []

    @staticmethod
    def _loose(name: str, text: str) -> list[str]:
        path = Path(name)
        if path.suffix in (".yml", ".yaml"):
            try:
                found = (yaml.safe_load(text) or {}).get("dependencies") or []
            except (yaml.YAMLError, AttributeError):
                return [f"{path.name} is not a conda environment file"]
            wanted = [d for d in found if isinstance(d, str) and not d.startswith("python")]
            wanted += [p for d in found if isinstance(d, dict) for p in d.get("pip") or []]
            loose = [w for w in wanted if "=" not in w]
            return [f"{path.name}: {', '.join(loose[:5])} without an exact version"] if loose else []
        lines = [line.split("#", 1)[0].strip() for line in text.splitlines()]
        wanted = [line for line in lines if line and not line.startswith("-")]  # -r, -c, --hash, -i
        if not wanted:
            said = " ".join(line.partition("#")[2] for line in text.splitlines())
            return [] if len(said.split()) >= 3 else [f"{path.name} names no package and no comment says why"]
        loose = [w for w in wanted if not PINNED.search(w)]
        return [f"{path.name}: {', '.join(loose[:5])} without an exact version"] if loose else []

    def describe(self) -> str:
        return ("the environment is pinned: a lock file, or requirements.txt (or environment.yml) with every "
                "package at its exact version, or, when no package is needed, a requirements.txt saying so")


@dataclass(frozen=True)
class NamesCodeReferences:
    """Each repository of the idea's code references is named in a section: where it was
    cloned and at which commit, or why it could not be."""

    section: str
    fields: ClassVar[tuple[str, ...]] = ()

    def missing(self, work: Work) -> list[str]:
        text = work.sections.get(self.section) or ""
        return [f"the idea's code reference {ref} in section {self.section} (its path and commit, "
                "or why it could not be cloned)" for ref in work.code_references
                if not any(name in text for name in _names_of(ref))]

    def describe(self) -> str:
        return (f"every repository of the idea's `code_references` (if any) is named in `{self.section}` "
                "with where it was cloned and its commit, or why it could not be")


def _names_of(repo: str) -> set[str]:
    """How a text may name a repository: as given, without scheme or `.git`, or as owner/name."""
    bare = re.sub(r"^[a-z+]+://", "", repo.strip()).removesuffix("/").removesuffix(".git")
    parts = [p for p in re.split(r"[/:]", bare) if p]
    names = {repo.strip(), bare}
    if len(parts) >= 2:
        names.add("/".join(parts[-2:]))
    return {n for n in names if n}
