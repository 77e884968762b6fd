"""What a study hands on: `results` (a table across a queue's sessions) and `export` (one
session as a bundle). Neither imports Prefect."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape

from labrun.cli.common import CliError, console, err, styled
from labrun.printable import printable

RESULT_FIELDS = ("workspace", "idea", "title", "state", "criteria", "met", "unmet", "unconfirmed", "not_judged",
                 "reproduced", "cost_usd", "claims")


def cmd_results(args) -> int:
    folder = Path(args.folder)
    if not folder.is_dir():
        raise CliError(f"{args.folder}: not a folder (name the folder of the sessions' workspaces, "
                       "as `labrun queue --workspaces` made them)")
    from labrun.status import session_status
    from labrun.workspace import Workspace

    roots = [folder] if Workspace(folder).has_session() else \
        sorted(p for p in folder.iterdir() if p.is_dir() and Workspace(p).has_session())
    if not roots:
        raise CliError(f"{args.folder}: no labrun session in it or in the folders under it")
    rows = []
    for root in roots:
        try:
            rows.append(result_row(root, session_status(root)))
        except Exception as e:  # one damaged session must not hide the others
            err.print(f"[yellow]note:[/yellow] {escape(str(root))}: not read ({escape(type(e).__name__)}: "
                      f"{escape(str(e).splitlines()[0] if str(e) else '')})")
    if args.json:
        print(json.dumps(rows, indent=2))
    elif args.csv:
        writer = csv.DictWriter(sys.stdout, RESULT_FIELDS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "claims": "; ".join(f"{c['id']} {c['metric']}={_num(c['value'])}"
                                                        for c in row["claims"])})
    else:
        print_results(rows, console.width)
    return 0


def result_row(root: Path, report: dict[str, Any]) -> dict[str, Any]:
    """One session's line of `labrun results` (`report`: its `labrun status --json`)."""
    v, s = report["verdict"], report["session"]
    return {"workspace": str(root), "idea": Path(report["idea"]["path"]).stem, "title": report["idea"]["title"],
            "state": session_state(report), "criteria": v["criteria"], "met": v["met"], "unmet": v["unmet"],
            "unconfirmed": v["unconfirmed"], "not_judged": v["not_judged"], "reproduced": v["reproduced"],
            "cost_usd": round(report["usage"]["cost_usd"], 6),
            "claims": [{"id": c["id"], "metric": c["metric"], "value": c["value"], "standing": c["standing"]}
                       for c in v["claims"]],
            "verdict": v["line"], "complete": s["complete"]}


def session_state(report: dict[str, Any]) -> str:
    """A session's state in a word or two: complete, awaits review, stopped by review, failed
    (at a phase), at a phase (running, or cut off), not started."""
    s = report["session"]
    if s["complete"]:
        return "complete"
    if s.get("awaiting_review"):
        return "awaits review"
    if s.get("stopped_by_review"):
        return "stopped by review"
    failed = [p["key"] for p in report["phases"] if p["status"] == "FAILED"]
    if failed:
        return f"failed: {failed[0]}"
    at = [p["key"] for p in report["phases"] if p["status"] == "IN PROGRESS"]
    if at:
        return f"at {at[0]}"
    done = [p["key"] for p in report["phases"] if p["status"] == "DONE"]
    return f"after {done[-1]}" if done else "not started"


def print_results(rows: list[dict[str, Any]], width: int) -> None:
    from labrun.cli.display import fitted_table

    ideas = [r["idea"] for r in rows]
    lines = []
    for r in rows:  # two sessions of one idea are told apart by their folders
        name = r["idea"] if ideas.count(r["idea"]) == 1 else Path(r["workspace"]).name
        reproduced = {True: "yes", False: "NO"}.get(r["reproduced"], "—")
        claims = "; ".join(f"{c['metric']}={_num(c['value'])}" for c in r["claims"]) or "—"
        lines.append((name, r["state"], f"{r['met']}/{r['criteria']}", str(r["unmet"]), str(r["unconfirmed"]),
                      reproduced, f"${r['cost_usd']:.2f}", claims))
    console.print(fitted_table(("idea", "state", "met", "no", "?", "rerun", "cost", "key claims"), lines,
                               width, (0, 7), {1: lambda t: styled(t) if t == "complete" else escape(t)}))
    console.print("met: the idea's criteria met; no: unmet; ?: unconfirmed (met, but on a result a rerun or the "
                  "sealed evaluation did not confirm); rerun: the engine's reruns gave the claims' numbers again. "
                  "`labrun status DIR` shows one session.", markup=False, style="dim")


def _num(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else "—" if value is None else str(value)


def cmd_export(args) -> int:
    from labrun.bundle import BundleError, export
    from labrun.cli.reading import session_dir

    root = session_dir(args.workspace)
    target = Path(args.to) if args.to else Path(f"{root.resolve().name}.tar.gz")
    try:
        done = export(root, target)
    except BundleError as e:
        raise CliError(str(e)) from None
    console.print(f"{done.path}: {len(done.files)} files of {args.workspace} "
                  "(without .labrun/, hidden files, caches, environments and key files)", markup=False)
    for rel in done.redacted:  # the agent's names: an escape sequence in one is shown, not run
        console.print(f"  {printable(rel)}: secrets redacted", markup=False)
    for rel in done.left_out:
        console.print(f"  left out: {printable(rel)}", markup=False)
    return 0
