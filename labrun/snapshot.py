"""What the agent's workspace holds, cheap enough to take at every attempt and phase: one
digest per file, `rel path → digest`.

- A file's sha256 is reused while its size, mtime, ctime and inode are unchanged (a cache in
  `.labrun/digests.json`), so only new and changed files are read. The ctime is the one the
  agent cannot set back (`touch -d` sets the mtime, and moves the ctime on).
- A file above `LABRUN_HASH_MAX_MB` (64) is never read: its digest is its size, mtime and
  ctime (`stat_digest`).
- Virtual environments and caches are found by their marker files (`pyvenv.cfg`,
  `conda-meta/`, `CACHEDIR.TAG`), not only by their names. A cache is left out; an
  environment is one entry, `env/`, whose digest changes when packages are installed or
  removed (the mtimes of its package folders), so a `pip install` still counts as a change.
- The walk and every read go through descriptors opened without following links
  (`labrun.wsfs`): a link is not part of the work, and the engine reads nothing through one.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import stat
import time
from pathlib import Path

from labrun.settings import settings
from labrun.workspace import DATA, Workspace, write_json
from labrun.wsfs import MAX_DEPTH, Beneath, Refused


def big_file_bytes() -> int:
    """Above this size a file is never read: its digest is its size and mtime (`LABRUN_HASH_MAX_MB`)."""
    return int(settings().hash_max_mb * 2**20)


def kept_file_bytes() -> int:
    """Files up to this size are kept as each attempt found them (`keep_copies`, `LABRUN_KEEP_MAX_MB`)."""
    return int(settings().keep_max_mb * 2**20)


SKIPPED_NAMES = {DATA, ".git", ".hg", ".svn", "__pycache__", ".ipynb_checkpoints", ".pytest_cache",
                 ".mypy_cache", ".ruff_cache", ".tox", ".nox"}
ENVIRONMENT_NAMES = {".venv", "venv", "node_modules"}
ENVIRONMENT_MARKERS = {"pyvenv.cfg", "conda-meta"}
CACHE_MARKER = "CACHEDIR.TAG"  # https://bford.info/cachedir/
PACKAGE_FOLDERS = ("lib/python*/site-packages", "Lib/site-packages", "conda-meta")
SETTLED_NS = 2 * 10**9
"""A digest is cached only for a file unchanged this long: a write within the same mtime
tick as the hashing could otherwise go unseen."""

_caches: dict[Path, "DigestCache"] = {}


def workspace_files(root: Path) -> dict[str, str]:
    """A digest for every file the agent's work consists of (engine data, STATE.md, caches
    aside; an environment as one `dir/` entry)."""
    root = Path(root).resolve()
    cache = _cache_for(root)
    found: dict[str, str] = {}
    cache.start()
    _walk(Beneath(root), found, cache)
    found.pop("STATE.md", None)
    cache.finish()
    return found


def entry_digest(root: Path, rel: str) -> str | None:
    """The digest `workspace_files` gives `rel` now, None if it is gone."""
    files = Beneath(Path(root).resolve())
    if rel.endswith("/"):
        return environment_digest(files.root / rel) if files.is_dir(rel) else None
    try:
        fd = files.open_file(rel)
    except (OSError, Refused):
        return None
    return _cache_for(files.root).digest(rel, fd, os.fstat(fd))


def keep_copies(root: Path, files: dict[str, str], store: Path) -> None:
    """A copy of each file of `files` (a snapshot of `root`) in `store`, named by its digest,
    so that the workspace as it was can be rebuilt later (a reproduction,
    `labrun.phases.reproduction`). Copies are shared: a file already kept costs nothing.
    Environments and files above `kept_file_bytes()` are not kept, nor a file that changed
    since its digest was taken."""
    store.mkdir(parents=True, exist_ok=True)
    most = kept_file_bytes()
    workspace = Beneath(root)
    for rel, digest in files.items():
        if len(digest) != 64 or (store / digest).exists():  # an environment, a big file, or kept
            continue
        try:
            data = workspace.read_bytes(rel, most + 1)
        except (OSError, Refused):
            continue
        if len(data) > most:
            continue
        if hashlib.sha256(data).hexdigest() == digest:
            temp = store / f".{digest}.tmp"
            try:
                temp.write_bytes(data)
                temp.replace(store / digest)
            except OSError:  # a full disk: that file cannot be rebuilt, and a reproduction says so
                temp.unlink(missing_ok=True)
                return


def changed(before: dict[str, str], after: dict[str, str]) -> set[str]:
    """Entries added, removed or changed between two snapshots."""
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


def _cache_for(root: Path) -> "DigestCache":
    if root not in _caches:
        _caches[root] = DigestCache(Workspace(root).digests)
    return _caches[root]


def _walk(files: Beneath, found: dict[str, str], cache: "DigestCache") -> None:
    """Every folder beneath the root, through the workspace's file API (no link followed, any
    depth, one folder open at a time); a folder's markers say what it is, whatever its name."""
    todo: list[str] = [""]
    while todo:
        rel = todo.pop()
        try:  # a name no record can hold (odd bytes, line breaks) is not part of the work
            entries = [(name, st) for name, st in files.entries(rel) if name.isprintable()]
        except (OSError, Refused):  # gone meanwhile, swapped for a link, or unreadable
            continue
        names = {name for name, _ in entries}
        if rel and CACHE_MARKER in names:
            continue
        if rel and names & ENVIRONMENT_MARKERS:
            found[rel + "/"] = environment_digest(files.root / rel)
            continue
        for name, st in entries:
            path = f"{rel}/{name}" if rel else name
            if stat.S_ISDIR(st.st_mode):
                if name in ENVIRONMENT_NAMES:
                    found[path + "/"] = environment_digest(files.root / path)
                elif name not in SKIPPED_NAMES and path.count("/") < MAX_DEPTH:
                    todo.append(path)
            elif stat.S_ISREG(st.st_mode):
                try:
                    fd = files.open_file(path)
                    found[path] = cache.digest(path, fd, os.fstat(fd))
                except (OSError, Refused):  # gone, swapped, or unreadable meanwhile
                    continue


def environment_digest(path: Path) -> str:
    """Changes when packages come or go: the mtimes of the environment's package folders."""
    def mtime(p: str | Path) -> int:  # its own, not a link's target: a dangling one is no error
        try:
            return os.stat(p, follow_symlinks=False).st_mtime_ns
        except OSError:
            return 0

    stamps = [str(mtime(path))]
    for pattern in PACKAGE_FOLDERS:
        stamps += [f"{p}:{mtime(p)}" for p in sorted(glob.glob(str(path / pattern)))]
    return "env:" + hashlib.sha256("\n".join(stamps).encode()).hexdigest()[:16]


def stat_digest(st: os.stat_result) -> str:
    """A big file's digest: what its stat says of its contents."""
    return f"stat:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def file_digest(fd: int, st: os.stat_result) -> str:
    """The digest of the open file `fd` (closed here), whose stat is `st`."""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(st.st_mode):
            raise OSError("not a regular file")
        if st.st_size > big_file_bytes():
            return stat_digest(st)
        os.set_blocking(fd, True)
        h = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
        return h.hexdigest()


class DigestCache:
    """`rel → [size, mtime_ns, ctime_ns, inode, digest]`, kept in memory and saved when it changed."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.entries: dict[str, list] = json.loads(path.read_text())
        except (OSError, ValueError):
            self.entries = {}
        self.seen: dict[str, list] = {}
        self.dirty = False

    def start(self) -> None:
        self.seen, self.dirty = {}, False

    def digest(self, rel: str, fd: int, st: os.stat_result) -> str:
        """`rel`'s digest; `fd`, the file open (closed here), `st` its stat."""
        key = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        known = self.entries.get(rel)
        if known is not None and known[:4] == key and stat.S_ISREG(st.st_mode):
            os.close(fd)
            self.seen[rel] = known
            return known[4]
        digest = file_digest(fd, st)
        if time.time_ns() - st.st_mtime_ns > SETTLED_NS:
            self.seen[rel] = [*key, digest]
            self.entries[rel] = self.seen[rel]
            self.dirty = True
        return digest

    def finish(self) -> None:
        """After a whole walk: forget files that are gone, and save."""
        if self.dirty or len(self.seen) != len(self.entries):
            self.entries = self.seen
            try:
                write_json(self.path, self.entries)
            except OSError:
                pass  # a cache: a full disk or a read-only workspace only costs time
