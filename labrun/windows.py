"""Waiting out a spent usage window (Claude Code's five-hour limit, a provider's reset time).

A spent window is not an error to retry in a loop. On the command line the engine counts
down to the reset and runs the phase again, which resumes it from its journal. A flow run
of a deployment (server mode) does not hold its worker for hours: it proposes a Scheduled
state for the reset time ("AwaitingUsageWindow") for itself and leaves through Prefect's
`Pause` signal, as `suspend_flow_run` does, so its process exits cleanly (exit code 0, no
crash reported) and frees the worker; at the reset time a worker starts the same flow run
again, and the phase cache and the journal make that run a resume.

The wait is clamped to at least `LABRUN_MIN_WINDOW_WAIT_S` (one minute unless set) and at
most six hours.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone

from labrun.model import UsageWindowSpent
from labrun.settings import settings

log = logging.getLogger("labrun")

MAX_WAIT_S = 6 * 3600.0
SCHEDULED_NAME = "AwaitingUsageWindow"


def min_wait_s() -> float:
    return settings().min_window_wait_s


def wait_seconds(resets_at: float, now: float | None = None) -> float:
    now = time.time() if now is None else now
    return min(max(resets_at - now, min_wait_s()), MAX_WAIT_S)


def in_deployment() -> bool:
    """True in a flow run started from a deployment (server mode)."""
    from prefect.runtime import deployment

    return bool(deployment.id)


def clock(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).strftime("%Y-%m-%d %H:%M:%S")


def countdown(seconds: float, what: str) -> None:
    """Sleep `seconds`, with a visible countdown on a terminal (stderr)."""
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    end = time.monotonic() + seconds
    if not console.is_terminal:
        time.sleep(seconds)
        return
    with console.status("") as status:
        while (left := end - time.monotonic()) > 0:
            h, rest = divmod(int(left + 0.999), 3600)
            status.update(f"{what}: resuming in {h}:{rest // 60:02d}:{rest % 60:02d}")
            time.sleep(min(1.0, left))


def wait_out(spent: UsageWindowSpent, what: str, store=None) -> None:
    """Wait for the window to reset, then return: the caller runs the phase again. In a
    flow run of a deployment, reschedule the flow run for the reset time and end this
    process instead (`Pause`); this does not return."""
    seconds = wait_seconds(spent.resets_at)
    until = time.time() + seconds
    note = f"{what}: usage window spent ({spent}); resuming at {clock(until)}"
    if in_deployment():
        reschedule(until, note, store)
    if store is not None:
        store.log(note)
    else:
        log.warning(note)
    countdown(seconds, what)


def reschedule(until: float, note: str, store=None) -> None:
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext
    from prefect.exceptions import Pause
    from prefect.states import Scheduled
    from prefect.utilities.engine import propose_state_sync

    flow_run = FlowRunContext.get().flow_run
    proposed = Scheduled(scheduled_time=datetime.fromtimestamp(until, timezone.utc),
                         name=SCHEDULED_NAME, message=note)
    with get_client(sync_client=True) as client:
        state = propose_state_sync(client, proposed, flow_run_id=flow_run.id)
    if not state.is_scheduled():
        raise RuntimeError(f"the flow run could not be rescheduled for the reset time (the server "
                           f"answered {state.type.value}); run it again after {clock(until)}")
    if store is not None:
        store.log(note + " (flow run rescheduled; its worker is free until then)")
    raise Pause(state=state)
