"""Where the engine's own tasks run (an experiment attempt, the rerun of one, the sealed
scoring): each takes a small serializable spec, rebuilds what it needs from the workspace
(`Session.attach`), never writes the session's state, and returns its record, which the
engine that owns the session records. So a task can run in this process or in another one.

Executors, by name (`LABRUN_TASKS_IN`):
- `here`: a call in the engine's process (the default);
- `process`: a Python process of its own, which dies with labrun.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import typing
from typing import Any, Callable

from prefect import task
from prefect.transactions import CommitMode, transaction
from pydantic import BaseModel

from labrun.interrupts import dies_with_labrun
from labrun.settings import settings

TASKS = {"attempt": "labrun.phases.attempts:experiment_attempt",
         "reproduction": "labrun.phases.reproduction:reproduce_attempt",
         "sealed-scoring": "labrun.phases.sealed_scoring:sealed_scoring"}
"""Each engine task by its Prefect name, so that another process can find it."""


class TaskSpec(BaseModel):
    """What every task of a session's is given: the session, by its workspace and id; the
    lease of the engine that holds the workspace (the phase task records under it:
    `Workspace.leased`); and the socket of the engine's egress proxy when its commands have
    the network (a task on the engine's machine uses it rather than starting a proxy of its
    own)."""

    workspace: str
    session_id: str
    lease: str | None = None
    egress: str | None = None

    @classmethod
    def of(cls, session, **what: Any):
        """The spec of a task of `session`'s, doing `what`."""
        confinement = session.confinement
        egress = confinement.egress_socket() if confinement.network_on else None
        return cls(workspace=str(session.ws.root), session_id=session.state.session_id,
                   lease=session.ws.lease, egress=str(egress) if egress else None, **what)


def engine_task(name: str, run_name: str, key: str):
    """labrun's pattern for an engine task: a Prefect task of one spec, its result persisted
    (in the workspace: `run_here`) and cached under `key`, formatted with the spec and never
    with the flow run, so that any later run of the session gets it back instead of doing it
    again."""
    return task(name=name, task_run_name=run_name, persist_result=True,
                cache_key_fn=lambda context, parameters: key.format(spec=parameters["spec"]))


def _task(name: str):
    module, attr = TASKS[name].split(":")
    return getattr(importlib.import_module(module), attr)


def run_here(name: str, spec: TaskSpec) -> dict[str, Any]:
    from labrun.workspace import Workspace

    # Committed at once: a finished task's record survives a crash of the phase around it.
    with transaction(commit_mode=CommitMode.EAGER):
        state = _task(name).with_options(result_storage=Workspace(spec.workspace).results)(spec, return_state=True)
    if state.is_failed() and isinstance(record := state.result(raise_on_failure=False), dict):
        return record  # a Failed state of the task's own, holding what it judged (a FAILED attempt)
    return state.result()


def run_in_process(name: str, spec: TaskSpec) -> dict[str, Any]:
    """The task in a Python process of its own, against the same Prefect API; its record
    comes back as the last line of its output."""
    job = json.dumps({"task": name, "spec": spec.model_dump(mode="json")})
    child = subprocess.Popen([sys.executable, "-m", "labrun.phases.execution"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, preexec_fn=dies_with_labrun(),
                             env={**os.environ, "PREFECT_LOGGING_LEVEL": "WARNING"})
    try:
        out, _ = child.communicate(job)
    finally:
        if child.poll() is None:  # the engine is unwinding (Ctrl-C): its task goes with it
            child.kill()
            child.wait()
    lines = out.strip().splitlines()
    if child.returncode != 0 or not lines:
        raise RuntimeError(f"the {name} task's process ended with exit code {child.returncode}")
    return json.loads(lines[-1])


EXECUTORS: dict[str, Callable[[str, TaskSpec], dict[str, Any]]] = {"here": run_here, "process": run_in_process}


def execute(name: str, spec: TaskSpec) -> dict[str, Any]:
    """Run the engine task `name` with `spec` where `LABRUN_TASKS_IN` says; its record."""
    return EXECUTORS[settings().tasks_in](name, spec)


def main() -> None:
    job = json.loads(sys.stdin.read())
    spec_type = typing.get_type_hints(_task(job["task"]).fn)["spec"]
    record = run_here(job["task"], spec_type.model_validate(job["spec"]))
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
