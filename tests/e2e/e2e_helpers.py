"""Helpers of the end-to-end tests (the fixtures are in conftest.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
CRASH_AFTER_S = 45
"""The zombie automation's window in these tests: heartbeats come every 30 s (prefect.yaml),
so a run is Crashed 15–45 s after its worker dies."""
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def client():
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def read_run(flow_run_id):
    with client() as c:
        return c.read_flow_run(flow_run_id)


def wait_for(flow_run_ids, states=FINAL, timeout_s: float = 240) -> dict[str, Any]:
    """Poll until every run's state type is in `states`; returns id → FlowRun."""
    ids = [str(i) for i in flow_run_ids]
    deadline = time.monotonic() + timeout_s
    runs: dict[str, Any] = {}
    while time.monotonic() < deadline:
        runs = {i: read_run(i) for i in ids}
        if all(r.state and r.state.type.value in states for r in runs.values()):
            return runs
        time.sleep(1)
    summary = {i: (r.name, r.state.type.value if r.state else None) for i, r in runs.items()}
    raise AssertionError(f"runs not in {sorted(states)} after {timeout_s:.0f} s: {summary}")


def task_runs(flow_run_id) -> list[Any]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with client() as c:
        return c.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])), limit=200
        )


def latest_task_states(flow_run_id, since=None) -> dict[str, str]:
    """Task run name → state name of the newest task run of that name (after `since`, a
    datetime). The server records task runs from events, a moment after they happen: this
    waits (up to 30 s) for every one to be final."""
    deadline = time.monotonic() + 30
    while True:
        found: dict[str, Any] = {}
        for t in task_runs(flow_run_id):
            if since is not None and t.created < since:
                continue
            if t.name not in found or t.created > found[t.name].created:
                found[t.name] = t
        if all(t.state and t.state.is_final() for t in found.values()) or time.monotonic() > deadline:
            return {name: t.state.name if t.state else "" for name, t in found.items()}
        time.sleep(0.5)


def flow_processes(worker) -> list:
    """The worker's flow-run processes (a worker starts each run as a child)."""
    from labrun.prefect_processes import descendants

    return [p for p in descendants(worker.proc.pid)
            if "labrun" in " ".join(_cmdline(p)) or "prefect" in " ".join(_cmdline(p))]


def _cmdline(proc) -> list[str]:
    try:
        return proc.cmdline()
    except Exception:
        return []


def status_json(workspace: Path, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "labrun.cli", "status", str(workspace), "--json"],
                         env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise AssertionError(f"labrun status {workspace} --json exited {out.returncode}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def labrun(*args: str, env: dict[str, str], cwd: Path | None = None,
           check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "labrun.cli", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"labrun {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


UUID_RE = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")


def idea_copy(folder: Path, name: str, title: str | None = None, source: str = "demo_noise_averaging.yaml") -> Path:
    """An example idea under a new name; a new title makes it a new idea (new content)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = (EXAMPLES / source).read_text()
    if title:
        text = re.sub(r"(?m)^(\s*title:\s*).*$", lambda m: m.group(1) + json.dumps(title), text, count=1)
    path = folder / name
    path.write_text(text)
    return path




def submit_run(idea, workspace, job_variables=None, **params):
    """A session run of the deployment, as `labrun queue` submits one."""
    from labrun.run_params import RunParams
    from labrun.serving.submit import submit_session

    return submit_session(RunParams(idea_path=str(idea), workspace=str(workspace), **params),
                          job_variables=job_variables)


def cancel_like_the_ui(flow_run_id, ui: str = "v2"):
    """What the Cancel button of Prefect's UI does: the flow run goes to Cancelling (V2
    forces it, V1 does not); its worker then stops the run's process and marks it Cancelled."""
    from prefect.client.schemas.objects import StateType
    from prefect.states import State

    with client() as c:
        return c.set_flow_run_state(flow_run_id, State(type=StateType.CANCELLING, name="Cancelling"),
                                    force=(ui == "v2"))
