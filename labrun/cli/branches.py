"""`labrun rerun`, `labrun branches` and `labrun diff` (labrun.branches does the work).

`branches` and `diff` only read, so they never import Prefect; `rerun` checks what it can
first, then runs the session flow with `from_phase`.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from labrun.cli.common import CliError, console
from labrun.cli.reading import session_dir


def cmd_rerun(args) -> int:
    from labrun.branches import BranchError, check_rerun, not_finished
    from labrun.cli.running import Run, check_workspace, passed_keys, review_after, run_session
    from labrun.state import load_state
    from labrun.workspace import Workspace, WorkspaceBusy

    root = session_dir(args.workspace)
    check_workspace(root)
    ws = Workspace(root)
    state, _ = load_state(ws)
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
    return run_session(Run(workspace=args.workspace, agent=args.agent, model=args.model, budget_usd=args.budget_usd,
                           max_turns=args.max_turns, verbose=args.verbose, from_phase=args.from_phase,
                           note=args.note, network=args.network, pass_env=list(passed_keys(args)),
                           review_after=review_after(args, state.phases)))


def cmd_branches(args) -> int:
    from labrun.branches import summaries
    from labrun.limits import total_usage
    from labrun.state import load_state
    from labrun.workspace import Workspace

    ws = Workspace(session_dir(args.workspace))
    state, _ = load_state(ws)
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

    try:
        report = diff(session_dir(args.workspace), args.a, args.b)
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
