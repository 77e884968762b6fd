"""The one way the engine touches a folder an agent can write (docs/design.md, Containment).
Standard library only.

The engine runs as the user, outside the sandbox; the agent's commands can put a link, a
FIFO or a folder anywhere in the workspace, at any moment. So every read, write, digest and
copy the engine makes there goes through a `Beneath`: a folder the engine trusts (chosen by
the user or by the engine, never by the agent), and paths under it that are resolved by the
kernel without following any link and without leaving it: `openat2` with
`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` (Linux 5.6+), or, where that is missing, a walk of one
component at a time with `O_NOFOLLOW` from the folder's descriptor. Whatever the agent swaps
in between two calls, the engine acts on what the kernel found beneath the folder, or on
nothing.

- Reads open regular files only (`O_NONBLOCK`, then a check): a FIFO cannot hang the engine,
  a device cannot be read.
- Writes are made in a staging folder of the engine's (under `.labrun/`, which no agent
  process can write), then renamed into place in a parent opened beneath: a rename replaces
  a link at the destination and never follows it.
- A path an agent names in a tool's input is checked first (`agent_path`): absolute outside
  the workspace, `..`, hidden (a component starting with a dot) and empty are refused, each
  in one line that says which; a link is refused when it is opened.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import platform
import secrets
import shutil
import stat
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Callable, Iterator

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437, "riscv64": 437, "ppc64le": 437, "s390x": 437}.get(platform.machine())
STAGING = ".labrun/staging"
"""Where engine writes are made before they are renamed into place (`Beneath.write`)."""
READ_LIMIT = 64 << 20
"""The most the engine reads of one of the agent's files unless a caller says otherwise: a
sparse terabyte must not become a terabyte of memory."""
MAX_DEPTH = 100
"""Folders deeper than this are not walked: a thousand nested folders must not exhaust the
engine's stack or descriptors."""


class Refused(ValueError):
    """A path the engine will not act on; the message is one line naming the path and why."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_openat2_works: bool | None = None if _SYS_OPENAT2 else False


def _openat2(dir_fd: int, rel: str, flags: int, mode: int) -> int | None:
    """The descriptor, or None where the kernel has no openat2 (then the walk serves)."""
    global _openat2_works
    if _openat2_works is False:
        return None
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0,
                   RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(_SYS_OPENAT2, dir_fd, os.fsencode(rel), ctypes.byref(how), ctypes.sizeof(how))
    if fd >= 0:
        _openat2_works = True
        return fd
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EPERM) and _openat2_works is None:  # no openat2, or a seccomp filter
        _openat2_works = False
        return None
    raise OSError(err, os.strerror(err), rel)


def _walk_open(dir_fd: int, parts: tuple[str, ...], flags: int, mode: int) -> int:
    """openat2's promise kept by hand: each folder opened with `O_NOFOLLOW` from the last."""
    fd = os.dup(dir_fd)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
    finally:
        os.close(fd)


def agent_path(name: str, root: Path) -> str:
    """`name`, a path an agent gave a tool, as a clean path relative to `root`; refused (in
    one line saying which) when it is absolute outside the workspace, goes up with `..`, is
    hidden or names nothing. Whether it is a link is found when it is opened."""
    if not name or "\0" in name:
        raise Refused(f"{name!r}: not a file name; name a file in the workspace")
    path = PurePosixPath(name)
    if path.is_absolute():
        try:
            path = path.relative_to(root)
        except ValueError:
            raise Refused(f"{name}: an absolute path outside the workspace {root}; name a file inside it, "
                          "relative to its root") from None
    parts = [p for p in path.parts if p != "."]
    if ".." in parts:
        raise Refused(f"{name}: goes up with '..'; name a file inside the workspace, relative to its root")
    if any(p.startswith(".") for p in parts):
        raise Refused(f"{name}: a hidden path (a name starting with '.'); labrun acts only on visible files")
    if not parts:
        raise Refused(f"{name}: the workspace itself; name a file inside it")
    return "/".join(parts)


class Beneath:
    """A folder the engine trusts, and the files beneath it reached without following links."""

    def __init__(self, root: str | Path, staging: str = STAGING):
        self.root = Path(root)
        self.staging = staging
        """Where `write` makes its files, beneath the root: a folder only the engine writes."""

    def _rel(self, path: str | Path, root_ok: bool = False) -> tuple[str, ...]:
        """The components of `path` (relative, or absolute under the root), as the engine
        names it (with `root_ok`, none for the root itself); `..` never appears in an engine's
        path, so it is refused, not resolved."""
        p = Path(path)
        if p.is_absolute():
            p = p.relative_to(self.root)
        parts = tuple(x for x in p.parts if x != ".")
        if (not parts and not root_ok) or ".." in parts:
            raise Refused(f"{path}: not a path beneath {self.root}")
        return parts

    def open(self, path: str | Path, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
        """A descriptor for `path`, found without following a link; `Refused` for a link on
        the way, `FileNotFoundError` for nothing there."""
        parts = self._rel(path)
        root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd = _openat2(root_fd, "/".join(parts), flags, mode)
            return fd if fd is not None else _walk_open(root_fd, parts, flags, mode)
        except OSError as e:
            link = self._link_on(parts)
            if link or e.errno in (errno.ELOOP, errno.EXDEV):
                raise Refused(f"{link or '/'.join(parts)} is a link; labrun follows no link in the workspace") from None
            raise
        finally:
            os.close(root_fd)

    def _link_on(self, parts: tuple[str, ...]) -> str | None:
        """The first link on the way to `parts`, to say which (the refusal itself is the kernel's)."""
        for i in range(1, len(parts) + 1):
            try:
                if stat.S_ISLNK(os.lstat(self.root.joinpath(*parts[:i])).st_mode):
                    return "/".join(parts[:i])
            except OSError:
                return None
        return None

    def open_file(self, path: str | Path) -> int:
        """A descriptor of a regular file for reading; `Refused` for anything else (a FIFO,
        which would hang the engine, a device, a folder)."""
        fd = self.open(path, os.O_RDONLY | os.O_NONBLOCK)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise Refused(f"{path} is not a regular file")
        os.set_blocking(fd, True)
        return fd

    def read_bytes(self, path: str | Path, limit: int = READ_LIMIT) -> bytes:
        """The file's bytes; `Refused` when it holds more than `limit`."""
        with os.fdopen(self.open_file(path), "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise Refused(f"{path} holds more than {limit:,} bytes, more than labrun reads of one file")
        return data

    def read_text(self, path: str | Path, errors: str = "strict", limit: int = READ_LIMIT) -> str:
        return self.read_bytes(path, limit).decode("utf-8", errors=errors)

    def lines(self, path: str | Path) -> Iterator[str]:
        """The text file's lines, streamed (a CLI's log grows long); none when it is not a
        regular file reached without a link."""
        try:
            f = open(self.open_file(path), encoding="utf-8", errors="replace")
        except (OSError, Refused):
            return
        with f:
            yield from f

    def _dir(self, parts: tuple[str, ...]) -> int:
        """The folder `parts` (the root for none), opened without following a link."""
        if not parts:
            return os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return self.open("/".join(parts), os.O_RDONLY | os.O_DIRECTORY)

    def lstat(self, path: str | Path) -> os.stat_result | None:
        """The entry's own stat (a link's, not its target's); None when there is none;
        `Refused` when a link lies on the way to it."""
        parts = self._rel(path)
        try:
            fd = self._dir(parts[:-1])
        except OSError:
            return None
        try:
            return os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        except OSError:
            return None
        finally:
            os.close(fd)

    def _kind(self, path: str | Path) -> int:
        try:
            st = self.lstat(path)
        except Refused:
            return 0
        return 0 if st is None else stat.S_IFMT(st.st_mode)

    def is_file(self, path: str | Path) -> bool:
        """A regular file, reached without a link."""
        return self._kind(path) == stat.S_IFREG

    def is_dir(self, path: str | Path) -> bool:
        return self._kind(path) == stat.S_IFDIR

    def exists(self, path: str | Path) -> bool:
        """Something that is not a link, reached without a link."""
        return self._kind(path) not in (0, stat.S_IFLNK)

    def mkdirs(self, path: str | Path) -> int:
        """The folder `path`, made where missing, opened (the caller closes it); `Refused`
        where a link or a file stands in the way."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in self._rel(path, root_ok=True):
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                try:
                    nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise Refused(f"{path}: {part} is a link or a file, not a folder; "
                                      "labrun follows no link in the workspace") from None
                    raise
                os.close(fd)
                fd = nxt
            return fd
        except BaseException:
            os.close(fd)
            raise

    def write(self, path: str | Path, data: bytes | str | BinaryIO, mode: int = 0o644,
              before_rename: Callable[[], None] | None = None, durable: bool = True) -> None:
        """Replace `path` whole: readers see the old file or the new one. Made in the staging
        folder, then renamed into a parent opened beneath the root; a link at `path` is
        replaced, never followed. `before_rename`: called with the new file written whole
        and not yet in place (a crash point's, or a check of what was streamed in). `data`: a
        file open for reading is copied in chunks (a big file need not fit in memory).
        `durable`: on disk (its data, then its folder) before this returns, so that it
        outlives the machine and not only the process."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        parts = self._rel(path)
        staging = self.mkdirs(self.staging)
        name = f"write-{secrets.token_hex(8)}"
        parent = None
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                         dir_fd=staging)
            try:
                with os.fdopen(fd, "wb") as f:
                    os.fchmod(f.fileno(), mode)
                    if isinstance(data, bytes):
                        f.write(data)
                    else:
                        shutil.copyfileobj(data, f, 1 << 20)
                    f.flush()
                    if durable:
                        os.fsync(f.fileno())
                parent = self.mkdirs("/".join(parts[:-1]))
                if before_rename:
                    before_rename()
                for tries in range(3, -1, -1):
                    try:
                        os.replace(name, parts[-1], src_dir_fd=staging, dst_dir_fd=parent)
                        break
                    except OSError as e:
                        if not tries or e.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST, errno.EACCES):
                            raise
                        if e.errno == errno.EACCES:  # the agent took its folder's write bit: the owner gives it back
                            os.fchmod(parent, stat.S_IMODE(os.fstat(parent).st_mode) | stat.S_IRWXU)
                        else:  # a folder the agent made at the engine's name: kept, beside
                            self.set_aside(path, "in-the-way")
                if durable:
                    os.fsync(parent)
            except BaseException:
                try:
                    os.unlink(name, dir_fd=staging)
                except OSError:
                    pass
                raise
        finally:
            os.close(staging)
            if parent is not None:
                os.close(parent)

    def copy(self, path: str | Path, dst: Path, digest_up_to: int = READ_LIMIT) -> tuple[str | None, os.stat_result]:
        """Copy the regular file `path` to `dst`, a new file of the engine's: what the kernel
        found beneath the root, whatever lies at that name a moment later; never a link to
        it (the agent could hold another link to the same file and change it). Holes stay
        holes. Its sha256 (None above `digest_up_to`) and its stat, as read."""
        fd = self.open_file(path)
        try:
            dst.parent.mkdir(parents=True, exist_ok=True)
            st = os.fstat(fd)
            return _copy(fd, dst, st.st_size <= digest_up_to), st
        finally:
            os.close(fd)

    def set_aside(self, path: str | Path, why: str) -> str | None:
        """Rename what lies at `path` (a file, a folder or a link, not followed) to
        `<name>.<why>-<random>` beside it: out of the way, nothing lost. Its new name, or
        None when nothing was there."""
        parts = self._rel(path)
        parent = self._dir(parts[:-1])
        aside = f"{parts[-1]}.{why}-{secrets.token_hex(3)}"
        try:
            os.rename(parts[-1], aside, src_dir_fd=parent, dst_dir_fd=parent)
        except FileNotFoundError:
            return None
        finally:
            os.close(parent)
        return "/".join((*parts[:-1], aside))

    def readlink(self, path: str | Path) -> str:
        """What the link `path` says, read, never followed."""
        parts = self._rel(path)
        fd = self._dir(parts[:-1])
        try:
            return os.readlink(parts[-1], dir_fd=fd)
        finally:
            os.close(fd)

    def entries(self, path: str | Path = "") -> list[tuple[str, os.stat_result]]:
        """The folder's entries, each with its own stat (a link's, not its target's), the
        folder reached without a link."""
        fd = self._dir(self._rel(path, root_ok=True))
        try:
            found = []
            for name in os.listdir(fd):
                try:
                    found.append((name, os.stat(name, dir_fd=fd, follow_symlinks=False)))
                except OSError:  # gone meanwhile
                    continue
            return found
        finally:
            os.close(fd)

    def files(self, path: str | Path = "", links: bool = False) -> Iterator[tuple[str, os.stat_result]]:
        """Every regular file beneath `path` (relative path, its stat), never through a link,
        no deeper than `MAX_DEPTH`; with `links`, the links too (not followed). One folder is
        open at a time, whatever the depth."""
        todo = [self._rel(path, root_ok=True)]
        while todo:
            parts = todo.pop()
            try:
                found = self.entries("/".join(parts))
            except (OSError, Refused):  # gone, or swapped for a link meanwhile
                continue
            for name, st in sorted(found, reverse=True):
                if stat.S_ISREG(st.st_mode) or (links and stat.S_ISLNK(st.st_mode)):
                    yield "/".join((*parts, name)), st
                elif stat.S_ISDIR(st.st_mode) and len(parts) < MAX_DEPTH:
                    todo.append((*parts, name))

    def remove(self, path: str | Path) -> None:
        """Remove the file, link or folder (whole) at `path`, reached without a link: what
        lies beneath a link in the way is never touched. A folder is first moved into the
        staging folder, and each folder in it moved up beside it before it is emptied, so
        any depth takes one descriptor and no recursion (`shutil.rmtree` recurses)."""
        parts = self._rel(path)
        parent = self._dir(parts[:-1])
        try:
            if not stat.S_ISDIR(os.stat(parts[-1], dir_fd=parent, follow_symlinks=False).st_mode):
                return os.unlink(parts[-1], dir_fd=parent)
            grave_name = f"{self.staging}/remove-{secrets.token_hex(6)}"
            grave = self.mkdirs(grave_name)
            os.rename(parts[-1], "0", src_dir_fd=parent, dst_dir_fd=grave)
        finally:
            os.close(parent)
        try:
            folders, n = ["0"], 0
            while n < len(folders):
                fd = os.open(folders[n], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=grave)
                n += 1
                try:
                    for name in os.listdir(fd):
                        if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                            os.rename(name, str(len(folders)), src_dir_fd=fd, dst_dir_fd=grave)
                            folders.append(str(len(folders)))
                        else:
                            os.unlink(name, dir_fd=fd)
                finally:
                    os.close(fd)
            for name in folders:
                os.rmdir(name, dir_fd=grave)
        finally:
            os.close(grave)
        staging = self._dir(self._rel(self.staging))
        try:
            os.rmdir(grave_name.rsplit("/", 1)[1], dir_fd=staging)
        finally:
            os.close(staging)

    def folders(self, path: str | Path = "", skip: Callable[[str, list[str]], bool] = lambda rel, names: False
                ) -> list[str]:
        """Every folder beneath `path` (relative paths), reached without a link, no deeper than
        `MAX_DEPTH`; `skip(rel, names)` (a folder and the names in it) leaves one out, and
        what it holds."""
        found, todo = [], [self._rel(path, root_ok=True)]
        while todo:
            parts = todo.pop()
            try:
                entries = self.entries("/".join(parts))
            except (OSError, Refused):
                continue
            for name, st in entries:
                if stat.S_ISDIR(st.st_mode) and len(parts) < MAX_DEPTH:
                    rel = "/".join((*parts, name))
                    try:
                        inside = [n for n, _ in self.entries(rel)]
                    except (OSError, Refused):
                        continue
                    if not skip(rel, inside):
                        found.append(rel)
                        todo.append((*parts, name))
        return found


def _copy(fd: int, dst: Path, digest: bool) -> str | None:
    """The open file's bytes into `dst` with its mode, its holes left holes (a sparse
    terabyte stays small); their sha256 when `digest`."""
    size = os.fstat(fd).st_size
    h = hashlib.sha256() if digest else None
    with open(dst, "wb") as out:
        at = 0
        while at < size:
            try:
                data = os.lseek(fd, at, os.SEEK_DATA)
            except OSError as e:  # ENXIO: only a hole is left; EINVAL: no holes on this file system
                data = size if e.errno == errno.ENXIO else at
            data = min(data, size)
            if h is not None and data > at:
                for n in range(at, data, 1 << 20):
                    h.update(bytes(min(1 << 20, data - n)))
            if data >= size:
                break
            try:
                hole = min(os.lseek(fd, data, os.SEEK_HOLE), size)
            except OSError:
                hole = size
            os.lseek(fd, data, os.SEEK_SET)
            out.seek(data)
            at = data
            while at < hole:
                chunk = os.read(fd, min(1 << 20, hole - at))
                if not chunk:  # shorter than it was: what is there is copied
                    hole = size = at
                    break
                if h is not None:
                    h.update(chunk)
                out.write(chunk)
                at += len(chunk)
        out.truncate(size)
    os.chmod(dst, stat.S_IMODE(os.fstat(fd).st_mode))
    return h.hexdigest() if h is not None else None
