"""Experiment attempts: each `run_experiment` call is one numbered attempt and one Prefect
subtask, recorded RUNNING in STATE.md before its command starts.

The subtask commits eagerly, so a finished attempt survives a crash of its phase; the
journal holds the agent's view of it, STATE.md the researcher's.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import re
import stat

from prefect.context import TaskRunContext
from prefect.states import Failed, State

from labrun.commands import start_supervised
from labrun.crashpoints import crashpoint
from labrun.evidence import echoed, kept_text, shell_writer, unmeasured
from labrun.phases.execution import TaskSpec, engine_task, execute
from labrun.settings import settings
from labrun.session import Session
from labrun.snapshot import changed, keep_copies, workspace_files
from labrun.state import Attempt, duration
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
    refuse_if_repeated(session, phase_key, inp, files)
    keep_copies(session.ws.root, files, session.ws.kept)  # so that the engine can run it again
    attempt = session.records.new(phase_key, inp, files)
    ended = execute("attempt", AttemptSpec.of(session, n=attempt.n))
    session.records.record(attempt.n, ended)
    if settings().tasks_in != "here":
        session.store.log(f"attempt {attempt.n} ran in process {ended['pid']} (LABRUN_TASKS_IN={settings().tasks_in})")
    return session.state.attempts[attempt.n - 1]


def refuse_if_repeated(session: Session, phase_key: str, inp: RunExperimentInput, files: dict[str, str]) -> None:
    """A refused call is not an attempt: it gets no number, only a Worklog line. After a
    failed attempt, the phase's next one says what it changed (a new phase starts afresh).

    "The same failed command on unchanged sources": the workspace now (`files`) against the
    workspace as the failed attempt found it. What that attempt wrote itself, its declared
    outputs and its metrics file do not count; any other change does, whatever the file."""
    attempts = session.state.attempts
    last = attempts[-1] if attempts else None
    reason = None
    if last and last.status == "FAILED" and last.phase == phase_key and not (inp.fix_applied or "").strip():
        reason = (
            f"attempt {_named(session, last)} failed ({last.error}); say in fix_applied what you changed "
            "before the next attempt"
        )
    else:
        for a in attempts:
            found = session.records.files(a.n) if a.status == "FAILED" and a.command == inp.command else None
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


class AttemptSpec(TaskSpec):
    n: int


@engine_task("attempt", "attempt {spec.n}", "labrun-{spec.session_id}-attempt-{spec.n}")
def experiment_attempt(spec: AttemptSpec) -> dict | State:
    """Run attempt n's command and judge it, from the workspace alone (`labrun.phases.execution`):
    what it notes as it runs goes to its run file, and its record is returned."""
    session = Session.attach(spec)
    try:
        record = _run(session, spec.n)
    finally:
        session.close()
    if record["status"] == "FAILED":  # the UI shows the task run failed; the engine records it all the same
        return Failed(message=f"attempt {spec.n} FAILED: {record['error']}", data=record)
    return record


def reattach_attempt(session: Session, n: int) -> Attempt:
    """Attempt n, left RUNNING by an engine that stopped while its command ran on under its
    supervisor: its task again, which waits for the command (or finds it ended) and judges it,
    once; never started again."""
    session.records.record(n, execute("attempt", AttemptSpec.of(session, n=n)))
    return session.state.attempts[n - 1]


def _run(session: Session, n: int) -> dict:
    """Start attempt n's command under its supervisor (`labrun.supervisor`), or re-attach to
    the one an earlier engine started; wait for its end, and judge it."""
    attempt = session.state.attempts[n - 1]
    run_file = session.records.run_path(n)
    noted = session.records.run(n)
    if noted.get("ended"):
        return {**noted["ended"], "pid": os.getpid()}
    noted["task_run"] = str(TaskRunContext.get().task_run.id)
    log = session.ws.root / attempt.log
    # Its metrics file and declared outputs, as it finds them: a deterministic run writes them
    # again byte for byte, which only their identity tells from a file it left alone.
    watched = [p for p in dict.fromkeys([attempt.metrics_file, *attempt.outputs]) if p]
    keep = settings().keep_experiments
    supervised = session.records.supervised(n)
    if supervised.read():  # started by an engine that stopped since: never started again
        session.ws.write_json(run_file, noted, durable=False)
        crashpoint("attempt-reattached")
    else:
        noted["found"] = {p: _identity(session, p) for p in watched}
        session.ws.write_json(run_file, noted, durable=False)  # about this process, not the disk
        folder = session.ws.files.open(session.records.supervisor_path(n).parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            supervised = start_supervised(
                attempt.command, session.ws.root, log, folder, session.records.supervisor_path(n).name,
                supervised.read, timeout_s=session.limits.time_limit_s, max_output_bytes=MAX_OUTPUT_BYTES,
                sandbox=session.confinement.sandbox(), keys=session.confinement.key_names(), keep=keep)
        finally:
            os.close(folder)
        crashpoint("attempt")
    try:
        report = supervised.wait()
    except BaseException:  # the engine is stopping (Ctrl-C): its attempt with it, unless asked otherwise
        if not keep:
            supervised.stop()
        raise
    supervised.release()
    session.ws.release_reserve_if_full()  # so that this attempt's record fits
    crashpoint("attempt-ended")
    if report is None:
        supervised.stop()  # what its command left, if it ran without a sandbox to end it
        ended = attempt.model_copy(update=dict(
            status="INTERRUPTED", task_run=noted["task_run"],
            error="its supervisor ended before its command did (killed, or the machine restarted); "
                  "anything it wrote may be incomplete")).model_dump()
        session.ws.write_json(run_file, {**noted, "ended": ended}, durable=False)
        return {**ended, "pid": os.getpid()}
    result = supervised.result(report, log, session.limits.time_limit_s, MAX_OUTPUT_BYTES)
    found = noted.get("found") or {}
    before = (session.records.files(n) or {}).get("before") or {}
    rewritten = [p for p in watched if found.get(p) and _identity(session, p) not in (None, found[p])
                 and shell_writer(attempt.command, p, before, session.ws.root) is None]  # `touch` computes nothing
    session.records.wrote(n, workspace_files(session.ws.root), rewritten)
    status, error, metrics, outputs = judge(session, attempt, result)
    record = session.records.files(n) or {}
    measured = attempt.model_copy(update={"metrics": metrics})
    kept = kept_text(session.ws.kept, record.get("before") or {})
    ended = attempt.model_copy(update=dict(
        status=status,
        exit_code=result.exit_code,
        duration_s=round(result.duration_s, 2),
        error=error,
        metrics=metrics,
        outputs=outputs,
        unmeasured=unmeasured(measured, record, kept, session.ws.root),
        echoed=echoed(measured, record, kept, session.ws.root),
        task_run=noted["task_run"],
    )).model_dump()
    session.ws.write_json(run_file, {**noted, "ended": ended}, durable=False)  # recorded by a resume if the engine stops now
    return {**ended, "pid": os.getpid()}


def _identity(session: Session, rel: str | None) -> list[int] | None:
    """A regular file's inode and modification time (None when there is none, or it is not one
    the engine reads): which tell a file written again from one left alone. A list: noted in
    the attempt's run file, for a resume that re-attaches to it."""
    try:
        st = session.ws.files.lstat(rel) if rel else None
    except Refused:
        return None
    return [st.st_ino, st.st_mtime_ns] if st is not None and stat.S_ISREG(st.st_mode) else None


def judge(session: Session, attempt: Attempt, result) -> tuple[str, str | None, dict, list[str]]:
    """FAILED on a non-zero exit, a traceback, a missing declared output or a NaN metric."""
    root = session.ws.root
    errors: list[str] = []
    if result.timed_out:
        limit = duration(session.limits.time_limit_s)
        errors.append(f"stopped after the idea's time_limit of {limit}, which bounds each attempt")
        logging.getLogger("labrun").warning(
            "attempt %d ran past the idea's time_limit of %s and was stopped; raise constraints.time_limit "
            "if a run needs longer", attempt.n, limit)
    elif result.too_much_output:
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

