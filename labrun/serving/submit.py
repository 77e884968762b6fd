"""Submitting sessions to the deployment: one flow run per idea, each with a workspace of its
own, and the Retry that Prefect's UI does."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from labrun.prefect_processes import ServerError
from labrun.run_params import RunParams, session_run_name
from labrun.serving import SESSION_DEPLOYMENT

IDEA_SUFFIXES = (".yaml", ".yml")


def collect_ideas(paths: list[str]) -> list[Path]:
    """Idea files named, and the idea files (*.yaml, *.yml) in folders named, in order."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(f for f in p.iterdir() if f.suffix in IDEA_SUFFIXES and f.is_file())
        elif p.is_file():
            found.append(p)
        else:
            raise ServerError(f"{p}: no such idea file or folder")
    return [f.resolve() for f in dict.fromkeys(found)]


def slug(text: str, limit: int = 40) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s[:limit].rstrip("-") or "idea"


def workspace_for(idea_path: Path, content_hash: str, root: Path) -> Path:
    """ROOT/<idea slug>-<short hash>: one workspace per idea content."""
    return (root / f"{slug(idea_path.stem)}-{content_hash[:8]}").resolve()


def submit_session(run: RunParams, deployment: str = SESSION_DEPLOYMENT, idempotency_key: str | None = None,
                   job_variables: dict[str, Any] | None = None):
    """One session flow run of the deployment; returns at once (the FlowRun). Only the
    parameters given go: a new session without an agent gets DEFAULT_AGENT, a resumed one
    keeps its own, and `pass_env` carries names only (the values are the worker's)."""
    from prefect.deployments import run_deployment

    return run_deployment(
        deployment, parameters=run.parameters(), timeout=0, flow_run_name=session_run_name(run.workspace or "."),
        tags=["labrun"], idempotency_key=idempotency_key, job_variables=job_variables,
        as_subflow=False,  # a session is a run of its own in the UI, not a queue's subflow
    )


def active_session_run(workspace: Path):
    """The run for `workspace` that has not ended (scheduled, waiting out a usage window,
    running, paused), or None. Queueing a second one would only wait on the first's lock."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (FlowRunFilter, FlowRunFilterName, FlowRunFilterState,
                                                FlowRunFilterStateType)
    from prefect.client.schemas.objects import StateType

    active = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.PAUSED,
              StateType.CANCELLING]
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            name=FlowRunFilterName(any_=[session_run_name(workspace)]),
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=active))))
    return next((r for r in runs if r.parameters.get("workspace") == str(workspace)), None)


def flow_run_url(flow_run_id) -> str:
    from prefect.utilities.urls import url_for

    return url_for("flow-run", obj_id=flow_run_id) or str(flow_run_id)


def retry_like_the_ui(flow_run_id, ui: str = "v2"):
    """What the Retry button of Prefect's UI does: the same flow run goes to AwaitingRetry
    and a worker runs it again; finished phases come from the cache. Prefect 3.9 serves two
    UIs: V2 (the default from `/`) forces the new state, V1 (`/runs/flow-run/<id>`, the
    links `labrun queue` prints) lets the server's orchestration rules accept it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.states import State

    if ui not in ("v1", "v2"):
        raise ValueError(f"ui must be v1 or v2, not {ui!r}")
    with get_client(sync_client=True) as client:
        return client.set_flow_run_state(
            flow_run_id,
            State(type=StateType.SCHEDULED, name="AwaitingRetry", message="Retry from the UI"),
            force=(ui == "v2"),
        )
