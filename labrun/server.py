"""Server mode (DESIGN.md): sessions as deployment runs on the `labrun` process work pool.

- `labrun server` starts a local Prefect server and a worker for the pool, after creating
  what the deployments rely on: the pool, its `sessions` work queue with a concurrency
  limit, the `labrun-model-api` global concurrency limit and the automation that marks a
  run Crashed when its heartbeats stop. Then it deploys `prefect.yaml`.
- `labrun queue` submits one session run per idea, each with a workspace of its own.
- `model_api_slot()` holds a slot of the `labrun-model-api` limit around one model call.

Importing this module does not import Prefect: `labrun`'s reading commands stay fast.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator

from labrun.agents import AGENTS

REPO = Path(__file__).resolve().parents[1]
POOL = "labrun"
SESSION_QUEUE = "sessions"
SESSION_DEPLOYMENT = "research-session/default"
QUEUE_DEPLOYMENT = "experiment-queue/ideas-folder"
MODEL_API_LIMIT = "labrun-model-api"
ZOMBIE_AUTOMATION = "labrun: mark runs Crashed when their heartbeats stop"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4200
DEFAULT_SESSION_SLOTS = 4
DEFAULT_MODEL_API_SLOTS = 4
MODEL_API_LEASE_S = 60
SLOT_TRIES = 5
CLIENT_MAX_RETRIES = 10
DEFAULT_CRASH_AFTER_S = 90
"""Three missed heartbeats at the 30 s that prefect.yaml sets."""
IDEA_SUFFIXES = (".yaml", ".yml")


class ServerError(Exception):
    """A one-line reason, and what to do about it."""


# -- the model API's global concurrency limit ----------------------------------------------


def server_mode() -> bool:
    """True in a deployment's flow run (prefect.yaml sets LABRUN_MODEL_API_LIMIT=on for them)
    on a Prefect server (PREFECT_API_URL), not on an ephemeral API. The opt-in keeps slots
    to servers that run Prefect's services, which free the lease of a killed engine's slot."""
    from prefect.settings import get_current_settings

    return os.environ.get("LABRUN_MODEL_API_LIMIT") == "on" and bool(get_current_settings().api.url)


_limits_ready: set[tuple[str, str]] = set()
_limits_lock = threading.Lock()


def ensure_global_limit(name: str, slots: int, update: bool = False) -> None:
    """Create the global concurrency limit `name` when the server lacks it (once per
    process and API). `update` sets its size when it exists already."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import (
        GlobalConcurrencyLimitCreate,
        GlobalConcurrencyLimitUpdate,
    )
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
    from prefect.settings import get_current_settings

    key = (str(get_current_settings().api.url), name)
    with _limits_lock:
        if key in _limits_ready and not update:
            return
        with get_client(sync_client=True) as client:
            try:
                existing = client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                try:
                    client.create_global_concurrency_limit(
                        GlobalConcurrencyLimitCreate(name=name, limit=slots)
                    )
                except ObjectAlreadyExists:  # another process made it first
                    pass
            else:
                if update and existing.limit != slots:
                    client.update_global_concurrency_limit(
                        name, GlobalConcurrencyLimitUpdate(limit=slots)
                    )
        _limits_ready.add(key)


@contextmanager
def model_api_slot() -> Iterator[None]:
    """Hold one slot of the `labrun-model-api` global concurrency limit for one model call.

    In server mode the limit is created when missing (size `LABRUN_MODEL_API_SLOTS`,
    default 4) and acquired strictly: a slot is never skipped silently. With Prefect's
    ephemeral API (`labrun run` without a server) there is one engine and no one to share
    the API with, so this does nothing and costs nothing.
    """
    if not server_mode():
        yield
        return
    from prefect.concurrency.sync import concurrency

    def slot():
        # strict: no slot, no call. A renewal hiccup during a long call does not end the
        # call; the lease of a dead engine's slot lapses within a minute.
        return concurrency(MODEL_API_LIMIT, occupy=1, strict=True, lease_duration=MODEL_API_LEASE_S,
                           raise_on_lease_renewal_failure=False)

    slots = int(os.environ.get("LABRUN_MODEL_API_SLOTS", DEFAULT_MODEL_API_SLOTS))
    ensure_global_limit(MODEL_API_LIMIT, slots)
    with ExitStack() as stack:
        for attempt in range(SLOT_TRIES):
            try:
                stack.enter_context(slot())
                break
            except Exception:  # the limit was deleted, or a busy server answered 503 throughout
                if attempt == SLOT_TRIES - 1:
                    raise
                time.sleep(2**attempt)
                _forget_limit(MODEL_API_LIMIT)
                ensure_global_limit(MODEL_API_LIMIT, slots)
        yield


def _forget_limit(name: str) -> None:
    with _limits_lock:
        for key in [k for k in _limits_ready if k[1] == name]:
            _limits_ready.discard(key)


# -- what the deployments rely on ----------------------------------------------------------


def prepare(session_slots: int = DEFAULT_SESSION_SLOTS, model_api_slots: int | None = None,
            crash_after_s: int = DEFAULT_CRASH_AFTER_S) -> list[str]:
    """Create (or bring up to date) the pool, its `sessions` queue and limit, the model
    API limit and the zombie automation. Returns one line per thing done."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    done: list[str] = []
    with get_client(sync_client=True) as client:
        try:
            pool = client.read_work_pool(POOL)
            if pool.type != "process":
                done.append(f"note: work pool {POOL} has type {pool.type}; labrun's prefect.yaml expects any pool named {POOL}")
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(
                name=POOL, type="process",
                base_job_template=ProcessWorker.get_default_base_job_template(),
                description="labrun research sessions",
            ))
            done.append(f"created work pool {POOL} (process)")
        try:
            queue = client.read_work_queue_by_name(SESSION_QUEUE, work_pool_name=POOL)
            if queue.concurrency_limit != session_slots:
                client.update_work_queue(queue.id, concurrency_limit=session_slots)
                done.append(f"set work queue {POOL}/{SESSION_QUEUE} to {session_slots} concurrent sessions")
        except ObjectNotFound:
            client.create_work_queue(SESSION_QUEUE, work_pool_name=POOL, concurrency_limit=session_slots,
                                     description="labrun research sessions")
            done.append(f"created work queue {POOL}/{SESSION_QUEUE} ({session_slots} concurrent sessions)")
        try:
            client.read_global_concurrency_limit_by_name(MODEL_API_LIMIT)
            exists = True
        except ObjectNotFound:
            exists = False
    if not exists or model_api_slots is not None:
        slots = model_api_slots or int(os.environ.get("LABRUN_MODEL_API_SLOTS", DEFAULT_MODEL_API_SLOTS))
        ensure_global_limit(MODEL_API_LIMIT, slots, update=True)
        done.append(f"global concurrency limit {MODEL_API_LIMIT}: {slots} model calls at once")
    done.append(ensure_zombie_automation(crash_after_s))
    return done


def zombie_automation(crash_after_s: int = DEFAULT_CRASH_AFTER_S):
    """Prefect's recipe for zombie flow runs: after a heartbeat, expect another heartbeat
    (or a state that ends or parks the run) within `crash_after_s`; otherwise Crashed."""
    from datetime import timedelta

    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    states = ("Completed", "Failed", "Cancelled", "Crashed", "Cancelling", "TimedOut",
              "Paused", "Suspended", "Scheduled", "AwaitingRetry", "Late")
    return AutomationCore(
        name=ZOMBIE_AUTOMATION,
        description="A flow run that stops sending heartbeats (its worker or machine died) "
        "is marked Crashed, so that it can be retried.",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *(f"prefect.flow-run.{s}" for s in states)},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=crash_after_s),
        ),
        actions=[ChangeFlowRunState(
            state=StateType.CRASHED,
            message=f"no heartbeat for {crash_after_s} s: the worker or its machine stopped; retry the run to resume it",
        )],
    )


def ensure_zombie_automation(crash_after_s: int = DEFAULT_CRASH_AFTER_S) -> str:
    from prefect.client.orchestration import get_client

    wanted = zombie_automation(crash_after_s)
    with get_client(sync_client=True) as client:
        found = client.read_automations_by_name(ZOMBIE_AUTOMATION)
        if not found:
            client.create_automation(wanted)
            return f"created automation {ZOMBIE_AUTOMATION!r} (Crashed after {crash_after_s} s without a heartbeat)"
        client.update_automation(found[0].id, wanted)
        for extra in found[1:]:
            client.delete_automation(extra.id)
    return f"automation {ZOMBIE_AUTOMATION!r}: Crashed after {crash_after_s} s without a heartbeat"


def prefect_cli() -> list[str]:
    return [sys.executable, "-m", "prefect"]


def deploy(env: dict[str, str] | None = None, repo: Path = REPO) -> str:
    """`prefect deploy --all` from the clone (prefect.yaml); returns its output."""
    if not (repo / "prefect.yaml").is_file():
        raise ServerError(f"{repo}/prefect.yaml is missing: run from a clone of labrun")
    proc = subprocess.run(
        [*prefect_cli(), "--no-prompt", "deploy", "--all"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=600,
    )
    if proc.returncode != 0:
        raise ServerError(f"`prefect deploy --all` failed in {repo}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc.stdout


# -- a local server and worker -------------------------------------------------------------


def free_port(host: str = DEFAULT_HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def healthy(api_url: str, timeout_s: float = 2.0) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=timeout_s) as r:
            return r.status == 200
    except (OSError, ValueError):
        return False


def server_env(api_url: str, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    env["PREFECT_API_URL"] = api_url
    return env


def start_server(host: str, port: int, env: dict[str, str], log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(
            [*prefect_cli(), "server", "start", "--host", host, "--port", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def wait_healthy(api_url: str, proc: subprocess.Popen | None, log: Path | None,
                 timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if healthy(api_url):
            return
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise ServerError(f"the Prefect server exited (code {proc.returncode}):\n{tail}")
        time.sleep(0.5)
    raise ServerError(f"the Prefect server at {api_url} did not answer within {timeout_s:.0f} s")


def start_worker(env: dict[str, str], log: Path | None = None, pool: str = POOL,
                 name: str | None = None) -> subprocess.Popen:
    cmd = [*prefect_cli(), "worker", "start", "--pool", pool]
    # On SQLite a burst of writers can keep the database locked through a client's default
    # five retries (about a minute); a worker that gives up while submitting a run marks it
    # Crashed before it starts. Ten retries wait out bursts of half an hour. Flow runs
    # inherit the worker's environment.
    env = {"PREFECT_CLIENT_MAX_RETRIES": str(CLIENT_MAX_RETRIES), **env}
    if name:
        cmd += ["--name", name]
    if log is None:
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc; [] elsewhere). Workers start each flow run
    in a session of its own, so a process group does not hold them."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def stop(proc: subprocess.Popen | None, grace_s: float = 15) -> None:
    """SIGINT the process group, SIGKILL what is left of it after `grace_s`; then end the
    processes it started in sessions of their own (a worker's flow runs) the same way."""
    if proc is None or proc.poll() is not None:
        return
    below = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except ProcessLookupError:
        pass
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    left = [p for p in below if _alive(p)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(p) for p in left):
            time.sleep(0.2)
        left = [p for p in left if _alive(p)]
        if not left:
            return


@contextmanager
def api(api_url: str) -> Iterator[None]:
    """Point this process's Prefect client at `api_url`."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}):
        yield


# -- queueing ideas ------------------------------------------------------------------------


def collect_ideas(paths: list[str]) -> list[Path]:
    """Idea files named, and the idea files (*.yaml, *.yml) in folders named, in order."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(f for f in p.iterdir() if f.suffix in IDEA_SUFFIXES and f.is_file())
        elif p.is_file():
            found.append(p)
        else:
            raise ServerError(f"{p}: no such idea file or folder")
    return [f.resolve() for f in dict.fromkeys(found)]


def slug(text: str, limit: int = 40) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s[:limit].rstrip("-") or "idea"


def workspace_for(idea_path: Path, content_hash: str, root: Path) -> Path:
    """ROOT/<idea slug>-<short hash>: one workspace per idea content."""
    return (root / f"{slug(idea_path.stem)}-{content_hash[:8]}").resolve()


def submit_session(idea_path: Path, workspace: Path, agent: str | None = None,
                   model: str | None = None, deployment: str = SESSION_DEPLOYMENT,
                   idempotency_key: str | None = None,
                   job_variables: dict[str, Any] | None = None):
    """One session flow run of the deployment; returns at once (the FlowRun)."""
    from prefect.deployments import run_deployment

    parameters: dict[str, Any] = {"idea_path": str(idea_path), "workspace": str(workspace)}
    if agent is not None:  # otherwise a new session is scripted, a resumed one keeps its agent
        parameters["agent"] = agent
    if model is not None:
        parameters["model"] = model
    return run_deployment(
        deployment, parameters=parameters, timeout=0, flow_run_name=workspace.name,
        tags=["labrun"], idempotency_key=idempotency_key, job_variables=job_variables,
        as_subflow=False,  # a session is a run of its own in the UI, not a queue's subflow
    )


def active_session_run(workspace: Path):
    """The run for `workspace` that has not ended (scheduled, waiting out a usage window,
    running, paused), or None. Queueing a second one would only wait on the first's lock."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (FlowRunFilter, FlowRunFilterName, FlowRunFilterState,
                                                FlowRunFilterStateType)
    from prefect.client.schemas.objects import StateType

    active = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.PAUSED,
              StateType.CANCELLING]
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            name=FlowRunFilterName(any_=[workspace.name]),
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=active))))
    return next((r for r in runs if r.parameters.get("workspace") == str(workspace)), None)


def flow_run_url(flow_run_id) -> str:
    from prefect.utilities.urls import url_for

    return url_for("flow-run", obj_id=flow_run_id) or str(flow_run_id)


def retry_like_the_ui(flow_run_id, ui: str = "v2"):
    """What the Retry button of Prefect's UI does: the same flow run goes to AwaitingRetry
    and a worker runs it again; finished phases come from the cache. Prefect 3.9 serves two
    UIs: V2 (the default from `/`) forces the new state, V1 (`/runs/flow-run/<id>`, the
    links `labrun queue` prints) lets the server's orchestration rules accept it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.states import State

    if ui not in ("v1", "v2"):
        raise ValueError(f"ui must be v1 or v2, not {ui!r}")
    with get_client(sync_client=True) as client:
        return client.set_flow_run_state(
            flow_run_id,
            State(type=StateType.SCHEDULED, name="AwaitingRetry", message="Retry from the UI"),
            force=(ui == "v2"),
        )


# -- command line --------------------------------------------------------------------------


def add_parsers(sub) -> None:
    """`labrun server` and `labrun queue`, added to labrun's command line."""
    server = sub.add_parser("server", help="a local Prefect server and a worker for the labrun pool")
    server.add_argument("--host", default=DEFAULT_HOST)
    server.add_argument("--port", type=int, default=DEFAULT_PORT)
    server.add_argument("--sessions", type=int, default=DEFAULT_SESSION_SLOTS,
                        help=f"sessions that run at once (the {SESSION_QUEUE} queue's limit; default %(default)s)")
    server.add_argument("--model-api-slots", type=int, default=None,
                        help=f"model calls at once over all sessions ({MODEL_API_LIMIT}; default {DEFAULT_MODEL_API_SLOTS})")
    server.add_argument("--crash-after", type=int, default=DEFAULT_CRASH_AFTER_S, metavar="SECONDS",
                        help="mark a run Crashed after this long without a heartbeat (default %(default)s)")
    server.add_argument("--no-worker", action="store_true", help="start the server only")
    server.set_defaults(handler=cmd_server)

    queue = sub.add_parser("queue", help="submit one session run per idea to the server")
    queue.add_argument("ideas", nargs="+", metavar="IDEA|DIR")
    queue.add_argument("--agent", choices=AGENTS, default=None)
    queue.add_argument("--model", default=None)
    queue.add_argument("--workspaces", default="workspaces", metavar="ROOT",
                       help="one workspace per idea is made under ROOT (default ./%(default)s)")
    queue.add_argument("--deployment", default=SESSION_DEPLOYMENT)
    queue.set_defaults(handler=cmd_queue)


def _cli_error(message: str, code: int = 2):
    from labrun.cli import CliError

    return CliError(message, code)


def cmd_queue(args) -> int:
    import httpx
    from prefect.settings import get_current_settings

    try:
        ideas = collect_ideas(args.ideas)
    except ServerError as e:
        raise _cli_error(str(e)) from None
    if not ideas:
        raise _cli_error(f"no idea files (*.yaml) in {' '.join(args.ideas)}")
    api_url = _api_url_for_clients()
    root = Path(args.workspaces).resolve()
    outcomes: list[str] = []
    with api(api_url):
        _check_deployment(args.deployment, api_url)
        for path in ideas:
            try:
                outcomes.append(_queue_one(path, root, args))
            except httpx.HTTPError as e:
                reason = (f"{e.response.status_code} {e.response.reason_phrase}"
                          if isinstance(e, httpx.HTTPStatusError) else f"{type(e).__name__}: {e}")
                raise _cli_error(
                    f"{path.name}: the Prefect API at {api_url} failed ({reason}) after "
                    f"{get_current_settings().client.max_retries} retries, with {outcomes.count('queued')} "
                    "idea(s) queued; run the same command again to queue the rest (a queued run is "
                    "not queued twice)", code=1
                ) from None
    return 2 if "invalid" in outcomes else 0


def _queue_one(path: Path, root: Path, args) -> str:
    """Submit one idea's session run, or say why not: "queued", "invalid" or "skipped"."""
    from labrun.cli import console, err
    from labrun.idea import IdeaError, load_idea
    from labrun.status import finished_and_intact

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
    if (workspace / ".labrun" / "state.json").is_file() and finished_and_intact(workspace):
        console.print(f"{path.name}: {workspace} already holds this session, complete; not queued")
        return "skipped"
    active = active_session_run(workspace)
    if active is not None:
        console.print(f"{path.name}: {workspace} is queued or running already (flow run {active.name} "
                      f"{active.id}, {active.state.name if active.state else 'no state'}); not queued again")
        return "skipped"
    run = submit_session(path, workspace, args.agent, args.model, args.deployment)
    console.print(f"{path.name} → {workspace}\n  flow run {run.name} {run.id}\n  {flow_run_url(run.id)}")
    return "queued"


def _api_url_for_clients() -> str:
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if url:
        if not healthy(url):
            raise _cli_error(f"the Prefect API at {url} (PREFECT_API_URL) does not answer; start it with `labrun server`")
        return url
    default = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}/api"
    if healthy(default):
        return default
    raise _cli_error("no Prefect server: start one with `labrun server` (or set PREFECT_API_URL to yours)")


def _check_deployment(name: str, api_url: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(name)
        except ObjectNotFound:
            raise _cli_error(
                f"no deployment {name} on {api_url}: run `labrun server`, or `prefect deploy --all` "
                "in the labrun clone"
            ) from None


def cmd_server(args) -> int:
    from labrun.cli import console

    host, port = args.host, args.port
    api_url = f"http://{host}:{port}/api"
    if port_in_use(host, port):
        raise _cli_error(f"{host}:{port} is in use (another Prefect server?); stop it or pick --port")
    env = server_env(api_url)
    home = Path(env.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
    logs = home / "labrun"
    server_log = logs / "server.log"
    server = worker = None
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        console.print(f"starting the Prefect server on {host}:{port} (log: {server_log})")
        server = start_server(host, port, env, server_log)
        wait_healthy(api_url, server, server_log)
        with api(api_url):
            for line in prepare(args.sessions, args.model_api_slots, args.crash_after):
                console.print(f"  {line}")
        console.print(f"deploying {REPO / 'prefect.yaml'}")
        deploy(env)
        console.print(f"  {SESSION_DEPLOYMENT} and {QUEUE_DEPLOYMENT} on pool {POOL}")
        if not args.no_worker:
            worker = start_worker(env)
        console.print(
            f"\n[bold]labrun server ready.[/bold] UI: http://{host}:{port}  ·  API: {api_url}\n"
            f"Queue ideas from another terminal:  PREFECT_API_URL={api_url} labrun queue IDEA.yaml|DIR\n"
            "Ctrl-C stops the worker and the server.\n",
        )
        while True:
            if server.poll() is not None:
                raise ServerError(f"the Prefect server stopped (code {server.returncode}); see {server_log}")
            if worker is not None and worker.poll() is not None:
                console.print(f"[yellow]the worker stopped (code {worker.returncode}); starting a new one[/yellow]")
                worker = start_worker(env)
            time.sleep(1)
    except KeyboardInterrupt:
        console.print("stopping the worker and the server…")
        return 0
    except ServerError as e:
        raise _cli_error(str(e), 1) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        stop(worker)
        stop(server)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt

