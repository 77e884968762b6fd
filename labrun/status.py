"""`labrun status`: what a session did and spent, read from its files (no Prefect)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from labrun.branches import rerun_pending, summaries
from labrun.journal import phase_usage
from labrun.session import changed_outputs
from labrun.state import load_state
from labrun.usage import Usage
from labrun.workspace import Workspace


def session_status(root: Path) -> dict[str, Any]:
    ws = Workspace(root)
    state, note = load_state(ws)
    phases, total = [], sum((b.archived for b in state.branches), Usage())
    for number, (key, record) in enumerate(state.phases.items(), 1):
        usage = phase_usage(ws.phase_dir(key))
        total += usage
        phases.append({"key": key, "number": number, "status": record.status,
                       "runs": record.runs, "error": record.error, "usage": usage.model_dump()})
    return {
        "session": {
            "id": state.session_id,
            "workspace": str(ws.root),
            "agent": state.agent,
            "model": state.model,
            "budget_usd": state.budget_usd,
            "complete": state.complete,
            "active_phase": state.active_phase,
            "next_action": state.next_action(str(ws.root)),
            "branch": state.branch,
        },
        "idea": {"title": state.title, "path": state.idea_path, "domain": state.domain,
                 "sha256": state.idea_hash},
        "phases": phases,
        "attempts": [
            {"n": a.n, "phase": a.phase, "status": a.status, "command": a.command,
             "error": a.error, "fix_applied": a.fix_applied, "metrics": a.metrics,
             "outputs": a.outputs, "exit_code": a.exit_code, "duration_s": a.duration_s,
             "log": a.log, "branch": a.branch}
            for a in state.attempts
        ],
        "usage": total.model_dump(),
        "notes": [note] if note else [],
        "branches": summaries(ws, state, total),
    }


def finished_and_intact(root: Path) -> bool:
    """Complete, and no finished phase's outputs changed since: a resume has nothing to do."""
    ws = Workspace(root)
    state, _ = load_state(ws)
    if not state.complete or rerun_pending(ws, state):
        return False
    for key in state.phases:
        manifest_file = ws.phase_dir(key) / "manifest.json"
        if not manifest_file.exists():
            return False
        if changed_outputs(json.loads(manifest_file.read_text()), state.file_digests, ws.root):
            return False
    return True
