"""The commands that run a session in this process: `run`, `resume`, `demo`.

Everything that can be refused is checked first, without Prefect: the idea, the workspace,
the agent's credentials, a session that is already complete. Then the Prefect API starts in
the background (unless a server is running already) while labrun imports the engine, and
the session flow runs in the main thread. SIGINT and SIGTERM unwind it (`labrun.interrupts`).
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from rich.markup import escape

from labrun.agents.registry import DEMO_AGENT
from labrun.cli.common import DEFAULT_AGENT, CliError, console, err, labrun_command, phase_options
from labrun.cli.display import SessionDisplay, summary
from labrun.resources import EXAMPLES
from labrun.run_params import RunParams, session_run_name

DEMO_IDEA = EXAMPLES / "demo_noise_averaging.yaml"
EXIT_AWAITS_REVIEW = 3
"""The run did all it may until a person reviews a phase (`labrun review`)."""
EXIT_STOPPED_BY_REVIEW = 4
"""The session's reviewer ended it."""


class Run(RunParams):
    """A run in this process: the run's parameters, and what the terminal needs besides."""

    verbose: bool = False
    start_again: str = ""
    """The command that starts the session again if it is interrupted before it exists."""


def cmd_run(args) -> int:
    from labrun.idea import IdeaError, load_idea
    from labrun.phase_registry import phase_list

    try:
        idea = load_idea(args.idea)
    except IdeaError as e:
        raise CliError(str(e)) from None
    from labrun.machine import compute_warnings

    for warning in idea.warnings + compute_warnings(idea):
        err.print(f"[yellow]warning:[/yellow] {args.idea}: {escape(warning)}")
    keys = passed_keys(args)
    root = Path(args.workspace)
    check_workspace(root)
    stored = _stored_state(root)
    if stored is not None:
        if stored.idea_hash != idea.content_hash:
            raise CliError(
                f"{args.workspace} already holds a session of another idea ({stored.idea_path}); "
                "use a new --workspace, or `labrun resume` to continue that one"
            )
        if (done := _nothing_to_do(root, args, stored)) is not None:
            return done
        console.print(f"{args.workspace} holds a session of this idea: resuming it.")
    elif root.exists() and any(root.iterdir()):
        console.print(f"[yellow]note:[/yellow] {args.workspace} is not empty; the agent will work beside what is there.")
    if stored is None:
        from labrun.sealed import seal

        try:
            seal(idea, Path(args.idea), root.resolve())  # a sealed evaluation that cannot be kept sealed
        except IdeaError as e:
            raise CliError(str(e)) from None
    agent = args.agent or (DEFAULT_AGENT if stored is None else None)  # a resumed one keeps its own
    with_phases = tuple(phase_options(args.with_phases, args.paper_style, idea.with_phases))
    reviewed = review_after(args, stored.phases if stored else phase_list([*with_phases, *idea.with_phases]))
    if stored is None:
        _estimate(idea, agent, args, with_phases)
    return run_session(Run(idea_path=args.idea, workspace=args.workspace, agent=agent, model=args.model,
                           budget_usd=args.budget_usd, max_turns=args.max_turns, verbose=args.verbose,
                           parallel_attempts=args.parallel_attempts, with_phases=list(with_phases),
                           paper_style=args.paper_style, network=args.network, pass_env=list(keys),
                           review_after=reviewed, experiments_pool=args.experiments_pool,
                           experiments_storage=args.experiments_storage,
                           start_again=f"{labrun_command()} run {args.idea} --workspace {args.workspace}"))


def _estimate(idea, agent: str, args, with_phases: tuple[str, ...]) -> None:
    """What the new session may cost and take (`labrun.estimate`), in its first lines."""
    from labrun.agents.registry import AgentUnavailable
    from labrun.estimate import estimate_lines

    try:
        lines = estimate_lines(idea, agent, args.model, args.budget_usd, with_phases, args.max_turns)
    except AgentUnavailable:
        return  # said in one line when the agent is checked
    for line in lines:
        console.print(line, markup=False)


def cmd_resume(args) -> int:
    from labrun.cli.reading import session_dir

    root = session_dir(args.workspace)
    check_workspace(root)
    keys = passed_keys(args)
    stored = _stored_state(root)
    if (done := _nothing_to_do(root, args, stored)) is not None:
        return done
    reviewed = review_after(args, stored.phases)
    last = stored.last_run
    if last is not None and last.deployment_id:
        console.print(f"[yellow]note:[/yellow] this session's last run was the deployment run {last.name} "
                      f"({last.id}); this resume runs here as a new flow run, also named {session_run_name(root)}, "
                      f"and that one keeps its state in the UI (retry it there instead to resume it on a worker)")
    return run_session(Run(workspace=args.workspace, model=args.model, budget_usd=args.budget_usd,
                           max_turns=args.max_turns, verbose=args.verbose, network=args.network,
                           parallel_attempts=args.parallel_attempts, pass_env=list(keys), review_after=reviewed,
                           experiments_pool=args.experiments_pool, experiments_storage=args.experiments_storage))


def cmd_demo(args) -> int:
    console.print("[bold]labrun demo[/bold]: the whole flow offline, with the scripted agent "
                  "(an offline stand-in for demos and tests, not research).")
    root = Path(args.workspace)
    check_workspace(root)
    if (stored := _stored_state(root)) is not None and (done := _nothing_to_do(root, args, stored)) is not None:
        return done
    return run_session(Run(idea_path=str(DEMO_IDEA), workspace=args.workspace, agent=DEMO_AGENT, verbose=args.verbose,
                           start_again=f"{labrun_command()} demo {args.workspace}"))


def review_after(args, phases=None) -> list[str] | None:
    """`--review-after`, each one of the session's `phases` (None: a phase labrun knows)."""
    from labrun.phase_registry import BY_KEY, review_after_phases

    if args.review_after is None:
        return None
    try:
        return review_after_phases(args.review_after.split(","), list(phases or BY_KEY))
    except ValueError as e:
        raise CliError(f"--review-after: {e}") from None


def passed_keys(args) -> tuple[str, ...]:
    """`--pass-env`, checked: each an environment variable's name, set here (this process's
    environment is the one the experiments' commands get)."""
    from labrun.keys import pass_env_names

    try:
        names = pass_env_names(args.pass_env or ())
    except ValueError as e:
        raise CliError(str(e)) from None
    for name in names:
        if not os.environ.get(name):
            raise CliError(f"--pass-env {name}: not set in this environment; export it first")
    return tuple(names)


def check_workspace(root: Path) -> None:
    """A folder labrun can write, or one it can make: said in one line before anything starts."""
    if root.exists() and not root.is_dir():
        raise CliError(f"{root}: is a file; name a folder for the session")
    nearest = root
    while not nearest.exists():
        nearest = nearest.parent
    from labrun.workspace import Workspace

    data = Workspace(root).data
    for folder in (nearest, data):
        if not folder.is_dir():
            continue
        try:
            fd, probe = tempfile.mkstemp(prefix=".labrun-probe-", dir=folder)
        except OSError as e:
            what = "the folder" if folder in (root, data) else f"its parent {folder}"
            raise CliError(f"{root}: cannot write to {what} ({e.strerror}); use a writable folder") from None
        os.close(fd)
        os.unlink(probe)


def _stored_state(root: Path):
    from labrun.state import load_state
    from labrun.workspace import Workspace

    ws = Workspace(root)
    if not ws.state_file.is_file():
        return None
    state, note = load_state(ws)
    if note:
        err.print(f"[yellow]note:[/yellow] {note}")
    return state


def _nothing_to_do(root: Path, args, stored) -> int | None:
    """The exit code of a run or resume that has nothing to do, having said so; else None."""
    from labrun.status import finished_and_intact

    overrides = getattr(args, "budget_usd", None) is not None or getattr(args, "max_turns", None) is not None
    if not overrides and finished_and_intact(root, stored):
        console.print(f"{args.workspace}: the session is already complete and its outputs are intact; nothing to do.")
        return 0
    if stored.stopped_by_review:
        console.print(f"{args.workspace}: nothing to do; next action: {stored.next_action(args.workspace)}")
        return EXIT_STOPPED_BY_REVIEW
    return None


def _check_agent(run: Run) -> None:
    """The agent's credentials and executable, and a price for a budgeted model, before any
    server starts."""
    from labrun.agents.backends import check_agent, require_priced
    from labrun.agents.registry import backend
    from labrun.idea import load_idea

    stored = _stored_state(Path(run.workspace))
    effective = run.agent or (stored.agent if stored else None)
    if effective is None:
        return
    budget = run.budget_usd
    try:
        if budget is None and backend(effective).priced:  # the session's budget, else the idea's
            # (as Session.open decides): labrun counts this agent's costs against it
            budget = stored.budget_usd if stored else load_idea(run.idea_path).agent_budget_usd
        check_agent(effective)  # its credentials, its executable and login, or how to get them
        require_priced(effective, run.model or (stored.model if stored else None), budget)
    except Exception as e:
        raise CliError(str(e)) from None


def run_session(run: Run) -> int:
    from labrun.commands import kill_group, running_groups
    from labrun.interrupts import Interrupted, on_hard_exit, stop_on_signals
    from labrun.prefect_processes import ServerError
    from labrun.run_api.api import RunApi

    display = _show_progress(run.workspace)
    _check_agent(run)
    log = logging.getLogger("labrun")
    api = None
    try:
        with stop_on_signals():
            api = RunApi.find_or_start()
            api.use()
            on_hard_exit(api.kill)
            on_hard_exit(lambda: [kill_group(g) for g in list(running_groups)])
            log.info(api.announcement())
            research_session = _import_engine(run.verbose)  # while the API starts
            api.wait()
            return _run_flow(run, research_session)
    except Interrupted as e:
        display.close()
        from labrun.workspace import Workspace

        if Workspace(run.workspace).has_session():
            err.print(f"[yellow]labrun: interrupted; resume with: {labrun_command()} resume {run.workspace}[/yellow]")
        else:
            err.print(f"[yellow]labrun: interrupted before the session started; start it again with: "
                      f"{run.start_again}[/yellow]")
        return e.exit_code
    except ServerError as e:
        raise CliError(str(e), code=1) from None
    finally:
        display.close()
        if api is not None:  # the run's own API lives as long as the run
            api.close()


def _import_engine(verbose: bool):
    """The session flow, with Prefect configured for this run."""
    from labrun.flows.session import research_session

    _quiet_prefect_console(verbose)
    return research_session


def _run_flow(run: Run, research_session) -> int:
    from labrun.agents import AgentUnavailable
    from labrun.branches import BranchError
    from labrun.serving.pools import PoolError
    from labrun.session import SessionMismatch
    from labrun.workspace import WorkspaceBusy

    from prefect.exceptions import Pause

    try:
        result = research_session(**{**run.parameters(), "workspace": str(Path(run.workspace).resolve())})
    except (WorkspaceBusy, AgentUnavailable, SessionMismatch, BranchError, PoolError) as e:
        raise CliError(str(e)) from None
    except Pause:  # Suspend pressed in the Prefect UI: a run without a deployment goes on by a resume
        _print_summary(run.workspace, err)
        raise CliError(f"session suspended from the Prefect UI\nresume with: {labrun_command()} resume {run.workspace}",
                       code=1) from None
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        _print_summary(run.workspace, err)
        if "`labrun resume " in first:  # the reason names the resume that helps (a budget, a turn limit)
            raise CliError(f"session stopped: {first.replace('`labrun ', f'`{labrun_command()} ')}", code=1) from None
        raise CliError(f"session stopped: {first}\nresume with: {labrun_command()} resume {run.workspace}",
                       code=1) from None
    _print_summary(run.workspace, console)
    if result.get("awaiting_review"):
        return EXIT_AWAITS_REVIEW
    if result.get("stopped_by_review"):
        return EXIT_STOPPED_BY_REVIEW
    return 0


def _print_summary(workspace: str, where) -> None:
    try:
        where.print(summary(workspace))
    except Exception as e:  # a summary that cannot be read must not hide how the run ended
        where.print(f"[yellow]labrun: no summary ({type(e).__name__}: {e})[/yellow]")


def _quiet_prefect_console(verbose: bool) -> None:
    """The terminal shows labrun's progress; Prefect's records still reach its API and UI."""
    if verbose:
        return
    from prefect.logging.handlers import PrefectConsoleHandler

    for name in ("", "prefect", *logging.root.manager.loggerDict):
        logger = logging.getLogger(name)
        if not name or name.startswith("prefect"):
            for handler in list(getattr(logger, "handlers", [])):
                if isinstance(handler, PrefectConsoleHandler):
                    logger.removeHandler(handler)


def _show_progress(workspace: str | None = None) -> SessionDisplay:
    log = logging.getLogger("labrun")
    for handler in [h for h in log.handlers if isinstance(h, SessionDisplay)]:
        log.removeHandler(handler)
    display = SessionDisplay(err, workspace)
    log.addHandler(display)
    log.setLevel(logging.INFO)
    log.propagate = False
    return display
