"""The engine's reads of paths the agent controls, without following a link.

The engine runs as the user, outside the sandbox: a path the agent made (an artifact, a
rerun's metrics file, an environment folder) may be a link, or lie in a folder that is one,
to anything the user can read. Here each path is opened one component at a time, each from
a descriptor of the folder above with O_NOFOLLOW, so no link is followed anywhere on it, and
a link swapped in meanwhile is refused as well (the kernel's openat2 RESOLVE_NO_SYMLINKS,
done with what Python has).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path


class Refused(Exception):
    """Why a path is not read, as a clause ("results/p.txt is a link"). `missing`: it is not there."""

    def __init__(self, clause: str, missing: bool = False):
        super().__init__(clause)
        self.missing = missing


def open_beneath(root: Path, rel: str, folder: bool = False) -> int:
    """A descriptor of `rel` under `root`: a plain file, or with `folder` a folder, reached
    through real folders only. `Refused` says why not."""
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or ".." in parts:
        raise Refused(f"{rel} is not a path inside {root}")
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise Refused(f"{root}: {e.strerror}", missing=e.errno == errno.ENOENT) from None
    try:
        for i, part in enumerate(parts):
            inner = i < len(parts) - 1 or folder
            # O_NONBLOCK: opening a FIFO the agent left there must not hang the engine.
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_DIRECTORY if inner else os.O_NONBLOCK)
            try:
                step = os.open(part, flags, dir_fd=fd)
            except OSError as e:
                raise _refusal(e, "/".join(parts[:i + 1]), fd, part) from None
            os.close(fd)
            fd = step
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISDIR(mode) if folder else stat.S_ISREG(mode)):
            raise Refused(f"{rel} is not a {'folder' if folder else 'plain file'}")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _refusal(error: OSError, where: str, parent: int, name: str) -> Refused:
    try:  # ELOOP and ENOTDIR say little: what is there says which
        kind = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return Refused(f"{where} is not there", missing=True)
    except OSError:
        return Refused(f"{where}: {error.strerror}")
    if stat.S_ISLNK(kind):
        return Refused(f"{where} is a link")
    if error.errno == errno.ENOTDIR:
        return Refused(f"{where} is not a folder")
    return Refused(f"{where}: {error.strerror}")


def copy_beneath(root: Path, rel: str, target: Path) -> tuple[str, os.stat_result]:
    """Copy the plain file `rel` under `root` to `target` (a new file of the engine's); its
    sha256 and its stat as read."""
    fd = open_beneath(root, rel)
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as source, open(target, "wb") as out:
        found = os.fstat(fd)
        for chunk in iter(lambda: source.read(1 << 20), b""):
            h.update(chunk)
            out.write(chunk)
    return h.hexdigest(), found


def read_beneath(root: Path, rel: str) -> bytes:
    """The plain file `rel` under `root`."""
    with os.fdopen(open_beneath(root, rel), "rb") as f:
        return f.read()
