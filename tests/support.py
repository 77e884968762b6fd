"""Helpers the tests share: running `labrun` as a user would, waiting, watching processes.

(Kept out of conftest.py: tests/ and tests/e2e/ each have a conftest, and a test module
importing "conftest" would get whichever was imported first.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
DEMO_IDEA = EXAMPLES / "demo_noise_averaging.yaml"


def labrun(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the `labrun` command line as a user would, in its own process."""
    return subprocess.run(
        [sys.executable, "-m", "labrun.cli", *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
    )


def start_labrun(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "labrun.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})},
    )


def wait_for(predicate, timeout: float = 120, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    """True while the process runs (a zombie left for a non-reaping init does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def running(needle: str) -> list[int]:
    """Pids of live processes whose command line holds `needle` (seen from outside any
    sandbox's PID namespace, where the pids a command sees mean nothing)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if needle in cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                pid = int(cmdline.parent.name)
                if alive(pid) and pid != os.getpid():
                    found.append(pid)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


def group_alive(pgid: int) -> bool:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
