"""Shared test setup: one embedded Prefect server for the whole run, in a throwaway home.

The server starts once (it takes seconds) and serves both the flows run in this process and
the `labrun` processes the tests start, through PREFECT_API_URL.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="labrun-test-prefect-")
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ["LABRUN_RETRY_BASE_S"] = "0.05"
os.environ.pop("PREFECT_API_URL", None)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: minutes of real servers, CLIs or kills; `pytest -m ''` runs "
                            "them too, as CI does")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI every test runs: a skip (a tool not installed, a fixture that cannot be made) is a
    failure that says which, so that a missing tool cannot turn a check into a pass."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"CI runs every test, and this one skipped: {reason}"


@pytest.fixture(scope="session")
def prefect_api() -> str:
    """The URL of the shared embedded Prefect server."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, temporary_settings

    server = SubprocessASGIServer()  # a new home: Prefect migrates its database first
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
    os.environ.pop("PREFECT_API_URL", None)


@pytest.fixture
def cli_setups(tmp_path, prefect_api):
    """`make(Setup, responder)`: a real-CLI test's setup (a fake API as `.api`, labrun's
    environment) in this test's folder; each fake API stops after the test."""
    made = []

    def make(setup, *args):
        made.append(setup(tmp_path, *args))
        return made[-1]

    yield make
    for s in made:
        s.api.stop()


@pytest.fixture
def template_copy(tmp_path, monkeypatch) -> Path:
    """A copy of templates/ that labrun.prompts renders from, for tests that edit templates."""
    from labrun import prompts

    root = tmp_path / "templates"
    shutil.copytree(prompts.TEMPLATES, root)
    monkeypatch.setattr(prompts, "TEMPLATES", root)
    monkeypatch.setattr(prompts, "env", prompts.make_env(root))
    return root


@pytest.fixture(scope="session")
def forker(prefect_api):
    """Engines to kill, cheaply: `forker.run(args, env)` is `labrun <args>` in a fresh
    process forked from one that imported labrun and Prefect once (tests/engine_forker.py)."""
    from engine_forker import EngineForker

    clean = {k: v for k, v in os.environ.items()
             if k not in ("LABRUN_MODEL", "LABRUN_PRICES", "LABRUN_CONTEXT_MANAGEMENT", "ANTHROPIC_AUTH_TOKEN",
                          "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "LABRUN_CRASH_AT", "LABRUN_SCRIPTED_FAULTS")}
    with EngineForker(clean, inherit=False) as engines:
        yield engines


@pytest.fixture
def cli(capsys):
    """`cli("resume", W)`: the same command line, run in this process (no interpreter start,
    no Prefect import: seconds saved per call), with `env` over this process's environment
    while it runs. Output as `subprocess.run` gives it."""
    import logging
    import subprocess

    from labrun.cli import main

    def call(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        log = logging.getLogger("labrun")
        saved = list(log.handlers), log.propagate, log.level
        capsys.readouterr()
        try:
            with pytest.MonkeyPatch.context() as mp:
                for name, value in (env or {}).items():
                    mp.setenv(name, value)
                code = main(list(args))
        finally:
            log.handlers[:], log.propagate, log.level = saved
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["labrun", *args], code, out, err)

    return call


@pytest.fixture
def abstract_socket():
    """An abstract Unix socket of the machine's, named as labrun's own once were (`@labrun-…`);
    listed in /proc/net/unix here, so a shell that does not list it is in another network namespace."""
    import socket
    import uuid

    from support import ESCAPED

    ESCAPED.unlink(missing_ok=True)  # and no file where a hostile shell's write would land
    name = f"labrun-engine-test-{uuid.uuid4().hex[:8]}"
    s = socket.socket(socket.AF_UNIX)
    s.bind("\0" + name)
    s.listen()
    assert f"@{name}" in Path("/proc/net/unix").read_text()
    yield name
    s.close()
    ESCAPED.unlink(missing_ok=True)
