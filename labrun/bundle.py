"""`labrun export`: a study as one `.tar.gz` to hand on: its code, results, figures, report,
STATE.md, environment file and the idea, without what is not the study's.

Left out: the engine's `.labrun/` (the idea excepted, as `IDEA.yaml`), every hidden file and
folder (`.env`, `.git`, `.cache`, a CLI's home), Python's and tools' caches (`__pycache__`,
`SKIPPED_NAMES`, a folder marked `CACHEDIR.TAG`), environments (`.venv`, `node_modules`, a
folder holding `pyvenv.cfg` or `conda-meta`), files named like keys (`*.pem`, `id_rsa`), and
every link and special file: the workspace is read through `labrun.wsfs` alone, so no link the
agent made is followed. Every file has its secrets redacted, text or not (`labrun.secrets`:
the environment's, and the session's keys for experiments whatever their names); a file over
REDACT_UP_TO is left out, not shipped unchecked. An existing bundle is never overwritten.
"""

from __future__ import annotations

import fnmatch
import io
import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from labrun.idea import IdeaError, load_idea
from labrun.keys import session_keys
from labrun.secrets import declare, redact_bytes
from labrun.state import load_state
from labrun.snapshot import CACHE_MARKER, ENVIRONMENT_MARKERS, ENVIRONMENT_NAMES, SKIPPED_NAMES
from labrun.workspace import Workspace
from labrun.wsfs import Refused

KEY_FILES = ("*.pem", "*.key", "*.p12", "*.pfx", "id_rsa*", "id_ed25519*", "id_ecdsa*", "*.keystore",
             "credentials", "credentials.json", "secrets.*")
"""File names that hold keys, whatever folder they are in."""
IDEA_NAME = "IDEA.yaml"
REDACT_UP_TO = 8 << 20
"""Files up to this size are read whole to redact secrets; a larger one is left out (listed)."""


class BundleError(ValueError):
    """The bundle cannot be made; one line says why."""


@dataclass
class Bundled:
    path: Path
    files: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    """Links, special files and files too large to check: found, not followed or copied."""
    redacted: list[str] = field(default_factory=list)


def left_out(name: str) -> bool:
    """A file or folder name that is never the study's."""
    return (name.startswith(".") or name in SKIPPED_NAMES or name in ENVIRONMENT_NAMES
            or any(fnmatch.fnmatch(name, pattern) for pattern in KEY_FILES))


def declare_session_keys(ws: Workspace) -> None:
    """Declare the keys of the session in `ws` secret, as the session itself does: a key
    passed as SERVICE_ACCESS is redacted too. Raises OSError or ValueError (one line) when the
    session's idea or state cannot be read."""
    try:
        idea_keys = load_idea(ws.idea_copy).api_keys
    except IdeaError as e:
        raise ValueError(str(e)) from None
    declare(k.name for k in session_keys(idea_keys, load_state(ws)[0].pass_env))


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
        declare_session_keys(ws)  # a key passed as SERVICE_ACCESS is redacted too
    except (OSError, ValueError) as e:
        raise BundleError(f"{ws.root}: the session's keys cannot be known, so they could not be redacted: "
                          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
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
    try:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read(REDACT_UP_TO + 1) if st.st_size <= REDACT_UP_TO else b""  # what is there now
    except OSError as e:
        done.left_out.append(f"{rel} ({e})")
        return
    if st.st_size > REDACT_UP_TO or len(data) > REDACT_UP_TO:
        done.left_out.append(f"{rel} (over {REDACT_UP_TO >> 20} MiB: not checked for secrets, left out)")
        return
    clean = redact_bytes(data)
    if clean != data:
        done.redacted.append(rel)
    _add_bytes(tar, arcname, clean, stat.S_IMODE(st.st_mode), st.st_mtime)
    done.files.append(rel)


def _add_bytes(tar: tarfile.TarFile, arcname: str, data: bytes, mode: int, mtime: float) -> None:
    info = tarfile.TarInfo(arcname)
    info.size, info.mode, info.mtime = len(data), mode, int(mtime)
    tar.addfile(info, io.BytesIO(data))
