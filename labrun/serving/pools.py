"""The work pool a session's experiment attempts run on (`--experiments-pool`, the flow
parameter `experiments_pool`, the idea's `constraints.experiments_pool`): checked before the
session runs, and the deployment of the attempt flow on it (`experiment-attempt/<pool>`,
made or brought up to date on demand, so any pool a worker polls will do: no prefect.yaml
entry per pool). The executor that sends attempts there is `run_on_pool` in
`labrun.phases.execution`; the flow is `labrun.flows.attempt`.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from labrun.serving import ATTEMPT_FLOW
from labrun.settings import settings

ATTEMPT_ENTRYPOINT = "labrun.flows.attempt.experiment_attempt_flow"
"""A module path, as prefect.yaml's: a worker imports the attempt flow of the labrun installed beside it."""
ATTEMPT_ENV = {
    # A lost worker stops the heartbeats: `labrun server`'s automation marks the run Crashed,
    # which the engine records as an infrastructure failure.
    "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30",
    "PREFECT_CLIENT_MAX_RETRIES": "10",
}

ATTEMPT_PARAMETERS = {
    "type": "object", "required": ["task", "spec"],
    "properties": {"task": {"type": "string", "title": "task", "description": "the engine task's name (attempt)"},
                   "spec": {"type": "object", "title": "spec",
                            "description": "its spec: the workspace, the session's id, the attempt's number"}}}
"""The flow's parameters as its signature has them (`labrun.flows.attempt`; declared here so
that the engine need not import the flow's module, which imports the engine's tasks)."""


class PoolError(ValueError):
    """An experiments pool that cannot take attempts: one line saying what to do."""


def check_pool(name: str, storage: str | None = None, workspace: str | None = None) -> str | None:
    """Refuses (`PoolError`) a pool the Prefect API does not know, experiments storage this
    machine cannot write and read back (`labrun.transfer`; the worker's side is checked as each
    attempt's flow run starts), and a pool no worker has polled for
    `LABRUN_POOL_WORKER_WAIT_MIN` minutes when `LABRUN_POOL_NO_WORKER=fail`; returns a warning
    for the latter otherwise."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    if storage:  # a pool whose attempts cannot get their files cannot take them
        from labrun.transfer import StorageError, check_storage

        try:
            check_storage(storage, workspace)
        except StorageError as e:
            raise PoolError(str(e)) from None

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
        except ObjectNotFound:
            known = ", ".join(p.name for p in client.read_work_pools()) or "none"
            raise PoolError(
                f"experiments pool {name!r}: the Prefect API at {client.api_url} has no work pool of that name "
                f"(it has: {known}); create it (`prefect work-pool create {name} --type process`) and start a "
                "worker for it, or name another") from None
    return unattended(name)


def unattended(name: str) -> str | None:
    """None while a worker has polled pool `name` within the last `LABRUN_POOL_WORKER_WAIT_MIN`
    minutes; else a line saying so (a `PoolError` under `LABRUN_POOL_NO_WORKER=fail`)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        workers = client.read_workers_for_work_pool(name)
    wait = settings().pool_worker_wait_min
    seen = [w.last_heartbeat_time for w in workers if w.last_heartbeat_time]
    if seen and datetime.now(timezone.utc) - max(seen) < timedelta(minutes=wait):
        return None
    line = f"experiments pool {name!r} has had no worker online for {wait:g} minutes"
    if settings().pool_no_worker == "fail":
        raise PoolError(f"{line}; start one (`prefect worker start --pool {name}`), or set "
                        "LABRUN_POOL_NO_WORKER=wait to wait for one")
    return f"{line}; its attempts wait for one (LABRUN_POOL_NO_WORKER=fail refuses instead)"


def attempt_deployment(pool: str):
    """The id of the deployment `experiment-attempt/<pool>`, made (or updated) now."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.create_deployment(
            flow_id=client.create_flow_from_name(ATTEMPT_FLOW), name=pool, entrypoint=ATTEMPT_ENTRYPOINT,
            work_pool_name=pool, tags=["labrun"], parameter_openapi_schema=ATTEMPT_PARAMETERS,
            job_variables={"env": ATTEMPT_ENV},
            description=f"labrun experiment attempts on work pool {pool} (made by the sessions that send them here)")


def attempt_job_variables(pool: str, gpus: int) -> dict[str, int]:
    """The job variables of the flow run of an attempt that asks for `gpus` GPUs: `gpus` itself
    where the pool's job template has a variable of that name (labrun-slurm's: the job's
    `--gres=gpu:N`, whose devices Slurm puts in the job's CUDA_VISIBLE_DEVICES, which
    `labrun.gpus` reads); else none, and the pool's own settings say what its jobs get. An
    attempt that asks for none keeps the pool's default."""
    from prefect.client.orchestration import get_client

    if not gpus:
        return {}
    with get_client(sync_client=True) as client:
        template = client.read_work_pool(pool).base_job_template
    return {"gpus": gpus} if "gpus" in template.get("variables", {}).get("properties", {}) else {}

