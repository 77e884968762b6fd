"""An experiment attempt's supervisor: the small process that runs its command so that the
attempt outlives the engine (a `kill -9`, the OOM killer, a lost worker, a crash).

The engine starts it in a session of its own, with no parent-death signal and no lifeline of
the engine's: it lives until its command ends. It runs outside the sandbox, as the engine's
user and a descendant of the engine's (its cgroup, its accounting), and starts the command
as the engine would have (inside bubblewrap, holding the sandbox's lifeline itself: the
sandbox ends with the supervisor, never with the engine). It enforces the attempt's time
limit and output limit, so that they hold while no engine runs, and writes its report into
the attempt's folder in `.labrun/`, which the command cannot write (read-only inside the
sandbox), through a descriptor of that folder the engine opened without following links:

1. before the command starts: its own identity, `pid`, `ticks` (its start time in clock
   ticks since boot, `start_ticks`) and `boot` (`boot_id`), which tell it from a later process
   given the same pid, in this boot or another;
2. once the command started: `pgid`, the command's process group (`pgid_ticks`: its first
   process's start), and `started` (epoch s);
3. once it ended: `ended` (epoch s), `duration_s` (its own monotonic clock: the real
   duration whatever the engine did meanwhile), `exit_code`, `timed_out`, `too_much_output`.

Each is the whole report written anew (a temporary file renamed over it), so a reader never
sees half of one. A report with no `ended` whose supervisor is gone (the machine restarted,
the supervisor was killed) is an interrupted attempt.

`python -I supervisor.py`, the job as one JSON object on stdin (`argv`, `cwd`, `env`,
`folder_fd`, `report`, `timeout_s`, `max_output_bytes`, `lifeline`: [read end, write end] or
null); stdout is the attempt's log, which the command writes too. The standard library only:
it imports nothing of labrun's, so it runs in an interpreter started with nothing else.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1


def start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc's `starttime`); None when
    there is no such process, or only its zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def boot_id() -> str | None:
    """This boot of the machine: a report written in another one (before a restart, or on
    another machine) names processes that are not its own, whatever their ids now."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def _new_file(folder_fd: int, name: str) -> int:
    """`name` in the folder, made anew (never opened through a link left in its place)."""
    try:
        os.unlink(name, dir_fd=folder_fd)
    except FileNotFoundError:
        pass
    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=folder_fd)


def write_report(folder_fd: int, name: str, report: dict) -> None:
    part = f".{name}.part"
    fd = _new_file(folder_fd, part)
    with os.fdopen(fd, "w") as f:
        json.dump(report, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    os.fsync(folder_fd)


def _dies_with_me():
    """The command's `preexec_fn`: SIGKILL when the supervisor ends (bubblewrap's own
    `--die-with-parent` and the lifeline cover the sandbox; this covers a command run without one)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
    return preexec


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


END_ROOM = 64 << 10
"""Disk taken for the end's report before the command starts: a command that fills the disk
cannot keep its end from being written."""


def _room_for_the_end(folder_fd: int, name: str) -> int:
    fd = _new_file(folder_fd, f".{name}.end")
    os.posix_fallocate(fd, 0, END_ROOM)
    return fd


def _write_end(folder_fd: int, name: str, fd: int, report: dict) -> None:
    """The end's report, into the room taken for it (writing within it needs no new blocks),
    then renamed over the report: whole, as every report is."""
    data = json.dumps(report, sort_keys=True).encode()
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))
    os.fsync(fd)
    os.close(fd)
    os.replace(f".{name}.end", name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    os.fsync(folder_fd)


def supervise(job: dict) -> dict:
    folder, name = job["folder_fd"], job["report"]
    report: dict = {"pid": os.getpid(), "ticks": start_ticks(os.getpid()), "boot": boot_id()}
    write_report(folder, name, report)
    end_fd = _room_for_the_end(folder, name)
    lifeline = job.get("lifeline")
    started, clock = time.time(), time.monotonic()
    proc = subprocess.Popen(job["argv"], cwd=job["cwd"], env=job["env"], stdin=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            pass_fds=(lifeline[0],) if lifeline else (), preexec_fn=_dies_with_me())
    if lifeline:
        os.close(lifeline[0])  # the sandbox holds its own copy; the write end stays here alone
    report.update(pgid=proc.pid, pgid_ticks=start_ticks(proc.pid), started=started)
    write_report(folder, name, report)
    timed_out = too_much = False
    try:
        watch = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        watch = None
    try:
        while True:
            if watch is not None:
                select.select([watch], [], [], 0.2)
            else:
                time.sleep(0.1)
            if proc.poll() is not None:
                break
            timed_out = time.monotonic() - clock > job["timeout_s"]
            too_much = os.fstat(1).st_size > job["max_output_bytes"]
            if timed_out or too_much:
                break
    finally:  # nothing the command started outlives it
        _kill_group(proc.pid)
        proc.wait()
        if lifeline:
            os.close(lifeline[1])
    report.update(ended=time.time(), duration_s=time.monotonic() - clock, timed_out=timed_out,
                  too_much_output=too_much, exit_code=None if (timed_out or too_much) else proc.returncode)
    _write_end(folder, name, end_fd, report)
    return report


PR_SET_DUMPABLE = 4


def main() -> None:
    # It holds the experiments' keys: no process of the same user reads its environment.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    job = json.loads(sys.stdin.read())
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    supervise(job)


if __name__ == "__main__":
    main()
