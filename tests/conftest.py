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

# Prefect sets up its logging once a process, its console handler bound to the stderr of that
# moment: so here, on the test session's own, not inside a test that captures its output (that
# stream closes as the test ends, and every later test that logs would fail).
from prefect.logging.configuration import ensure_logging_setup  # noqa: E402

ensure_logging_setup()


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


# -- fixtures shared by test modules (each defined here once) ---------------------------------


@pytest.fixture
def bubblewrap_works():
    """Skips the test (in CI: fails it) where bubblewrap cannot make a sandbox."""
    from support import require_bubblewrap

    require_bubblewrap()


@pytest.fixture
def session_idea() -> Path:
    """The idea `session` opens: the demo's. A module overrides this fixture for another."""
    from support import DEMO_IDEA

    return DEMO_IDEA


@pytest.fixture
def session(tmp_path, session_idea, prefect_api):
    """A scripted session on `session_idea` in this test's folder, with the results/ folder
    its experiments write to; its tools' attempts are Prefect subtasks on the shared server."""
    from labrun.session import Session

    s = Session.open(tmp_path / "ws", session_idea, "scripted")
    (s.ws.root / "results").mkdir()
    yield s
    s.close()


@pytest.fixture
def api(monkeypatch):
    """The fake Messages API (tests/fake_messages_api.py), the SDK in this process pointed at it."""
    from fake_messages_api import FakeMessagesAPI

    with FakeMessagesAPI() as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        for name in ("ANTHROPIC_AUTH_TOKEN", "LABRUN_MODEL", "LABRUN_PRICES", "LABRUN_CONTEXT_MANAGEMENT"):
            monkeypatch.delenv(name, raising=False)
        yield server


@pytest.fixture
def serve(monkeypatch, prefect_api):
    """`serve(responder)`: the fake Messages API, answering with `responder`; the `labrun`
    processes the test starts talk to it."""
    from fake_messages_api import FakeMessagesAPI

    servers = []
    for name in ("ANTHROPIC_AUTH_TOKEN", "LABRUN_MODEL", "LABRUN_PRICES", "LABRUN_CONTEXT_MANAGEMENT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")

    def start(responder) -> FakeMessagesAPI:
        api = FakeMessagesAPI(default=responder, cache_accounting=True).start()
        servers.append(api)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        return api

    yield start
    for api in servers:
        api.stop()


TEX_BINARIES = {"latexmk", "pdflatex", "latex", "lualatex", "xelatex", "tex", "etex", "pdftex",
                "bibtex", "biber", "luatex", "xetex"}


@pytest.fixture
def no_tex(tmp_path, monkeypatch):
    """The PATH with every TeX program hidden: a folder of links to everything else on it
    (outside /tmp, which the sandbox of the agent's commands replaces with its own)."""
    from labrun import latex

    farm = Path(tempfile.mkdtemp(prefix="labrun-bin-without-tex-", dir="/var/tmp"))
    for folder in os.environ["PATH"].split(os.pathsep):
        for entry in Path(folder).glob("*") if Path(folder).is_dir() else []:
            if entry.name not in TEX_BINARIES and not os.path.lexists(farm / entry.name):  # a dangling link too
                (farm / entry.name).symlink_to(entry)
    monkeypatch.setenv("PATH", str(farm))
    assert latex.toolchain() is None
    yield farm
    shutil.rmtree(farm, ignore_errors=True)


THROWAWAY_PROMPT = """{% extends "system.md.j2" %}
{% block heading %}# Phase {{ n }} of {{ total }}: {{ key }}{% endblock %}
{% block instructions %}
## This phase: a second look

Write `notes/second-look.md` with what a fresh reader would question.
{% endblock %}
"""


@pytest.fixture
def throwaway(tmp_path, monkeypatch):
    """A phase declared and templated in a temp dir, placed after analysis; the scripted
    agent gets a script for it. The registry is restored afterwards."""
    from labrun.agents import scripted
    from labrun.phase_registry import BY_KEY, Files, Phase, Sections, register

    templates = tmp_path / "templates"
    (templates / "phases").mkdir(parents=True)
    (templates / "phases" / "second_look.md.j2").write_text(THROWAWAY_PROMPT)
    phase = Phase("second_look", "Second Look", "question the analysis",
                  (Files("notes/second-look.md"), Sections(doubts="Doubts")),
                  max_turns=5, templates=templates, default=False)
    saved = dict(BY_KEY)
    register(phase, after="analysis")
    monkeypatch.setitem(scripted.SCRIPT, "second_look", [
        lambda r: [scripted._call("str_replace_based_edit_tool", command="create",
                                  path="notes/second-look.md", file_text="- Only one seed.\n")],
        lambda r: [scripted._call("complete_phase", summary="Doubts noted.",
                                  sections={"doubts": "- Only one seed was run."})],
    ])
    yield phase
    BY_KEY.clear()
    BY_KEY.update(saved)
