"""A review's Prefect side (`labrun.review` has the rest): the Resume form, and the gate
after a reviewed phase, which suspends a deployment run until the decision comes. The form
shows what the reviewer reads (the plan's text, the analysis), cut to FORM_CHARS; the whole is
the session's `-review` artifact, linked from the form."""

from __future__ import annotations

import logging
import uuid

from prefect.context import FlowRunContext
from prefect.flow_runs import suspend_flow_run
from prefect.input import RunInput
from pydantic import Field, ValidationError

from labrun.artifacts import artifact_key, artifact_url, publish_markdown, untrusted_markdown
from labrun.secrets import redact
from labrun.review import RESULTS, GateResult, apply, description, excerpt, reading, record, review_round
from labrun.state import Review, ReviewDecision

UI_REVIEWER = "the Prefect UI"
FORM_CHARS = 6000
"""Of what the reviewer reads, the Resume form shows this much; the artifact holds the whole."""


class ReviewInput(RunInput):
    """The Prefect UI's Resume form for a phase that awaits review (and what `labrun review`
    sends a suspended deployment run)."""

    decision: ReviewDecision = Field(
        description="approve: go on to the next phase; revise: send this phase back to the agent with "
                    "the text; stop: end the session here")
    text: str = Field(default="", description="approve: a comment every later phase's prompt shows; "
                                              "revise: what to change")
    reviewer: str = Field(default=UI_REVIEWER, description="who reviews (recorded in STATE.md)")


def gate(session, number: int, phase: str, manifest: dict) -> GateResult:
    """After `phase` completed (with `manifest`): go on, run it again with a revision, stop,
    or wait."""
    state, store = session.state, session.store
    reviews = state.reviews_of(phase)
    last = reviews[-1] if reviews else None
    if last is None or (last.applied and last.decision == "revise"):  # the phase completed: ask
        last = Review(phase=phase, branch=state.branch, round=review_round(state, phase),
                      outputs=list(manifest.get("files", {})))
        state.reviews.append(last)
        store.log(f"phase {number} {phase} awaits review: `labrun review {session.ws.root}`")
    if last.applied:
        return RESULTS[last.decision]
    if last.decision is None:
        given = _wait_on_worker(session, last) if _deployment_run() else None
        if given is None:
            return "waiting"
        record(store, last, given.decision, given.text, given.reviewer)
    return apply(session, number, last)


def _deployment_run() -> bool:
    ctx = FlowRunContext.get()
    return bool(ctx and ctx.flow_run and ctx.flow_run.deployment_id)


def _wait_on_worker(session, review: Review) -> ReviewInput | None:
    """Suspend this deployment run until the review comes (this process then exits); on the
    run that the Resume starts, the same suspension returns the decision. A run started again
    any other way (a Retry pressed meanwhile) finds none, and suspends anew."""
    form = ReviewInput.with_initial_data(description=form_description(session.state, session.ws.root, review))
    run = str(FlowRunContext.get().flow_run.id)
    while True:
        if review.pause_key is None or review.flow_run != run:  # this run's own suspension
            with session.store.transaction():
                review.pause_key = f"review-{review.branch}-{review.phase}-{review.round}-{uuid.uuid4().hex[:8]}"
                review.flow_run = run
        try:
            return suspend_flow_run(wait_for_input=form, key=review.pause_key)
        except ValidationError:  # resumed without a decision: not by a Resume
            logging.getLogger("labrun").info("phase %s still awaits review; suspending again", review.phase)
            review.pause_key = None


def form_description(state, root, review: Review) -> str:
    """The Resume form's Markdown: the review's summary (`labrun.review.description`), then
    what the phase wrote for the reviewer, cut to FORM_CHARS with a link to the whole; all but
    that link redacted and made safe for the browser (`untrusted_markdown`): the summary quotes
    the agent too."""
    head = untrusted_markdown(redact(description(state, root, review)))
    text = reading(root, review.phase)
    if not text:
        return head
    published = publish_markdown(state.title, state.session_id, "review", text,
                                 f"What the reviewer of phase {review.phase} reads (round {review.round}): "
                                 f"session {state.session_id}")
    shown, cut = excerpt(untrusted_markdown(text), FORM_CHARS)
    key = artifact_key(state.title, state.session_id, "review")
    url = artifact_url(published) if published else None
    whole = (f"[the artifact {key}]({url}), on the run's Artifacts tab" if url else
             f"the artifact {key}, on the run's Artifacts tab" if published else "in the workspace, in the files named above")
    tail = f"\n\n**{cut} more lines:** the whole text is {whole}." if cut else ""
    return f"{head}\n\n---\n\n{shown}{tail}"
