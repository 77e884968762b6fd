"""`labrun review DIR`: what a phase that awaits review produced, and the decision on it.

A session run in a terminal ended to wait: the decision is saved in its state, and the
session goes on here, as `labrun resume` does. A deployment run suspended itself: the
decision goes to it as its run input (what the Prefect UI's Resume form sends), and a
worker goes on with it.
"""

from __future__ import annotations

from pathlib import Path

from labrun.cli.common import CliError, console, labrun_command


def cmd_review(args) -> int:
    from labrun.cli.reading import session_dir
    from labrun.cli.running import Run, _stored_state, check_workspace, run_session
    from labrun.review import description, os_user

    root = session_dir(args.workspace)
    state = _stored_state(root)
    decision, text = _decision(args)
    review = state.awaiting_review
    if review is None:
        raise CliError(f"{args.workspace}: no phase awaits review (next action: {state.next_action(args.workspace)})")
    if decision is None:
        text = description(state, root, review)
        if console.is_terminal:  # rendered for a person; a pipe gets the Markdown itself
            from rich.markdown import Markdown

            console.print(Markdown(text))
        else:
            console.print(text, markup=False, highlight=False)
        command = f"{labrun_command()} review {args.workspace}"
        console.print(f"\n{command} --approve [--comment TEXT]\n{command} --revise TEXT\n{command} --stop")
        return 0
    if review.decision is not None:
        console.print(f"[yellow]note:[/yellow] this review was decided already ({review.decision} by "
                      f"{review.reviewer}, {review.decided_at}); the session goes on with that decision")
    elif review.flow_run and _resume_deployment_run(review.flow_run, decision, text, os_user()):
        return 0
    else:
        _record(root, decision, text, os_user())
        console.print(f"review of {review.phase}: {decision} by {os_user()}, recorded; the session goes on here")
    check_workspace(root)
    return run_session(Run(workspace=args.workspace, verbose=args.verbose))


def _decision(args) -> tuple[str | None, str]:
    chosen = [d for d, given in (("approve", args.approve), ("revise", args.revise is not None),
                                 ("stop", args.stop)) if given]
    if len(chosen) > 1:
        raise CliError(f"--{' and --'.join(chosen)}: give one decision")
    if args.comment and chosen != ["approve"]:
        raise CliError("--comment goes with --approve (a revision's text is --revise TEXT)")
    if chosen == ["revise"] and not args.revise.strip():
        raise CliError("--revise TEXT: say what the agent should change")
    decision = chosen[0] if chosen else None
    return decision, (args.revise if decision == "revise" else args.comment or "")


def _record(root: Path, decision: str, text: str, reviewer: str) -> None:
    """Save the decision in the session's state, under its lock (no engine runs it now)."""
    from labrun.review import record
    from labrun.state import StateStore
    from labrun.workspace import Workspace, WorkspaceBusy

    ws = Workspace(root)
    try:
        ws.lock()
    except WorkspaceBusy as e:
        raise CliError(str(e)) from None
    try:
        store = StateStore.load(ws)
        record(store, store.state.awaiting_review, decision, text, reviewer)
    finally:
        ws.unlock()


def _resume_deployment_run(flow_run: str, decision: str, text: str, reviewer: str) -> bool:
    """Send the decision to the suspended deployment run; False if it no longer waits (the
    decision is then applied here)."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.flow_runs import resume_flow_run
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from labrun.cli.serving import _api_url_for_clients
    from labrun.serving.submit import flow_run_url

    with temporary_settings({PREFECT_API_URL: _api_url_for_clients()}):
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(UUID(flow_run))
        if not run.state or not run.state.is_paused():
            console.print(f"[yellow]note:[/yellow] flow run {run.name} no longer waits "
                          f"({run.state.name if run.state else 'no state'}); the decision is applied here")
            return False
        resume_flow_run(run.id, run_input={"decision": decision, "text": text, "reviewer": reviewer})
        console.print(f"flow run {run.name} resumed with the decision ({decision}); a worker goes on with it\n"
                      f"  {flow_run_url(run.id)}")
    return True
