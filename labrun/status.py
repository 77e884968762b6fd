"""`labrun status`: what a session did and spent, read from its files (no Prefect)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from labrun.branches import BranchError, archive_dir, no_branch, rerun_pending, summaries
from labrun.journal import phase_usage
from labrun.plan import summary as plan_summary
from labrun.limits import total_usage
from labrun.session import changed_outputs
from labrun.live import live
from labrun.state import SessionState, live_line, load_state, session_clock
from labrun.usage import Usage
from labrun.verdicts import Outcome, outcome
from labrun.workspace import Workspace


def session_status(root: Path) -> dict[str, Any]:
    ws = Workspace(root)
    state, note = load_state(ws)
    phases, total = [], sum((b.archived for b in state.branches), Usage())
    older = older_prompts(ws, state)
    for number, (key, record) in enumerate(state.phases.items(), 1):
        usage = phase_usage(ws.phase_dir(key))
        total += usage
        phases.append({"key": key, "number": number, "status": record.status, "runs": record.runs,
                       "error": record.error, "usage": usage.model_dump(), "older_prompt": key in older})
    return {
        "session": {
            "id": state.session_id,
            "workspace": str(ws.root),
            "agent": state.agent,
            "model": state.model,
            "budget_usd": state.budget_usd,
            "paper_style": state.paper_style,
            "complete": state.complete,
            "active_phase": state.active_phase,
            "next_action": state.next_action(str(ws.root)),
            "branch": state.branch,
            "clock": session_clock(state, total.cost_usd),
            "review_after": state.review_after,
            "awaiting_review": _review(state.awaiting_review),
            "stopped_by_review": _review(state.stopped_by_review),
        },
        "idea": {"title": state.title, "path": state.idea_path, "domain": state.domain,
                 "sha256": state.idea_hash},
        "phases": phases,
        "attempts": [
            {"n": a.n, "phase": a.phase, "status": a.status, "run_id": a.run_id, "command": a.command,
             "error": a.error, "fix_applied": a.fix_applied, "metrics": a.metrics,
             "outputs": a.outputs, "exit_code": a.exit_code, "duration_s": a.duration_s,
             "log": a.log, "branch": a.branch, "gpus": a.gpus, "background": a.background, "beside": a.beside,
             "reproduction": a.reproduction.model_dump() if a.reproduction else None}
            for a in state.attempts
        ],
        "running": running_attempts(ws, state),
        "sealed_evaluation": state.sealed.model_dump(exclude={"digests"}) if state.sealed else None,
        "plan": plan_summary(state.plan, state.live_attempts(), ws.root),
        "verdict": session_outcome(ws, state).as_dict(),
        "usage": total.model_dump(),
        "notes": [note] if note else [],
        "branches": summaries(ws, state, total),
        "reviews": [r.model_dump(exclude={"pause_key"}) for r in state.reviews],
    }


def running_attempts(ws: Workspace, state: SessionState) -> list[dict[str, Any]]:
    """Each RUNNING attempt's live view (`labrun.live`), with its phase, command and the view
    in words (`line`)."""
    found = []
    for a in state.attempts:
        if a.status == "RUNNING":
            view = live(ws, a)
            found.append({**view.as_dict(), "line": live_line(view), "phase": a.phase, "command": a.command})
    return found


def session_outcome(ws: Workspace, state: SessionState) -> Outcome:
    """The session's verdict so far (`labrun.verdicts`)."""
    from labrun.idea import load_idea

    return outcome(ws, state, load_idea(ws.idea_copy))


def _review(review) -> dict[str, Any] | None:
    return review.model_dump(exclude={"pause_key"}) if review else None


def older_prompts(ws: Workspace, state: SessionState) -> set[str]:
    """Finished phases whose templates have been reworded since they ran. They stay finished
    (the cache version is what a phase asks, not its wording); the user may redo them."""
    from labrun.idea import load_idea
    from labrun.phase_registry import BY_KEY
    from labrun.prompts import prompt_digest

    done = [k for k, r in state.phases.items() if r.status == "DONE" and k in BY_KEY]
    if not done:
        return set()
    domain = load_idea(ws.idea_copy).guidance_domain
    older = set()
    for key in done:
        manifest = ws.phase_dir(key) / "manifest.json"
        asked = json.loads(manifest.read_text()).get("prompt") if manifest.exists() else None
        if asked is not None and asked != prompt_digest(key, domain):
            older.add(key)
    return older


def nothing_to_do(root: Path, idea_path: str | None = None) -> str | None:
    """Why a run for `root` would do nothing, or None: its session (of this idea, if one is
    named) is finished and intact, or its reviewer stopped it. A scheduled or repeated run
    then writes nothing."""
    ws = Workspace(root)
    if not ws.state_file.is_file():
        return None
    state, _ = load_state(ws)
    if finished_and_intact(root, state):
        reason = "the session is already complete and its outputs are intact"
    elif state.stopped_by_review:
        reason = "its reviewer stopped the session"
    else:
        return None
    if idea_path is not None:
        from labrun.idea import load_idea

        if load_idea(idea_path).content_hash != state.idea_hash:
            return None
    return reason


def finished_and_intact(root: Path, state: SessionState | None = None) -> bool:
    """Complete, and no finished phase's outputs changed since, nor what it asks (its cache
    version, unless a rerun pinned it): a resume has nothing to do. `state`: the session's,
    when the caller has read it already."""
    from labrun.phase_registry import phase_version

    ws = Workspace(root)
    if state is None:
        state, _ = load_state(ws)
    if not state.complete or rerun_pending(ws, state):
        return False
    pinned = state.branches[-1].pinned if state.branches else {}
    for key in state.phases:
        manifest_file = ws.phase_dir(key) / "manifest.json"
        if not manifest_file.exists():
            return False
        manifest = json.loads(manifest_file.read_text())
        if changed_outputs(manifest, state.file_digests, ws.root):
            return False
        if key not in pinned and f"-{key}-{phase_version(key)}-" not in manifest.get("key", ""):
            return False
    return True


def branch_status(root: Path, n: int) -> dict[str, Any]:
    """`labrun status --branch N`: the current branch as it is, an earlier one as it stood
    when the next replaced it."""
    ws = Workspace(root)
    state, _ = load_state(ws)
    if n == state.branch:
        return session_status(root)
    snapshot = archive_dir(ws, n) / "status.json"
    if not 1 <= n < state.branch or not snapshot.exists():
        raise BranchError(no_branch(root, state, n))
    report = json.loads(snapshot.read_text())
    report["session"]["branch"] = n
    report["branches"] = summaries(ws, state, total_usage(ws, state))
    return report
