"""Running an agent's command: in the workspace, in its own process group, with a timeout,
bounded output, a scrubbed environment, and inside the sandbox (`labrun.sandbox`).

`Execution` is the seam between the engine and a process it starts for the agent: `bash`,
`run_experiment`, a rerun and the sealed scorer all start theirs through `run_command`, which
takes one by name (`EXECUTIONS`), so what each sees, hides and may write is what its `Sandbox`
says, decided in one place (`Confinement.sandbox`)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar, Iterable, Protocol

from labrun.sandbox import Lifeline, Sandbox, bubblewrap
from labrun.secrets import redact, scrubbed_env


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
) -> CommandResult:
    """Run `command` with bash; its whole output goes to `log_path` (the kernel writes it,
    so the log survives a crash of the engine). The process group is killed on timeout or
    when the output passes `max_output_bytes`. `keys`: the secrets it gets (the session's
    keys for experiments); bubblewrap starts from the same environment, so they reach the
    command inside the sandbox too."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = ["bash", "-c", command]
    env = scrubbed_env(keys)
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
    duration = time.monotonic() - start
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
    return CommandResult(
        exit_code=None if (timed_out or too_much) else proc.returncode,
        output=redact(text),
        duration_s=duration,
        timed_out=timed_out,
        too_much_output=too_much,
    )


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
