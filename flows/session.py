"""The research session flow: the session's phases as cached tasks, in order.

Every run of a session (a fresh `labrun resume`, a Retry pressed in the Prefect UI, a
deployment re-run) walks the same phase tasks, the list the session was started with (the
six research phases unless `with_phases` added optional ones); the cache skips finished
ones, and a phase whose outputs changed on disk runs again, with everything after it.
"""

from __future__ import annotations

import errno
import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import flow, get_run_logger
from prefect.context import FlowRunContext, TaskRunContext
from prefect.exceptions import Pause, TerminationSignal
from prefect.logging.handlers import APILogHandler
from prefect.states import State

from labrun.agents.registry import AgentUnavailable
from labrun.agents.backends import require_priced
from labrun.artifacts import SessionArtifacts
from labrun.branches import check_rerun_start, finish_rerun, rerun
from labrun.keys import unset, unset_line
from labrun.machine import compute_warnings
from labrun.model import UsageWindowSpent
from labrun.flows.review import gate
from labrun.review import review_round
from labrun.run_params import RunParams, flow_parameters, session_run_name
from labrun.session import Session
from labrun.state import FlowRunRecord, utc
from labrun.status import nothing_to_do, session_status
from labrun.windows import wait_out
from labrun.phase_registry import phase_version
from labrun.phases.execution import TaskSpec
from labrun.phases.phase import manifest_digest, run_phase


class _RunLogHandler(APILogHandler):
    """Sends labrun's progress (engine events, turns) to the Prefect run it happens in, so it
    shows in the run's logs in the UI; outside a run it is silent."""

    def emit(self, record: logging.LogRecord) -> None:
        if TaskRunContext.get() or FlowRunContext.get():
            super().emit(record)


_labrun_log = logging.getLogger("labrun")
if not any(isinstance(h, APILogHandler) for h in _labrun_log.handlers):  # PREFECT_LOGGING_EXTRA_LOGGERS
    _labrun_log.addHandler(_RunLogHandler())
# On a worker nothing else sets it, and Prefect's root logger (WARNING) would drop every event.
if _labrun_log.level == logging.NOTSET:
    _labrun_log.setLevel(logging.INFO)


def _run_name() -> str:
    """Every run of a session, however started, is named after its workspace, as `labrun
    queue` names them, so that the UI lists a session's runs together."""
    from prefect.runtime import flow_run

    workspace = flow_run.parameters.get("workspace")  # checked after the name is given
    return session_run_name(workspace) if isinstance(workspace, str) and workspace else "research-session"


class SessionStopped(Exception):
    """The session stopped short; the message says why and how to resume."""


@flow(name="research-session", flow_run_name=_run_name, log_prints=True, persist_result=False)
@flow_parameters()
def research_session(**params: Any) -> State:
    """A research session: a new one from `idea_path` in `workspace`, or the one there resumed
    (a retry of a run continues the branch it started). The run's result is a dict (complete,
    awaiting_review, stopped_by_review); its state's message says how the session came out."""
    # Without one the parameter holds its `Field` (`flow_parameters`), or is absent.
    if not isinstance(params.get("workspace"), str) or not params["workspace"]:
        raise SessionStopped(
            "this run names no workspace: give the parameters workspace (and idea_path for a new session); "
            "a schedule made with `prefect deployment schedule create` passes none (see docs/server-mode.md, "
            "Scheduling a session)")
    run = RunParams(**params)
    workspace, from_phase = run.workspace, run.from_phase
    if not from_phase and (reason := nothing_to_do(Path(workspace), run.idea_path)):
        get_run_logger().info("%s: %s; nothing to do", workspace, reason)
        return _ended(Path(workspace), {"complete": True}, f"nothing to do: {reason}")
    rerunning = bool(from_phase)  # the branch gets agent and model; the earlier one keeps its own
    if rerunning:
        check_rerun_start(Path(workspace), from_phase)  # before anything is written
    if run.experiments_pool:
        _check_pool(run.experiments_pool, run.experiments_storage, workspace)  # before anything is written
    session = Session.open(run.model_copy(update={"agent": None, "model": None}) if rerunning else run)
    try:
        if (pool := session.state.experiments_pool) and (pool, session.state.experiments_storage) != \
                (run.experiments_pool, run.experiments_storage):  # the idea's, or kept
            _check_pool(pool, session.state.experiments_storage, workspace)
        if rerunning:
            rerun(session, from_phase, run.agent, run.model, run.note or "", _flow_run_id(), session_status)
        else:
            finish_rerun(session)  # a rerun cut short by a crash
    except BaseException:
        session.close()
        raise
    artifacts = SessionArtifacts.attach(session)  # STATE.md, attempts, progress, usage in the UI
    try:
        _record_flow_run(session)
        _crash_left_attempts(session)
        return _ended(session.ws.root, run_session(session))
    except KeyboardInterrupt as e:  # labrun.interrupts.Interrupted names the signal
        _record_interruption(session, str(e) or "Ctrl-C (SIGINT)")
        raise
    except TerminationSignal:  # Prefect's own SIGTERM handler during a flow run
        _record_interruption(session, _termination_reason())
        raise
    except Pause as e:  # suspended: by its review gate (recorded there), or from the Prefect UI
        if session.state.awaiting_review is None:
            _record_suspension(session, e)
        raise
    finally:
        artifacts.close()
        session.close()


def _check_pool(pool: str, storage: str | None, workspace: str) -> None:
    """The work pool the attempts go to, before anything runs: an unknown one is refused (in
    one line: `PoolError`), as is storage the engine cannot use; one without a worker is said
    (`labrun.serving.pools`)."""
    from labrun.serving.pools import check_pool

    if warning := check_pool(pool, storage, workspace):
        logging.getLogger("labrun").warning("%s", warning)


def _ended(root: Path, result: dict[str, Any], head: str | None = None) -> State:
    """The run's Completed state, its message the session's verdict (`labrun.verdicts`), so the
    UI's list of runs says how each came out."""
    from prefect.states import Completed

    if head is None:
        head = ("session complete" if result.get("complete") else
                f"awaits review of phase {result['awaiting_review']}" if result.get("awaiting_review") else
                f"stopped by its reviewer after phase {result.get('stopped_by_review')}")
    try:
        verdict = session_status(root)["verdict"]["line"]
    except Exception as e:  # the verdict is a view: never worth failing a finished run
        verdict = f"no verdict ({type(e).__name__}: {e})"
    return Completed(message=f"{head}; {verdict}", data=result)


def run_session(session: Session) -> dict[str, Any]:
    store = session.store
    store.log(f"session run started (agent {session.state.agent})")
    # A deployment run comes here without the command line's checks.
    require_priced(session.state.agent, session.state.model, session.state.budget_usd)
    if FlowRunContext.get().flow_run.deployment_id:  # `labrun run` said these before it started
        for warning in session.idea.warnings + compute_warnings(session.idea):
            logging.getLogger("labrun").warning("idea: %s", warning)
    if missing := unset_line(unset(session.confinement.experiment_keys())):
        logging.getLogger("labrun").warning("%s", missing)
    upstream: list[str] = []
    refresh = False
    pinned = session.state.branches[-1].pinned if session.state.branches else {}
    for number, phase in enumerate(session.phases, 1):
        changed = session.stale_outputs(phase.key)
        if changed:
            store.log(f"phase {number} {phase.key}: outputs changed ({', '.join(changed[:5])}); running it again")
        refresh = refresh or bool(changed)
        while True:  # once, and again for each revision a reviewer asks for
            manifest = _run_phase(session, number, phase.key, upstream, refresh, pinned.get(phase.key))
            outcome = gate(session, number, phase.key, manifest) if phase.key in session.state.review_after else "approved"
            if outcome != "revised":
                break
        if outcome == "waiting":
            return {"session": session.state.session_id, "complete": False, "awaiting_review": phase.key}
        if outcome == "stopped":
            return {"session": session.state.session_id, "complete": False, "stopped_by_review": phase.key}
        upstream.append(manifest_digest(manifest))
    store.log("session complete")
    return {"session": session.state.session_id, "complete": True}


def _run_phase(session: Session, number: int, key: str, upstream: list[str], refresh: bool,
               pinned_key: str | None) -> dict[str, Any]:
    """The phase's task, to its manifest (from the cache when it finished earlier)."""
    store = session.store
    task = run_phase.with_options(result_storage=session.ws.results, refresh_cache=refresh)
    params = dict(
        spec=TaskSpec.of(session),
        phase_key=key,
        number=number,
        version=phase_version(key),
        upstream="-".join(upstream) or "none",
        refresh=refresh,
        branch=session.state.branch,
        pinned_key=pinned_key,
        review_round=review_round(session.state, key),
    )
    state: State = task(**params, return_state=True)
    while isinstance(spent := _exception(state), UsageWindowSpent):
        # On a worker this reschedules the flow run for the reset time and exits instead.
        wait_out(spent, f"phase {number} {key}", store)
        state = task(**params, return_state=True)  # resumes the phase from its journal
    if not state.is_completed():
        error = _reason(state)
        store.set_phase(key, "FAILED", f"phase {number} {key} failed: {error}", error)
        if isinstance(_exception(state), AgentUnavailable):
            raise _exception(state)  # its message says what to install or run
        raise SessionStopped(f"phase {key} stopped: {error}")
    if state.name == "Cached":
        event = f"phase {number} of {len(session.phases)} {key} skipped (finished earlier)"
    else:
        event = f"phase {number} of {len(session.phases)} {key} finished"
    store.set_phase(key, "DONE", event)
    return state.result()


def _record_flow_run(session: Session) -> None:
    """So that `labrun status` can say how to retry a deployment's run."""
    run = FlowRunContext.get().flow_run
    with session.store.transaction() as state:
        state.last_run = FlowRunRecord(
            id=str(run.id), name=run.name, deployment_id=str(run.deployment_id) if run.deployment_id else None)


def _crash_left_attempts(session: Session) -> None:
    """A killed engine leaves its attempts' task runs Running in Prefect: each one whose
    attempt the session now calls INTERRUPTED is set Crashed, so the UI agrees with STATE.md."""
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    left = [a for a in session.state.attempts if a.status == "INTERRUPTED" and a.task_run]
    if not left:
        return
    try:
        with get_client(sync_client=True) as client:
            for a in left:
                if not client.read_task_run(UUID(a.task_run)).state.is_final():
                    client.set_task_run_state(UUID(a.task_run), Crashed(
                        message=f"attempt {a.n}: the engine running it stopped; the session marked it INTERRUPTED"),
                        force=True)
    except Exception as e:  # the UI's view is never worth a session
        logging.getLogger("labrun").warning("could not mark the killed attempts' task runs Crashed: %s", e)


def _record_interruption(session: Session, reason: str) -> None:
    """In STATE.md, in plain words. Attempts still running are killed and marked as a resume
    would mark them (unless LABRUN_KEEP_EXPERIMENTS=on); the phase that was running is
    INTERRUPTED (its task Crashed)."""
    session.records.reconcile(interrupted=True)
    running = [(n, p) for n, p in enumerate(session.phases, 1) if session.state.phases[p.key].status == "IN PROGRESS"]
    hint = f"resume with `labrun resume {session.ws.root}`"
    if not running:
        session.store.log(f"session interrupted by {reason}; {hint}")
        return
    number, phase = running[0]
    session.store.set_phase(phase.key, "INTERRUPTED", f"phase {number} {phase.key} interrupted by {reason}; {hint}",
                            f"interrupted by {reason}")


def _record_suspension(session: Session, pause: Pause) -> None:
    """The run was suspended from the Prefect UI (Suspend in the classic UI, Pause in the new
    one: both set its state Suspended through the API). Prefect refuses its next task, and
    this process ends: the phase stays IN PROGRESS, to go on from its journal when the run is
    resumed or retried. STATE.md says so, and until when Prefect waits for the Resume."""
    from prefect.client.orchestration import get_client

    state = pause.state  # the refusal of the next task, with the suspension's timeout
    try:
        with get_client(sync_client=True) as client:  # the Suspended state itself: when it was set
            state = client.read_flow_run(FlowRunContext.get().flow_run.id).state or state
    except Exception as e:  # the times are a view: never worth the record
        logging.getLogger("labrun").warning("could not read the suspended run's state: %s", e)
    session.records.reconcile()  # an attempt whose task Prefect refused never ran
    with session.store.transaction() as s:
        run = s.last_run
        if run is None:
            return
        run.suspended_at = utc(state.timestamp) if state else utc(datetime.now(timezone.utc))
        timeout = state.state_details.pause_timeout if state else None
        run.resume_by = utc(timeout) if timeout else None
        session.store.event(f"flow run {run.name} suspended from the Prefect UI at {run.suspended_at}; "
                            "stopped before its next step, to go on when the run is resumed or retried")


CANCELLED = "a cancellation of its flow run in Prefect (the UI's Cancel)"


def _termination_reason() -> str:
    """What Prefect's SIGTERM stands for: a worker stopping a cancelled run tells the run's
    process so before it signals it (Prefect's attempt control channel); else a SIGTERM."""
    try:
        from prefect._internal.control_listener import get_intent
    except ImportError:  # a Prefect without that channel: a cancellation reads as SIGTERM
        return "SIGTERM"
    return CANCELLED if get_intent() == "cancel" else "SIGTERM"


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
