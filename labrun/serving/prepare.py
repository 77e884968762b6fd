"""What the deployments rely on, created on a Prefect server (or brought up to date): the
`labrun` process pool, its `sessions` work queue and limit, the `labrun-model-api` global
concurrency limit, and the automation that marks a run Crashed when its heartbeats stop."""

from __future__ import annotations

from labrun.model_api_limit import MODEL_API_LIMIT, configured_slots, ensure_global_limit
from labrun.serving import (DEFAULT_CRASH_AFTER_S, DEFAULT_SESSION_SLOTS, POOL, SESSION_QUEUE,
                            ZOMBIE_AUTOMATION)


def prepare(session_slots: int = DEFAULT_SESSION_SLOTS, model_api_slots: int | None = None,
            crash_after_s: int = DEFAULT_CRASH_AFTER_S) -> list[str]:
    """Returns one line per thing done."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    done: list[str] = []
    with get_client(sync_client=True) as client:
        try:
            pool = client.read_work_pool(POOL)
            if pool.type != "process":
                done.append(f"note: work pool {POOL} has type {pool.type}; labrun's prefect.yaml expects any pool named {POOL}")
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(
                name=POOL, type="process",
                base_job_template=ProcessWorker.get_default_base_job_template(),
                description="labrun research sessions",
            ))
            done.append(f"created work pool {POOL} (process)")
        try:
            queue = client.read_work_queue_by_name(SESSION_QUEUE, work_pool_name=POOL)
            if queue.concurrency_limit != session_slots:
                client.update_work_queue(queue.id, concurrency_limit=session_slots)
                done.append(f"set work queue {POOL}/{SESSION_QUEUE} to {session_slots} concurrent sessions")
        except ObjectNotFound:
            client.create_work_queue(SESSION_QUEUE, work_pool_name=POOL, concurrency_limit=session_slots,
                                     description="labrun research sessions")
            done.append(f"created work queue {POOL}/{SESSION_QUEUE} ({session_slots} concurrent sessions)")
        try:
            client.read_global_concurrency_limit_by_name(MODEL_API_LIMIT)
            exists = True
        except ObjectNotFound:
            exists = False
    if not exists or model_api_slots is not None:
        slots = model_api_slots or configured_slots()
        ensure_global_limit(MODEL_API_LIMIT, slots, update=True)
        done.append(f"global concurrency limit {MODEL_API_LIMIT}: {slots} model calls at once")
    done.append(ensure_zombie_automation(crash_after_s))
    return done


def zombie_automation(crash_after_s: int = DEFAULT_CRASH_AFTER_S):
    """Prefect's recipe for zombie flow runs: after a heartbeat, expect another heartbeat
    (or a state that ends or parks the run) within `crash_after_s`; otherwise Crashed."""
    from datetime import timedelta

    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    from labrun.windows import SCHEDULED_NAME

    # State events are named after the state's name: a run parked for a usage window
    # ("AwaitingUsageWindow") or started again (Pending, Running) is alive, not silent.
    states = ("Completed", "Failed", "Cancelled", "Crashed", "Cancelling", "TimedOut",
              "Paused", "Suspended", "Scheduled", "AwaitingRetry", "Late", SCHEDULED_NAME,
              "Pending", "Running")
    return AutomationCore(
        name=ZOMBIE_AUTOMATION,
        description="A flow run that stops sending heartbeats (its worker or machine died) "
        "is marked Crashed, so that it can be retried.",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *(f"prefect.flow-run.{s}" for s in states)},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=crash_after_s),
        ),
        actions=[ChangeFlowRunState(
            state=StateType.CRASHED,
            message=f"no heartbeat for {crash_after_s} s: the worker or its machine stopped; retry the run to resume it",
        )],
    )


def ensure_zombie_automation(crash_after_s: int = DEFAULT_CRASH_AFTER_S) -> str:
    from prefect.client.orchestration import get_client

    wanted = zombie_automation(crash_after_s)
    with get_client(sync_client=True) as client:
        found = client.read_automations_by_name(ZOMBIE_AUTOMATION)
        if not found:
            client.create_automation(wanted)
            return f"created automation {ZOMBIE_AUTOMATION!r} (Crashed after {crash_after_s} s without a heartbeat)"
        # An update starts the automation's windows afresh, which would forget the heartbeats
        # of runs left in flight when the server stopped: update only what changed.
        if _definition(found[0]) != _definition(wanted):
            client.update_automation(found[0].id, wanted)
        for extra in found[1:]:
            client.delete_automation(extra.id)
    return f"automation {ZOMBIE_AUTOMATION!r}: Crashed after {crash_after_s} s without a heartbeat"


def _definition(automation) -> object:
    """What an automation does, comparable between the one stored and the one wanted: no ids
    (a new trigger gets a new one), and sets in order."""
    def normal(value):
        if isinstance(value, dict):
            return {k: normal(v) for k, v in value.items() if k != "id"}
        if isinstance(value, list):
            items = [normal(v) for v in value]
            return sorted(items) if all(isinstance(v, str) for v in items) else items
        return value

    return normal(automation.model_dump(mode="json", include={"name", "description", "enabled",
                                                              "trigger", "actions"}))
