"""A phase as a cached Prefect task: it gives the agent only this phase's prompt, runs the
conversation (continuing a half-done one), and returns a manifest of what it produced.

The cache key is the session, the phase, the phase's version and the digests of the
upstream manifests, never the flow run, so any later run of the session skips it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from prefect import task

from labrun import prompts
from labrun.agents.backends import make_agent
from labrun.crashpoints import crashpoint
from labrun.journal import Conversation, SystemRecord, UserRecord, phase_usage
from labrun.session import Session
from labrun.secrets import redact
from labrun.snapshot import workspace_files
from labrun.phase_registry import BY_KEY, Phase
from labrun.phases.attempts import PhaseAttempts
from labrun.phases.execution import TaskSpec
from labrun.phases.report_header import stamp_report
from labrun.phases.reproduction import reproduce
from labrun.phases.sealed_scoring import score_sealed
from labrun.tools import ToolBox


ENGINE_STEPS = {"experiments": (reproduce, score_sealed), "analysis": (reproduce, score_sealed),
                "documentation": (stamp_report,)}
"""What the engine does itself once the agent has completed a phase, before its outputs are
recorded: it reruns the attempts behind the claims and scores the sealed evaluation's
artifact (each only once for what it already did), and heads REPORT.md with the results as
its records hold them."""


def engine_steps(session: Session, phase_key: str) -> list:
    """The phase's engine steps; every phase after documentation (the paper) may edit
    REPORT.md, so each stamps its header again, last: no phase can edit it away."""
    steps = list(ENGINE_STEPS.get(phase_key, ()))
    order = list(session.state.phases)
    if "documentation" in order and order.index(phase_key) > order.index("documentation"):
        steps.append(stamp_report)
    return steps


def toolbox(session: Session, phase: Phase) -> ToolBox:
    """The agent's tools for one phase; its experiment attempts are Prefect subtasks."""
    return ToolBox(session, phase, PhaseAttempts(session, phase.key))


def manifest_digest(manifest: dict[str, Any]) -> str:
    produced = {"files": manifest["files"], "sections": manifest["sections"]}
    return hashlib.sha256(json.dumps(produced, sort_keys=True).encode()).hexdigest()[:16]


def _cache_key(context, p: dict[str, Any]) -> str:
    """`pinned_key`: the key a phase that a rerun reuses finished under. A phase that a rerun runs
    again has its branch in the key (branch 1's keys are those of a session that never reran),
    and one that a reviewer sent back has its review round (`labrun.review`)."""
    if p.get("pinned_key"):
        return p["pinned_key"]
    branch = f"-b{p['branch']}" if p.get("branch", 1) > 1 else ""
    revised = f"-r{p['review_round']}" if p.get("review_round", 1) > 1 else ""
    return f"labrun-{p['spec'].session_id}-{p['phase_key']}-{p['version']}-{p['upstream']}{branch}{revised}"


def reattach(tools: ToolBox, convo: Conversation) -> list[dict[str, Any]]:
    """Answer the tool calls a stopped engine cut off, and return those answered as
    interrupted. An attempt whose command ran on under its supervisor (left RUNNING:
    `AttemptRecords.reconcile`) is re-attached: waited for, or found ended, and recorded once;
    its `run_experiment` call gets its real result. One run in the background is followed in
    the background again. Any other call is answered as cut off."""
    session, phase = tools.session, tools.phase
    running = [a for a in session.state.attempts if a.status == "RUNNING" and a.phase == phase.key]
    interrupted = []
    for block in convo.unanswered_tool_uses():
        its = [a for a in running if block["input"].get("command") == a.command]
        if block["name"] == "run_experiment" and its:
            running.remove(its[0])
            attempt = tools.experiments.adopt(its[0].n)
            convo.add_tool_result(block["id"], block["name"], redact(tools.attempt_report(attempt, prompts.reattached_tool(attempt.status == "RUNNING"))),
                                  attempt.status == "INTERRUPTED")
            continue
        convo.add_tool_result(block["id"], block["name"], prompts.interrupted_tool(block["name"]), True)
        interrupted.append(block)
    for attempt in running:  # no call left to answer (in the background, or a coding CLI's): recorded all the same
        tools.experiments.adopt(attempt.n)
    return interrupted


@task(
    name="phase",
    task_run_name="{number}-{phase_key}",
    cache_key_fn=_cache_key,
    persist_result=True,
)
def run_phase(spec: TaskSpec, phase_key: str, number: int, version: str,
              upstream: str, refresh: bool = False, branch: int = 1,
              pinned_key: str | None = None, review_round: int = 1) -> dict[str, Any]:
    """`spec`: the session, under the lease of the engine that holds its workspace (the agent's
    tools record into its state as they go). `refresh`: the phase must run again (its outputs,
    or an upstream phase's, changed). `branch`, `pinned_key` and `review_round`: see
    `_cache_key`."""
    session = Session.attach(spec, writing=True)
    try:
        return _run(session, spec, phase_key, number, version, upstream, refresh, branch, pinned_key, review_round)
    finally:
        session.close()


def _run(session: Session, spec: TaskSpec, phase_key: str, number: int, version: str, upstream: str,
         refresh: bool, branch: int, pinned_key: str | None, review_round: int) -> dict[str, Any]:
    session.ws.check_disk()
    phase = BY_KEY[phase_key]
    phase_dir = session.ws.phase_dir(phase_key)
    key = _cache_key(None, {"spec": spec, "phase_key": phase_key, "version": version,
                            "upstream": upstream, "branch": branch, "pinned_key": pinned_key,
                            "review_round": review_round})
    order = list(session.state.phases)
    record = session.state.phases[phase_key]
    record.runs += 1
    convo = Conversation.latest(phase_dir)
    if convo is not None and convo.completed and convo.completed.get("key") == key \
            and not refresh:
        # Finished, but the engine died before Prefect committed the result.
        session.store.set_phase(phase_key, "IN PROGRESS", f"phase {number} {phase_key} found finished in its journal")
        return convo.completed
    cut = convo.cut_call() if convo is not None else None
    if cut is not None:
        # Saved before the journal moves on past the cut call, so that it is said once at least.
        session.store.log(f"phase {number} {phase_key}: the engine stopped in the model call of turn {cut}; "
                          "if the API had answered it, that reply is lost and its cost is not counted")
    tools = toolbox(session, phase)
    if convo is not None and convo.completed is None and convo.turns:
        interrupted = reattach(tools, convo)
        if convo.revising:
            event = f"phase {number} of {len(order)} {phase_key} revised at turn {convo.turns + 1}, as its reviewer asked"
        else:
            if convo.completion() is None:
                convo.add_user_text(prompts.resume_note(phase_key, [b["name"] for b in interrupted], order))
            event = f"phase {number} of {len(order)} {phase_key} resumed at turn {convo.turns + 1} (run {record.runs})"
    else:
        if convo is None or convo.completed is not None:
            convo = Conversation.start(phase_dir)
        # A phase cut off before its first reply keeps its prompt: the same request is asked again.
        if convo.system is None:
            files_before = workspace_files(session.ws.root)  # what the phase's `setup` puts there is its own
            convo.append(SystemRecord(text=prompts.phase_system_prompt(session, phase_key), files_before=files_before,
                                      prompt=prompts.prompt_digest(phase_key, session.idea.guidance_domain)))
        if not convo.of(UserRecord):
            convo.add_user_text(prompts.kickoff(phase_key, order))
        event = f"phase {number} of {len(order)} {phase_key} started (run {record.runs})"
    session.store.set_phase(phase_key, "IN PROGRESS", event)

    start = convo.system
    error: BaseException | None = None
    try:
        if convo.completion() is None:
            agent = make_agent(session.state.agent, session.state.model, session.ws.root)
            agent.run_phase(tools, convo, start.text, session.limits.max_turns(phase), session.limits.budget())
    except BaseException as e:
        error = e
        raise
    finally:
        tools.experiments.close(error)
    completion = convo.completion()
    for step in engine_steps(session, phase_key):
        step(session)

    files_now = workspace_files(session.ws.root)
    manifest = {
        "phase": phase_key,
        "key": key,
        "summary": completion.get("summary", ""),
        "files": {k: v for k, v in files_now.items() if (start.files_before or {}).get(k) != v},
        "sections": sorted(k for k, v in (completion.get("sections") or {}).items() if v),
        "prompt": start.prompt,  # the templates it was asked with (`labrun status`)
        "usage": phase_usage(phase_dir).model_dump(),
    }
    session.finish_phase(phase_key, manifest)
    convo.complete(manifest)
    crashpoint("phase-end")  # Prefect commits the cached result after this returns
    return manifest
