"""`labrun export`: a study as one `.tar.gz` to hand on: its code, results, figures, report,
STATE.md, environment file and the idea, without what is not the study's.

Left out: the engine's `.labrun/` (the idea excepted, as `IDEA.yaml`), every hidden file and
folder (`.env`, `.git`, `.cache`, a CLI's home), Python's and tools' caches (`__pycache__`,
`SKIPPED_NAMES`, a folder marked `CACHEDIR.TAG`), environments (`.venv`, `node_modules`, a
folder holding `pyvenv.cfg` or `conda-meta`), files named like keys (`*.pem`, `id_rsa`), and
every link and special file: the workspace is read through `labrun.wsfs` alone, so no link the
agent made is followed. Text files have the environment's secrets redacted
(`labrun.secrets`). An existing bundle is never overwritten.
"""

from __future__ import annotations

import fnmatch
import io
import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from labrun.secrets import redact
from labrun.snapshot import CACHE_MARKER, ENVIRONMENT_MARKERS, ENVIRONMENT_NAMES, SKIPPED_NAMES
from labrun.workspace import Workspace
from labrun.wsfs import READ_LIMIT, Refused

KEY_FILES = ("*.pem", "*.key", "*.p12", "*.pfx", "id_rsa*", "id_ed25519*", "id_ecdsa*", "*.keystore",
             "credentials", "credentials.json", "secrets.*")
"""File names that hold keys, whatever folder they are in."""
IDEA_NAME = "IDEA.yaml"
REDACT_UP_TO = 8 << 20
"""Text files up to this size are read whole to redact secrets; larger ones are data, copied as they are."""


class BundleError(ValueError):
    """The bundle cannot be made; one line says why."""


@dataclass
class Bundled:
    path: Path
    files: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    """Links and special files found and not followed or copied."""
    redacted: list[str] = field(default_factory=list)


def left_out(name: str) -> bool:
    """A file or folder name that is never the study's."""
    return (name.startswith(".") or name in SKIPPED_NAMES or name in ENVIRONMENT_NAMES
            or any(fnmatch.fnmatch(name, pattern) for pattern in KEY_FILES))


def export(workspace: str | Path, target: str | Path) -> Bundled:
    """Write the study in `workspace` to `target` (a new `.tar.gz`), its files under a folder
    named after the workspace."""
    ws = Workspace(workspace)
    target = Path(target).absolute()
    if not target.name.endswith((".tar.gz", ".tgz")):
        raise BundleError(f"{target}: a bundle is a .tar.gz; name it so")
    if target.resolve().is_relative_to(ws.root):
        raise BundleError(f"{target}: inside the workspace; write the bundle elsewhere")
    top = ws.root.name
    try:
        out = open(target, "xb")  # never overwrites: a bundle handed on stays as it was
    except FileExistsError:
        raise BundleError(f"{target}: already exists; labrun does not overwrite it (remove it, or name another)") from None
    except OSError as e:
        raise BundleError(f"{target}: cannot write it ({e.strerror})") from None
    done = Bundled(target)
    try:
        with out, tarfile.open(fileobj=out, mode="w:gz") as tar:
            for rel, st in _walk(ws, done):
                _add(ws, tar, rel, f"{top}/{rel}", done)
            if IDEA_NAME not in done.files and ws.idea_copy.is_file():
                data = ws.idea_copy.read_bytes()  # the engine's own copy: not the agent's to link
                _add_bytes(tar, f"{top}/{IDEA_NAME}", data, 0o644, ws.idea_copy.stat().st_mtime)
                done.files.append(IDEA_NAME)
    except BaseException:
        target.unlink(missing_ok=True)  # no half bundle left behind
        raise
    return done


def _walk(ws: Workspace, done: Bundled):
    """The workspace's files that belong to the study, each (path, stat), in order; links and
    special files noted in `done.left_out`."""
    files = ws.files
    todo = [""]
    while todo:
        folder = todo.pop()
        try:
            entries = sorted(files.entries(folder))
        except (OSError, Refused):  # gone, or swapped for a link meanwhile
            continue
        names = {name for name, _ in entries}
        if folder and (CACHE_MARKER in names or names & ENVIRONMENT_MARKERS):
            continue  # a cache or an environment: rebuilt from the environment file, not shipped
        for name, st in entries:
            rel = f"{folder}/{name}" if folder else name
            if left_out(name):
                continue
            if stat.S_ISDIR(st.st_mode):
                todo.append(rel)
            elif stat.S_ISREG(st.st_mode):
                yield rel, st
            else:
                done.left_out.append(rel + (" (a link, not followed)" if stat.S_ISLNK(st.st_mode) else
                                            " (not a regular file)"))


def _add(ws: Workspace, tar: tarfile.TarFile, rel: str, arcname: str, done: Bundled) -> None:
    try:
        fd = ws.files.open_file(rel)  # a link swapped in since the walk is refused here
    except (OSError, Refused) as e:
        done.left_out.append(f"{rel} ({e})")
        return
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_size <= REDACT_UP_TO:
            data = f.read(READ_LIMIT)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            if text is not None and (clean := redact(text)) != text:
                data = clean.encode()
                done.redacted.append(rel)
            _add_bytes(tar, arcname, data, stat.S_IMODE(st.st_mode), st.st_mtime)
        else:
            info = tarfile.TarInfo(arcname)
            info.size, info.mode, info.mtime = st.st_size, stat.S_IMODE(st.st_mode), int(st.st_mtime)
            tar.addfile(info, f)
    done.files.append(rel)


def _add_bytes(tar: tarfile.TarFile, arcname: str, data: bytes, mode: int, mtime: float) -> None:
    info = tarfile.TarInfo(arcname)
    info.size, info.mode, info.mtime = len(data), mode, int(mtime)
    tar.addfile(info, io.BytesIO(data))
