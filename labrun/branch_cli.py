"""`labrun rerun`, `labrun branches` and `labrun diff` (labrun.branches does the work).

`branches` and `diff` only read, so they never import Prefect; `rerun` checks what it can
first, then runs the session flow with `from_phase`.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from labrun.agents import AGENTS


def add_parsers(sub) -> None:
    from labrun.cli import _limits

    rerun = sub.add_parser("rerun", help="run a finished session again from a phase, as a new branch")
    rerun.add_argument("workspace")
    rerun.add_argument("--from", dest="from_phase", required=True, metavar="PHASE",
                       help="the first phase to run again; the earlier ones are reused")
    rerun.add_argument("--agent", choices=AGENTS, default=None)
    rerun.add_argument("--model", default=None)
    rerun.add_argument("--note", default="", help="why this branch (shown by `labrun branches`)")
    _limits(rerun)
    rerun.set_defaults(handler=cmd_rerun)

    branches = sub.add_parser("branches", help="a session's branches: start phase, model, time, cost, note")
    branches.add_argument("workspace")
    branches.add_argument("--json", action="store_true")
    branches.set_defaults(handler=cmd_branches)

    diff = sub.add_parser("diff", help="two branches' metrics and key outputs, side by side")
    diff.add_argument("workspace")
    diff.add_argument("a", type=int, metavar="A")
    diff.add_argument("b", type=int, metavar="B")
    diff.add_argument("--json", action="store_true")
    diff.set_defaults(handler=cmd_diff)


def cmd_rerun(args) -> int:
    from labrun.branches import BranchError, check_rerun, not_finished
    from labrun.cli import CliError, _run_flow, _session_dir
    from labrun.status import load_state
    from labrun.workspace import Workspace, WorkspaceBusy

    root = _session_dir(args.workspace)
    ws = Workspace(root)
    state = load_state(ws)
    try:
        check_rerun(state, args.from_phase, Path(args.workspace))
    except BranchError as e:
        raise CliError(str(e)) from None
    reason = not_finished(state, args.from_phase, Path(args.workspace))
    if reason:
        raise CliError(reason)
    try:
        ws.lock()  # a live engine holds it: say so before anything starts
    except WorkspaceBusy as e:
        raise CliError(str(e)) from None
    ws.unlock()
    return _run_flow(None, args.workspace, args.agent, args.model, args.budget_usd, args.max_turns,
                     from_phase=args.from_phase, note=args.note)


def cmd_branches(args) -> int:
    from labrun.branches import summaries
    from labrun.cli import _session_dir, console
    from labrun.session import total_usage
    from labrun.status import load_state
    from labrun.workspace import Workspace

    ws = Workspace(_session_dir(args.workspace))
    state = load_state(ws)
    rows = summaries(ws, state, total_usage(ws, state))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table("branch", "from", "agent · model", "started (UTC)", "cost", "note",
                  caption="* the current branch; `labrun status DIR --branch N` shows one")
    table.columns[3].no_wrap = True
    for b in rows:
        table.add_row(f"{b['n']}{' *' if b['current'] else ''}", b["from_phase"],
                      b["agent"] + (f" · {b['model']}" if b["model"] else ""),
                      b["started_at"].removesuffix(" UTC")[:16], f"${b['usage']['cost_usd']:.4f}", b["note"])
    console.print(table)
    return 0


def cmd_diff(args) -> int:
    from labrun.branches import BranchError, diff
    from labrun.cli import CliError, _session_dir, console

    try:
        report = diff(_session_dir(args.workspace), args.a, args.b)
    except BranchError as e:
        raise CliError(str(e)) from None
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    a, b = report["a"], report["b"]
    metrics = Table("metrics file", "metric", f"branch {a}", f"branch {b}", "change")
    for m in report["metrics"]:
        metrics.add_row(m["file"], m["metric"], _shown(m["a"]), _shown(m["b"]), _change(m["a"], m["b"]))
    console.print(metrics if report["metrics"] else "no metrics files in either branch")
    files = Table("key output", f"branch {a} → branch {b}")
    for f in report["files"]:
        files.add_row(f["path"], f["status"])
    console.print(files)
    for f in report["files"]:
        if f["diff"]:
            console.print(f"\n[bold]{f['path']}[/bold]")
            console.print("\n".join(f["diff"]), markup=False)
    return 0


def _shown(value) -> str:
    return "—" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)


def _change(a, b) -> str:
    if a == b:
        return "same"
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
    return f"{b - a:+.6g}" if numbers else "changed"
