"""The commands that only read: `check`, `status`, `state`. None imports Prefect."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from labrun.cli.common import CliError, console, err, labrun_command, styled


def cmd_check(args) -> int:
    from labrun.idea import IdeaError, load_idea
    from labrun.keys import check_warnings
    from labrun.machine import compute_warnings
    from labrun.phase_registry import phase_list
    from labrun.prompts import guidance_domain, layers

    from labrun.sealed import seal

    try:
        idea = load_idea(args.idea)
        seal(idea, Path(args.idea), None)
    except IdeaError as e:
        for problem in e.problems:
            err.print(problem)
        return 2
    for warning in idea.warnings + check_warnings(idea) + compute_warnings(idea):
        err.print(f"[yellow]warning:[/yellow] {args.idea}: {escape(warning)}")
    if args.strict and idea.warnings:  # the file's own problems, not this machine's or environment's
        err.print(f"{args.idea}: not valid with --strict: {len(idea.warnings)} warning(s) about the file")
        return 2
    budget = f"${idea.budget_usd:g}" if idea.budget_usd is not None else "none"
    agent_budget = f"${idea.agent_budget_usd:g}" if idea.agent_budget_usd is not None else "none (--budget-usd sets one)"
    extra = f" · with {', '.join(idea.with_phases)}" if idea.with_phases else ""
    extra += f" · paper style {idea.paper_style}" if idea.paper_style else ""
    extra += f" · sealed evaluation of {idea.sealed_evaluation.artifact}" if idea.sealed_evaluation else ""
    console.print(f"{args.idea}: valid · {idea.title} · domain {idea.domain} "
                  f"(guidance: {guidance_domain(idea.guidance_domain)}) · experiments' budget {budget} "
                  f"· agent's budget {agent_budget}{extra}", markup=False)
    from labrun.cli.common import DEFAULT_AGENT
    from labrun.estimate import estimate_lines

    console.print(f"before it runs, for the {DEFAULT_AGENT} agent (the default):", markup=False)
    for line in estimate_lines(idea, DEFAULT_AGENT):
        console.print(f"  {line}", markup=False)
    console.print("prompt layers of each phase: its own instructions, the general guidance, the domain's")
    for number, key in enumerate(phase_list(idea.with_phases), 1):
        layout = layers(key, idea.guidance_domain)
        changes = [f"adds {', '.join(layout.added)}"] if layout.added else []
        changes += [f"replaces {', '.join(layout.replaced)}"] if layout.replaced else []
        domain = f"{layout.domain}: {'; '.join(changes)}" if changes else "no domain guidance"
        console.print(f"  {number} {key:<15} general: {len(layout.blocks)} blocks · {domain}",
                      markup=False)
    return 0


def cmd_state(args) -> int:
    from labrun.printable import printable
    from labrun.state import state_md_text
    from labrun.workspace import Workspace

    # What the agent gave (its sections, its commands) may hold a terminal's escape sequences.
    sys.stdout.write(printable(state_md_text(Workspace(session_dir(args.workspace))), multiline=True))
    return 0


def cmd_status(args) -> int:
    from labrun.branches import BranchError
    from labrun.status import branch_status, session_status

    root = session_dir(args.workspace)
    try:
        report = session_status(root) if args.branch is None else branch_status(root, args.branch)
    except BranchError as e:
        raise CliError(str(e)) from None
    for note in report.get("notes", []):
        err.print(f"[yellow]note:[/yellow] {note}")
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print_status(report)
    return 0


def print_status(report: dict) -> None:
    s = report["session"]
    console.print(f"[bold]{report['idea']['title']}[/bold]  ({s['workspace']})")
    branch = next((b for b in report.get("branches", []) if b["n"] == s.get("branch")), None)
    console.print(f"agent {s['agent']}" + (f" · model {s['model']}" if s["model"] else "")
                  + f" · {'complete' if s['complete'] else 'not complete'}"
                  + (_branch_line(branch) if branch and len(report["branches"]) > 1 else ""))
    if verdict := report.get("verdict"):  # an archived branch's status from before verdicts has none
        console.print(f"verdict{'' if s['complete'] else ' so far'}: {verdict['line']}", markup=False)
    phases = Table("#", "phase", "status", "runs", "tokens", "cost")
    for i, p in enumerate(report["phases"], 1):
        u = p["usage"]
        tokens = sum(u[k] for k in u if k.endswith("tokens"))
        phases.add_row(str(i), p["key"], styled(p["status"]), str(p["runs"]), f"{tokens:,}", f"${u['cost_usd']:.4f}")
    console.print(phases)
    for p in report["phases"]:
        if p.get("older_prompt"):
            console.print(f"phase {p['key']}: finished with an older prompt (its templates were reworded "
                          "since; it stays finished)")
    if report["attempts"]:
        console.print(attempts_table(report["attempts"], console.width))
    print_running(report.get("running", []))  # an archived branch's status has none
    print_plan(report["plan"], report.get("verdict"))
    u = report["usage"]
    console.print(f"usage: {u['input_tokens']:,} in · {u['output_tokens']:,} out · "
                  f"{u['cache_read_input_tokens']:,} cache read · {u['cache_creation_input_tokens']:,} "
                  f"cache write · ${u['cost_usd']:.4f}"
                  + (f" (${u['estimated_usd']:.4f} of it estimated: runs killed before their bill)"
                     if u.get("estimated_usd") else ""))
    console.print(clock_text(s["clock"]), markup=False)
    if review := s.get("awaiting_review"):
        console.print(f"awaiting review: phase {review['phase']} since {review['requested_at']}; it wrote "
                      f"{escape(', '.join(review['outputs'][:8]) or 'no files')}", highlight=False)
    console.print(f"next: {s['next_action']}")


def attempts_table(attempts: list[dict], width: int) -> Table:
    """One line per attempt, fitting `width`: the command and the error share what the other
    columns leave, cut with an ellipsis (`status --json` and `labrun state` give them whole)."""
    from labrun.cli.display import fitted_table

    rows = []
    for a in attempts:
        note = a["error"] or (f"fix: {a['fix_applied']}" if a["fix_applied"] else "")
        rows.append((str(a["n"]), a["phase"], a["run_id"] or "", a["status"],
                     " ".join(a["command"].split()), " ".join(note.split())))
    return fitted_table(("#", "phase", "run", "status", "command", "error / fix"), rows, width, (4, 5),
                        {3: styled})


def print_running(running: list[dict]) -> None:
    """Each running attempt: how long it has run, its GPUs, its command, then the last lines
    of its log (`labrun.live`: escaped already), each cut to the terminal's width."""
    from labrun.printable import printable

    for a in running:
        console.print(printable(f"attempt {a['n']} ({a['phase']}): {a['line']} · {' '.join(a['command'].split())}"),
                      markup=False, soft_wrap=False, no_wrap=True, overflow="ellipsis")
        for line in a["tail"]:
            console.print(f"  │ {line}", markup=False, soft_wrap=False, no_wrap=True, overflow="ellipsis")


def _branch_line(b: dict) -> str:
    where = "the current branch" if b["current"] else f"kept in {b['archive']}"
    return f" · branch {b['n']} (from {b['from_phase']}; {where})"


def clock_text(clock: dict) -> str:
    """The clock and the two budgets, as STATE.md shows them."""
    from labrun.state import render_clock

    return render_clock(clock)


def print_plan(plan: dict, verdict: dict | None) -> None:
    """The run list with its coverage, and the verdicts on the idea's evaluation criteria (the
    engine's, `verdict`; the agent's own where a status from before them holds none)."""
    if plan["runs"]:
        c = plan["coverage"]
        runs = Table("run", "purpose", "seeds", "criteria", "coverage",
                     title=f"run list: {c['done']} of {c['runs']} done, {c['deviated']} set aside, {c['open']} open")
        for r in plan["runs"]:
            if r["state"] == "done":
                shown = "done: " + ", ".join(f"#{n}" for n in r["succeeded"])
            elif r["state"] == "deviated":
                shown = f"deviation: {r['deviation']}"
            else:
                shown = "open" + (f" (tried {', '.join(f'#{n}' for n in r['attempts'])})" if r["attempts"] else "")
            runs.add_row(*map(escape, (r["id"], r["purpose"], ", ".join(map(str, r["seeds"])) or "—",
                                       ", ".join(r["criteria"]) or "—", shown)))
        console.print(runs)
    if verdict is not None:
        for v in verdict["verdicts"]:
            by = f" ({v['by']})" if v["verdict"] != "not judged" else ""
            console.print(f"  {v['id']} {v['text']} — {v['verdict']}{by}" + (f": {v['basis']}" if v["basis"] else ""),
                          markup=False)
    else:
        for criterion in plan["criteria"]:
            said = f"{criterion['status']}: {criterion['note']}" if criterion["status"] else "not judged yet"
            console.print(f"  {criterion['id']} {criterion['text']} — {said}", markup=False)
    for output in plan["outputs"]:
        shown = "present" if output["exists"] else (f"deviation: {output['deviation']}" if output["deviation"] else "missing")
        console.print(f"  analysis output {output['path']}: {shown}", markup=False)
    if plan["negative_outcome"]:
        console.print(f"negative outcome: {plan['negative_outcome']}", markup=False)


def session_dir(workspace: str) -> Path:
    root = Path(workspace)
    if root.exists() and not root.is_dir():
        raise CliError(f"{workspace}: is a file, not a session's folder")
    from labrun.workspace import Workspace

    if not Workspace(root).has_session():
        raise CliError(f"{workspace}: no labrun session here (start one with `{labrun_command()} run IDEA.yaml "
                       f"--workspace {workspace}`)")
    return root
