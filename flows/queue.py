"""The experiment queue: submit one research-session run per new idea file in a folder.

Deployed on a cron schedule by prefect.yaml (`experiment-queue/ideas-folder`). An idea is
new when its content has not been submitted before: each submission carries an
idempotency key made of the idea's file name and content hash, so the server creates at
most one session run per idea however often the queue runs; an edited idea is a new idea
with a workspace of its own. Invalid ideas are reported and left out.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from labrun.idea import IdeaError, load_idea
from labrun.status import finished_and_intact
from labrun.workspace import Workspace
from labrun.serving import SESSION_DEPLOYMENT
from labrun.serving.submit import collect_ideas, flow_run_url, submit_session, workspace_for


@flow(name="experiment-queue", log_prints=True, persist_result=False)
def experiment_queue(
    folder: str,
    workspaces: str,
    agent: str | None = None,
    model: str | None = None,
    deployment: str = SESSION_DEPLOYMENT,
    with_phases: list[str] | None = None,
    paper_style: str | None = None,
    pass_env: list[str] | None = None,
) -> list[dict[str, Any]]:
    """`folder` and `workspaces` are paths on the worker (relative ones: from its working
    directory, the clone); `with_phases`, `paper_style` and `pass_env` (names of keys for the
    experiments) go to every new session."""
    log = get_run_logger()
    began = datetime.now(timezone.utc)
    source = Path(folder).resolve()
    if not source.is_dir():
        log.warning("%s: no such folder; nothing to queue", source)
        return []
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
        run = submit_session(path, workspace, agent, model, deployment, idempotency_key=key,
                             with_phases=with_phases, paper_style=paper_style, pass_env=pass_env)
        if run.created is not None and run.created < began:
            continue  # the server answered the key with the run an earlier queue run made
        log.info("%s → %s: flow run %s %s", path.name, workspace, run.name, flow_run_url(run.id))
        submitted.append({"idea": str(path), "workspace": str(workspace), "flow_run_id": str(run.id),
                          "flow_run_name": run.name})
    log.info("%d new idea(s) queued from %s", len(submitted), source)
    return submitted

