"""Experiment attempts on a machine that cannot see the workspace (`--experiments-storage`):
the second process worker on pool `gpu` runs in a mount namespace of its own where the
engine's folder is covered by an empty tmpfs; only the store is visible to both. Each attempt's
files go there by content, its outputs and metrics come back, STATE.md and the report record it.
Real server, real workers, a real mount namespace (root and `unshare` needed: skipped without).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from e2e_helpers import client, labrun
from labrun import prefect_processes as processes
from labrun.serving import CLIENT_MAX_RETRIES
from labrun.status import session_status
from support import DEMO_IDEA

POOL = "gpu"


def _can_hide() -> str | None:
    """Why a folder cannot be hidden from a worker here, or None."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return "needs root and unshare(1) to give the worker a mount namespace of its own"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "mount", "-t", "tmpfs", "tmpfs", "/mnt"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare --mount cannot mount a tmpfs here: {probe.stderr.strip()}"


@pytest.fixture
def hidden_worker(prefect_server, deployed, tmp_path):
    """A process worker on pool `gpu` that cannot see `tmp_path/engine` (a tmpfs over it in a
    mount namespace of its own, which its flow runs inherit)."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.workers.process import ProcessWorker

    if why := _can_hide():
        pytest.skip(why)
    hidden = tmp_path / "engine"
    hidden.mkdir()
    with client() as c:
        try:
            c.create_work_pool(WorkPoolCreate(name=POOL, type="process",
                                              base_job_template=ProcessWorker.get_default_base_job_template()))
        except ObjectAlreadyExists:
            pass
    env = {**prefect_server.env, "PREFECT_WORKER_QUERY_SECONDS": "1",
           "PREFECT_CLIENT_MAX_RETRIES": str(CLIENT_MAX_RETRIES)}
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
           f'mount -t tmpfs tmpfs "{hidden}" && touch "{hidden}/worker-sees-only-this" && exec "$@"', "sh",
           *processes.prefect_cli(), "worker", "start", "--pool", POOL, "--name", "e2e-hidden-worker"]
    proc = processes.spawn(cmd, env, prefect_server.logs / "hidden-worker.log")
    yield hidden
    processes.stop(proc)


def test_attempts_on_a_worker_that_cannot_see_the_workspace_travel_by_content(
        prefect_server, hidden_worker, tmp_path):
    ws, store = hidden_worker / "ws", tmp_path / "store"
    done = labrun("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted", "--experiments-pool", POOL,
                  "--experiments-storage", f"file://{store}", env=prefect_server.env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (hidden_worker / "worker-sees-only-this").exists()  # the worker's folder was another one

    status = session_status(ws)
    assert status["session"]["complete"], status["session"]
    attempts = status["attempts"]
    assert [a["status"] for a in attempts] == ["FAILED", "SUCCESS", "SUCCESS"], attempts
    assert attempts[1]["metrics"] and (ws / "results/metrics.json").is_file()  # what it wrote came back
    assert json.loads((ws / "results/metrics.json").read_text()) == attempts[1]["metrics"]
    state_md = (ws / "STATE.md").read_text()
    assert "Status: SUCCESS" in state_md and "Status: RUNNING" not in state_md
    assert (ws / ".labrun/attempts/attempt-002.log").read_text()  # its log came back too
    record = json.loads((ws / ".labrun/attempts/attempt-002.files.json").read_text())
    assert "results/metrics.json" in record["wrote"], record

    with client() as c:  # each ran on the worker, from the store
        for a in attempts:
            run = c.read_flow_run(json.loads((ws / f".labrun/attempts/attempt-{a['n']:03d}.run.json").read_text())
                                  ["flow_run"])
            assert run.work_pool_name == POOL and f"attempt {a['n']} {a['status']}" in run.state.message

    # Bytes: each attempt's files against what of them the store lacked (the rest did not travel).
    there: set[str] = set()
    for a in attempts:
        went = json.loads((store / f"attempts/{status['session']['id']}/{a['n']}/in.json").read_text())
        assert not any(f.startswith(".labrun/") for f in went["files"])
        size = sum(e["size"] for e in went["files"].values())
        sent = sum(e["size"] for e in went["files"].values() if e["sha256"] not in there)
        print(f"\nattempt {a['n']}: its workspace {size} bytes in {len(went['files'])} files, {sent} bytes sent",
              file=sys.stderr)
        if a["n"] > 1:
            assert sent < size, "files the store had were sent again"
        back = store / f"attempts/{status['session']['id']}/{a['n']}/out.json"
        there |= {e["sha256"] for m in (went, json.loads(back.read_text())) for e in m["files"].values()}
