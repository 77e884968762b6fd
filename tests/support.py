"""Helpers the tests share: running `labrun` as a user would, waiting, watching processes.

(Kept out of conftest.py: tests/ and tests/e2e/ each have a conftest, and a test module
importing "conftest" would get whichever was imported first.)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
DEMO_IDEA = EXAMPLES / "demo_noise_averaging.yaml"
SHARED = Path(os.environ.get("LABRUN_SHARED") or REPO.parent / "shared")
NEURICO_IDEAS = SHARED / "neurico-ideas"
"""NeuriCo's real idea files: a development checkout and CI have them beside the clone."""


def needs_shared():
    import pytest

    return pytest.mark.skipif(not NEURICO_IDEAS.is_dir(), reason=(
        f"needs NeuriCo's idea files in {NEURICO_IDEAS} (the shared folder beside the clone, as in "
        "CI; or set LABRUN_SHARED to that folder)"))


def listening_ports(shell_output: str) -> set[int]:
    """The TCP ports a shell saw listening, from the researchers' setup step (its `LISTEN
    <address>:<port in hex>` lines, read from /proc/net/tcp of the shell's network namespace)."""
    import re

    return {int(port, 16) for port in re.findall(r"LISTEN [0-9A-F]+:([0-9A-F]{4})", shell_output)}


ESCAPED = Path("/var/tmp/labrun-cli-escaped")
"""Where the researchers' hostile shell tries to write outside the workspace (not under /tmp,
which a sandbox has of its own); the `abstract_socket` fixture clears it first."""


def assert_shell_contained(shell_output: str, ws: Path, abstract: str) -> None:
    """The researchers' setup shell (`claude_responder.HOSTILE`) saw no abstract socket of the
    machine's (`abstract` is one the test opened), wrote neither into `.labrun/` nor outside
    the workspace, and found labrun's MCP socket but called no tool through it (the probe is
    shown reaching a listening socket in tests/test_mcp_tools.py)."""
    assert "ABSTRACT" in shell_output or "WRITE" in shell_output, f"the hostile probes did not run: {shell_output}"
    assert re.search(r"MCP \S+mcp\.sock REFUSED", shell_output), f"the MCP probe found no socket: {shell_output}"
    assert not re.search(r"MCP \S+ REACHED", shell_output), shell_output
    assert f"@{abstract}" not in shell_output and "ABSTRACT @labrun-" not in shell_output, shell_output
    assert not (ws / ".labrun" / "escaped").exists(), "the CLI's shell wrote into .labrun/"
    assert not ESCAPED.exists(), "the CLI's shell wrote outside the workspace"


def machine_listening_ports() -> set[int]:
    """The TCP ports listening in this (the tests') network namespace: the machine's."""
    lines = [line.split() for name in ("tcp", "tcp6") for line in open(f"/proc/net/{name}").read().splitlines()[1:]]
    return {int(f[1].rsplit(":", 1)[1], 16) for f in lines if f[3] == "0A"}


def require_bubblewrap() -> None:
    """Skip a sandbox test where bubblewrap cannot sandbox, saying why (in CI a skip fails:
    tests/conftest.py)."""
    import pytest

    from labrun.sandbox import bubblewrap

    if bubblewrap() is None:
        pytest.skip("bubblewrap is not installed or cannot sandbox here: run .ci/install-bubblewrap "
                    "(apt-get install bubblewrap)")


def labrun(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the `labrun` command line as a user would, in its own process."""
    return subprocess.run(
        [sys.executable, "-m", "labrun.cli", *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
    )


def status(ws: Path, *args: str) -> dict:
    """`labrun status W --json`, as a user gets it."""
    result = labrun("status", str(ws), "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def start_labrun(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "labrun.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})},
    )


def assert_complete(ws: Path, result: subprocess.CompletedProcess) -> None:
    """`labrun` ended well and STATE.md shows each of the six phases DONE."""
    from labrun.phase_registry import PHASES
    from labrun.state import phase_table

    assert result.returncode == 0, result.stdout + result.stderr
    table = phase_table((ws / "STATE.md").read_text())
    assert all(table[p.key] == "DONE" for p in PHASES), table


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


def on_prefect_home(home: Path) -> list[str]:
    """Live processes other than this one whose environment names `home` as PREFECT_HOME:
    what a run on that home started, wherever in the process tree it now is."""
    import psutil

    found = []
    for p in psutil.process_iter():
        try:
            if (p.pid != os.getpid() and p.status() != psutil.STATUS_ZOMBIE
                    and p.environ().get("PREFECT_HOME") == str(home)):
                found.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
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


def tmpfs(mount: Path, options: str):
    """A real tmpfs mounted at `mount` for one test (mounting needs root: skips without)."""
    import contextlib

    import pytest

    @contextlib.contextmanager
    def mounted():
        mount.mkdir(exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs ({options}) here (it needs root): {done.stderr.strip()}")
        try:
            yield mount
        finally:
            subprocess.run(["umount", "--lazy", str(mount)], check=True)
    return mounted()


def processes_with_env(*marks: str) -> list[int]:
    """Live processes whose environment holds every `NAME=value` of `marks`: a test's own agent
    CLIs, marked by a temporary directory, found wherever they run (another process group, a
    PID namespace)."""
    wanted = {m.encode() for m in marks}
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if wanted <= set(environ.read_bytes().split(b"\0")) and alive(int(environ.parent.name)):
                found.append(int(environ.parent.name))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


USAGE_FIELDS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def assert_billed_as_estimated(bills, report: dict) -> None:
    """labrun counted exactly the tokens a fake API billed (`bills`: its replies as
    `(model, Usage)`), priced from labrun's table, and all of it marked estimated (a CLI
    that reports tokens only)."""
    import pytest

    from labrun.prices import cost_usd

    bills = list(bills)
    cost = sum(cost_usd(model, usage) for model, usage in bills)
    assert cost > 0
    for k in USAGE_FIELDS:
        assert report["usage"][k] == sum(getattr(usage, k) for _, usage in bills), k
    assert report["usage"]["cost_usd"] == pytest.approx(cost, rel=1e-9)
    assert report["usage"]["estimated_usd"] == pytest.approx(report["usage"]["cost_usd"], rel=1e-9)


def state_md_sections(keys=None) -> list[str]:
    """STATE.md's top-level sections for a session of the phases `keys` (default: the six)
    without branches or reviews: the engine's own, and the phases' sections from the registry,
    the attempts before the results."""
    from labrun.phase_registry import DEFAULT, section_titles

    titles = list(section_titles(DEFAULT if keys is None else keys).values())
    at = titles.index("Experiment Results")
    return ["Session Title", "Current State", "Worklog", *titles[:at], "Experiment Attempts", *titles[at:]]


def attempt_group(ws: Path) -> int | None:
    """The process group of the workspace's running attempt's command, as its supervisor
    reported it (`.labrun/attempts/attempt-NNN.supervisor.json`), once the command has started."""
    report = attempt_supervisor(ws)
    return report.get("pgid") if report else None


def attempt_supervisor(ws: Path) -> dict | None:
    """What the supervisor of the workspace's running attempt reports (`labrun.supervisor`):
    its `pid`, its command's `pgid`, and once it ended, its end."""
    import json

    try:
        attempts = json.loads((ws / ".labrun/state.json").read_text())["attempts"]
    except (OSError, ValueError):
        return None
    for a in attempts:
        if a["status"] == "RUNNING":
            try:
                return json.loads((ws / f".labrun/attempts/attempt-{a['n']:03d}.supervisor.json").read_text())
            except (OSError, ValueError):
                continue
    return None


def kill_attempt_supervisor(ws: Path) -> None:
    """SIGKILL the running attempt's supervisor alone: the sandbox goes with it (its lifeline);
    unsandboxed, what the command started is left for the engine to kill. The attempt is
    then INTERRUPTED: what a test does that needs the attempt stopped with the engine."""
    import signal

    report = attempt_supervisor(ws)
    assert report, "no running attempt's supervisor"
    os.kill(report["pid"], signal.SIGKILL)
