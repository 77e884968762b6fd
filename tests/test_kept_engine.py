"""The engine kept between runs (`labrun.serving.kept_engine`): a warm `labrun run` handed to
a fork of a process that imported Prefect already, in the user's own terminal.

One Prefect home and one story, since each engine start imports Prefect anew:
- a finished run leaves the kept API and the engine;
- the next run, typed into a pseudo-terminal with a relative workspace and a fault switch
  that the engine's own environment lacks, runs in a fork of the engine and writes to that
  terminal; Ctrl-Z stops it and SIGCONT (`fg`) lets it go on; Ctrl-C there stops it as it
  stops a run in its own process, and takes the engine and the API along;
- a `kill -9` of a handed-over run takes its fork and its experiment command with it, and
  the resume, handed over too, redoes only the cut-off attempt;
- a module that changed on disk retires the engine: that run starts in its own process;
- a second Ctrl-C ends a handed-over run at once, with its fork, the engine and the API.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from support import DEMO_IDEA, alive, ready_engine, wait_for
from terminal import Terminal
from labrun import turns
from test_anthropic_session import flow_runs_of
from labrun.state import phase_table
from labrun.status import session_status

IN_ENGINE = "running in the engine kept between runs"
ONCE = {"planning": 1, "setup": 1, "implementation": 1, "analysis": 1, "documentation": 1}


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "home"
    yield home
    for name in ("kept-engine", "kept-api"):  # whatever the story left running
        try:
            os.kill(json.loads((home / "labrun" / f"{name}.json").read_text())["pid"], signal.SIGKILL)
        except (OSError, ValueError):
            pass


def environment(home: Path, faults: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "LABRUN_SCRIPTED_FAULTS")}
    return {**env, "PREFECT_HOME": str(home), "LABRUN_KEEP_API": "3", "LABRUN_SCRIPTED_FAULTS": faults}


def labrun(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labrun.cli", *args], capture_output=True, text=True,
                          timeout=300, env=env)


def the_fork(engine: int) -> psutil.Process:
    wait_for(lambda: len(psutil.Process(engine).children()) == 1, timeout=30, what="the engine's fork")
    return psutil.Process(engine).children()[0]


def in_its_attempt(ws: Path, engine: int) -> list[psutil.Process]:
    """Once a handed-over run is in its first attempt: its fork and what the fork started."""
    wait_for(lambda: (ws / ".labrun/faults/experiments-1.reached").exists(), timeout=120,
             what="the handed-over run to reach its attempt")
    fork = the_fork(engine)
    wait_for(lambda: any("sleep" in p.cmdline() for p in fork.children(recursive=True)), what="the attempt's command")
    return [fork, *fork.children(recursive=True)]


def test_a_warm_run_is_handed_to_the_kept_engine_and_behaves_as_one_in_its_own_process(tmp_path, home, prefect_api):
    first = labrun("run", str(DEMO_IDEA), "--workspace", str(tmp_path / "first"), "--agent", "scripted",
                   env=environment(home))
    assert first.returncode == 0, first.stderr
    assert IN_ENGINE not in first.stderr
    engine = ready_engine(home)
    api = json.loads((home / "labrun" / "kept-api.json").read_text())["pid"]
    assert "hang@" not in Path(f"/proc/{engine}/environ").read_text()

    # In a terminal, from another folder: the fork takes the terminal, the folder, the fault.
    term = Terminal("run", str(DEMO_IDEA), "--workspace", "ws", "--agent", "scripted",
                    env=environment(home, "hang@experiments:3"), cwd=str(tmp_path))
    ws = tmp_path / "ws"
    try:
        wait_for(lambda: (ws / ".labrun/faults/experiments-3.reached").exists(), timeout=120,
                 what="the handed-over run to reach its experiments")
        fork = the_fork(engine)
        below = [fork, *fork.children(recursive=True)]
        assert psutil.Process(term.proc.pid).children() == []  # the run is the fork's
        assert IN_ENGINE in term.output and "phase 4 experiments started" in term.output, term.output
        assert "\x1b[" in term.output  # rich saw a terminal: the fork writes to the user's own
        os.write(term.master, b"\x1a")  # Ctrl-Z: the run stops too; SIGCONT (`fg`) goes on with both
        wait_for(lambda: {psutil.Process(p).status() for p in (term.proc.pid, fork.pid)} == {psutil.STATUS_STOPPED},
                 timeout=5, what="the run and its fork to stop")
        os.kill(term.proc.pid, signal.SIGCONT)
        wait_for(lambda: psutil.STATUS_STOPPED not in {psutil.Process(p).status() for p in (term.proc.pid, fork.pid)},
                 timeout=5, what="the run and its fork to go on")
        started = time.monotonic()
        term.ctrl_c()
        code = term.wait(timeout=30)
        assert code == 130 and time.monotonic() - started < 5, term.output
        assert "interrupted; resume with: labrun resume ws" in " ".join(term.output.split()), term.output
        assert "Traceback" not in term.output, term.output
        wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in below),
                 timeout=5, what="the fork and what it started to go")
        wait_for(lambda: not alive(engine) and not alive(api), timeout=5,
                 what="the kept engine and API to go with an interrupted run")
    finally:
        term.close() if term.proc.poll() is None else os.close(term.master)
    state_md = (ws / "STATE.md").read_text()
    assert "phase 4 experiments interrupted by Ctrl-C (SIGINT)" in state_md
    assert phase_table(state_md)["experiments"] == "FAILED"

    resumed = labrun("resume", str(ws), env=environment(home))
    assert resumed.returncode == 0 and IN_ENGINE not in resumed.stderr, resumed.stderr  # no engine: in-process
    phases = {p["key"]: p["runs"] for p in session_status(ws)["phases"]}
    assert phases == {**ONCE, "experiments": 2}

    # A kill -9 of a handed-over run, in an attempt: its fork and command go; the engine stays.
    engine = ready_engine(home)  # started again by the resume
    ws2 = tmp_path / "ws2"
    run = subprocess.Popen([sys.executable, "-m", "labrun.cli", "run", str(DEMO_IDEA), "--workspace", str(ws2),
                            "--agent", "scripted"], env=environment(home, "hang-attempt@experiments:1"),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        below = in_its_attempt(ws2, engine)
        run.kill()
        run.wait()
        wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in below),
                 timeout=10, what="the fork and its attempt to die with the run")
        assert alive(engine)  # a kill -9 is no interruption: it stays for the next run
    finally:
        if run.poll() is None:
            run.kill()
    # The resume, handed over, uses its own PREFECT_API_URL (the tests' server), not the one
    # the engine's environment has (the kept API): the fork reads Prefect's settings again.
    resumed = labrun("resume", str(ws2), env={**environment(home), "PREFECT_API_URL": prefect_api})
    assert resumed.returncode == 0 and IN_ENGINE in resumed.stderr, resumed.stderr
    from prefect import get_client
    with get_client(sync_client=True) as client:
        assert [r.state.type.value for r in flow_runs_of(client, ws2)] == ["COMPLETED"]
    report = session_status(ws2)
    assert {p["key"]: p["runs"] for p in report["phases"]} == {**ONCE, "experiments": 2}
    assert [(a["n"], a["status"]) for a in report["attempts"]] == [(1, "INTERRUPTED"), (2, "FAILED"), (3, "SUCCESS")]

    # A module the engine imported changed: it retires, and the run runs in its own process.
    module = Path(turns.__file__)
    os.utime(module, ns=(module.stat().st_atime_ns, module.stat().st_mtime_ns + 1))
    fresh = labrun("run", str(DEMO_IDEA), "--workspace", str(tmp_path / "ws3"), "--agent", "scripted",
                   env=environment(home))
    assert fresh.returncode == 0 and IN_ENGINE not in fresh.stderr, fresh.stderr
    wait_for(lambda: not alive(engine), timeout=10, what="the stale engine to retire")

    # A second Ctrl-C while the first waits on a frozen API: the run ends at once, as in its
    # own process, and with it the fork, the engine and the API.
    engine = ready_engine(home)  # started by that run
    api = psutil.Process(json.loads((home / "labrun" / "kept-api.json").read_text())["pid"])
    ws4 = tmp_path / "ws4"
    term = Terminal("run", str(DEMO_IDEA), "--workspace", str(ws4), "--agent", "scripted",
                    env=environment(home, "hang-attempt@experiments:1"))
    try:
        below = in_its_attempt(ws4, engine)
        api.suspend()
        term.ctrl_c()
        time.sleep(2)
        assert term.proc.poll() is None, term.output  # the first still waits on the frozen API
        started = time.monotonic()
        term.ctrl_c()
        code = term.wait(timeout=10)
        assert code == 130 and time.monotonic() - started < 2, term.output
        assert "stopped at once" in term.output, term.output
        wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in below),
                 timeout=5, what="the fork and its attempt to go")
        wait_for(lambda: not alive(engine) and not alive(api.pid), timeout=5, what="the engine and API to go")
    finally:
        term.close() if term.proc.poll() is None else os.close(term.master)


def test_every_variable_a_module_reads_on_import_is_part_of_the_engines_key():
    """A kept engine imported labrun once, with the environment of the run that started it:
    a variable read on import (not when used) must select the engine, or a run would get the
    engine's value instead of its own."""
    import ast

    import labrun.flows
    import labrun.phases
    from labrun.serving.kept_engine import READ_AT_IMPORT

    def reads(node) -> set[str]:
        """The names `os.environ[...]`, `os.environ.get(...)` or `os.getenv(...)` read."""
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv"):
            return {a.value for a in node.args[:1] if isinstance(a, ast.Constant)}
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            return {node.slice.value} if isinstance(node.slice, ast.Constant) else set()
        return set()

    read = set()
    for package in (labrun, labrun.flows, labrun.phases):
        for source in Path(package.__path__[0]).rglob("*.py"):
            for statement in ast.parse(source.read_text()).body:
                if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    # run on import: decorators, defaults, a class's body (not its methods')
                    body = [*statement.decorator_list, *getattr(statement.args, "defaults", [])] \
                        if not isinstance(statement, ast.ClassDef) else [*statement.decorator_list, *(
                            b for b in statement.body if not isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)))]
                    statement = ast.Module(body=[b if isinstance(b, ast.stmt) else ast.Expr(b) for b in body],
                                           type_ignores=[])
                for node in ast.walk(statement):
                    read |= reads(node)
    assert read == set(READ_AT_IMPORT)
