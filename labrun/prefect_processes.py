"""The local Prefect processes that labrun starts (the API of a `labrun run`, a server and a
worker for `labrun server`), and stopping them with everything they started.

Each is started in a session of its own, so that a Ctrl-C in labrun's terminal reaches
labrun alone, which then stops them in order (the API last, once the run has reported its
state). Each also gets a parent-death signal, so that it dies with labrun even after a
`kill -9`. Processes are named by pid and start time (`identified`), so that a pid reused
by another process is never signalled. Importing this module does not import Prefect.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping

import psutil

from labrun.interrupts import dies_with_labrun
from labrun.serving import CLIENT_MAX_RETRIES, DEFAULT_HOST, POOL


class ServerError(Exception):
    """A one-line reason, and what to do about it."""


def prefect_home(env: Mapping[str, str] | None = None) -> Path:
    """PREFECT_HOME in `env` (this process's environment by default)."""
    env = os.environ if env is None else env
    return Path(env.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()


def profiles_path(env: Mapping[str, str] | None = None) -> Path:
    """Prefect's profiles file in `env` (this process's environment by default)."""
    env = os.environ if env is None else env
    return Path(env.get("PREFECT_PROFILES_PATH") or prefect_home(env) / "profiles.toml").expanduser()


def new_database(env: dict[str, str] | None = None) -> bool:
    """Whether a Prefect API started with `env` (this process's environment by default) makes
    its database first: no setting names a database, and PREFECT_HOME has none yet. Prefect's
    migrations then take most of a first start, with nothing else to show."""
    env = os.environ if env is None else env
    if any(k.startswith(("PREFECT_SERVER_DATABASE_", "PREFECT_API_DATABASE_")) for k in env):
        return False
    try:
        if "DATABASE" in profiles_path(env).read_text():  # a profile may name another database: say nothing
            return False
    except OSError:
        pass
    return not (prefect_home(env) / "prefect.db").exists()


def prefect_cli() -> list[str]:
    return [sys.executable, "-m", "prefect"]


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
    """The environment of a server labrun starts: telemetry off (offline it prints
    tracebacks), and every client pointed at it."""
    env = dict(os.environ if base is None else base)
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    env["PREFECT_API_URL"] = api_url
    return env


def spawn(cmd: list[str], env: dict[str, str], log: Path | None) -> subprocess.Popen:
    """`cmd` in a session of its own that dies with this process. Call it from the main
    thread (`dies_with_labrun`)."""
    out = subprocess.DEVNULL
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        out = open(log, "ab")
    try:
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=dies_with_labrun())
    finally:
        if log is not None:
            out.close()


def start_server(host: str, port: int, env: dict[str, str], log: Path) -> subprocess.Popen:
    """`prefect server start`: the API, the UI and Prefect's services."""
    return spawn([*prefect_cli(), "server", "start", "--host", host, "--port", str(port)], env, log)


def wait_healthy(api_url: str, proc: subprocess.Popen | None, log: Path | None, timeout_s: float = 180) -> None:
    """Until the API at `api_url` answers, or `proc` (a child) ends."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if healthy(api_url):
            return
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise ServerError(f"the Prefect server exited (code {proc.returncode}):\n{tail}")
        time.sleep(0.1)
    raise ServerError(f"the Prefect server at {api_url} did not answer within {timeout_s:.0f} s")


def identified(pid: int, started: float) -> psutil.Process | None:
    """The process `pid` if it is the one that started at `started` (psutil's create_time,
    as a record stored it); None when it is gone or the pid now names another process (after
    a reboot, or a `kill -9` and the pid's reuse)."""
    try:
        proc = psutil.Process(pid)
        return proc if proc.create_time() == started else None
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def start_worker(env: dict[str, str], log: Path | None = None, pool: str = POOL,
                 name: str | None = None) -> subprocess.Popen:
    # A worker that gives up on a locked SQLite while submitting a run marks it Crashed
    # before it starts; flow runs inherit the worker's environment.
    env = {"PREFECT_CLIENT_MAX_RETRIES": str(CLIENT_MAX_RETRIES), **env}
    cmd = [*prefect_cli(), "worker", "start", "--pool", pool]
    if name:
        cmd += ["--name", name]
    return spawn(cmd, env, log)


def descendants(pid: int) -> list[psutil.Process]:
    """Every process below `pid`. Workers start each flow run in a session of its own, so a
    process group does not hold them."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop(proc: subprocess.Popen | None, grace_s: float = 15, first: int = signal.SIGTERM) -> None:
    """`first` to the process group, SIGKILL to what is left of it after `grace_s`; then
    the processes it started in sessions of their own (a worker's flow runs), the same way.
    The group's id is `proc`'s pid, which no other process can take before `proc` is reaped
    (by `proc.wait` here); psutil checks each descendant's start time before it signals."""
    if proc is None:
        return
    below = descendants(proc.pid)
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, first)
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
    left = [p for p in below if alive(p)]
    for p in left:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, left = psutil.wait_procs(left, timeout=grace_s)
    for p in left:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(left, timeout=grace_s)
