"""The research session flow: the session's phases as cached tasks, in order.

Every run of a session (a fresh `labrun resume`, a Retry pressed in the Prefect UI, a
deployment re-run) walks the same phase tasks, the list the session was started with (the
six research phases unless `with_phases` added optional ones); the cache skips finished
ones, and a phase whose outputs changed on disk runs again, with everything after it.
"""

from __future__ import annotations

import errno
import logging
from typing import Any

from prefect import flow
from prefect.context import FlowRunContext, TaskRunContext
from prefect.exceptions import TerminationSignal
from prefect.logging.handlers import APILogHandler
from prefect.states import State

from labrun.agents import AgentUnavailable, require_priced
from labrun.artifacts import SessionArtifacts
from labrun.branches import finish_rerun, rerun
from labrun.keys import unset, unset_line
from labrun.model import UsageWindowSpent
from labrun.session import Session
from labrun.state import FlowRunRecord
from labrun.status import session_status
from labrun.windows import wait_out
from labrun.phases.phase import manifest_digest, phase_version, run_phase


class _RunLogHandler(APILogHandler):
    """Sends labrun's progress (engine events, turns) to the Prefect run it happens in, so it
    shows in the run's logs in the UI; outside a run it is silent."""

    def emit(self, record: logging.LogRecord) -> None:
        if TaskRunContext.get() or FlowRunContext.get():
            super().emit(record)


_labrun_log = logging.getLogger("labrun")
if not any(isinstance(h, APILogHandler) for h in _labrun_log.handlers):  # PREFECT_LOGGING_EXTRA_LOGGERS
    _labrun_log.addHandler(_RunLogHandler())


class SessionStopped(Exception):
    """The session stopped short; the message says why and how to resume."""


@flow(name="research-session", log_prints=True, persist_result=False)
def research_session(
    idea_path: str | None,
    workspace: str,
    agent: str | None = None,
    model: str | None = None,
    budget_usd: float | None = None,
    max_turns: int | None = None,
    with_phases: list[str] | None = None,
    paper_style: str | None = None,
    network: bool | None = None,
    from_phase: str | None = None,
    note: str | None = None,
    pass_env: list[str] | None = None,
) -> dict[str, Any]:
    """`with_phases`: optional phases a new session runs too (e.g. ["resources", "paper"]),
    besides those its idea asks for; `paper_style`: the paper phase's LaTeX style (plain by
    default). A session keeps the phases and the style it started with. `network`: False
    runs the agent's commands without network from now on. `pass_env`: names of keys (API
    keys, tokens) the experiments' commands get besides the idea's `constraints.api_keys`;
    the session keeps them, and a resume adds to them (their values come from this process's
    environment: a worker's, for a deployment run).

    `from_phase`: start a new branch of a session at this finished phase (`labrun rerun`):
    the phases before it are reused, it and the later ones run again with `agent` and `model`;
    `note` says why. A retry of this run continues the branch it started."""
    rerunning = bool(from_phase)  # the branch gets agent and model; the earlier one keeps its own
    session = Session.open(workspace, idea_path, None if rerunning else agent, None if rerunning else model,
                           budget_usd, max_turns, with_phases or (), paper_style, network, pass_env or ())
    try:
        if rerunning:
            rerun(session, from_phase, agent, model, note or "", _flow_run_id(), session_status)
        else:
            finish_rerun(session)  # a rerun cut short by a crash
    except BaseException:
        session.close()
        raise
    artifacts = SessionArtifacts.attach(session)  # STATE.md, attempts, progress, usage in the UI
    try:
        _record_flow_run(session)
        return run_session(session)
    except KeyboardInterrupt as e:  # labrun.interrupts.Interrupted names the signal
        _record_interruption(session, str(e) or "Ctrl-C (SIGINT)")
        raise
    except TerminationSignal:  # Prefect's own SIGTERM handler during a flow run
        _record_interruption(session, "SIGTERM")
        raise
    finally:
        artifacts.close()
        session.close()


def run_session(session: Session) -> dict[str, Any]:
    store, ws = session.store, session.ws
    store.log(f"session run started (agent {session.state.agent})")
    # A deployment run comes here without the command line's checks.
    require_priced(session.state.agent, session.state.model, session.state.budget_usd)
    if missing := unset_line(unset(session.experiment_keys())):
        logging.getLogger("labrun").warning("%s", missing)
    upstream: list[str] = []
    refresh = False
    kept = session.state.branches[-1].kept if session.state.branches else {}
    for number, phase in enumerate(session.phases, 1):
        changed = session.stale_outputs(phase.key)
        if changed:
            store.log(f"phase {number} {phase.key}: outputs changed ({', '.join(changed[:5])}); running it again")
        refresh = refresh or bool(changed)
        task = run_phase.with_options(result_storage=ws.results, refresh_cache=refresh)
        params = dict(
            session_id=session.state.session_id,
            workspace=str(ws.root),
            phase_key=phase.key,
            number=number,
            version=phase_version(phase.key),
            upstream="-".join(upstream) or "none",
            rerun=refresh,
            branch=session.state.branch,
            kept=kept.get(phase.key),
        )
        state: State = task(**params, return_state=True)
        while isinstance(spent := _exception(state), UsageWindowSpent):
            # On a worker this reschedules the flow run for the reset time and exits instead.
            wait_out(spent, f"phase {number} {phase.key}", store)
            state = task(**params, return_state=True)  # resumes the phase from its journal
        if not state.is_completed():
            error = _reason(state)
            store.set_phase(phase.key, "FAILED", f"phase {number} {phase.key} failed: {error}", error)
            if isinstance(_exception(state), AgentUnavailable):
                raise _exception(state)  # its message says what to install or run
            raise SessionStopped(f"phase {phase.key} stopped: {error}")
        manifest = state.result()
        cached = state.name == "Cached"
        if cached:
            event = f"phase {number} {phase.key} skipped (finished earlier)"
        else:
            event = f"phase {number} {phase.key} finished"
        store.set_phase(phase.key, "DONE", event)
        upstream.append(manifest_digest(manifest))
    store.log("session complete")
    return {"session": session.state.session_id, "complete": True}


def _record_flow_run(session: Session) -> None:
    """So that `labrun status` can say how to retry a deployment's run."""
    run = FlowRunContext.get().flow_run
    session.state.last_run = FlowRunRecord(
        id=str(run.id), name=run.name, deployment_id=str(run.deployment_id) if run.deployment_id else None)
    session.store.save()


def _record_interruption(session: Session, reason: str) -> None:
    """In STATE.md, in plain words. Attempts still running are killed and marked as a resume
    would mark them; the phase that was running is FAILED (its task Crashed)."""
    session.reconcile_after_crash()
    running = [(n, p) for n, p in enumerate(session.phases, 1) if session.state.phases[p.key].status == "IN PROGRESS"]
    hint = f"resume with `labrun resume {session.ws.root}`"
    if not running:
        session.store.log(f"session interrupted by {reason}; {hint}")
        return
    number, phase = running[0]
    session.store.set_phase(phase.key, "FAILED", f"phase {number} {phase.key} interrupted by {reason}; {hint}",
                            f"interrupted by {reason}")


def _flow_run_id() -> str | None:
    ctx = FlowRunContext.get()
    return str(ctx.flow_run.id) if ctx and ctx.flow_run else None


def _exception(state: State) -> BaseException | None:
    if state.is_completed():
        return None
    try:
        state.result()
    except BaseException as e:
        return e
    return None


def _reason(state: State) -> str:
    """One line: the phase's own exception carries the reason."""
    e = _exception(state)
    if e is None:
        return state.message or state.name
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return f"the disk is full ({e.filename or 'a write'}: {e.strerror}); free some space"
    return str(e).splitlines()[0] if str(e) else type(e).__name__
