"""Experiment attempts: each `run_experiment` call is one numbered attempt and one Prefect
subtask, recorded RUNNING in STATE.md before its command starts.

The subtask commits eagerly, so a finished attempt survives a crash of its phase; the
journal holds the agent's view of it, STATE.md the researcher's.
"""

from __future__ import annotations

import contextvars
import errno
import logging
import math
import os
import re
import stat
import threading
import time
from contextlib import contextmanager
from typing import Callable

from prefect.context import TaskRunContext
from prefect.states import Failed, State

from labrun import gpus
from labrun.commands import start_supervised
from labrun.agents.registry import own_shell
from labrun.model import UsageWindowSpent
from labrun.sandbox import HOW_TO_INSTALL, bubblewrap
from labrun.secrets import declare
from labrun.crashpoints import crashpoint
from labrun.evidence import echoed, kept_text, shell_writer, unmeasured
from labrun.phases.execution import TaskSpec, cancel_on_pool, engine_task, execute
from labrun.settings import settings
from labrun.session import Session
from labrun.snapshot import changed, keep_copies, workspace_files
from labrun.state import Attempt, duration
from labrun.tools import BASH_TIMEOUT_S, RunExperimentInput, ToolError, parse_metrics
from labrun.wsfs import Refused

ERROR_LINE = re.compile(r"^\s*([\w.]*(Error|Exception|Exit|Interrupt)\b.*)$", re.M)
TEX_ERROR = re.compile(r"^(?:\S+\.(?:tex|sty|cls|bib):\d+: |! ).+$", re.M)  # TeX's first error
MAX_OUTPUT_BYTES = 200_000_000
MAX_METRICS_BYTES = 10_000_000
"""More is not a metrics file: the engine reads no further."""
DISK_FULL = os.strerror(errno.ENOSPC)  # "No space left on device"


STOP_WAIT_S = 120
"""How long `stop_experiment` waits for an attempt to end before it says so."""
OUTPUT_CHARS = 20_000
"""The most of an attempt's new output one `experiment_output` call returns (its end)."""


class PhaseAttempts:
    """A phase's experiment attempts (`labrun.tools.Experiments`). Each is a Prefect subtask
    (`experiment_attempt`) run in the agent's turn or, with `run_in_background`, in a thread
    of its own that records it as it ends while the turn goes on. At most
    `Limits.parallel_attempts` run at once; a later one waits for a slot, and says so in its
    run file (`AttemptRecords.run`)."""

    def __init__(self, session: Session, phase_key: str):
        self.session = session
        self.phase_key = phase_key
        self.done: dict[int, threading.Event] = {}
        """This phase's attempts started or re-attached here, set once recorded."""
        self.seen: dict[int, int] = {}
        """How much of each attempt's log `output` has returned."""
        self.told: set[int] = set()
        self.stopped: dict[int, str] = {}
        """Attempts this engine ends, and why."""
        self.own_calls: list[list[float | None]] = session.records.own_calls()
        """When the agent's own tools (`bash`, the editor) ran while attempts ran: [start, end]
        (epoch s; end None while it runs), kept for a resume (`AttemptRecords.own_calls`)."""
        self.live = 0
        self.turn = threading.Condition()
        self.abandoned = False

    # -- the tools ----------------------------------------------------------------------------

    def run(self, inp: RunExperimentInput) -> Attempt:
        session = self.session
        files = workspace_files(session.ws.root)
        refuse_if_repeated(session, self.phase_key, inp, files)
        self._refuse_if_shared(inp)
        keep_copies(session.ws.root, files, session.ws.kept)  # so that the engine can run it again
        attempt = session.records.new(self.phase_key, inp, files)
        if not inp.run_in_background:
            return self._finish(attempt.n)
        self._in_background(attempt.n)
        return session.state.attempts[attempt.n - 1]

    def output(self, n: int, wait_s: float) -> tuple[Attempt, str]:
        if n in self.done:
            self.done[n].wait(wait_s)
        attempt = self.session.state.attempts[n - 1]
        if attempt.status != "RUNNING":
            self.told.add(n)
        return attempt, self._new_output(n)

    def stop(self, n: int, why: str = "stopped by the agent (stop_experiment)") -> Attempt:
        if n not in self.done:
            phase = self.session.state.attempts[n - 1].phase
            raise ToolError(f"attempt {n} is not one of this phase's running attempts (it is {phase}'s)")
        self.stopped[n] = why
        self.session.ws.write_json(self.session.records.stop_path(n), {"why": why}, durable=False)
        deadline = time.monotonic() + STOP_WAIT_S
        cancelled = False
        while not self.done[n].wait(0.2):  # its supervisor may start any moment: killed once it has
            if flow_run := self.session.records.run(n).get("flow_run"):
                if not cancelled:  # on a pool's worker: the flow run cancelled, which ends its command there
                    cancel_on_pool(flow_run)
                    cancelled = True
            elif (supervised := self.session.records.supervised(n)).read().get("pid"):
                supervised.stop()
            if time.monotonic() > deadline:
                raise ToolError(f"attempt {n} has not stopped after {STOP_WAIT_S} s; experiment_output({n}) tells "
                                "when it ends")
        self.told.add(n)
        return self.session.state.attempts[n - 1]

    def running(self) -> list[int]:
        return [a.n for a in self.session.state.attempts if a.status == "RUNNING" and a.phase == self.phase_key]

    def ended_since(self) -> list[Attempt]:
        ended = [self.session.state.attempts[n - 1] for n, e in self.done.items()
                 if e.is_set() and n not in self.told and self.session.state.attempts[n - 1].background]
        self.told.update(a.n for a in ended)
        return ended

    # -- the engine's side --------------------------------------------------------------------

    def adopt(self, n: int) -> Attempt:
        """Attempt n, left RUNNING by an engine that stopped while its command ran on under its
        supervisor: waited for (or found ended) and judged, once; never started again. A
        background attempt is followed in the background again, the others before this returns."""
        attempt = self.session.state.attempts[n - 1]
        if attempt.background:
            self._in_background(n, reattached=True)
            return attempt
        return self._finish(n, reattached=True)

    def watch(self, call: Callable[[], str]) -> str:
        """Around one of the agent's own tool calls (`bash`, the editor): when it ran, so that an
        attempt that ran meanwhile says so (`beside`)."""
        if not any(a.status == "RUNNING" for a in self.session.state.attempts):
            return call()
        window: list[float | None] = [time.time(), None]
        self.own_calls.append(window)
        self.session.records.note_own_calls(self.own_calls)  # before it runs: an engine killed meanwhile leaves it said
        try:
            return call()
        finally:
            window[1] = time.time()
            self.session.records.note_own_calls(self.own_calls)

    def close(self, error: BaseException | None) -> None:
        """As the phase ends with attempts still running. A signal (Ctrl-C: the engine's
        interruption ends them, `AttemptRecords.reconcile`) or a spent usage window (the phase
        runs again and re-attaches) leaves them to their supervisors; any other end stops them,
        unless LABRUN_KEEP_EXPERIMENTS=on, which leaves them for the resume."""
        running = [n for n in self.running() if n in self.done]
        if running and isinstance(error, (Exception, type(None))) and not isinstance(error, UsageWindowSpent) \
                and not settings().keep_experiments:
            for n in running:
                self.stop(n, "the phase ended while it ran")
        self.abandoned = True

    def _beside(self, n: int) -> list[str]:
        """What else could write the workspace while attempt n's command ran: the session's
        other attempts whose commands ran at the same time, the agent's own tools, and for a
        coding CLI with a shell of its own, that shell, beside a background attempt."""
        records, attempts = self.session.records, self.session.state.attempts
        mine = records.supervised(n).read()
        if "started" not in mine:
            return []
        start, end = mine["started"], mine.get("ended", time.time())

        def overlaps(a: float, b: float | None) -> bool:
            return a < end and (b is None or b > start)

        def ended(a: Attempt, report: dict) -> float | None:
            """Its end as its supervisor reported it; one stopped or killed reported none, and
            ran until its task judged it (its run file's last change); None while it runs."""
            if "ended" in report or a.status == "RUNNING":
                return report.get("ended")
            st = records.ws.files.lstat(records.run_path(a.n))
            return st.st_mtime if st is not None else None

        found = [f"attempt {a.n}" for a in attempts if a.n != n
                 and "started" in (other := records.supervised(a.n).read())
                 and overlaps(other["started"], ended(a, other))]
        # An own call cut off by a killed engine ended by its timeout at the latest (its sandbox died with it).
        if any(overlaps(a, b if b is not None else a + BASH_TIMEOUT_S) if a is not None else False
               for a, b in self.own_calls):
            found.append("the agent's own commands")
        if attempts[n - 1].background and own_shell(self.session.state.agent):
            found.append("the agent's own shell")
        return found

    def _refuse_if_shared(self, inp: RunExperimentInput) -> None:
        """Two attempts at once never declare the same file: the engine could not tell whose it is."""
        mine = {p for p in (inp.metrics_file, *inp.outputs) if p}
        for n in self.running():
            a = self.session.state.attempts[n - 1]
            if shared := sorted(mine & {p for p in (a.metrics_file, *a.outputs) if p}):
                raise ToolError(f"Refused, not run: attempt {n}, still running, writes {', '.join(shared)} too; "
                                "give this attempt files of its own, or wait for that one.")

    def _in_background(self, n: int, reattached: bool = False) -> None:
        self.done[n] = threading.Event()
        context = contextvars.copy_context()  # a subtask of this phase's, as a call here would be
        threading.Thread(target=context.run, args=(self._finish, n, reattached), daemon=True,
                         name=f"labrun-attempt-{n}").start()

    def _finish(self, n: int, reattached: bool = False) -> Attempt:
        """Attempt n run (or re-attached) to its end and recorded."""
        session = self.session
        done = self.done.setdefault(n, threading.Event())
        try:
            with self._slot(n, reattached):
                ended = None if n in self.stopped else execute("attempt", AttemptSpec.of(session, n=n))
        except Exception as e:  # a background attempt's task: recorded, as a call here would be raised
            if not session.state.attempts[n - 1].background:
                raise
            ended = {"status": "INTERRUPTED", "error": f"the engine's task for it failed: {e}"}
        try:
            if self.abandoned:
                return session.state.attempts[n - 1]
            if ended is None or (n in self.stopped and ended["status"] == "INTERRUPTED"):
                ended = {**(ended or {}), "status": "INTERRUPTED", "error": self.stopped[n]}
            ended["beside"] = self._beside(n)
            session.records.record(n, ended)
            if "pid" in ended and settings().tasks_in != "here":
                session.store.log(f"attempt {n} ran in process {ended['pid']} (LABRUN_TASKS_IN={settings().tasks_in})")
            return session.state.attempts[n - 1]
        finally:
            done.set()

    @contextmanager
    def _slot(self, n: int, reattached: bool):
        """One of the session's `parallel_attempts` slots, waited for (a re-attached attempt
        runs already: it takes one at once)."""
        limit = self.session.limits.parallel_attempts
        with self.turn:
            if not reattached and self.live >= limit:
                self._note_waiting(n, f"waiting for a free slot ({self.live} attempts running, at most {limit} at once)")
                while self.live >= limit and n not in self.stopped:
                    self.turn.wait(0.5)
            self.live += 1
        try:
            yield
        finally:
            with self.turn:
                self.live -= 1
                self.turn.notify_all()

    def _note_waiting(self, n: int, why: str) -> None:
        run = self.session.records.run(n)
        self.session.ws.write_json(self.session.records.run_path(n), {**run, "waiting": why}, durable=False)

    def _new_output(self, n: int) -> str:
        """Attempt n's output since the last look: at most its last `OUTPUT_CHARS` characters
        (read beneath the workspace, never through a link)."""
        start = self.seen.get(n, 0)
        try:
            fd = self.session.ws.files.open_file(self.session.state.attempts[n - 1].log)
        except (OSError, Refused):
            return ""
        try:
            size = os.fstat(fd).st_size
            skipped = max(0, size - start - OUTPUT_CHARS)
            data = os.pread(fd, size - start - skipped, start + skipped) if size > start else b""
        finally:
            os.close(fd)
        # Whole lines only: a line cut in two (a key it printed among them) is redacted whole or not
        # shown; the start of a line comes with the next look, once it is written out.
        if skipped and b"\n" in data:
            cut = data.index(b"\n") + 1
            skipped, data = skipped + cut, data[cut:]
        if self.session.state.attempts[n - 1].status == "RUNNING" and b"\n" in data:
            data = data[:data.rindex(b"\n") + 1]
        self.seen[n] = start + skipped + len(data)
        head = f"[... {skipped} bytes skipped; the whole output is in its log ...]\n" if skipped else ""
        return head + data.decode(errors="replace")


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
            # What it wrote itself, when nothing else could write beside it: else only what it declared.
            own = (set() if a.beside else set(found["wrote"])) | set(a.outputs) | {a.metrics_file} - {None}
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
        if spec.pool:  # on a pool's worker: its own environment, else its server's Secret blocks
            keys_from_secret_blocks(session.confinement.key_names())
        if spec.sandboxed and bubblewrap() is None:  # a worker never runs unconfined what its engine confines
            record = _not_run(session, spec.n, "this worker cannot run labrun's sandbox (bubblewrap), which the "
                              f"session's engine runs its commands in; {HOW_TO_INSTALL} on the worker")
        else:
            record = _run(session, spec.n)
    finally:
        session.close()
    if record["status"] == "FAILED":  # the UI shows the task run failed; the engine records it all the same
        return Failed(message=f"attempt {spec.n} FAILED: {record['error']}", data=record)
    return record


def _not_run(session: Session, n: int, why: str, status: str = "INTERRUPTED") -> dict:
    """Attempt n's record when its command was never started (INTERRUPTED: the machine's doing
    or the engine's, not the experiment's), in its run file as a record of its task's is."""
    attempt = session.state.attempts[n - 1]
    ended = attempt.model_copy(update=dict(status=status, error=why,
                                           task_run=str(TaskRunContext.get().task_run.id))).model_dump()
    session.ws.write_json(session.records.run_path(n), {**session.records.run(n), "ended": ended}, durable=False)
    return {**ended, "pid": os.getpid()}


def keys_from_secret_blocks(names: list[str]) -> None:
    """The keys this worker's environment lacks, from the Prefect Secret block of the same name
    in lower case with dashes (`OPENAI_API_KEY`: `openai-api-key`), where there is one: so a key
    reaches a remote attempt by its name, never in a flow run's parameters. Declared secret,
    so that whatever labrun writes redacts it."""
    from prefect.blocks.system import Secret

    for name in names:
        if name in os.environ:
            continue
        try:
            value = Secret.load(name.lower().replace("_", "-")).get()
        except ValueError:  # no such block
            continue
        if isinstance(value, str) and value:
            os.environ[name] = value
            declare([name])


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
        try:
            claim = _claim_gpus(session, attempt, noted)
        except gpus.GpuRefused as e:  # the machine it runs on has fewer
            return _not_run(session, n, str(e), "FAILED")
        if claim is None:  # stopped while it waited
            return _not_run(session, n, "stopped before it started")
        noted.pop("waiting", None)
        session.ws.write_json(run_file, noted, durable=False)  # about this process, not the disk
        folder = session.ws.files.open(session.records.supervisor_path(n).parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            supervised = start_supervised(
                attempt.command, session.ws.root, log, folder, session.records.supervisor_path(n).name,
                supervised.read, timeout_s=session.limits.time_limit_s, max_output_bytes=MAX_OUTPUT_BYTES,
                sandbox=session.confinement.sandbox().with_gpus(claim), keys=session.confinement.key_names(),
                keep=keep, env=claim.env(), hold=claim.fds)
        finally:
            os.close(folder)
            claim.close()  # the supervisor holds the GPUs now, as long as it lives
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
            status="INTERRUPTED", task_run=noted["task_run"], gpus=noted.get("gpus", []),
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
        gpus=noted.get("gpus", []),
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


def _claim_gpus(session: Session, attempt: Attempt, noted: dict) -> gpus.Claim | None:
    """The GPUs attempt n asked for, waited for until free (its run file says so meanwhile);
    None when the engine stopped it first."""
    run_file = session.records.run_path(attempt.n)
    stop = session.records.stop_path(attempt.n)

    def waiting(why: str) -> None:
        session.ws.write_json(run_file, {**noted, "waiting": why}, durable=False)

    class Stopped:  # `gpus.Cancel`: whether the engine stopped the attempt
        def wait(self, timeout: float) -> bool:
            time.sleep(timeout)
            return session.ws.files.exists(stop)

    try:
        claim = gpus.claim(attempt.gpu_count, on_wait=waiting, cancelled=Stopped())
    except gpus.GpuWaitCancelled:
        return None
    if session.ws.files.exists(stop):
        claim.close()
        return None
    noted["gpus"] = claim.ids
    return claim


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

