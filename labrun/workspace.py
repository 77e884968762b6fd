"""A session's workspace: where engine data lives, atomic writes, and the writer lock."""

from __future__ import annotations

import fcntl
import json
import os
import secrets
from pathlib import Path
from typing import Any

from labrun.crashpoints import crashpoint
from labrun.secrets import redact_data
from labrun.settings import settings
from labrun.wsfs import Beneath


DATA = ".labrun"
"""The name of the engine's folder in a workspace; every path in it is named here."""
RESERVE_BYTES = 4 << 20
"""Kept allocated in `.labrun/reserve` and given up when a command fills the disk, so the
record of that command (its attempt, the journal) can still be written."""


class WorkspaceBusy(Exception):
    pass


class DiskFull(Exception):
    """Too little free disk to go on safely; the session resumes once space is freed."""


class Workspace:
    """`<root>/.labrun/` holds the engine's data; everything else is the agent's. The engine
    reads and writes beneath the root only through `files` (`labrun.wsfs`): never through a
    link, never outside."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        self.files = Beneath(self.root)
        self.data = self.root / DATA
        self.state_file = self.data / "state.json"
        self.state_lock = self.data / "state.lock"
        """Held while a `StateStore` reads, changes and writes the state (`transaction`)."""
        self.lock_file = self.data / "lock"
        """The engine's hold on the workspace (`lock`), and its lease."""
        self.idea_copy = self.data / "idea.yaml"
        """The idea as the session started from it."""
        self.state_md = self.root / "STATE.md"
        self.results = self.data / "results"
        self.attempts = self.data / "attempts"
        self.kept = self.data / "kept"
        """Copies of the files the attempts started from, by digest (`snapshot.keep_copies`)."""
        self.digests = self.data / "digests.json"
        """The snapshot's digest cache (`labrun.snapshot`)."""
        self.branches = self.data / "branches"
        """Branch n, whole, once a later branch replaced it (`labrun.branches`)."""
        self.reproductions = self.data / "reproductions"
        self.tmp = self.data / "tmp"
        """The engine's scratch files for the agent's commands (the bash tool's log, Codex's TMPDIR)."""
        self.sandbox_tmp = self.data / "sandbox" / "tmp"
        """The sandbox's `/tmp`."""
        self.cache = self.data / "cache"
        """The sandbox's home and caches (pip, uv, Hugging Face, torch), kept across attempts."""
        self.faults = self.data / "faults"
        """The scripted agent's fault marks (tests)."""
        self.legacy_sealed = self.data / "sealed"
        """Where earlier versions kept the sealed scorer's log."""
        self._lock_fd: int | None = None
        self.lease: str | None = None
        """Given by `lock` to this holding of the workspace (`leased`)."""

    def write(self, path: Path | str, text: str, durable: bool = True) -> None:
        """Replace a file beneath the root whole (`Beneath.write`: readers see the old file or
        the new one, and a link in the way is replaced or refused, never followed).
        `durable=False` for what matters only while the machine stays up (a view rendered
        again from records, a note on a running process): the process may die, not the disk."""
        self.files.write(path, text, before_rename=lambda: crashpoint("atomic-write"), durable=durable)

    def write_json(self, path: Path | str, data: Any, durable: bool = True) -> None:
        """Engine records (manifests, attempts' files): secrets redacted, keys included."""
        self.write(path, json.dumps(redact_data(data), indent=2, sort_keys=True) + "\n", durable)

    def agent_home(self, backend: str) -> Path:
        """A coding CLI's home of its own, for a backend that keeps one in the workspace."""
        return self.data / backend

    def phase_dir(self, key: str) -> Path:
        return self.data / "phases" / key

    def manifest(self, phase_key: str) -> dict[str, Any] | None:
        """What the phase's last finished run produced (None before it first finishes)."""
        path = self.phase_dir(phase_key) / "manifest.json"
        return json.loads(self.files.read_text(path)) if self.files.is_file(path) else None

    def attempt_log(self, n: int) -> Path:
        return self.attempts / f"attempt-{n:03d}.log"

    def attempt_file(self, n: int, kind: str) -> Path:
        """Attempt n's record of `kind` beside its log: `files`, `run`, `supervisor`
        (`labrun.attempt_records`)."""
        return self.attempts / f"attempt-{n:03d}.{kind}.json"

    @property
    def reserve(self) -> Path:
        return self.data / "reserve"

    def state_identity(self) -> tuple[int, int, int] | None:
        """Which save of the state is on disk: each replaces state.json (a new inode)."""
        try:
            st = os.stat(self.state_file)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def has_session(self) -> bool:
        """A session was started here (its state is written before anything else runs)."""
        return self.state_file.is_file()

    def lock(self) -> None:
        """Hold the workspace for this process. The kernel drops a flock when its holder
        dies, so a crashed engine never keeps the workspace."""
        self.data.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = (os.pread(fd, 64, 0).decode(errors="replace").split() or ["unknown"])[0]
            os.close(fd)
            raise WorkspaceBusy(
                f"{self.root}: another labrun process (pid {holder}) is running this session; "
                "wait for it to finish or stop it first"
            ) from None
        self.lease = secrets.token_hex(8)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {self.lease}".encode(), 0)
        self._lock_fd = fd
        self._keep_reserve()

    def leased(self, lease: str | None) -> bool:
        """Whether the engine that holds the workspace now is the one that gave `lease`: a
        phase task of that engine's, in whatever process, may record into the session's state
        (under `StateStore.transaction`'s lock); one of an engine since gone may not."""
        try:
            fd = os.open(self.lock_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return False  # nobody holds it
            except BlockingIOError:
                return lease is not None and os.pread(fd, 64, 0).decode(errors="replace").split()[1:] == [lease]
        finally:
            os.close(fd)

    # -- disk --------------------------------------------------------------------------------

    def free_mb(self) -> float:
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize / 2**20

    def nearly_full(self) -> bool:
        """Below `LABRUN_MIN_FREE_MB` free: the session stops (resumably) before its next step."""
        return self.free_mb() < settings().min_free_mb

    def check_disk(self) -> None:
        """Stop before the next step when the disk is nearly full, not halfway through it."""
        if self.nearly_full():
            raise DiskFull(
                f"{self.root}: only {self.free_mb():.0f} MB free on its disk, below labrun's floor of "
                f"{settings().min_free_mb:g} MB (LABRUN_MIN_FREE_MB); free some space, then "
                f"`labrun resume {self.root}`"
            )

    def release_reserve_if_full(self) -> None:
        """After a command: if it filled the disk, free the reserve so its record fits."""
        if self.nearly_full():
            self.reserve.unlink(missing_ok=True)

    def _keep_reserve(self) -> None:
        if self.reserve.exists():
            return
        fd = os.open(self.reserve, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except OSError:  # no room for it (check_disk will say so), or no fallocate here
            self.reserve.unlink(missing_ok=True)
        finally:
            os.close(fd)

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def write_atomic(path: Path, text: str) -> None:
    """For the engine's own files outside any workspace (a workspace's go through
    `Workspace.write`): the folder that holds `path` is the engine's, and is trusted."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Beneath(path.parent, staging=".").write(path.name, text, before_rename=lambda: crashpoint("atomic-write"))


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
