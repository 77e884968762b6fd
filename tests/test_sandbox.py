"""Agent commands run in bubblewrap: they cannot see the engine's environment, cannot write
outside the workspace, die with the engine, and where bubblewrap is missing the user is told
once. What they can reach over the network: tests/test_containment.py."""

from __future__ import annotations

import base64
import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from support import DEMO_IDEA, wait_for
from labrun import sandbox
from labrun.session import Session
from labrun.phase_registry import BY_KEY
from labrun.phases.phase import toolbox

needs_bwrap = pytest.mark.usefixtures("bubblewrap_works")


def open_session(tmp_path, idea=DEMO_IDEA, **settings) -> Session:
    return Session.open(tmp_path / "ws", idea, "scripted", **settings)


def bash(session: Session, command: str) -> str:
    return toolbox(session, BY_KEY["experiments"]).call("bash", {"command": command}).content


@needs_bwrap
def test_a_command_cannot_read_the_engines_environment_even_encoded(session, monkeypatch):
    key = "sk-ant-api03-" + uuid.uuid4().hex + uuid.uuid4().hex
    plain = "p4ss-" + uuid.uuid4().hex  # no shape: only the environment says it is a secret
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    monkeypatch.setenv("DB_PASSWORD", plain)
    out = bash(session, "for f in /proc/$PPID/environ /proc/1/environ /proc/[0-9]*/environ; do "
                        "echo B64 $(base64 -w0 $f); echo REV $(tr '\\0' '\\n' < $f | rev | tr '\\n' ' '); done; "
                        "env | base64 -w0; echo; ls /proc | grep -c '^[0-9]'")
    decoded = [base64.b64decode(line.split()[1] + "==").decode(errors="replace")
               for line in out.splitlines() if line.startswith("B64 ") and len(line.split()) > 1]
    decoded += [base64.b64decode(line + "==").decode(errors="replace")
                for line in out.splitlines() if line and " " not in line and len(line) > 40]
    reversed_lines = [line[4:][::-1] for line in out.splitlines() if line.startswith("REV ")]
    assert decoded, out  # it did read the environments it can see
    for secret in (key, plain):
        for seen in [out, *decoded, *reversed_lines]:
            assert secret not in seen
    processes = int(out.splitlines()[-1])
    assert processes < 10, "the command sees processes beyond its own sandbox"


@needs_bwrap
def test_a_command_cannot_write_outside_the_workspace(session, tmp_path):
    root = session.ws.root
    name = f"labrun-sandbox-test-{uuid.uuid4().hex}"
    home_file, beside = os.path.join(os.path.expanduser("~"), name), tmp_path / name
    state_before = session.ws.state_file.read_bytes()
    try:
        out = bash(session, f"touch {home_file}; touch {beside}; echo x > .labrun/state.json; "
                            "mount -o remount,rw / && touch /remounted; "
                            "touch made-here.txt && echo wrote-workspace; "
                            "echo kept > /tmp/notes.txt && echo wrote-tmp")
        assert not os.path.exists(home_file) and not beside.exists(), out
        assert not os.path.exists("/remounted")
        assert session.ws.state_file.read_bytes() == state_before
        assert "wrote-workspace" in out and (root / "made-here.txt").is_file()
        # A private /tmp, the same from one command to the next, not the machine's.
        assert "wrote-tmp" in out and not os.path.exists("/tmp/notes.txt")
        assert "kept" in bash(session, "cat /tmp/notes.txt")
    finally:
        for path in (home_file, str(beside), "/remounted"):
            if os.path.exists(path):
                os.unlink(path)


@needs_bwrap
def test_the_python_of_labruns_helpers_runs_though_the_home_it_lies_in_is_covered(session, monkeypatch):
    """As pyenv's does (`~/.pyenv`): the sandbox covers the home and shows the installation
    again, read-only, for the bridge to the egress proxy and the hand-over of secrets."""
    installation = Path(sys.base_prefix)
    monkeypatch.setenv("HOME", str(installation))
    assert [p for p in sandbox.hidden_paths() if p == installation or p in installation.parents]
    out = bash(session, f"{sandbox.interpreter()} -I -c 'import ssl, json; print(6 * 7)'; "
                        f"touch {installation}/written && echo wrote")
    assert "42" in out and "wrote" not in out, out
    assert session.confinement.sandbox().network, "the bridge, run by that Python, was not tried"


# (A coding CLI in labrun's PID namespace has the same lifeline; its bwrap builds so little
# that no kill here fell in the window, so it is not run again.)
ENGINE = """
import sys
from pathlib import Path
from labrun.commands import run_command
from labrun.sandbox import Sandbox
ws = Path(sys.argv[1])
run_command(sys.argv[2], ws, ws / "out.log", 900, 10**6, sandbox=Sandbox(ws, ws / "tmp"),
            on_start=lambda pgid: print(pgid, flush=True))
"""


@needs_bwrap
def test_what_runs_in_bubblewrap_dies_with_an_engine_killed_the_moment_it_started_it(tmp_path):
    """However early the engine is killed, even before bwrap has set up its own
    `--die-with-parent`, nothing it ran in bubblewrap outlives the engine."""
    ws = tmp_path / "ws"
    ws.mkdir()
    marker = f"sleep 600.{uuid.uuid4().int % 10**9}"  # found by its command line
    for delay in (0, 0, 0, 0.001, 0.002, 0.004, 0.008, 0.05):
        proc = subprocess.Popen([sys.executable, "-c", ENGINE, str(ws), marker], stdout=subprocess.PIPE,
                                text=True)
        proc.stdout.readline()
        time.sleep(delay)
        proc.kill()
        proc.wait()

    def left() -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or ())]
    try:
        wait_for(lambda: not left(), timeout=10, what="everything to die with its engine")
    finally:
        for p in left():
            p.kill()


def test_without_bubblewrap_commands_run_and_the_user_is_told_once(session, tmp_path, monkeypatch, caplog):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(shutil.which("bash"), bin_dir / "bash")
    monkeypatch.setenv("PATH", str(bin_dir))
    sandbox.probed_bubblewrap.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="labrun"):
            first = bash(session, "echo one")
            second = bash(session, "echo two")
    finally:
        sandbox.probed_bubblewrap.cache_clear()
    assert "one" in first and "two" in second
    warnings = [r.getMessage() for r in caplog.records if "unsandboxed" in r.getMessage()]
    assert len(warnings) == 1 and "apt-get install bubblewrap" in warnings[0]


@needs_bwrap
def test_bubblewrap_is_looked_up_on_the_path_as_it_is_now(tmp_path, monkeypatch):
    """A PATH without bwrap for a while (a test's, a user's shell) does not leave the
    engine unsandboxed once bwrap is on PATH again."""
    found = sandbox.bubblewrap()
    with monkeypatch.context() as m:
        m.setenv("PATH", str(tmp_path))
        assert sandbox.bubblewrap() is None
    assert sandbox.bubblewrap() == found


KEYRING_PROBE = """
import ctypes, sys
calls = {"x86_64": (248, 250), "aarch64": (217, 219)}[sys.argv[1]]
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(64)
got = libc.syscall(calls[1], 11, int(sys.argv[2]), buf, 64)  # KEYCTL_READ
print("READ", buf.value.decode() if got > 0 else f"refused {ctypes.get_errno()}")
"""

KEYRING_ENGINE = """
import ctypes, platform, subprocess, sys, tempfile
from pathlib import Path
from labrun.sandbox import Lifeline, Sandbox
add_key, keyctl = {"x86_64": (248, 250), "aarch64": (217, 219)}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall(keyctl, 1, None)  # KEYCTL_JOIN_SESSION_KEYRING: a keyring of this engine's, as a login makes
key = libc.syscall(add_key, b"user", b"krb5cc:labrun-test", b"TICKET-7f3a", 11, ctypes.c_int(-3))
probe = [sys.executable, "-c", sys.argv[1], platform.machine(), str(key)]
print("OUTSIDE", subprocess.run(probe, capture_output=True, text=True).stdout.strip())
ws = Path(tempfile.mkdtemp())
(ws / ".labrun").mkdir()
lifeline = Lifeline()
inside = [Path(sys.base_prefix, "bin", "python3").as_posix(), "-c", sys.argv[1], platform.machine(), str(key)]
proc = lifeline.popen(Sandbox(ws, ws / ".labrun" / "tmp", (ws / ".labrun",), network=False).wrap(inside, lifeline.fd),
                      stdout=subprocess.PIPE, text=True)
print("INSIDE", proc.communicate()[0].strip())
lifeline.cut()
"""


@needs_bwrap
def test_a_command_cannot_read_the_engines_kernel_keyring():
    """A login puts keys in the session keyring (Kerberos tickets, tools' tokens), and every
    process inherits it: read outside the sandbox, refused inside (seccomp, `no_keyrings`)."""
    import platform
    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip(f"the keyring calls' numbers are known for x86_64 and aarch64, not {platform.machine()}")
    said = subprocess.run([sys.executable, "-c", KEYRING_ENGINE, KEYRING_PROBE], capture_output=True, text=True,
                          timeout=60)
    assert "OUTSIDE READ TICKET-7f3a" in said.stdout, said.stdout + said.stderr  # the weak target
    assert "INSIDE READ refused 1" in said.stdout, said.stdout + said.stderr  # EPERM


@needs_bwrap
def test_a_command_cannot_reach_the_engines_lock_files(session, monkeypatch):
    """A flock needs only a read-only descriptor, and `.labrun/` is shown read-only: a command
    that could open the engine's lock files could stall every save of the state, or hold the
    workspace against a resume once its engine died. Each is covered up (/dev/null in its
    place); shown first to be the real file where they are not."""
    from labrun.confinement import Confinement

    session.store.save()  # the state's lock file exists
    real = {p.name: os.stat(p).st_ino for p in (session.ws.state_lock, session.ws.lock_file)}
    look = "stat -c '%n %i %F' .labrun/state.lock .labrun/lock"

    def seen() -> dict[str, tuple[int, str]]:
        out = bash(session, look)
        return {name.split("/")[-1]: (int(ino), kind) for name, ino, kind in
                (line.split(" ", 2) for line in out.splitlines() if line.startswith(".labrun/"))}

    with monkeypatch.context() as weak:  # the protection off: the lock files shown
        weak.setattr(Confinement, "_locks", lambda self: ())
        assert {name: ino for name, (ino, _) in seen().items()} == real
    covered = seen()
    assert set(covered) == set(real) and all(kind == "character special file" for _, kind in covered.values()), covered
    assert not {name for name, (ino, _) in covered.items() if ino == real[name]}
