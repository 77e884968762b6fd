"""Review by a person between phases.

A session names the phases a person reviews (`review_after`). When one of them completes,
the flow asks for a review and nothing runs until it is given:

- a deployment run suspends itself (`suspend_flow_run` waiting for a `ReviewInput`): it
  holds no worker and no process, and the Prefect UI's Resume form takes the decision;
- a run in a terminal ends; `labrun review DIR` records the decision and goes on.

A decision is made in two saved steps: recorded (`decided_at`), then applied (`applied`).
An approval lets the next phase start, its comment in every later phase's prompt; a revision
sends the phase back to the agent as a new message of the same conversation, and the phase
is reviewed again once it completes; a stop ends the session. A crash between the two steps
applies the decision on the next run, once; one before the first leaves the review waiting.
"""

from __future__ import annotations

import getpass
from typing import Any, Literal

from labrun import prompts
from labrun.artifacts import read_agent_text
from labrun.crashpoints import crashpoint
from labrun.journal import Conversation, UserRecord
from labrun.phase_registry import BY_KEY
from labrun.state import Review, SessionState, now
from labrun.workspace import Workspace

GateResult = Literal["approved", "revised", "stopped", "waiting"]
"""What the flow does after a reviewed phase: go on, run it again, end, or end to wait."""
RESULTS: dict[str, GateResult] = {"approve": "approved", "revise": "revised", "stop": "stopped"}
"""What each decision, once applied, has the flow do."""


def review_round(state: SessionState, phase: str) -> int:
    """1, and one more for every revision applied: the phase's cache key has it."""
    return 1 + sum(r.applied and r.decision == "revise" for r in state.reviews_of(phase))


def record(store, review: Review, decision: str, text: str, reviewer: str) -> None:
    """Step one: the decision, saved (`store`: the session's `StateStore`)."""
    review.decision, review.text = decision, " ".join(text.split()) if decision == "approve" else text.strip()
    review.reviewer, review.decided_at = reviewer or "unknown", now()
    said = f": {review.text}" if review.text else ""
    store.log(f"review of {review.phase} (round {review.round}): {decision} by {review.reviewer}{said}")
    crashpoint("review-decided")


def apply(session, number: int, review: Review) -> GateResult:
    """Step two: what the decision does, once."""
    if review.decision == "revise":
        convo = Conversation.latest(session.ws.phase_dir(review.phase))
        mark = f"{review.branch}-{review.phase}-{review.round}"
        if not any(r.revision == mark for r in convo.of(UserRecord)):
            convo.append(UserRecord(revision=mark, content=[{"type": "text", "text": prompts.revision(
                review.phase, review.text, list(session.state.phases))}]))
    review.applied = True
    event = {"approve": f"phase {number} {review.phase} approved; the session goes on",
             "revise": f"phase {number} {review.phase} goes back to the agent with the reviewer's revision",
             "stop": f"the session stopped after phase {number} {review.phase}, as {review.reviewer} decided"}
    session.store.log(event[review.decision])
    crashpoint("review-applied")
    return RESULTS[review.decision]


def os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def description(state: SessionState, root, review: Review) -> str:
    """What to read before deciding (`labrun review DIR`, the Resume form), in markdown."""
    before = [r for r in state.reviews_of(review.phase) if r.round == review.round - 1]
    return prompts.env.get_template("review.md.j2").render(
        review=review, state=state, root=str(root), manifest=_manifest(root, review.phase),
        show_plan=review.phase == "planning", revision=before[-1].text if before else "").strip()


def reading(root, phase: str) -> str:
    """What the phase wrote for the reviewer to read, in Markdown: its Markdown files (its own
    first: planning.md, REPORT.md), each under its path, as the workspace holds them (no link
    followed), redacted; empty when it wrote none."""
    files = list(_manifest(root, phase).get("files", {}))
    own = [f for f in (BY_KEY[phase].hands_on if phase in BY_KEY else ()) if f in files]
    texts = [(f, read_agent_text(root, f)) for f in own + [f for f in files if f.endswith(".md") and f not in own]]
    return "\n\n".join(f"## `{f}`\n\n{text.strip()}" for f, text in texts if text is not None)


def excerpt(text: str, chars: int) -> tuple[str, int]:
    """`text` cut at a line's end within `chars` (a code block left open is closed), and the
    number of lines cut off."""
    if len(text) <= chars:
        return text, 0
    shown = text[:chars].rsplit("\n", 1)[0]
    cut = len(text[len(shown):].strip("\n").splitlines())
    if sum(line.lstrip().startswith("```") for line in shown.splitlines()) % 2:
        shown += "\n```"
    return shown, cut


def _manifest(root, phase: str) -> dict[str, Any]:
    return Workspace(root).manifest(phase) or {}
