"""The experiment queue: submit one research-session run per new idea file in a folder.

Deployed on a cron schedule by prefect.yaml (`experiment-queue/ideas-folder`). An idea is
new when its content has not been submitted before: each submission carries an
idempotency key made of the idea's file name and content hash, so the server creates at
most one session run per idea however often the queue runs; an edited idea is a new idea
with a workspace of its own. Invalid ideas are reported and left out.
"""

from __future__ import annotations

import inspect
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from labrun.idea import IdeaError, load_idea
from labrun.run_params import RunParams, flow_parameters
from labrun.status import finished_and_intact
from labrun.workspace import Workspace
from labrun.serving import SESSION_DEPLOYMENT
from labrun.serving.submit import collect_ideas, flow_run_url, submit_session, workspace_for


class NoIdeasFolder(Exception):
    """The queue's `folder` is not a folder on the worker: its run fails, so that a
    misconfigured schedule shows red in the UI instead of green and idle."""


def _run_name() -> str:
    """`ideas from <folder>`: what a run of the queue looked at, not a random pair of words."""
    from prefect.runtime import flow_run

    return f"ideas from {flow_run.parameters.get('folder')}"


@flow(name="experiment-queue", flow_run_name=_run_name, log_prints=True, persist_result=False)
@flow_parameters(before={
    "folder": (str, inspect.Parameter.empty, "The folder of idea files, a path on the worker (a relative one: from its "
               "working directory, the clone)."),
    "workspaces": (str, inspect.Parameter.empty, "The folder under which each idea gets a workspace of its own."),
    "deployment": (str, SESSION_DEPLOYMENT, "The session deployment each idea's run is a run of."),
}, only=("agent", "model", "with_phases", "paper_style", "pass_env", "review_after"))
def experiment_queue(folder: str, workspaces: str, deployment: str = SESSION_DEPLOYMENT,
                     **session: Any) -> list[dict[str, Any]]:
    """One session run per new idea file in `folder`; the session's parameters go to every new one."""
    log = get_run_logger()
    began = datetime.now(timezone.utc)
    source = Path(folder).resolve()
    if not source.is_dir():
        raise NoIdeasFolder(f"folder {source}: {'not a folder' if source.exists() else 'no such folder'} on this "
                            "worker; set the deployment's `folder` parameter to the folder of idea files")
    root = Path(workspaces).resolve()
    submitted: list[dict[str, Any]] = []
    for path in collect_ideas([str(source)]):
        try:
            idea = load_idea(path)
        except IdeaError as e:
            log.error("%s: not queued: %s", path.name, "; ".join(e.problems))
            continue
        except Exception as e:  # one unreadable file does not hold up the others
            log.error("%s: not queued: cannot read it (%s: %s)", path.name, type(e).__name__, e)
            continue
        workspace = workspace_for(path, idea.content_hash, root)
        if Workspace(workspace).has_session() and finished_and_intact(workspace):
            continue  # done already (queued some other way)
        key = f"labrun-queue-{workspace.name}"
        run = submit_session(RunParams(idea_path=str(path), workspace=str(workspace), **session), deployment,
                             idempotency_key=key)
        if run.created is not None and run.created < began:
            continue  # the server answered the key with the run an earlier queue run made
        log.info("%s → %s: flow run %s %s", path.name, workspace, run.name, flow_run_url(run.id))
        submitted.append({"idea": str(path), "workspace": str(workspace), "flow_run_id": str(run.id),
                          "flow_run_name": run.name})
    log.info("%d new idea(s) queued from %s", len(submitted), source)
    return submitted

