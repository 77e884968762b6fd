"""labrun's command line (DESIGN.md, contract).

`status`, `state` and `check` only read, so they never import Prefect; `run`, `resume` and
`demo` run the session flow in this process.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from labrun.agents import AGENTS, CLI_AGENTS
from labrun.resources import EXAMPLES

DEMO_IDEA = EXAMPLES / "demo_noise_averaging.yaml"

console = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class CliError(Exception):
    """A one-line message for the user; `code` is the exit status."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from labrun.server import CLIENT_MAX_RETRIES  # a locked SQLite server answers 503 for a while

    os.environ.setdefault("PREFECT_CLIENT_MAX_RETRIES", str(CLIENT_MAX_RETRIES))
    try:
        return args.handler(args)
    except CliError as e:
        err.print(f"[red]labrun:[/red] {e}")
        return e.code
    except KeyboardInterrupt:
        err.print("[yellow]labrun: interrupted; resume with `labrun resume WORKSPACE`[/yellow]")
        return 130
    except Exception as e:  # a damaged session file: say which, never a traceback
        from labrun.journal import JournalCorrupt

        if isinstance(e, JournalCorrupt):
            err.print(f"[red]labrun:[/red] {e}")
            return 2
        if type(e).__name__ == "ValidationError" or isinstance(e, (ValueError, OSError)):
            where = getattr(args, "workspace", None) or getattr(args, "idea", "")
            err.print(f"[red]labrun:[/red] {where}: cannot read the session's files ({type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''}); restore .labrun/state.json from a backup "
                      "or start a new workspace")
            return 2
        raise


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labrun", description="Durable autonomous research sessions on Prefect.")
    sub = p.add_subparsers(required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="start (or continue) a session for an idea")
    run.add_argument("idea")
    run.add_argument("--workspace", required=True)
    run.add_argument("--agent", choices=AGENTS, default=None)
    run.add_argument("--model", default=None)
    run.add_argument("--with", dest="with_phases", default="", metavar="PHASE,...",
                     help="optional phases to run besides the six research phases")
    _limits(run)
    run.set_defaults(handler=cmd_run)

    resume = sub.add_parser("resume", help="continue a session; finished phases are skipped")
    resume.add_argument("workspace")
    _limits(resume)
    resume.set_defaults(handler=cmd_resume)

    status = sub.add_parser("status", help="phases, attempts, tokens and cost")
    status.add_argument("workspace")
    status.add_argument("--json", action="store_true")
    status.add_argument("--branch", type=int, default=None, metavar="N", help="one branch (`labrun branches`)")
    status.set_defaults(handler=cmd_status)

    state = sub.add_parser("state", help="print STATE.md")
    state.add_argument("workspace")
    state.set_defaults(handler=cmd_state)

    check = sub.add_parser("check", help="validate an idea file")
    check.add_argument("idea")
    check.set_defaults(handler=cmd_check)

    demo = sub.add_parser("demo", help="the whole flow offline, with the scripted agent")
    demo.add_argument("workspace", nargs="?", default="labrun-demo")
    demo.set_defaults(handler=cmd_demo)

    from labrun.server import add_parsers as add_server_commands  # `server`, `queue`
    from labrun.branch_cli import add_parsers as add_branch_commands  # `rerun`, `branches`, `diff`

    add_server_commands(sub)
    add_branch_commands(sub)
    return p


def _limits(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget-usd", type=float, default=None, help="session budget in USD")
    p.add_argument("--max-turns", type=int, default=None, help="turn limit of every phase")


# -- reading commands (no Prefect) ---------------------------------------------------------


def cmd_check(args) -> int:
    from labrun.idea import IdeaError, load_idea

    try:
        idea = load_idea(args.idea)
    except IdeaError as e:
        for problem in e.problems:
            err.print(problem)
        return 2
    for warning in idea.warnings:
        err.print(f"[yellow]warning:[/yellow] {args.idea}: {warning}")
    budget = f"${idea.budget_usd:g}" if idea.budget_usd is not None else "none"
    from labrun.phases import PHASES
    from labrun.prompts import guidance_domain, layers

    console.print(f"{args.idea}: valid · {idea.title} · domain {idea.domain} "
                  f"(guidance: {guidance_domain(idea.guidance_domain)}) · budget {budget}", markup=False)
    console.print("prompt layers of each phase: its own instructions, the general guidance, the domain's")
    for number, phase in enumerate(PHASES, 1):
        layout = layers(phase.key, idea.guidance_domain)
        changes = [f"adds {', '.join(layout.added)}"] if layout.added else []
        changes += [f"replaces {', '.join(layout.replaced)}"] if layout.replaced else []
        domain = f"{layout.domain}: {'; '.join(changes)}" if changes else "no domain guidance"
        console.print(f"  {number} {phase.key:<15} general: {len(layout.blocks)} blocks · {domain}",
                      markup=False)
    return 0


def cmd_state(args) -> int:
    path = _session_dir(args.workspace) / "STATE.md"
    sys.stdout.write(path.read_text())
    return 0


def cmd_status(args) -> int:
    from labrun.branches import BranchError, branch_status
    from labrun.status import session_status

    root = _session_dir(args.workspace)
    try:
        report = session_status(root) if args.branch is None else branch_status(root, args.branch)
    except BranchError as e:
        raise CliError(str(e)) from None
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
    phases = Table("#", "phase", "status", "runs", "tokens", "cost")
    for i, p in enumerate(report["phases"], 1):
        u = p["usage"]
        tokens = sum(u[k] for k in u if k.endswith("tokens"))
        phases.add_row(str(i), p["key"], p["status"], str(p["runs"]), f"{tokens:,}", f"${u['cost_usd']:.4f}")
    console.print(phases)
    if report["attempts"]:
        attempts = Table("attempt", "phase", "status", "command", "error / fix")
        for a in report["attempts"]:
            note = a["error"] or (f"fix: {a['fix_applied']}" if a["fix_applied"] else "")
            attempts.add_row(str(a["n"]), a["phase"], a["status"], a["command"], note)
        console.print(attempts)
    u = report["usage"]
    console.print(f"usage: {u['input_tokens']:,} in · {u['output_tokens']:,} out · "
                  f"{u['cache_read_input_tokens']:,} cache read · {u['cache_creation_input_tokens']:,} "
                  f"cache write · ${u['cost_usd']:.4f}"
                  + (f" (${u['estimated_usd']:.4f} of it estimated: runs killed before their bill)"
                     if u.get("estimated_usd") else ""))
    console.print(f"next: {s['next_action']}")


def _branch_line(b: dict) -> str:
    where = "the current branch" if b["current"] else f"kept in {b['archive']}"
    return f" · branch {b['n']} (from {b['from_phase']}; {where})"


def _session_dir(workspace: str) -> Path:
    root = Path(workspace)
    if not (root / ".labrun" / "state.json").is_file():
        raise CliError(f"{workspace}: no labrun session here (start one with `labrun run IDEA.yaml --workspace {workspace}`)")
    return root


# -- running commands ----------------------------------------------------------------------


def cmd_run(args) -> int:
    from labrun.idea import IdeaError, load_idea

    try:
        idea = load_idea(args.idea)
    except IdeaError as e:
        raise CliError(str(e)) from None
    for warning in idea.warnings:
        err.print(f"[yellow]warning:[/yellow] {args.idea}: {warning}")
    state_file = Path(args.workspace) / ".labrun" / "state.json"
    if state_file.is_file():
        stored = json.loads(state_file.read_text())
        if stored["idea_hash"] != idea.content_hash:
            raise CliError(
                f"{args.workspace} already holds a session of another idea ({stored['idea_path']}); "
                "use a new --workspace, or `labrun resume` to continue that one"
            )
        console.print(f"{args.workspace} holds a session of this idea: resuming it.")
    elif Path(args.workspace).exists() and any(Path(args.workspace).iterdir()):
        console.print(f"[yellow]note:[/yellow] {args.workspace} is not empty; the agent will work beside what is there.")
    # A new session defaults to the real agent; an existing one keeps its own.
    agent = args.agent or ("anthropic" if not state_file.is_file() else None)
    from labrun.phases import phase_list

    with_phases = [p for p in args.with_phases.split(",") if p.strip()]
    try:
        phase_list(with_phases)
    except ValueError as e:
        raise CliError(f"--with: {e}") from None
    return _run_flow(args.idea, args.workspace, agent, args.model, args.budget_usd, args.max_turns,
                     with_phases)


def cmd_resume(args) -> int:
    root = _session_dir(args.workspace)
    from labrun.status import finished_and_intact

    if finished_and_intact(root) and args.budget_usd is None and args.max_turns is None:
        console.print(f"{args.workspace}: the session is already complete and its outputs are intact; nothing to do.")
        return 0
    return _run_flow(None, args.workspace, None, None, args.budget_usd, args.max_turns)


def cmd_demo(args) -> int:
    console.print("[bold]labrun demo[/bold]: the whole flow offline, with the scripted agent "
                  "(an offline stand-in for demos and tests, not research).")
    state_file = Path(args.workspace) / ".labrun" / "state.json"
    if state_file.is_file():
        from labrun.status import finished_and_intact

        if finished_and_intact(Path(args.workspace)):
            console.print(f"{args.workspace}: the demo session is already complete; nothing to do.")
            return 0
    code = _run_flow(str(DEMO_IDEA), args.workspace, "scripted", None, None, None)
    if code == 0:
        console.print(f"Read {args.workspace}/REPORT.md and {args.workspace}/STATE.md, "
                      f"or run `labrun status {args.workspace}`.")
    return code


def _run_flow(idea_path, workspace, agent, model, budget_usd, max_turns, with_phases=(),
              from_phase=None, note=None) -> int:
    _configure_logging()
    # Prefect's first ephemeral start migrates a new database: on a small machine that takes
    # longer than Prefect's default 20 s wait.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    from labrun.agents import AgentUnavailable
    from labrun.branches import BranchError
    from labrun.session import SessionMismatch
    from labrun.workspace import WorkspaceBusy

    state_file = Path(workspace) / ".labrun" / "state.json"
    effective = agent or (json.loads(state_file.read_text())["agent"] if state_file.is_file() else None)
    if effective == "anthropic":
        from labrun.agents.anthropic import check_credentials

        try:
            check_credentials()
        except Exception as e:
            raise CliError(str(e)) from None
    if effective in CLI_AGENTS:
        from labrun.agents import make_agent

        try:
            make_agent(effective, model, workspace)  # finds the CLI and its login, or says how to get them
        except AgentUnavailable as e:
            raise CliError(str(e)) from None
    from labrun.flows.session import research_session

    _quiet_prefect_console()
    try:
        research_session(idea_path, str(Path(workspace).resolve()), agent, model, budget_usd, max_turns,
                         list(with_phases), from_phase=from_phase, note=note)
    except (WorkspaceBusy, AgentUnavailable, SessionMismatch, BranchError) as e:
        raise CliError(str(e)) from None
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CliError(f"session stopped: {first}\nresume with: labrun resume {workspace}", code=1) from None
    console.print(f"[green]Session complete.[/green] {workspace}/REPORT.md · `labrun status {workspace}`")
    return 0


def _quiet_prefect_console() -> None:
    """The terminal shows labrun's progress; Prefect's records still reach its API and UI."""
    from prefect.logging.handlers import PrefectConsoleHandler

    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, PrefectConsoleHandler):
            root.removeHandler(handler)


class _Progress(logging.Handler):
    """Engine events and turns, one line each, on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        colour = "yellow" if record.levelno >= logging.WARNING else "dim"
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        err.print(f"[{colour}]{stamp}[/{colour}] {escape(record.getMessage())}")


def _configure_logging() -> None:
    handler = _Progress()
    log = logging.getLogger("labrun")
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    log.propagate = False


if __name__ == "__main__":
    # `python -m labrun.cli`: run the imported module, so that commands defined elsewhere
    # raise the same CliError that main catches (not a copy of it in __main__).
    from labrun.cli import main as imported_main

    sys.exit(imported_main())
