"""The README's server-mode walkthrough, as a new user types it: `labrun server` with the
scripted agent's fault injection, `labrun queue examples/ --workspaces DIR --agent scripted`
from the clone, every run failing once in its experiments phase, and Retry (as the button of
the page `labrun queue` links to does it) finishing each one. The only change: a free port
and a Prefect home of the test's own, so nothing else on the machine is touched."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time

from labrun import prefect_processes as processes
from labrun.serving import submit

from e2e_helpers import REPO, UUID_RE, labrun, status_json, wait_for

README = (REPO / "README.md").read_text()


def _readme_commands() -> tuple[str, str]:
    """The walkthrough's `labrun server` and `labrun queue` lines, as the README writes them."""
    block = README.split("## Server mode", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [line.split("#", 1)[0].strip() for line in block.strip().splitlines()]
    server = next(line for line in lines if line.endswith("labrun server"))
    queue = next(line for line in lines if " queue " in line)
    return server, queue


def test_the_readme_server_walkthrough_ends_green(tmp_path):
    server_line, queue_line = _readme_commands()
    faults, _, server_cmd = server_line.partition(" ")
    assert faults == "LABRUN_SCRIPTED_FAULTS=raise@experiments:3" and server_cmd == ".venv/bin/labrun server"
    queue_args = shlex.split(queue_line)
    assert queue_args[:3] == [".venv/bin/labrun", "queue", "examples/"], queue_line
    workspaces = tmp_path / "labrun-workspaces"
    queue_args = [str(workspaces) if a == "~/labrun-workspaces" else a for a in queue_args[1:]]

    port = processes.free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "LABRUN_SCRIPTED", "ANTHROPIC_"))}
    env.update({"PREFECT_HOME": str(tmp_path / "home"), "PREFECT_WORKER_QUERY_SECONDS": "1"})
    log = tmp_path / "labrun-server.log"
    with open(log, "w") as out:
        server = subprocess.Popen([sys.executable, "-m", "labrun.cli", "server", "--port", str(port)],
                                  env={**env, "LABRUN_SCRIPTED_FAULTS": "raise@experiments:3"}, cwd=REPO,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while "labrun server ready" not in log.read_text():
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        assert "Ctrl-C stops the worker and the server." in log.read_text()
        client_env = {**env, "PREFECT_API_URL": api_url}  # the README's export, on this port
        out = labrun(*queue_args, env=client_env, cwd=REPO).stdout
        blocks = re.split(r"\n(?=\S)", out.strip())
        assert len(blocks) == 3, out
        runs = {}
        for block in blocks:
            assert "agent scripted" in block, block
            runs[block.split(" → ")[1].splitlines()[0].strip()] = UUID_RE.search(block).group(0)

        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: api_url}):
            failed = wait_for(runs.values(), timeout_s=300)
            assert {r.state.type.value for r in failed.values()} == {"FAILED"}, failed
            for workspace in runs:
                phases = {p["key"]: p["status"] for p in status_json(workspace, client_env)["phases"]}
                assert phases["implementation"] == "DONE" and phases["experiments"] == "FAILED", phases
            for run_id in runs.values():  # the Retry button of the run's page
                assert submit.retry_like_the_ui(run_id, ui="v1").status.value == "ACCEPT"
            done = wait_for(runs.values(), timeout_s=300)
            assert {r.state.type.value for r in done.values()} == {"COMPLETED"}, done
        for workspace in runs:
            report = status_json(workspace, client_env)
            assert report["session"]["complete"], report["session"]
            assert {p["key"]: p["runs"] for p in report["phases"]}["implementation"] == 1  # from the cache
    finally:
        os.killpg(server.pid, signal.SIGINT)  # Ctrl-C in its terminal
        assert server.wait(60) == 0, log.read_text()


def test_labrun_server_without_a_worker_says_what_ctrl_c_stops(tmp_path):
    port = processes.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(tmp_path / "home")
    log = tmp_path / "labrun-server.log"
    with open(log, "w") as out:
        server = subprocess.Popen([sys.executable, "-m", "labrun.cli", "server", "--port", str(port), "--no-worker"],
                                  env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while "labrun server ready" not in log.read_text():
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        said = log.read_text()
        assert "Ctrl-C stops the server." in said and "worker" not in said.split("labrun server ready")[1], said
    finally:
        os.killpg(server.pid, signal.SIGINT)
        assert server.wait(60) == 0, log.read_text()
    assert "stopping the server…" in log.read_text()
