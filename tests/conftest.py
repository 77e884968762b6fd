"""Shared test setup: one embedded Prefect server for the whole run, in a throwaway home.

The server starts once (it takes seconds) and serves both the flows run in this process and
the `labrun` processes the tests start, through PREFECT_API_URL.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="labrun-test-prefect-")
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ["LABRUN_RETRY_BASE_S"] = "0.05"
os.environ.pop("PREFECT_API_URL", None)

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
DEMO_IDEA = EXAMPLES / "demo_noise_averaging.yaml"


@pytest.fixture(scope="session")
def prefect_api() -> str:
    """The URL of the shared embedded Prefect server."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, temporary_settings

    server = SubprocessASGIServer()
    server.start(timeout=120)
    os.environ["PREFECT_API_URL"] = server.api_url
    with temporary_settings({PREFECT_API_URL: server.api_url}):
        yield server.api_url
        # Send what this process still holds (logs, events) while the server is up; else the
        # interpreter's exit retries it against a stopped server for a minute or more.
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker

        APILogWorker.drain_all(timeout=10)
        EventsWorker.drain_all(timeout=10)
    server.stop()


def labrun(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the `labrun` command line as a user would, in its own process."""
    return subprocess.run(
        [sys.executable, "-m", "labrun.cli", *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
    )


def start_labrun(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "labrun.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})},
    )


def wait_for(predicate, timeout: float = 120, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    """True while the process runs (a zombie left for a non-reaping init does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def group_alive(pgid: int) -> bool:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
