"""The Prefect API that `labrun run` keeps between runs (LABRUN_KEEP_API, in idle minutes).

Prefect's API needs seconds to import and start, more than the rest of a run's start-up. So
the first run that finds no server starts this one, detached (a session of its own, no
parent-death signal: it outlives that run by design), and later runs with the same
PREFECT_HOME use it. It exits by itself once no run has used it for LABRUN_KEEP_API minutes
(default 10); LABRUN_KEEP_API=0 turns it off, and each run then starts and stops its own.

Each run that keeps them holds a shared lock on PREFECT_HOME/labrun/kept-api.lease while it
runs (the kernel drops it when the run ends, even after `kill -9`). An interrupted run
(Ctrl-C, SIGTERM) leaves nothing behind: it takes the API with it unless another run is
using it. The API counts as idle while it can take that lock exclusively; when it goes, it
takes the lock first and removes its record (kept-api.json), so that a run never picks up
an API that is on its way out.

Its process is `labrun.run_api.process` with the idle minutes. The record names it by
its pid and its start time: a pid alone may name another process after a reboot or a `kill
-9`, and labrun never signals that one.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path

from labrun.prefect_processes import (ServerError, alive, free_port, identified, prefect_home, send, server_env, spawn,
                                      still_running)
from labrun.secrets import is_secret_name
from labrun.serving import DEFAULT_HOST
from labrun.settings import settings

DEFAULT_IDLE_MINUTES = 10.0


def idle_minutes() -> float:
    """LABRUN_KEEP_API: how long the API stays up unused (0: no API is kept)."""
    raw = settings().keep_api.strip().lower()
    if raw in ("", "on", "yes", "true"):
        return DEFAULT_IDLE_MINUTES
    if raw in ("off", "no", "false"):
        return 0.0
    try:
        return max(float(raw), 0.0)
    except ValueError:
        raise ServerError(f"LABRUN_KEEP_API={raw!r}: give minutes (a number) or 0 to turn it off") from None


def _folder() -> Path:
    folder = prefect_home() / "labrun"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def record_path() -> Path:
    """Where the kept API leaves its address and process while it runs."""
    return _folder() / "kept-api.json"


def log_path() -> Path:
    return _folder() / "kept-api.log"


def _lock(name: str, how: int) -> int:
    fd = os.open(_folder() / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, how)
    return fd


def hold_lease() -> int:
    """For the rest of this run: the kept API does not go while the run holds this."""
    return _lock("kept-api.lease", fcntl.LOCK_SH)


def stop_unless_used(lease: int, grace_s: float) -> None:
    """For an interrupted run: stop the kept API, unless another run holds the lease.
    Holding it alone, the run keeps it until it exits, so that a run starting now starts
    anew."""
    try:
        fcntl.flock(lease, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return  # another run uses it
    record, proc = _recorded()
    if record is not None:
        record_path().unlink(missing_ok=True)
        stop_process(proc, grace_s)


def stop_process(proc, grace_s: float) -> None:
    """SIGTERM, then SIGKILL after `grace_s`, to `proc` (psutil's, which knows its start
    time) while its pid still names it."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not send(proc, sig):
            return
        deadline = time.monotonic() + grace_s
        while still_running(proc) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not still_running(proc):
            return


def process_of(record: dict):
    """The live process (psutil) that a record names by pid and start time, or None."""
    try:
        proc = identified(int(record["pid"]), float(record["started"]))
    except (KeyError, TypeError, ValueError):  # a record without a start time (an older labrun's): stale
        return None
    return proc if proc is not None and alive(proc) else None


def read_record() -> dict | None:
    """The kept API's record (its address, pid and start time), if its process is alive."""
    return _recorded()[0]


def _recorded():
    """The record and its live process, or (None, None)."""
    try:
        record = json.loads(record_path().read_text())
    except (OSError, ValueError):
        return None, None
    proc = process_of(record) if isinstance(record, dict) else None
    return (record, proc) if proc is not None else (None, None)


def forget_record() -> None:
    """At the kept API's end: its record, unless a newer one has replaced it."""
    try:
        if json.loads(record_path().read_text()).get("pid") == os.getpid():
            record_path().unlink()
    except (OSError, ValueError):
        pass


def open_lease() -> int:
    return os.open(_folder() / "kept-api.lease", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def unused(lease: int) -> bool:
    """No run holds the lease now; if so, this process holds it exclusively until `release`."""
    try:
        fcntl.flock(lease, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def release(lease: int) -> None:
    fcntl.flock(lease, fcntl.LOCK_UN)


def find_or_start(minutes: float):
    """The kept API's URL and process (psutil), and whether this call started it. Call it
    holding the lease; one run at a time decides (kept-api.start.lock), so two runs start
    one API."""
    import psutil

    fd = _lock("kept-api.start.lock", fcntl.LOCK_EX)
    try:
        record, proc = _recorded()
        if record is not None:
            return record["api_url"], proc, False
        port = free_port()
        url = f"http://{DEFAULT_HOST}:{port}/api"
        child = spawn([sys.executable, "-m", "labrun.run_api.process", str(port), str(minutes)],
                      server_env(url, kept_env()), log_path(), die_with_parent=False)
        proc = psutil.Process(child.pid)  # this process's child, not reaped: the pid is still its own
        record_path().write_text(json.dumps({"api_url": url, "pid": proc.pid, "started": proc.create_time()}))
        return url, proc, True
    finally:
        os.close(fd)


def kept_env() -> dict[str, str]:
    """The environment of the kept API: it outlives this run, so it keeps none of the
    run's secrets but Prefect's own (a database URL with its password)."""
    return {k: v for k, v in os.environ.items() if k.startswith("PREFECT_") or not is_secret_name(k)}


def go_when_idle(server, idle_s: float) -> None:
    """Stop `server` once no run has held the lease for `idle_s`."""
    lease = open_lease()
    idle_since = time.monotonic()
    while not server.should_exit:
        time.sleep(min(idle_s / 4, 5.0))
        if not unused(lease):
            idle_since = time.monotonic()
            continue
        if time.monotonic() - idle_since >= idle_s:
            # Keep the lock until this process ends: a run starting now waits, then starts anew.
            forget_record()
            server.should_exit = True
            return
        release(lease)
