"""Running an agent's command: in the workspace, in its own process group, with a timeout,
bounded output, a scrubbed environment, and inside the sandbox (`labrun.sandbox`).

`Execution` is the seam between the engine and a process it starts for the agent: `bash`,
`run_experiment`, a rerun and the sealed scorer all start theirs through `run_command`, which
takes one by name (`EXECUTIONS`), so what each sees, hides and may write is what its `Sandbox`
says, decided in one place (`Confinement.sandbox`)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar, Iterable, Protocol

from labrun.sandbox import Lifeline, Sandbox, bubblewrap
from labrun.secrets import redact, scrubbed_env
from labrun.supervisor import boot_id, start_ticks, write_report


@dataclass
class CommandResult:
    exit_code: int | None
    output: str
    """Head and tail of the output, cut from the middle when long, secrets redacted."""
    duration_s: float
    timed_out: bool = False
    too_much_output: bool = False


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Execution(Protocol):
    """Where an agent's process runs."""

    name: ClassVar[str]

    def start(self, argv: list[str], **popen) -> subprocess.Popen:
        """`argv` started (with `subprocess.Popen`'s keywords), as this execution runs it."""

    def ended(self) -> None:
        """After the process ended: let go of what held it."""


@dataclass
class Bubblewrap:
    """In the sandbox `sandbox` describes, tied to the engine by a lifeline (`labrun.sandbox`)."""

    sandbox: Sandbox
    name: ClassVar[str] = "bubblewrap"

    def start(self, argv: list[str], **popen) -> subprocess.Popen:
        self.lifeline = Lifeline()
        return self.lifeline.popen(self.sandbox.wrap(argv, self.lifeline.fd), **popen)

    def ended(self) -> None:
        self.lifeline.cut()


@dataclass
class Unsandboxed:
    """As the user, with only the scrubbed environment: where bubblewrap cannot run (said
    once, at its first use), and for a session started without a sandbox."""

    sandbox: Sandbox | None = None
    name: ClassVar[str] = "none"

    def start(self, argv: list[str], **popen) -> subprocess.Popen:
        return subprocess.Popen(argv, **popen)

    def ended(self) -> None:
        pass


EXECUTIONS: dict[str, type[Bubblewrap] | type[Unsandboxed]] = {e.name: e for e in (Bubblewrap, Unsandboxed)}


def execution(sandbox: Sandbox | None) -> Execution:
    """The execution for `sandbox`: bubblewrap's where it works here, else none."""
    return EXECUTIONS["bubblewrap" if sandbox is not None and bubblewrap() is not None else "none"](sandbox)


running_groups: set[int] = set()
"""Process groups of the commands running now: what a second Ctrl-C kills before labrun exits."""


def run_command(
    command: str,
    cwd: Path,
    log_path: Path,
    timeout_s: float,
    max_output_bytes: int,
    show_chars: int = 20_000,
    on_start: Callable[[int], None] | None = None,
    sandbox: Sandbox | None = None,
    keys: Iterable[str] = (),
    env: dict[str, str] | None = None,
) -> CommandResult:
    """Run `command` with bash; its whole output goes to `log_path` (the kernel writes it,
    so the log survives a crash of the engine). The process group is killed on timeout or
    when the output passes `max_output_bytes`. `keys`: the secrets it gets (the session's
    keys for experiments); bubblewrap starts from the same environment, so they reach the
    command inside the sandbox too. `env`: variables it gets besides (a rerun's GPUs)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = ["bash", "-c", command]
    env = {**scrubbed_env(keys), **(env or {})}
    runner = execution(sandbox)
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = runner.start(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    running_groups.add(proc.pid)
    timed_out = too_much = False
    exited = _ExitWatch(proc)
    try:
        if on_start:
            on_start(proc.pid)
        while True:
            if exited(0.1):
                break
            timed_out = time.monotonic() - start > timeout_s
            too_much = log_path.stat().st_size > max_output_bytes
            if timed_out or too_much:
                kill_group(proc.pid)
                proc.wait()
                break
    finally:  # nothing the command started outlives it, nor an interrupted engine
        exited.close()
        kill_group(proc.pid)
        proc.wait()
        running_groups.discard(proc.pid)
        runner.ended()
    return _result(log_path, None if (timed_out or too_much) else proc.returncode, time.monotonic() - start,
                   timed_out, too_much, timeout_s, max_output_bytes, show_chars)


def _result(log_path: Path, exit_code: int | None, duration: float, timed_out: bool, too_much: bool,
            timeout_s: float, max_output_bytes: int, show_chars: int) -> CommandResult:
    """What an ended command's log and end say, as the engine reports it."""
    # The command held the log open, and may have made it sparse and huge (ftruncate costs it
    # nothing): past the limit, its end is not output the engine reads.
    if log_path.stat().st_size > max_output_bytes:
        os.truncate(log_path, max_output_bytes)
    _redact_file(log_path)
    with open(log_path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(0)
        head = f.read(show_chars)
        tail = b""
        if size > 2 * show_chars:
            f.seek(size - show_chars)
            tail = f.read()
        elif size > show_chars:
            tail = f.read()
    if tail and size > 2 * show_chars:
        text = (
            head.decode(errors="replace")
            + f"\n\n[... {size - 2 * show_chars} bytes cut from the middle of the output; "
            f"the whole output is in {log_path.name} ...]\n\n"
            + tail.decode(errors="replace")
        )
    else:
        text = (head + tail).decode(errors="replace")
    if timed_out:
        text += f"\n[killed: the command ran past its timeout of {timeout_s:g} s]"
    if too_much:
        text += f"\n[killed: the command wrote more than {max_output_bytes} bytes of output]"
    return CommandResult(exit_code=exit_code, output=redact(text), duration_s=duration, timed_out=timed_out,
                         too_much_output=too_much)


class _ExitWatch:
    """`watch(timeout)`: whether the process ended within `timeout` s, told the moment it
    does (its pidfd) where `Popen.wait(timeout)` polls and wakes up to 50 ms late."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        try:
            self.fd: int | None = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):  # not Linux 5.3 or later: Popen's polling
            self.fd = None

    def __call__(self, timeout: float) -> bool:
        if self.fd is not None:
            select.select([self.fd], [], [], timeout)
            return self.proc.poll() is not None
        try:
            self.proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _redact_file(path: Path) -> None:
    text = path.read_bytes().decode(errors="replace")
    clean = redact(text)
    if clean != text:
        path.write_text(clean)


# -- an experiment attempt's command, under a supervisor that outlives the engine --------------

SUPERVISOR = Path(__file__).with_name("supervisor.py")
"""Run from its file with `python -I`: it imports nothing of labrun's (`labrun.supervisor`)."""


@dataclass
class Supervised:
    """A command under its supervisor (`labrun.supervisor`), known by the report the
    supervisor writes (`read`: {} before it wrote one). `proc`: the supervisor, when this
    process started it (so that it is reaped); None when a resume re-attached to it."""

    read: Callable[[], dict]
    proc: subprocess.Popen | None = None
    held: tuple[int, ...] = ()
    """Its groups in `running_groups`, which a second Ctrl-C kills."""

    def alive(self, report: dict) -> bool:
        """Whether the supervisor `report` names still runs: the same pid and the same start
        time, in this boot."""
        if self.proc is not None:
            return self.proc.poll() is None
        return _ours(report) and report.get("ticks") is not None and start_ticks(report["pid"]) == report["ticks"]

    def wait(self) -> dict | None:
        """The supervisor's last report once its command ended; None when the supervisor is
        gone without one (killed, or the machine restarted)."""
        watch: int | None = None
        try:
            while True:
                report = self.read()
                if "ended" in report:
                    return report
                if not self.alive(report):
                    report = self.read()  # it may have ended between the two looks
                    return report if "ended" in report else None
                if watch is None:
                    try:  # told the moment it ends, child of this process or not
                        watch = os.pidfd_open(report["pid"]) if report else None
                    except (AttributeError, OSError):
                        pass
                if watch is not None:
                    select.select([watch], [], [], 1.0)
                else:
                    time.sleep(0.1)
        finally:
            if watch is not None:
                os.close(watch)

    def release(self) -> None:
        """After it ended: reaped, and no longer for a second Ctrl-C to kill."""
        if self.proc is not None:
            self.proc.wait()
        running_groups.difference_update(self.held)

    def groups(self, report: dict | None = None) -> list[int]:
        """The process groups to kill to stop it: the supervisor's, and its command's while
        that group is still the one it started (`pgid_ticks`; a group's id is not given to
        another process while any process of the group lives)."""
        report = self.read() if report is None else report
        if not _ours(report):  # another boot's ids: whatever holds them now is not this attempt's
            return []
        found = [report["pid"]] if self.alive(report) else []
        if report.get("pgid") and start_ticks(report["pgid"]) in (None, report.get("pgid_ticks")):
            found.append(report["pgid"])
        return found

    def stop(self) -> None:
        """Kill the supervisor first (so that it reports no end), then its command's group."""
        for group in self.groups():
            kill_group(group)
        self.release()

    def result(self, report: dict, log_path: Path, timeout_s: float, max_output_bytes: int,
               show_chars: int = 20_000) -> CommandResult:
        """What the ended command's report and log say."""
        return _result(log_path, report["exit_code"], report["duration_s"], report["timed_out"],
                       report["too_much_output"], timeout_s, max_output_bytes, show_chars)


def _egress_lifeline(sandbox: Sandbox | None) -> tuple[int, ...]:
    """The lifeline of the egress proxy the sandbox goes out through, where this process started
    it: the supervisor holds it as long as it lives, so the proxy outlives the engine with it."""
    from labrun.egress import LIFELINES

    if sandbox is None or not sandbox.network or sandbox.egress is None:
        return ()
    fd = LIFELINES.get(str(sandbox.egress))
    return (fd,) if fd is not None else ()


def _ours(report: dict) -> bool:
    """A report of this boot's, with an identity to go by."""
    return bool(report) and report.get("boot") is not None and report["boot"] == boot_id()


def start_supervised(command: str, cwd: Path, log_path: Path, folder_fd: int, report: str,
                     read: Callable[[], dict], timeout_s: float, max_output_bytes: int,
                     sandbox: Sandbox | None = None, keys: Iterable[str] = (),
                     keep: bool = False, env: dict[str, str] | None = None, hold: Iterable[int] = ()) -> Supervised:
    """Start `command` under a supervisor in a session of its own, which writes its report
    `report` into the folder `folder_fd` (the engine's, opened without following links) and
    enforces `timeout_s` and `max_output_bytes` itself; returns once the command has started
    (its group is in the report) or the supervisor ended. As `run_command` runs it (bash, the
    scrubbed environment with `keys`, the sandbox), but the sandbox's lifeline is the
    supervisor's. Unless `keep`, a second Ctrl-C kills it (`running_groups`). `env`: variables
    the command gets besides (its GPUs); `hold`: descriptors the supervisor holds as long as it
    lives (its GPUs' locks, `labrun.gpus`)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = ["bash", "-c", command]
    env = {**scrubbed_env(keys), **(env or {})}
    lifeline: tuple[int, int] | None = None
    if execution(sandbox).name == "bubblewrap":
        assert sandbox is not None
        lifeline = os.pipe()
        argv = sandbox.wrap(argv, lifeline[0])
    job = {"argv": argv, "cwd": str(cwd), "env": env, "folder_fd": folder_fd, "report": report,
           "timeout_s": timeout_s, "max_output_bytes": max_output_bytes, "lifeline": lifeline}
    try:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-I", str(SUPERVISOR)], cwd=cwd, env=env, stdin=subprocess.PIPE,
                                    stdout=log, stderr=log, start_new_session=True,
                                    pass_fds=(folder_fd, *(lifeline or ()), *_egress_lifeline(sandbox), *hold))
    finally:
        for fd in lifeline or ():
            os.close(fd)  # the supervisor holds both ends now
    assert proc.stdin is not None
    # Its identity on disk before it has a job: an engine killed from here on leaves a
    # supervisor that a resume finds (and waits for, or finds gone), never one it cannot see.
    write_report(folder_fd, report, {"pid": proc.pid, "ticks": start_ticks(proc.pid), "boot": boot_id()})
    with proc.stdin:
        proc.stdin.write(json.dumps(job).encode())
    noted = read()
    while proc.poll() is None and "pgid" not in noted:
        time.sleep(0.01)
        noted = read()
    held = () if keep else (proc.pid, *([noted["pgid"]] if "pgid" in noted else []))
    running_groups.update(held)
    return Supervised(read, proc, held)
