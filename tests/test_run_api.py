"""The Prefect API of a run without a server lives as long as the run (`labrun.run_api`):
after `labrun demo` finishes, no process it started is alive, in its process tree or anywhere
else on its Prefect home; and a run uses `labrun server`'s API when one is up, starting none.
Real `labrun` processes, watched with psutil."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from support import on_prefect_home


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_URL", "LABRUN_SCRIPTED"))}
    env["PREFECT_HOME"] = str(home)
    return env


def _run_watching(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, dict[psutil.Process, str]]:
    """`labrun ARGS` to its end: its exit code, its output, and every process seen below it
    while it ran, with its command line as last seen (a process that has ended has none)."""
    out = cwd / "labrun.out"
    with open(out, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "labrun.cli", *args], cwd=cwd, env=env, stdout=f,
                                stderr=subprocess.STDOUT)
    seen: dict[psutil.Process, str] = {}
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            for p in psutil.Process(proc.pid).children(recursive=True):
                seen[p] = _cmd(p) or seen.get(p, "")  # psutil.Process: equal when pid and start time are
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
    return proc.wait(), out.read_text(errors="replace"), seen


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cmd(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def test_no_process_outlives_a_finished_labrun_demo(tmp_path):
    home = tmp_path / "prefect-home"
    code, out, seen = _run_watching(["demo", "demo-ws"], _env(home), tmp_path)
    try:
        assert code == 0 and "Session complete ·" in out, out[-3000:]
        assert any("labrun.run_api.process" in cmd for cmd in seen.values()), "the demo started no API of its own"
        assert [f"{p.pid} {cmd[:120]}" for p, cmd in seen.items() if _alive(p)] == []
        assert on_prefect_home(home) == []
    finally:
        for p in seen:
            if _alive(p):
                p.kill()


def test_a_run_uses_the_api_of_labrun_server_and_starts_none(tmp_path, prefect_api):
    """`labrun server` leaves its API's address in PREFECT_HOME/labrun/server.json while it
    runs; here that record names the tests' running Prefect server."""
    home = tmp_path / "prefect-home"
    (home / "labrun").mkdir(parents=True)
    (home / "labrun" / "server.json").write_text(json.dumps({"api_url": prefect_api, "pid": os.getpid()}))
    code, out, seen = _run_watching(["demo", "demo-ws"], _env(home), tmp_path)
    assert code == 0 and "Session complete ·" in out, out[-3000:]
    assert f"using the Prefect API at {prefect_api} (labrun server)" in " ".join(out.split()), out[-3000:]
    assert seen and not any("labrun.run_api.process" in cmd for cmd in seen.values())


CLOSE_ON_A_DEAD_API = """
import os, sys, time
os.environ["PREFECT_API_URL"] = "http://127.0.0.1:9/api"  # nothing listens there
from prefect.events import emit_event
from labrun.run_api.api import close_prefect_clients
for i in range(3):
    emit_event(event="labrun.test", resource={"prefect.resource.id": "labrun.test"})
print(time.time(), flush=True)
close_prefect_clients(1.0)
"""


def test_prefects_clients_get_a_bounded_close_and_the_exit_waits_on_none(tmp_path):
    """Events that cannot reach the API (it is gone): the close gives them its second, drops
    them saying so, and the interpreter's exit does not wait on them (Prefect's own drain
    at exit retries each for seconds)."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | {"PREFECT_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", CLOSE_ON_A_DEAD_API], capture_output=True, text=True, env=env,
                          timeout=120)
    took = time.time() - float(done.stdout.split()[0])
    assert took < 4, f"{took:.1f} s from the close to the exit:\n{done.stderr}"
    assert "the rest is dropped" in done.stderr, done.stderr
