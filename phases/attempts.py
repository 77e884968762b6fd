"""Experiment attempts: each `run_experiment` call is one numbered attempt and one Prefect
subtask, recorded RUNNING in STATE.md before its command starts.

The subtask commits eagerly, so a finished attempt survives a crash of its phase; the
journal holds the agent's view of it, STATE.md the researcher's.
"""

from __future__ import annotations

import errno
import math
import os
import re

from prefect import task
from prefect.context import TaskRunContext
from prefect.transactions import CommitMode, transaction

from labrun.commands import run_command
from labrun.crashpoints import crashpoint
from labrun.evidence import kept_text, unmeasured
from labrun.session import Session
from labrun.snapshot import changed, keep_copies, workspace_files
from labrun.state import Attempt
from labrun.tools import RunExperimentInput, ToolError, parse_metrics
from labrun.wsfs import Refused

ERROR_LINE = re.compile(r"^\s*([\w.]*(Error|Exception|Exit|Interrupt)\b.*)$", re.M)
TEX_ERROR = re.compile(r"^(?:\S+\.(?:tex|sty|cls|bib):\d+: |! ).+$", re.M)  # TeX's first error
MAX_OUTPUT_BYTES = 200_000_000
MAX_METRICS_BYTES = 10_000_000
"""More is not a metrics file: the engine reads no further."""
DISK_FULL = os.strerror(errno.ENOSPC)  # "No space left on device"


def start_attempt(session: Session, phase_key: str, inp: RunExperimentInput) -> Attempt:
    files = workspace_files(session.ws.root)
    refuse_if_repeated(session, inp, files)
    keep_copies(session.ws.root, files, session.ws.kept)  # so that the engine can run it again
    attempt = session.new_attempt(phase_key, inp, files)
    with transaction(commit_mode=CommitMode.EAGER):
        record = experiment_attempt.with_options(result_storage=session.ws.results)(
            session_id=session.state.session_id, workspace=str(session.ws.root), n=attempt.n
        )
    return Attempt.model_validate(record)


def refuse_if_repeated(session: Session, inp: RunExperimentInput, files: dict[str, str]) -> None:
    """A refused call is not an attempt: it gets no number, only a Worklog line.

    "The same failed command on unchanged sources": the workspace now (`files`) against the
    workspace as the failed attempt found it. What that attempt wrote itself, its declared
    outputs and its metrics file do not count; any other change does, whatever the file."""
    attempts = session.state.attempts
    last = attempts[-1] if attempts else None
    reason = None
    if last and last.status == "FAILED" and not (inp.fix_applied or "").strip():
        reason = (
            f"attempt {_named(session, last)} failed ({last.error}); say in fix_applied what you changed "
            "before the next attempt"
        )
    else:
        for a in attempts:
            found = session.attempt_files(a.n) if a.status == "FAILED" and a.command == inp.command else None
            if found is None or found["wrote"] is None:
                continue
            own = set(found["wrote"]) | set(a.outputs) | {a.metrics_file} - {None}
            if not [f for f in changed(found["before"], files) if not _under(f, own)]:
                reason = (
                    f"attempt {_named(session, a)} already ran this command on these same files and "
                    f"failed ({a.error}); change the code, its inputs or the command first"
                )
    if reason:
        session.store.log(f"run_experiment refused: {reason}")
        raise ToolError(f"Refused, not run: {reason}.")


def _under(path: str, paths: set[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in paths)


def _named(session: Session, attempt: Attempt) -> str:
    """An earlier branch's attempt says so (`labrun rerun`: one numbering, every branch)."""
    return f"{attempt.n}" if attempt.branch == session.state.branch else f"{attempt.n} (branch {attempt.branch})"


def _attempt_key(context, parameters) -> str:
    return f"labrun-{parameters['session_id']}-attempt-{parameters['n']}"


@task(
    name="attempt",
    task_run_name="attempt {n}",
    cache_key_fn=_attempt_key,
    persist_result=True,
)
def experiment_attempt(session_id: str, workspace: str, n: int) -> dict:
    session = Session.get(workspace)
    attempt = session.state.attempts[n - 1]
    session.update_attempt(n, task_run=str(TaskRunContext.get().task_run.id))
    log = session.ws.root / attempt.log
    result = run_command(
        attempt.command,
        session.ws.root,
        log,
        timeout_s=session.time_limit_s,
        max_output_bytes=MAX_OUTPUT_BYTES,
        on_start=lambda pgid: (session.update_attempt(n, pgid=pgid), crashpoint("attempt")),
        sandbox=session.sandbox(),
        keys=session.key_names(),
    )
    session.ws.release_reserve_if_full()  # so that this attempt's record fits
    session.attempt_wrote(n, workspace_files(session.ws.root))
    status, error, metrics, outputs = judge(session, attempt, result)
    record = session.attempt_files(n) or {}
    ended = attempt.model_copy(update={"metrics": metrics})
    session.update_attempt(
        n,
        status=status,
        exit_code=result.exit_code,
        duration_s=round(result.duration_s, 2),
        error=error,
        metrics=metrics,
        outputs=outputs,
        unmeasured=unmeasured(ended, record, kept_text(session.ws.kept, record.get("before") or {}), session.ws.root),
        pgid=None,
    )
    return session.state.attempts[n - 1].model_dump()


def judge(session: Session, attempt: Attempt, result) -> tuple[str, str | None, dict, list[str]]:
    """FAILED on a non-zero exit, a traceback, a missing declared output or a NaN metric."""
    root = session.ws.root
    errors: list[str] = []
    if result.timed_out or result.too_much_output:
        errors.append(result.output.rsplit("\n", 1)[-1].strip("[]"))
    elif result.exit_code != 0:
        errors.append(f"exit code {result.exit_code}")
    full = (root / attempt.log).read_text(errors="replace")
    if "Traceback (most recent call last)" in full or (errors and ERROR_LINE.search(full)):
        found = ERROR_LINE.findall(full)
        errors.insert(0, found[-1][0].strip() if found else "a Python traceback")
    if errors and (tex := TEX_ERROR.search(full)):
        errors.insert(0, tex.group(0).strip())
    if DISK_FULL in full or (errors and session.ws.nearly_full()):
        errors.insert(0, f"the disk filled up ({session.ws.free_mb():.0f} MB free)")
    files = session.ws.files  # the agent's paths, read without following its links
    outputs = [p for p in attempt.outputs if files.exists(p)]
    errors += [f"declared output {p} is missing" for p in attempt.outputs if p not in outputs]
    metrics: dict = {}
    if attempt.metrics_file:
        name = attempt.metrics_file
        try:
            metrics = parse_metrics(files.read_bytes(name, MAX_METRICS_BYTES).decode(errors="replace"))
        except FileNotFoundError:
            errors.append(f"metrics file {name} is missing")
        except (Refused, ValueError) as e:  # a link or no regular file; json.JSONDecodeError is a ValueError
            errors.append(f"metrics file {name} is unreadable: {e}")
        bad = [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
        errors += [f"metric {k} is {metrics[k]}" for k in bad]
        metrics = {k: (str(v) if k in bad else v) for k, v in metrics.items()}
    if errors:
        return "FAILED", "; ".join(dict.fromkeys(errors)), metrics, outputs
    return "SUCCESS", None, metrics, outputs

