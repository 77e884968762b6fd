"""A real Prefect server for the end-to-end tests of server mode.

Session fixtures start `prefect server start` on 127.0.0.1 (a free port, a temporary
PREFECT_HOME), create what the deployments need (the `labrun` process pool and the rest,
as `labrun server` does), run `prefect deploy --all` from prefect.yaml at the repository
root, and start a worker for the pool. Tests talk to the server through the Prefect client
(this process's settings point at it) and through `labrun` subprocesses.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from labrun.serving.deploy import deploy
from labrun.serving.prepare import prepare
from labrun import prefect_processes as processes
from labrun.serving import submit

from e2e_helpers import submit_run, CRASH_AFTER_S, EXAMPLES, REPO, UUID_RE, labrun, wait_for



def pytest_configure(config):
    config.addinivalue_line(
        "markers", "e2e: end-to-end test against a real Prefect server and worker (also slow)"
    )


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.slow)


def _clean_env() -> dict[str, str]:
    """This environment without the caller's Prefect profile settings or fault injection."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("PREFECT_") and not k.startswith("LABRUN_SCRIPTED")}


@dataclass
class Server:
    api_url: str
    ui_url: str
    home: Path
    env: dict[str, str]
    proc: subprocess.Popen
    logs: Path


@dataclass
class Worker:
    env: dict[str, str]
    logs: Path
    proc: subprocess.Popen | None = None
    started: int = 0

    def start(self) -> None:
        self.started += 1
        self.proc = processes.start_worker(self.env, self.logs / f"worker-{self.started}.log",
                                     name=f"e2e-worker-{self.started}")

    def kill_hard(self) -> list[int]:
        """kill -9 of the worker and every process below it (its flow runs): a dead machine."""
        assert self.proc is not None
        pids = [self.proc.pid, *(p.pid for p in processes.descendants(self.proc.pid))]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        return pids

    def stop(self) -> None:
        processes.stop(self.proc)


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    home = tmp_path_factory.mktemp("prefect-home")
    logs = tmp_path_factory.mktemp("logs")
    port = processes.free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = _clean_env()
    env.update({
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_API_URL": api_url,
        "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
        "PREFECT_SERVER_LOG_RETRYABLE_ERRORS": "true",  # "database is locked" in server.log
    })
    proc = processes.start_server("127.0.0.1", port, env, logs / "server.log")
    try:
        processes.wait_healthy(api_url, proc, logs / "server.log")
    except Exception:
        processes.stop(proc)
        raise
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url, PREFECT_HOME: str(home)}):
        yield Server(api_url, f"http://127.0.0.1:{port}", home, env, proc, logs)
    processes.stop(proc)


@pytest.fixture(scope="session")
def deployed(prefect_server):
    """The pool and what goes with it, then `prefect deploy --all` from the repository."""
    started = time.monotonic()
    done = prepare(session_slots=4, crash_after_s=CRASH_AFTER_S)
    out = deploy(prefect_server.env, REPO)
    assert "research-session/default" in out.replace("'", "")
    return {"prepared": done, "deploy_s": time.monotonic() - started}


@pytest.fixture(scope="session")
def worker(prefect_server, deployed):
    env = dict(prefect_server.env)
    env["PREFECT_WORKER_QUERY_SECONDS"] = "1"  # pick runs up at once, not every 10 s
    w = Worker(env, prefect_server.logs)
    w.start()
    yield w
    w.stop()


@dataclass
class Sessions:
    """Three sessions submitted at once; one of them fails on purpose."""

    root: Path
    runs: dict[str, str] = field(default_factory=dict)
    """idea file name → flow run id"""
    workspaces: dict[str, Path] = field(default_factory=dict)
    failing: str = ""
    wall_s: float = 0.0


@pytest.fixture(scope="session")
def three_sessions(prefect_server, worker, tmp_path_factory) -> Sessions:
    """Two ideas through `labrun queue`, a third through the same submission with a fault
    (`raise@experiments:3`, in that run's environment only), all three at once."""
    root = tmp_path_factory.mktemp("queue")
    ideas = root / "ideas"
    ideas.mkdir()
    for name in ("demo_noise_averaging.yaml", "ml_label_smoothing_calibration.yaml",
                 "nlp_short_text_language_id.yaml"):
        shutil.copy(EXAMPLES / name, ideas / name)
    sessions = Sessions(root=root / "workspaces", failing="nlp_short_text_language_id.yaml")
    started = time.monotonic()
    out = labrun("queue", str(ideas / "demo_noise_averaging.yaml"),
                 str(ideas / "ml_label_smoothing_calibration.yaml"),
                 "--workspaces", str(sessions.root), "--agent", "scripted", env=prefect_server.env).stdout
    for block in re.split(r"\n(?=\S)", out.strip()):
        name, arrow, rest = block.partition(" → ")
        assert arrow, out
        sessions.workspaces[name] = Path(rest.splitlines()[0].strip())
        sessions.runs[name] = UUID_RE.search(block).group(0)
        assert f"{prefect_server.ui_url}/runs/flow-run/{sessions.runs[name]}" in block
    from labrun.idea import load_idea

    failing = ideas / sessions.failing
    ws = submit.workspace_for(failing, load_idea(failing).content_hash, sessions.root)
    run = submit_run(failing, ws, agent="scripted", job_variables={"env": {
        "LABRUN_SCRIPTED_FAULTS": "raise@experiments:3",
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30",
    }})
    sessions.workspaces[sessions.failing] = ws
    sessions.runs[sessions.failing] = str(run.id)
    wait_for(sessions.runs.values())
    sessions.wall_s = time.monotonic() - started
    return sessions
