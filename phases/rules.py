"""The parts a phase's completion rule is made of.

Each part says what it still misses in the session's work so far (`Work`) and describes
itself in words for the prompts. A phase needing something new declares a new part here
(or in its own module): the tools and the turn loop only ever ask `phase.missing(work)`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, Sequence

from labrun import latex, toollog


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

    def own_attempts(self) -> list[Any]:
        return [a for a in self.attempts if a.phase == self.phase]


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


@dataclass(frozen=True)
class CitesFetchedSource:
    """The files cite at least one source that a tool really fetched in this phase (its tool
    log shows the fetch), or the section states why the network gave nothing."""

    files: tuple[str, ...]
    section: str
    MARKER: ClassVar[str] = "No source could be fetched:"

    def missing(self, work: Work) -> list[str]:
        texts = [(work.root / f).read_text(errors="replace") for f in self.files if (work.root / f).is_file()]
        cited = set().union(*(toollog.cited(t) for t in texts))
        if work.log is not None and cited & toollog.fetched(work.log, work.own_attempts()):
            return []
        reason = (work.sections.get(self.section) or "").partition(self.MARKER)[2]
        if len(reason.strip()) >= 15:
            return []
        return [f"a source cited in {' or '.join(self.files)} that a tool fetched in this phase "
                f"(cited: {len(cited)}, none of them fetched), or a line `{self.MARKER} <why>` "
                f"in the section {self.section}"]

    def describe(self) -> str:
        files = " or ".join(f"`{f}`" for f in self.files)
        return (f"{files} cites at least one source (its URL, `arXiv:` id or `doi:`) that a tool "
                f"fetched in this phase, or the section `{self.section}` has a line "
                f"`{self.MARKER} <why>`")


@dataclass(frozen=True)
class LatexPaper:
    """A LaTeX paper whose inputs, figures and citations all resolve, with no placeholder."""

    main: str
    bib: str

    def missing(self, work: Work) -> list[str]:
        main = work.root / self.main
        if not main.is_file():
            return []  # `Files` says so
        folder = main.parent
        problems = []
        if "\\begin{document}" not in latex.text(main):
            problems.append(f"{self.main} has no \\begin{{document}}")
        sources, queue = [main], [main]
        while queue:  # the files \input, as TeX finds them from the main file's folder
            for name in latex.inputs(latex.text(queue.pop(0))):
                path = folder / (name if name.endswith(".tex") else f"{name}.tex")
                if not path.is_file() or not latex.text(path).strip():
                    problems.append(f"{os.path.relpath(path, work.root)} (\\input by the paper) is missing or empty")
                elif path not in sources and len(sources) < 200:
                    sources.append(path)
                    queue.append(path)
        used = "".join(latex.text(p) for p in sources)
        for name in latex.graphics(used):
            if not any((folder / f"{name}{ext}").is_file() for ext in ("", ".pdf", ".png", ".jpg")):
                problems.append(f"figure {name} (in \\includegraphics) is not there")
        bib = work.root / self.bib
        known = latex.bib_keys(bib.read_text(errors="replace")) if bib.is_file() else set()
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
class TraceableNumbers:
    """Every decimal number the paper's text states is in a results file (at the precision
    it is written), or in the idea itself (the claim under test)."""

    folder: str
    results: str = "results"
    IDEA: ClassVar[str] = ".labrun/idea.yaml"

    def missing(self, work: Work) -> list[str]:
        papers = sorted((work.root / self.folder).rglob("*.tex"))
        if not papers:
            return []
        sources = [p for p in (work.root / self.results).rglob("*") if p.is_file()]
        for a in work.attempts:  # what experiments wrote elsewhere (the paper's own builds aside)
            if a.status == "SUCCESS":
                sources += [work.root / f for f in [*a.outputs, a.metrics_file]
                            if f and not f.startswith(f"{self.folder}/")]
        known = latex.Numbers.in_files([*sources, work.root / self.IDEA])
        untraced = [(p, n) for p in papers for n in latex.stated_numbers(latex.body(latex.text(p)))
                    if not known.traces(n)]
        if not untraced:
            return []
        shown = "; ".join(f"{p.relative_to(work.root)}:{n.line}: {n.written}" for p, n in untraced[:6])
        more = f" (and {len(untraced) - 6} more)" if len(untraced) > 6 else ""
        return [f"numbers in no results file under {self.results}/: {shown}{more}; take each from "
                "its results file, or add the file that holds it"]

    def describe(self) -> str:
        return (f"every decimal number in the paper's text is in a results file under "
                f"`{self.results}/` (at the precision it is written) or in the idea")


@dataclass(frozen=True)
class Compiled:
    """With TeX installed here: a `latexmk` attempt of this phase succeeded after the last
    edit of the paper's sources. Without TeX: the section says the paper was not compiled."""

    main: str
    section: str

    def missing(self, work: Work) -> list[str]:
        if latex.toolchain() is None:
            if "not compiled" in (work.sections.get(self.section) or "").lower():
                return []
            return [f"the section {self.section} saying the paper was not compiled (no TeX is installed here)"]
        main = work.root / self.main
        pdf = main.with_suffix(".pdf")
        runs = [a for a in work.own_attempts() if "latexmk" in a.command]
        if not runs or runs[-1].status != "SUCCESS":
            return [f"a successful `latexmk` run of {self.main} through run_experiment"]
        edited = max((p.stat().st_mtime for p in main.parent.rglob("*")
                      if p.suffix in (".tex", ".bib", ".sty", ".cls")), default=0)
        if not pdf.is_file() or pdf.stat().st_mtime < edited:
            return [f"{pdf.name} compiled after the last edit of the paper's sources (compile again)"]
        return []

    def describe(self) -> str:
        if latex.toolchain() is None:
            return (f"the section `{self.section}` says the paper was not compiled (no TeX is "
                    "installed here)")
        return (f"the last `latexmk` run of `{self.main}` through `run_experiment` succeeded, "
                "after the paper's last edit")
