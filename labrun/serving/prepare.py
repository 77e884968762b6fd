"""What the deployments rely on, created on a Prefect server (or brought up to date): the
`labrun` process pool, its `sessions` work queue and limit, the `labrun-model-api` global
concurrency limit, the automation that marks a run Crashed when its heartbeats stop, and,
when asked, the one that notifies a webhook when a session completes, fails or awaits review."""

from __future__ import annotations

from labrun.model_api_limit import MODEL_API_LIMIT, configured_slots, ensure_global_limit
from labrun.serving import (DEFAULT_CRASH_AFTER_S, DEFAULT_SESSION_SLOTS, NOTIFY_AUTOMATION, NOTIFY_BLOCK,
                            POOL, SESSION_FLOW, SESSION_QUEUE, ZOMBIE_AUTOMATION)

NOTIFIED_STATES = ("Completed", "Failed", "Crashed", "Suspended")
"""A session run's states worth a message: it ended, or it waits for a review (Suspended)."""


def prepare(session_slots: int = DEFAULT_SESSION_SLOTS, model_api_slots: int | None = None,
            crash_after_s: int = DEFAULT_CRASH_AFTER_S, notify: str | None = None) -> list[str]:
    """Returns one line per thing done. `notify`: a webhook URL (None leaves the notification
    automation as it is, or absent)."""
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
    if notify:
        done.append(ensure_notify_automation(notify))
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
    if _ensure_automation(zombie_automation(crash_after_s)):
        return f"created automation {ZOMBIE_AUTOMATION!r} (Crashed after {crash_after_s} s without a heartbeat)"
    return f"automation {ZOMBIE_AUTOMATION!r}: Crashed after {crash_after_s} s without a heartbeat"


def notify_automation(block_document_id):
    """Prefect's recipe for a notification: each state event of a `research-session` flow run
    in NOTIFIED_STATES sends the notification block a subject and a body (the run, its state,
    its message, which holds the verdict, and its page in the UI)."""
    from datetime import timedelta

    from prefect.events.actions import SendNotification
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    state = "{{ event.resource['prefect.state-name'] }}"
    return AutomationCore(
        name=NOTIFY_AUTOMATION,
        description=f"Posts to the webhook of the block {NOTIFY_BLOCK} when a {SESSION_FLOW} run "
                    f"is {', '.join(NOTIFIED_STATES[:-1])} or {NOTIFIED_STATES[-1]} (awaits review).",
        trigger=EventTrigger(
            expect={f"prefect.flow-run.{s}" for s in NOTIFIED_STATES},
            match=ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
            match_related=ResourceSpecification({"prefect.resource.role": "flow",
                                                 "prefect.resource.name": SESSION_FLOW}),
            posture=Posture.Reactive,
            threshold=1,
            within=timedelta(0),
        ),
        actions=[SendNotification(
            block_document_id=block_document_id,
            subject=f"labrun: {{{{ flow_run.name }}}} {state}",
            body=f"The labrun session {{{{ flow_run.name }}}} is {state}: "
                 "{{ event.resource['prefect.state-message'] }}\n{{ flow_run|ui_url }}",
        )],
    )


def ensure_notify_automation(url: str) -> str:
    """The block `labrun-notify` (Prefect's custom webhook: a JSON body `{"subject", "body"}`
    posted to `url`, kept as the block's secret, since a webhook's URL often holds its token)
    and the automation that uses it."""
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    block = CustomWebhookNotificationBlock(
        name=NOTIFY_BLOCK, url="{{url}}", secrets={"url": url},
        json_data={"subject": "{{subject}}", "body": "{{body}}"})
    block_id = block.save(NOTIFY_BLOCK, overwrite=True)
    created = _ensure_automation(notify_automation(block_id))
    return (f"{'created' if created else 'updated'} automation {NOTIFY_AUTOMATION!r} "
            f"(block {NOTIFY_BLOCK}: a webhook of the URL given)")


def _ensure_automation(wanted) -> bool:
    """Create the automation `wanted` names, or bring the one there up to date; True when it
    was created."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        found = client.read_automations_by_name(wanted.name)
        if not found:
            client.create_automation(wanted)
            return True
        # An update starts the automation's windows afresh, which would forget the heartbeats
        # of runs left in flight when the server stopped: update only what changed.
        if _definition(found[0]) != _definition(wanted):
            client.update_automation(found[0].id, wanted)
        for extra in found[1:]:
            client.delete_automation(extra.id)
    return False


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
