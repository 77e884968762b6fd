"""Where the engine's own tasks run (an experiment attempt, the rerun of one, the sealed
scoring): each takes a small serializable spec, rebuilds what it needs from the workspace
(`Session.attach`), never writes the session's state, and returns its record, which the
engine that owns the session records. So a task can run in this process or in another one.

Executors, by name (`LABRUN_TASKS_IN`):
- `here`: a call in the engine's process (the default);
- `process`: a Python process of its own, which dies with labrun;
- `pool`: a flow run of its own on a Prefect work pool, for the attempts of a session that
  names one (`TaskSpec.pool`: `--experiments-pool`), whatever `LABRUN_TASKS_IN` says.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import logging
import subprocess
import sys
import time
import typing
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from prefect import task
from prefect.transactions import CommitMode, transaction
from pydantic import BaseModel

from labrun.interrupts import dies_with_labrun
from labrun.sandbox import bubblewrap
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
    own); and the work pool the session's attempts run on, if it names one, with the storage
    their files travel through when its workers cannot see the workspace (`labrun.transfer`)."""

    workspace: str
    session_id: str
    lease: str | None = None
    egress: str | None = None
    pool: str | None = None
    storage: str | None = None
    sandboxed: bool = False
    """The engine runs its commands in bubblewrap: a worker that cannot refuses the attempt."""

    @classmethod
    def of(cls, session, **what: Any):
        """The spec of a task of `session`'s, doing `what`."""
        confinement = session.confinement
        egress = confinement.egress_socket() if confinement.network_on else None
        return cls(workspace=str(session.ws.root), session_id=session.state.session_id,
                   lease=session.ws.lease, egress=str(egress) if egress else None,
                   pool=session.state.experiments_pool, storage=session.state.experiments_storage,
                   sandboxed=bubblewrap() is not None, **what)


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


def spec_of(name: str, data: dict[str, Any]) -> TaskSpec:
    """The spec of engine task `name`, from its JSON form."""
    return typing.get_type_hints(_task(name).fn)["spec"].model_validate(data)


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


ON_POOL = {"attempt"}
"""The engine tasks a session's work pool runs: its attempts (their reruns and the sealed
scoring stay with the engine)."""
HELD_FOR = timedelta(days=365)
"""A flow run on a pool is created scheduled this far ahead, so that no worker takes it
before its id is on disk; then it is scheduled for now."""
POLL_S = (1.0, 2.0, 5.0)
"""The waits between two looks at a flow run on a pool: short at first, then every 5 s."""


def run_on_pool(name: str, spec: TaskSpec) -> dict[str, Any]:
    """Attempt `spec.n` as a flow run of the `experiment-attempt` deployment on the session's
    pool (`labrun.flows.attempt`), named after the session and the attempt and tagged with the
    session, so the UI lists it beside the session's runs; its record once it is final.

    Durable on both sides: the flow run's id is in the attempt's run file before any worker
    can take the run (it is created held, `HELD_FOR`, under an idempotency key of the
    session's and the attempt's, so an engine killed even before it wrote the id finds the
    same run again). An engine that finds an id there (a resume: `reattach_attempt`) waits for
    that run instead of starting another. A run that ends Crashed, Cancelled or Failed
    without the attempt's record is the infrastructure's failure (a lost worker), not the
    experiment's: INTERRUPTED, saying so.

    With `spec.storage` the worker need not see the workspace: the files the attempt starts
    from go there by content before the run is created, and what it changed comes back from
    there once the run is final, before its record is read (`labrun.transfer`)."""
    from labrun import transfer
    from labrun.attempt_records import AttemptRecords
    from labrun.workspace import Workspace

    n: int = spec.n  # type: ignore[attr-defined]  # an attempt's (ON_POOL)
    ws = Workspace(spec.workspace)
    records = AttemptRecords(ws, store=None)
    store = transfer.Store(spec.storage) if spec.storage else None
    declared = transfer.declared_data(_idea(ws)) if store else []
    flow_run = records.run(n).get("flow_run")
    try:
        if not flow_run and store:
            sent = transfer.send(ws, store, spec.session_id, n, declared)
            logging.getLogger("labrun").info("attempt %d: %d of its %d bytes sent to %s (the rest was there)", n,
                                             store.sent, sum(e.size for e in sent.files.values()), store.url)
        run = _wait(flow_run or _submit(name, spec, n, records), spec.pool or "", n)
        if store and not records.run(n).get("ended") and transfer.receive(ws, store, spec.session_id, n, declared):
            logging.getLogger("labrun").info("attempt %d: %d bytes brought back from %s", n, store.received, store.url)
    except (transfer.StorageError, transfer.TransferRefused, OSError) as e:
        if not store:
            raise
        return {"status": "INTERRUPTED", "task_run": records.run(n).get("task_run"), "pid": None,
                "error": f"an infrastructure failure, not the experiment's: its files could not travel through "
                         f"{store.url} ({e}); anything it wrote may be incomplete"}
    return _outcome(run, spec.pool, n, records)


def _idea(ws):
    from labrun.idea import load_idea

    return load_idea(ws.idea_copy)


def _submit(name: str, spec: TaskSpec, n: int, records) -> str:
    from prefect.deployments import run_deployment

    from labrun.run_params import session_run_name
    from labrun.serving.pools import attempt_deployment, attempt_job_variables
    from labrun.state import load_state

    pool = spec.pool
    session = session_run_name(spec.workspace)
    # The remote side starts an egress proxy of its own, and records nothing under a lease.
    remote = spec.model_copy(update={"lease": None, "egress": None})
    gpus = load_state(records.ws)[0].attempts[n - 1].gpu_count
    run = run_deployment(attempt_deployment(pool), parameters={"task": name, "spec": remote.model_dump(mode="json")},
                         job_variables=attempt_job_variables(pool, gpus),
                         flow_run_name=f"{session}-{name}-{n}", tags=["labrun", f"session:{session}"],
                         scheduled_time=datetime.now(timezone.utc) + HELD_FOR, timeout=0,
                         idempotency_key=f"labrun-{spec.session_id}-{name}-{n}")
    records.ws.write_json(records.run_path(n), {**records.run(n), "flow_run": str(run.id), "pool": pool})
    logging.getLogger("labrun").info("attempt %d sent to work pool %s as flow run %s (%s)", n, pool, run.name, run.id)
    return str(run.id)


def _wait(flow_run: str, pool: str, n: int):
    """The flow run, once final: released if it is still held, looked at every few seconds."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled, Scheduled

    from labrun.serving.pools import PoolError, unattended

    started = time.monotonic()
    warned_at = started
    wait_s = settings().pool_worker_wait_min * 60
    for i in itertools.count():
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(UUID(flow_run))
            state = run.state
            if state is not None and state.is_final():
                return run
            held = state is not None and state.is_scheduled() and state.state_details.scheduled_time is not None \
                and state.state_details.scheduled_time > datetime.now(timezone.utc) + HELD_FOR / 2
            if held:  # its id is on disk: any worker of the pool may take it now
                client.set_flow_run_state(run.id, Scheduled(), force=True)
            elif state is not None and state.is_scheduled() and time.monotonic() - warned_at > wait_s:
                warned_at = time.monotonic()
                try:
                    if line := unattended(pool):
                        logging.getLogger("labrun").warning("attempt %d waits for a worker: %s", n, line)
                except PoolError as e:
                    client.set_flow_run_state(run.id, Cancelled(message=str(e)), force=True)
        time.sleep(POLL_S[min(i, len(POLL_S) - 1)])
    raise AssertionError("unreachable")


def cancel_on_pool(flow_run: str) -> None:
    """Cancel an attempt's flow run on its pool: its worker ends the run's process, whose task
    then stops the attempt's command (`experiment_attempt`, as on Ctrl-C)."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(UUID(flow_run), Cancelling(message="stopped by the agent"), force=True)


def _outcome(run, pool: str | None, n: int, records) -> dict[str, Any]:
    """The attempt's record, from its run file where its task wrote it; INTERRUPTED, as the
    infrastructure's failure, when the flow run ended without one."""
    from labrun.commands import kill_group

    noted = records.run(n)
    if noted.get("ended"):
        return {**noted["ended"], "pid": None}
    state = run.state
    where = f"its flow run {run.name} on work pool {pool}"
    said = f" ({state.message})" if state.message else ""
    if state.is_cancelled() or (state.is_crashed() and _cancel_asked(run)):
        why = f"{where} was cancelled{said} before the attempt ended"
    elif state.is_crashed():
        why = f"{where} crashed{said}: the machine or the job running it was lost"
    else:
        why = f"{where} ended {state.name}{said} before the attempt did"
    for group in records.supervised(n).groups():  # what it left on this machine, if it ran here
        kill_group(group)
    return {"status": "INTERRUPTED", "task_run": noted.get("task_run"), "pid": None,
            "error": f"an infrastructure failure, not the experiment's: {why}; anything it wrote may be incomplete"}


def _cancel_asked(run) -> bool:
    """Whether someone cancelled the run (it went Cancelling) before it crashed: a worker that
    stops a run's process by a signal, as the labrun-slurm worker's scancel does, has the run
    read Crashed (its engine took the signal for a crash) until the worker marks it Cancelled,
    seconds later."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return any(s.is_cancelling() for s in client.read_flow_run_states(run.id))


EXECUTORS: dict[str, Callable[[str, TaskSpec], dict[str, Any]]] = {
    "here": run_here, "process": run_in_process, "pool": run_on_pool}


def execute(name: str, spec: TaskSpec) -> dict[str, Any]:
    """Run the engine task `name` with `spec`: on the session's work pool if it names one and
    the task is one a pool runs, else where `LABRUN_TASKS_IN` says; its record."""
    where = "pool" if spec.pool and name in ON_POOL else settings().tasks_in
    return EXECUTORS[where](name, spec)


def main() -> None:
    job = json.loads(sys.stdin.read())
    record = run_here(job["task"], spec_of(job["task"], job["spec"]))
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
