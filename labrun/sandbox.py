"""The sandbox of agent commands: bubblewrap (`bwrap`, the Linux sandbox of Flatpak and of
Claude Code's own sandboxing), when it is installed and works here.

A command inside it sees:
- a PID namespace of its own, so the engine's /proc (and its environment, API keys
  included) is out of sight;
- only the scrubbed environment: bwrap itself is started from it, since its first process
  keeps the environment it was started with;
- no capabilities (as root, bwrap would otherwise keep them, and a remount would undo the
  read-only binds);
- the workspace read-write, its `.labrun/` read-only, the rest of the file system read-only;
- a private /tmp (a folder of the session's, so that it lasts from one command to the next)
  and a private /dev (with the GPUs);
- the network, unless the session turned it off;
and it dies with the engine, however the engine dies.

bwrap's own `--die-with-parent` leaves a window of some milliseconds after bwrap starts (it
sets the signal only once the sandbox is built), in which a killed engine leaves the sandbox
running for good. The lifeline closes it: a watcher inside the sandbox, started before the
command, waits on a pipe that only the engine holds open. The kernel closes that pipe when
the engine dies, and the watcher then kills everything in the sandbox.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

log = logging.getLogger("labrun")

HOW_TO_INSTALL = "install bubblewrap (Debian and Ubuntu: `apt-get install bubblewrap`; Fedora: `dnf install bubblewrap`)"
GPU_DEVICES = ("/dev/nvidia*", "/dev/dri", "/dev/kfd")
_BASE = ("--unshare-pid", "--die-with-parent", "--cap-drop", "ALL", "--ro-bind", "/", "/", "--dev", "/dev")
# `kill -1` reaches every process of the sandbox's PID namespace but its init, which then
# exits with its child. The command is not handed the lifeline.
_WATCHER = '{{ read -r -u {fd} _; kill -KILL -1; }} & exec "$@" {fd}<&-'


@dataclass(frozen=True)
class Sandbox:
    workspace: Path
    tmp: Path
    """Bound as /tmp."""
    readonly: tuple[Path, ...] = ()
    """Folders inside the workspace that commands may read but not change."""
    network: bool = True
    writable: tuple[Path, ...] = ()
    """Folders that commands may change besides the workspace, even inside a read-only one
    (a coding CLI's own home, when the CLI itself runs in the sandbox)."""

    def wrap(self, argv: list[str], lifeline: int) -> list[str]:
        """`argv` run inside the sandbox (which needs `bubblewrap()`). `lifeline` is the read
        end of a pipe whose write end only the engine holds: the sandbox lasts while it is
        open."""
        bwrap = bubblewrap()
        assert bwrap is not None, "Sandbox.wrap needs bubblewrap"
        self.tmp.mkdir(parents=True, exist_ok=True)
        args = [bwrap, *_BASE]
        for device in sorted(d for pattern in GPU_DEVICES for d in glob.glob(pattern)):
            args += ["--dev-bind", device, device]
        # /tmp before the workspace, which may lie under /tmp itself.
        args += ["--proc", "/proc", "--bind", str(self.tmp), "/tmp",
                 "--bind", str(self.workspace), str(self.workspace)]
        for path in self.readonly:
            path.mkdir(parents=True, exist_ok=True)
            args += ["--ro-bind", str(path), str(path)]
        for path in self.writable:
            path.mkdir(parents=True, exist_ok=True)
            args += ["--bind", str(path), str(path)]
        if not self.network:
            args.append("--unshare-net")
        return [*args, "--chdir", str(self.workspace), "--", *watched(argv, lifeline)]


def watched(argv: list[str], lifeline: int) -> list[str]:
    """`argv` with the lifeline's watcher beside it: run in a PID namespace of bubblewrap's,
    everything in it ends when the engine's end of the lifeline closes."""
    return ["bash", "-c", _WATCHER.format(fd=lifeline), "labrun-lifeline", *argv]


class Lifeline:
    """The pipe a bubblewrap lives on: the process gets the read end (`fd`), the engine only
    the write end, which `cut` closes once the process has ended (the kernel does it when the
    engine dies)."""

    def __init__(self) -> None:
        self.fd, self._held = os.pipe()

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        try:
            return subprocess.Popen(argv, pass_fds=(self.fd,), **kwargs)
        except BaseException:
            self.cut()
            raise
        finally:
            os.close(self.fd)  # the process holds its own copy

    def cut(self) -> None:
        os.close(self._held)


@lru_cache(maxsize=1)
def bubblewrap() -> str | None:
    """The path of a working `bwrap`, or None; says once, when there is none, that agent
    commands run unsandboxed and how to change that."""
    path = shutil.which("bwrap")
    if path is None:
        log.warning("agent commands run unsandboxed: bubblewrap (bwrap) is not installed; %s", HOW_TO_INSTALL)
        return None
    probe = subprocess.run([path, *_BASE, "--proc", "/proc", "true"], env={}, capture_output=True, text=True)
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or [f"exit code {probe.returncode}"])[-1]
        log.warning("agent commands run unsandboxed: bubblewrap cannot make a sandbox here (%s); "
                    "it needs root or unprivileged user namespaces", why)
        return None
    return path
