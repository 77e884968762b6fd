"""`labrun` in a pseudo-terminal, as a person runs it: the terminal is its controlling
terminal and its process group the foreground one, so a typed Ctrl-C (byte 0x03) makes the
terminal send SIGINT to that whole group, exactly as in a real terminal."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import termios
import threading
import time

import psutil


class Terminal:
    def __init__(self, *args: str, env: dict[str, str], cwd: str | None = None):
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "labrun.cli", *args], stdin=slave, stdout=slave, stderr=slave,
            env=env, cwd=cwd, preexec_fn=_take_terminal, close_fds=True,
        )
        os.close(slave)
        self._out = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.seen: dict[int, psutil.Process] = {}
        """Every process seen below labrun while it ran, by pid."""

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every holder of the terminal's other end is gone
                return
            if not chunk:
                return
            self._out += chunk

    @property
    def output(self) -> str:
        return self._out.decode(errors="replace").replace("\r\n", "\n")

    def watch(self) -> list[psutil.Process]:
        """Note the processes below labrun now (they may leave its tree later)."""
        try:
            for p in psutil.Process(self.proc.pid).children(recursive=True):
                self.seen.setdefault(p.pid, p)
        except psutil.NoSuchProcess:
            pass
        return list(self.seen.values())

    def ctrl_c(self) -> None:
        os.write(self.master, b"\x03")

    def hang_up(self) -> None:
        """Close the terminal, as closing its window does: the kernel sends SIGHUP to the
        session's leader, and its writes to the terminal fail from then on."""
        os.close(self.master)
        self.master = -1

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code

    def survivors(self, grace_s: float = 2.0) -> list[str]:
        """Processes seen below labrun that are still alive `grace_s` after it ended."""
        deadline = time.monotonic() + grace_s
        while True:
            left = [p for p in self.seen.values() if _alive(p)]
            if not left or time.monotonic() > deadline:
                return [f"{p.pid} {' '.join(_cmdline(p))[:120]}" for p in left]
            time.sleep(0.1)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for p in self.seen.values():
            if _alive(p):
                p.kill()
        if self.master >= 0:
            os.close(self.master)


def _take_terminal() -> None:
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []
