"""The server-mode commands: `labrun server` (a local server, what the deployments rely on,
the deployments and a worker) and `labrun queue` (one session run per idea)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from rich.markup import escape

from labrun.cli.common import DEFAULT_AGENT, CliError, console, err, phase_options
from labrun.prefect_processes import ServerError
from labrun.serving import DEFAULT_HOST, DEFAULT_PORT, POOL, QUEUE_DEPLOYMENT, SESSION_DEPLOYMENT


def cmd_server(args) -> int:
    from labrun import prefect_processes as processes
    from labrun.prefect_processes import new_database, prefect_home
    from labrun.serving.address import server_record
    from labrun.serving.deploy import deploy, deployment_file
    from labrun.serving.prepare import prepare

    host, port = args.host, args.port
    api_url = f"http://{host}:{port}/api"
    if args.notify is not None and not args.notify.startswith(("http://", "https://")):
        raise CliError("--notify: give the webhook's http:// or https:// URL")
    if processes.port_in_use(host, port):
        raise CliError(f"{host}:{port} is in use (another Prefect server?); stop it or pick --port")
    env = processes.server_env(api_url)
    logs = prefect_home() / "labrun"
    server_log = logs / "server.log"
    server = worker = None
    stopped = "the server" if args.no_worker else "the worker and the server"
    record = server_record()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    try:
        console.print(f"starting the Prefect server on {host}:{port} (log: {server_log})")
        if new_database(env):
            console.print("  a new Prefect home: Prefect builds its database first, which takes a while")
        server = processes.start_server(host, port, env, server_log)
        processes.wait_healthy(api_url, server, server_log)
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: api_url}):
            for line in prepare(args.sessions, args.model_api_slots, args.crash_after, args.notify):
                console.print(f"  {line}")
        console.print(f"deploying {deployment_file()}")
        deploy(env)
        console.print(f"  {SESSION_DEPLOYMENT} and {QUEUE_DEPLOYMENT} on pool {POOL}")
        if not args.no_worker:
            worker = processes.start_worker(env, logs / "worker.log")
        # `labrun run` and `labrun queue` on this machine find the server here.
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"api_url": api_url, "pid": server.pid}))
        console.print(
            f"\n[bold]labrun server ready.[/bold] UI: http://{host}:{port}  ·  API: {api_url}\n"
            f"`labrun run` and `labrun queue` here use it; elsewhere set PREFECT_API_URL={api_url}\n"
            f"Ctrl-C stops {stopped}.\n",
        )
        while True:
            if server.poll() is not None:
                raise ServerError(f"the Prefect server stopped (code {server.returncode}); see {server_log}")
            if worker is not None and worker.poll() is not None:
                console.print(f"[yellow]the worker stopped (code {worker.returncode}); starting a new one[/yellow]")
                worker = processes.start_worker(env, logs / "worker.log")
            time.sleep(1)
    except KeyboardInterrupt:
        console.print(f"stopping {stopped}…")
        return 0
    except ServerError as e:
        raise CliError(str(e), 1) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        record.unlink(missing_ok=True)
        processes.stop(worker)
        processes.stop(server)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def cmd_queue(args) -> int:
    import httpx
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    from labrun.keys import pass_env_names
    from labrun.serving.submit import collect_ideas

    from labrun.cli.running import review_after

    args.with_phases = phase_options(args.with_phases, args.paper_style)  # each idea may ask for more
    args.review_after = review_after(args)
    try:  # their values are the worker's, so they are not looked for here
        args.pass_env = pass_env_names(args.pass_env or ())
    except ValueError as e:
        raise CliError(str(e)) from None
    try:
        ideas = collect_ideas(args.ideas)
    except ServerError as e:
        raise CliError(str(e)) from None
    if not ideas:
        raise CliError(f"no idea files (*.yaml) in {' '.join(args.ideas)}")
    api_url = _api_url_for_clients()
    root = Path(args.workspaces).resolve()
    outcomes: list[str] = []
    with temporary_settings({PREFECT_API_URL: api_url}):
        _check_deployment(args.deployment, api_url)
        if args.experiments_pool:
            _check_pool(args.experiments_pool, args.experiments_storage, args.workspaces)
        for path in ideas:
            try:
                outcomes.append(_queue_one(path, root, args))
            except httpx.HTTPError as e:
                reason = (f"{e.response.status_code} {e.response.reason_phrase}"
                          if isinstance(e, httpx.HTTPStatusError) else f"{type(e).__name__}: {e}")
                raise CliError(
                    f"{path.name}: the Prefect API at {api_url} failed ({reason}) after "
                    f"{get_current_settings().client.max_retries} retries, with {outcomes.count('queued')} "
                    "idea(s) queued; run the same command again to queue the rest (a queued run is "
                    "not queued twice)", code=1
                ) from None
    return 2 if "invalid" in outcomes else 0


def _queue_one(path: Path, root: Path, args) -> str:
    """Submit one idea's session run, or say why not: "queued", "invalid" or "skipped"."""
    from labrun.idea import IdeaError, load_idea
    from labrun.run_params import RunParams
    from labrun.serving.submit import active_session_run, flow_run_url, submit_session, workspace_for
    from labrun.status import finished_and_intact
    from labrun.workspace import Workspace

    try:
        idea = load_idea(path)
    except IdeaError as e:
        err.print(f"[red]{path}: not queued[/red]")
        for problem in e.problems:
            err.print(f"  {problem}")
        return "invalid"
    except Exception as e:  # an idea the checker itself chokes on
        err.print(f"[red]{path}: not queued: cannot read it ({type(e).__name__}: {e})[/red]")
        return "invalid"
    workspace = workspace_for(path, idea.content_hash, root)
    if Workspace(workspace).has_session() and finished_and_intact(workspace):
        console.print(f"{path.name}: {workspace} already holds this session, complete; not queued")
        return "skipped"
    active = active_session_run(workspace)
    if active is not None:
        console.print(f"{path.name}: {workspace} is queued or running already (flow run {active.name} "
                      f"{active.id}, {active.state.name if active.state else 'no state'}); not queued again")
        return "skipped"
    run = submit_session(RunParams(idea_path=str(path), workspace=str(workspace), agent=args.agent, model=args.model,
                                   with_phases=args.with_phases or None, paper_style=args.paper_style,
                                   pass_env=args.pass_env or None, review_after=args.review_after,
                                   experiments_pool=args.experiments_pool,
                                   experiments_storage=args.experiments_storage),
                         args.deployment)
    console.print(f"{path.name} → {workspace}\n  {_agent_of(workspace, args.agent)}\n"
                  f"  flow run {run.name} {run.id}\n  {flow_run_url(run.id)}")
    return "queued"


def _agent_of(workspace: Path, asked: str | None) -> str:
    """Which agent the queued run uses, in words: the one asked for, or the session's own."""
    import json

    from labrun.workspace import Workspace

    try:
        own = json.loads(Workspace(workspace).state_file.read_text()).get("agent")
    except (OSError, ValueError):
        own = None
    if asked:
        return f"agent {asked}"
    return f"agent {own}, the session's own" if own else f"agent {DEFAULT_AGENT}, the default"


def _api_url_for_clients() -> str:
    from labrun.prefect_processes import healthy
    from labrun.serving.address import configured_api_url, labrun_server_url

    url = configured_api_url()
    if url:
        if not healthy(url):
            raise CliError(f"the Prefect API at {url} (PREFECT_API_URL) does not answer; start it with `labrun server`")
        return url
    url = labrun_server_url()
    if url:
        return url
    default = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}/api"
    if healthy(default):
        return default
    raise CliError("no Prefect server: start one with `labrun server` (or set PREFECT_API_URL to yours)")


def _check_pool(pool: str, storage: str | None, workspaces: str) -> None:
    from labrun.serving.pools import PoolError, check_pool

    try:
        warning = check_pool(pool, storage, workspaces)
    except PoolError as e:
        raise CliError(str(e)) from None
    if warning:
        err.print(f"[yellow]warning:[/yellow] {escape(warning)}")


def _check_deployment(name: str, api_url: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(name)
        except ObjectNotFound:
            raise CliError(
                f"no deployment {name} on {api_url}: run `labrun server`, or `prefect deploy --all` "
                "in the labrun clone"
            ) from None
