"""The `experiment-attempt` flow: one engine task of a session's (an experiment attempt) as
a flow run of its own, on the work pool the session sends its attempts to (`run_on_pool` in
`labrun.phases.execution`; its deployment `experiment-attempt/<pool>`: `labrun.serving.pools`).

It runs the task as the engine's process would (`run_here`: from the workspace alone, its
result persisted in the workspace): in the workspace's own path, which the worker then sees on
storage shared with the engine, or, when the session names experiments storage (`spec.storage`),
in a workspace of its own made from the files the engine sent there, whose changes go back the
same way (`labrun.transfer`). The keys the attempt names come from the worker's own environment:
the parameters carry names, never values (the UI shows them). Its state says how the attempt
came out; its record is in the attempt's run file, which the engine reads.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.states import Completed, Failed, State

from labrun.phases.execution import run_here, spec_of
from labrun.serving import ATTEMPT_FLOW
from labrun.settings import settings


@flow(name=ATTEMPT_FLOW, persist_result=False, log_prints=True)
def experiment_attempt_flow(task: str, spec: dict[str, Any]) -> State:
    """One engine task of a session's, from its spec (its workspace, session and attempt number).

    Args:
        task: the engine task's name (attempt)
        spec: what it is given: the workspace, the session's id, the attempt's number
    """
    parsed = spec_of(task, spec)
    if parsed.storage:
        from labrun.transfer import run_from_storage

        record = run_from_storage(parsed, lambda here: run_here(task, here), settings().experiments_workdir)
    else:
        record = run_here(task, parsed)
    line = f"attempt {record['n']} {record['status']}" + (f": {record['error']}" if record.get("error") else "")
    # The states carry the line alone: the record is in the run file, and Prefect's engine
    # reads a Failed state's data as the exception to raise (a dict there is a TypeError).
    return Completed(message=line) if record["status"] == "SUCCESS" else Failed(message=line)
