"""Experiment attempts on another work pool (`--experiments-pool`): each attempt a flow run
of its own on pool `gpu`, served by a second process worker, the workspace on storage both
see (the same disk here). Real server, real workers, real engines killed for real.

- an unknown pool is refused in one line, before anything runs;
- a `labrun run` engine sends its attempts to `gpu`; kill -9 of the engine while one runs
  there: the resume waits for that flow run and records it once (its command started once),
  metrics and outputs come back, STATE.md records every attempt; no key's value is in a
  flow run's parameters;
- a session run of the deployment (`experiments_pool` its parameter) whose remote attempt
  loses its flow-run process (a lost machine): the flow run is Crashed, the attempt
  INTERRUPTED as an infrastructure failure, and the model is told so; the session goes on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e_helpers import client, labrun, submit_run, wait_for
from labrun import prefect_processes as processes
from labrun.agents.scripted import SLOW_ATTEMPT_STARTS
from labrun.journal import Conversation, ToolResultRecord
from labrun.run_params import session_run_name
from labrun.status import session_status
from support import DEMO_IDEA

POOL = "gpu"
KEY, SECRET = "LABRUN_E2E_POOL_KEY", "pool-secret-value-7f3a"


@pytest.fixture(scope="module")
def gpu_worker(prefect_server, deployed):
    """A second process worker, on pool `gpu`, its environment holding the key's value."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.workers.process import ProcessWorker

    with client() as c:
        try:
            c.create_work_pool(WorkPoolCreate(name=POOL, type="process",
                                              base_job_template=ProcessWorker.get_default_base_job_template()))
        except ObjectAlreadyExists:
            pass
    env = {**prefect_server.env, "PREFECT_WORKER_QUERY_SECONDS": "1", KEY: SECRET}
    proc = processes.start_worker(env, prefect_server.logs / "gpu-worker.log", pool=POOL, name="e2e-gpu-worker")
    yield proc
    processes.stop(proc)


def engine(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "labrun.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def until(check, what: str, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def run_file(ws: Path, n: int) -> dict:
    try:
        return json.loads((ws / f".labrun/attempts/attempt-{n:03d}.run.json").read_text())
    except (OSError, ValueError):
        return {}


def flow_runs_of(ws: Path) -> dict[int, object]:
    """Each attempt's flow run, by the id its run file holds."""
    runs = {}
    with client() as c:
        for a in session_status(ws)["attempts"]:
            runs[a["n"]] = c.read_flow_run(run_file(ws, a["n"])["flow_run"])
    return runs


def test_unknown_pool_is_refused_and_attempts_run_on_the_pool_through_a_kill_of_the_engine(
        prefect_server, deployed, gpu_worker, tmp_path):
    env = {**prefect_server.env, KEY: SECRET}
    refused = labrun("run", str(DEMO_IDEA), "--workspace", str(tmp_path / "nowhere"), "--agent", "scripted",
                     "--experiments-pool", "no-such-pool", env=env, check=False)
    assert refused.returncode == 2, refused
    [said] = [line for line in refused.stderr.splitlines() if line.startswith("labrun:")]
    assert "no-such-pool" in said and "no work pool" in said and "Traceback" not in refused.stderr, refused.stderr
    assert not (tmp_path / "nowhere/.labrun/state.json").exists()  # refused before anything was written

    ws = tmp_path / "ws"
    first = engine(["run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted", "--experiments-pool", POOL,
                    "--pass-env", KEY], {**env, "LABRUN_SCRIPTED_FAULTS": "slow-attempt@experiments:3"})
    until(lambda: (ws / SLOW_ATTEMPT_STARTS).exists() or first.poll() is not None, "the slow attempt to start")
    assert first.poll() is None, first.communicate()[1][-3000:]
    first.send_signal(signal.SIGKILL)  # the engine alone: the attempt is the gpu worker's flow run
    assert first.wait(60) == -9
    assert run_file(ws, 2).get("flow_run"), "the flow run's id is on disk before it ran"

    resumed = labrun("resume", str(ws), env=env, check=False)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    status = session_status(ws)
    assert status["session"]["complete"]
    assert (ws / SLOW_ATTEMPT_STARTS).read_text() == "started\n", "the remote attempt was started again"
    attempts = status["attempts"]
    assert [a["status"] for a in attempts] == ["FAILED", "SUCCESS", "SUCCESS"], attempts
    assert attempts[1]["metrics"] and (ws / "results/metrics.json").is_file()  # what it wrote came back
    state_md = (ws / "STATE.md").read_text()
    assert "Status: SUCCESS" in state_md and "Status: RUNNING" not in state_md

    name = session_run_name(ws)
    runs = flow_runs_of(ws)
    for a in attempts:  # each its own flow run on the pool, named and tagged after the session
        run = runs[a["n"]]
        assert run.name == f"{name}-attempt-{a['n']}" and f"session:{name}" in run.tags, run
        assert run.work_pool_name == POOL, run
        assert run.state.type.value == ("COMPLETED" if a["status"] == "SUCCESS" else "FAILED"), (a, run.state)
        assert f"attempt {a['n']} {a['status']}" in run.state.message
        assert SECRET not in json.dumps(run.parameters, default=str)  # names only: the UI shows parameters
    assert sorted(r.name for r in session_flow_runs(name)) == sorted(r.name for r in runs.values()), \
        "an attempt was sent to the pool twice"


def session_flow_runs(name: str) -> list:
    """Every flow run tagged with the session."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    with client() as c:
        return c.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[f"session:{name}"])))


def test_a_lost_remote_worker_is_an_infrastructure_failure_told_to_the_model(
        prefect_server, deployed, worker, gpu_worker, tmp_path):
    ws = tmp_path / "ws"
    session_run = submit_run(DEMO_IDEA, ws, agent="scripted", experiments_pool=POOL, job_variables={"env": {
        "LABRUN_SCRIPTED_FAULTS": "hang-attempt@experiments:3", "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}})
    report = ws / ".labrun/attempts/attempt-002.supervisor.json"
    until(lambda: report.exists() and "pgid" in report.read_text(), "the hanging remote attempt's command", 240)
    # The machine running the attempt is lost: its flow-run process and all below it, kill -9
    # (the worker itself lives on to report it).
    for p in processes.descendants(gpu_worker.pid):
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    done = wait_for([session_run.id], timeout_s=300)[str(session_run.id)]
    assert done.state.type.value == "COMPLETED", done.state

    attempts = session_status(ws)["attempts"]
    lost = attempts[1]
    assert lost["status"] == "INTERRUPTED" and "infrastructure failure" in lost["error"], lost
    assert "crashed" in lost["error"] and lost["exit_code"] is None and not lost["metrics"], lost  # nothing half-recorded
    assert flow_runs_of(ws)[2].state.type.value == "CRASHED"
    assert attempts[2]["status"] == "SUCCESS"  # the agent ran it again, on the pool
    told = [r for r in Conversation.latest(ws / ".labrun/phases/experiments").of(ToolResultRecord)
            if r.name == "run_experiment"][1]
    assert "INTERRUPTED" in told.content and "infrastructure failure" in told.content, told.content
