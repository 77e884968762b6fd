"""REPORT.md's engine section, and the paper's `labrun_results.tex`: the results as the engine
vouches for them, rendered from its own records (the claims, the attempts' metrics, the
reproduction, the sealed evaluation), the way STATE.md is.

The section stands under the report's title between `<!-- labrun:results -->` markers; it is
written last by documentation and by every phase after it, so no phase can edit it away, and
any other `labrun:` block found in the report is removed (a forged one among them). The
agent's prose around it is its own; the numbers that prose, README.md and the paper state
that no record holds are listed in the section, not refused (`labrun.prose_numbers`).
"""

from __future__ import annotations

import itertools
import posixpath
import re
import unicodedata
from typing import Any

from labrun import latex, paper
from labrun.crashpoints import crashpoint
from labrun import verdicts
from labrun.claims import Standing, Verdict, number
from labrun.evidence import ENGINE_BLOCK
from labrun.prose_numbers import Record, stated, unrecorded
from labrun.session import Session
from labrun.phases.reproduction import reproduction_lines
from labrun.phases.sealed_scoring import sealed_line

MAX_METRICS = 64
"""An attempt with more numbers than this adds to the record only those a claim cites."""
CONVENTIONS = (1.96, 2.576, 1.645, 0.05, 0.01, 0.001)
"""Conventional constants of statistics (a 95% interval's z, significance levels), which a
report states and no attempt needs to record."""
MAX_LISTED = 40


def sealed_scores(session: Session) -> dict[str, Any]:
    return verdicts.sealed_scores(session.state)


def results(session: Session) -> tuple[list[Standing], list[Verdict]]:
    """Each claim's standing and each criterion's verdict (`labrun.verdicts`, which every
    other view of the session's verdict reads too)."""
    return verdicts.results(session.ws, session.state, session.idea)


def cell(text: Any) -> str:
    """The agent's text in one table cell: one line, no markup that could end the section."""
    return " ".join(str(text).split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def value_of(s: Standing) -> str:
    c = s.claim
    shown = f"{cell(c.metric)} = {_num(s.value)} ({_from(c.attempts)})"
    if c.baseline_attempts:
        shown += f"; baseline {_num(s.baseline)} ({_from(c.baseline_attempts)})"
    return shown


def _num(value: Any) -> str:
    return f"{value:.6g}" if number(value) else "—"


def _from(ns: list[int]) -> str:
    ns = list(dict.fromkeys(ns))
    return f"#{ns[0]}" if len(ns) == 1 else "mean of " + ", ".join(f"#{n}" for n in ns)


def section(session: Session, edited: bool = False) -> str:
    """REPORT.md's engine section, markers included (`edited`: the paper's results file held
    something else than the engine wrote)."""
    standings, verdicts = results(session)
    lines = ["<!-- labrun:results -->", "## Results as the engine recorded them", "",
             "*Written by labrun from its own records (the attempts, their reruns, the sealed evaluation) "
             "each time a phase touches this report; an edit here is replaced.*", ""]
    lines += reproduction_lines(session)
    attempts = {a.n: a for a in session.state.live_attempts()}
    if (sealed := sealed_line(session)) is not None:
        made = [n for n, a in attempts.items() if a.status == "SUCCESS" and session.state.sealed.artifact in
                ((session.records.files(n) or {}).get("wrote") or ())]
        lines += ["", sealed + ("" if made or not sealed_scores(session) else
                               " (no successful attempt wrote the artifact: it was made outside the record)")]
    if standings:
        lines += ["", "| claim | value in the record | runs | reproduction | sealed score |", "|---|---|---|---|---|"]
        for s in standings:
            runs = sorted({attempts[n].run_id for n in s.claim.attempts if n in attempts and attempts[n].run_id})
            score = (f"{_num(s.sealed)}" + (" (**contradicts**)" if s.contradicted else "") if s.sealed is not None else
                     f"{cell(s.scored)} (another metric)" if s.scored else "—")
            lines.append(f"| {cell(s.claim.id)}: {cell(s.claim.statement)} | {value_of(s)} | {', '.join(runs) or '—'} "
                         f"| {cell(s.status)} | {score} |")
    else:
        lines += ["", "No claim was handed over: nothing in this report is vouched for by the engine."]
    if verdicts:
        lines += ["", "| criterion | verdict | decided by | basis |", "|---|---|---|---|"]
        for v in verdicts:
            claims = f" ({', '.join(v.claims)})" if v.claims and v.by == "agent" else ""  # the engine's basis names them
            lines.append(f"| {v.criterion.id}: {cell(v.criterion.text)} | **{v.verdict}** | {v.by} | {cell(v.basis)}{claims} |")
    notes = [f"- {cell(s.claim.id)}: #{a.attempt} set aside by the agent: {cell(a.reason)}"
             for s in standings for a in s.claim.set_aside]
    notes += [f"- {cell(s.claim.id)}: the code its attempts ran has changed or gone since: {', '.join(s.code_changed)}"
              for s in standings if s.code_changed]
    notes += others_of_runs([s.claim for s in standings], attempts)
    if (negative := session.state.plan.negative_outcome) is not None:
        ran = [f"#{a.n}" + (f" ({a.run_id})" if a.run_id else "") for a in attempts.values()
               if a.phase == "experiments" and a.status == "SUCCESS"]
        notes.append(f"- Negative outcome: {cell(negative)}" + (f"; successful attempts of the experiments all the same: "
                                                             f"{', '.join(ran)}" if ran else ""))
    if notes:
        lines += ["", *notes]
    texts = write_up(session)
    imitations = [f"{name}:{n}" for name, text, _ in texts for n in imitating(text)]
    imitations += [f"{paper.RESULTS}, edited since the engine wrote it (a PDF compiled from it may show other values)"] \
        if edited else []
    if imitations:
        lines += ["", f"**Imitations of this section in the agent's text** (not the engine's): {', '.join(imitations)}."]
    listed = unrecorded_numbers(texts, record(session, standings))
    if listed:
        shown = "; ".join(listed[:MAX_LISTED]) + (f"; and {len(listed) - MAX_LISTED} more" if len(listed) > MAX_LISTED else "")
        lines += ["", f"**Numbers not in any attempt's record** (the agent's own, not vouched for): {shown}."]
    return "\n".join([*lines, "<!-- /labrun:results -->"]) + "\n\n"


def others_of_runs(claims: list, attempts: dict) -> list[str]:
    """For each run a claim cites, its attempts in any phase that no claim cites or sets
    aside, failed ones with their error: every try of a run counts, not the ones picked."""
    cited = {n for c in claims for n in (*c.attempts, *c.baseline_attempts, *(a.attempt for a in c.set_aside))}
    runs = {attempts[n].run_id for c in claims for n in (*c.attempts, *c.baseline_attempts) if n in attempts} - {None}
    found = []
    for run in sorted(runs):
        left = [a for n, a in attempts.items() if a.run_id == run and n not in cited and a.status in ("SUCCESS", "FAILED")]
        if left:
            said = "; ".join(f"#{a.n} {a.status}" + (f" ({cell(a.error)})" if a.error else "") for a in left)
            found.append(f"- Run {cell(run)} also has attempts no claim cites: {said}")
    return found


def record(session: Session, standings: list[Standing]) -> Record:
    """What the engine's records hold: every measured metric, each rerun's and the sealed
    score's numbers, the attempts' durations, the claims' values, and the numbers the idea and
    the plan state. Never an output file's contents: a per-item file would hold every number."""
    work = session.work("documentation", {})
    claimed_metrics = {(n, c.metric) for c in session.state.plan.claims for n in c.attempts} | \
        {(n, c.compared_metric) for c in session.state.plan.claims for n in c.baseline_attempts}
    values: list[float] = [*CONVENTIONS]
    for a in work.attempts:
        measured = {k: float(v) for k, v in work.evidence.measured(a).items() if number(v)}
        if len(measured) > MAX_METRICS:  # a flood of numbers would hold any: only what claims cite counts
            measured = {k: v for k, v in measured.items() if (a.n, k) in claimed_metrics}
        values += measured.values()
        values += [float(v) for v in (a.reproduction.metrics if a.reproduction else {}).values() if number(v)]
        values += [a.duration_s] if a.duration_s else []
    values += [float(v) for v in sealed_scores(session).values() if number(v)]
    values += [v for text in work.evidence.stated for n in stated(text) for v, _ in n.readings]
    claimed = [x for s in standings for x in (s.value, s.baseline) if x is not None]
    values += claimed
    differences = [a - b for a, b in itertools.permutations(claimed, 2)]
    return Record(tuple(values), tuple(differences))


def write_up(session: Session) -> list[tuple[str, str, bool]]:
    """(name, the agent's text, LaTeX or not) of REPORT.md, README.md and the paper's sources;
    REPORT.md without the engine's section (its lines kept blank), and any other block marked
    as the engine's unmarked: a block of the agent's hides nothing."""
    files = session.ws.files
    names = [(n, False) for n in ("REPORT.md", "README.md")]
    if files.is_dir(paper.FOLDER):
        names += [(rel, True) for rel in paper_sources(session) if rel != paper.RESULTS]
    texts = []
    for name, is_tex in names:
        try:
            text = files.read_text(name, errors="replace")
        except (OSError, ValueError):
            continue
        if name == "REPORT.md":
            text = ENGINE_BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        texts.append((name, text.replace("<!-- labrun:", "<!-- "), is_tex))
    return texts


def paper_sources(session: Session) -> list[str]:
    """The paper's `.tex` files, and those its main file inputs from elsewhere in the workspace."""
    files = session.ws.files
    found = [rel for rel, _ in sorted(files.files(paper.FOLDER)) if rel.endswith(".tex")]
    queue = [paper.MAIN] if paper.MAIN in found else []
    while queue and len(found) < 200:
        try:
            text = latex.uncommented(files.read_text(queue.pop(0), errors="replace"))
        except (OSError, ValueError):
            continue
        for name in latex.inputs(text):
            rel = posixpath.normpath(posixpath.join(paper.FOLDER, name if name.endswith(".tex") else f"{name}.tex"))
            if posixpath.isabs(rel) or rel.startswith("..") or rel in found:
                continue  # outside the workspace: nothing the engine reads
            try:
                if files.is_file(rel):
                    found.append(rel)
                    queue.append(rel)
            except ValueError:  # Refused: not a path the engine follows
                continue
    return found


IMITATION = re.compile(r"results as the engine recorded them|labrun:\s*results|numbers not in any attempt|"
                       r"\\(?:re)?newcommand\s*\{?\\labrun|\\def\s*\\labrun|\\let\s*\\labrun")
INVISIBLE = dict.fromkeys(map(ord, "\u00ad\u200b\u200c\u200d\u200e\u200f\u2060\ufeff"))


def imitating(text: str) -> list[int]:
    """The lines of the agent's text that imitate the engine's section or redefine its LaTeX
    commands, whatever the case, width or invisible characters."""
    lines = unicodedata.normalize("NFKC", text).translate(INVISIBLE).lower().splitlines()
    return [i for i, line in enumerate(lines, 1) if IMITATION.search(" ".join(line.split()))]


def unrecorded_numbers(texts: list[tuple[str, str, bool]], held: Record) -> list[str]:
    """`file:line: number` for each number the write-up states that no record holds."""
    return [f"{name}:{n.line}: {cell(n.written)}" for name, text, latex in texts
            for n in unrecorded(text, held, latex=latex)]


def stamp_report(session: Session) -> None:
    """REPORT.md begins with the engine's section, after its title when it has one; any
    earlier `labrun:` block is removed. The paper's results file is rewritten with it."""
    files = session.ws.files
    edited = write_paper_results(session)
    try:
        text = ENGINE_BLOCK.sub("", files.read_text("REPORT.md", errors="replace")).lstrip("\n")
    except (OSError, ValueError):  # none, or not a file the engine reads (a link, a FIFO, too big)
        return
    title, rest = (text.split("\n", 1) + [""])[:2] if text.startswith("# ") else ("", text)
    head = f"{title}\n\n" if title else ""
    rendered = section(session, edited)
    crashpoint("rendering")  # a kill before the write: the phase's engine steps run again on resume
    session.ws.write("REPORT.md", head + rendered + rest.lstrip("\n"))


TEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
               "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}"}


def tex(text: Any) -> str:
    return "".join(TEX_SPECIAL.get(c, c) for c in " ".join(str(text).split()))


def paper_results(session: Session) -> str:
    """`labrun_results.tex`: `\\labrunvalue{K1}` gives claim K1's value as the record holds it,
    `\\labrunverdict{C1}` a criterion's verdict, and `\\labrunresults` the table of both."""
    standings, verdicts = results(session)
    key = lambda text: re.sub(r"[^A-Za-z0-9.-]", "", text)  # noqa: E731  (a claim id's letters)
    lines = [r"\makeatletter"]
    lines += [rf"\@namedef{{labrun@value@{key(s.claim.id)}}}{{{_num(s.value)}}}" for s in standings]
    lines += [rf"\@namedef{{labrun@verdict@{v.criterion.id}}}{{{v.verdict}}}" for v in verdicts]
    lines += [r"\makeatother", r"\newcommand{\labrunresults}{%", r"\begin{tabular}{llll}\hline",
              r"claim & value in the record & attempts & reproduction \\\hline"]
    lines += [rf"{tex(s.claim.id)} & {tex(s.claim.metric)} = {_num(s.value)} & {tex(_from(s.claim.attempts))} & "
              rf"{tex(s.status)} \\" for s in standings]
    lines += [r"\hline", r"criterion & verdict & decided by & \\\hline"]
    lines += [rf"{v.criterion.id} & {v.verdict} & {tex(v.by)} & \\" for v in verdicts]
    lines += [r"\hline\end{tabular}}", ""]
    return paper.RESULTS_COMMANDS + "\n".join(lines)


def write_paper_results(session: Session) -> bool:
    """The paper's `labrun_results.tex`, when the session writes a paper; True when it held
    something else than the engine writes now or wrote at the paper's start (an edit)."""
    if "paper" not in session.state.phases:
        return False
    text = paper_results(session)
    try:
        was = session.ws.files.read_text(paper.RESULTS, errors="replace")
    except (OSError, ValueError):
        was = None
    try:
        session.ws.write(paper.RESULTS, text)
    except (OSError, ValueError):
        pass  # a folder of the agent's in the way: the paper's rule says its input is missing
    return was is not None and was not in (text, paper.RESULTS_COMMANDS + paper.NO_RESULTS)
