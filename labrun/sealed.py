"""A sealed evaluation: a scorer and held-out data that an idea names (`sealed_evaluation`),
kept outside the workspace, hidden from every command of the agent and never in a prompt,
and run by the engine on the artifact the experiments wrote (`phases.sealed_scoring`).

When a session starts, the sealed files are found (relative to the idea file), checked to
lie outside the workspace and where no sandbox of any session shows them (under a home or
the machine's /tmp), and their fingerprints recorded; a change to them later is refused at
scoring time. Hiding them needs bubblewrap: without it, a session that names a sealed
evaluation does not start.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from labrun.idea import Idea, IdeaError
from labrun.sandbox import HOW_TO_INSTALL, bubblewrap, homes
from labrun.state import Sealed


def digest(path: Path) -> str:
    """What changes when the file, or a file of the folder, is changed, moved or replaced: its
    stat (size, times, inode), never its contents. state.json, which the agent can read, keeps
    it: a digest of the contents would let the agent check its guesses of the held-out data.
    "missing" when gone."""
    def stamp(st: os.stat_result) -> str:
        return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"

    h = hashlib.sha256()
    if path.is_file():
        h.update(stamp(path.stat()).encode())
    elif path.is_dir():
        for folder, names, files in os.walk(path):
            names.sort()
            for name in sorted(files):
                full = Path(folder) / name
                h.update(f"{full.relative_to(path)}\0{stamp(full.stat())}\0".encode())
    else:
        return "missing"
    return h.hexdigest()


def unseen(path: Path) -> bool:
    """Whether no sandbox of any session shows `path`: each covers every home, and has a /tmp
    of its own."""
    return any(p == path or p in path.parents for p in (*homes(), Path("/tmp")))


def seal(idea: Idea, idea_path: Path, workspace: Path | None) -> Sealed | None:
    """The sealed evaluation a new session of `idea` in `workspace` starts with (None if it
    names none; `workspace` None: any). An `IdeaError` naming the field says why it cannot
    be used."""
    wanted = idea.sealed_evaluation
    if wanted is None:
        return None
    where = str(idea_path)
    files = {}
    for field, value in (("scorer", wanted.scorer), ("data", wanted.data)):
        if value is None:
            continue
        path = (Path(idea_path).resolve().parent / Path(value).expanduser()).resolve()
        if not path.exists() or (field == "scorer" and not path.is_file()):
            raise IdeaError(where, [f"{where}: sealed_evaluation.{field}: {path} is not there"
                                    f"{'' if field == 'data' else ' (a file)'}"])
        if workspace is not None and (path == workspace or workspace in path.parents or path in workspace.parents):
            raise IdeaError(where, [f"{where}: sealed_evaluation.{field}: {path} must lie outside the workspace "
                                    f"({workspace}), which the agent reads"])
        if not unseen(path):
            raise IdeaError(where, [f"{where}: sealed_evaluation.{field}: {path} lies where other sessions' sandboxes "
                                    "can read it; keep the sealed files under your home or /tmp, which no sandbox shows"])
        files[field] = path
    python = interpreter_named(wanted.python, Path(idea_path), workspace, where)
    if bubblewrap() is None:
        raise IdeaError(where, [f"{where}: sealed_evaluation needs bubblewrap to hide the scorer and its data "
                                f"from the agent's commands; {HOW_TO_INSTALL}"])
    return Sealed(scorer=str(files["scorer"]), data=str(files["data"]) if "data" in files else None,
                  python=python, artifact=wanted.artifact, digests={str(p): digest(p) for p in files.values()})


def interpreter_named(value: str | None, idea_path: Path, workspace: Path | None, where: str) -> str | None:
    """The absolute path of `sealed_evaluation.python` (None if unset). Its links are kept: a
    virtual environment's `bin/python` is one, and finds its packages by where it lies."""
    if value is None:
        return None
    path = Path(os.path.abspath(Path(idea_path).resolve().parent / Path(value).expanduser()))
    why = None
    if not path.is_file() or not os.access(path, os.X_OK):
        why = "is not there (a program)"
    elif workspace is not None and any(p == workspace or workspace in p.parents for p in (path, path.resolve())):
        why = f"must lie outside the workspace ({workspace}), which the agent writes"
    elif Path("/tmp") in path.parents:
        why = "must not lie under /tmp, which the scorer's sandbox has of its own"
    if why:
        raise IdeaError(where, [f"{where}: sealed_evaluation.python: {path} {why}"])
    return str(path)


def hidden(sealed: Sealed | None) -> tuple[Path, ...]:
    """What the agent's sandboxes cover up: the sealed files."""
    if sealed is None:
        return ()
    return tuple(Path(p) for p in (sealed.scorer, sealed.data) if p)


def tampered(sealed: Sealed) -> str | None:
    """What changed among the sealed files since the session started, in one line; None if nothing."""
    changed = [p for p, d in sealed.digests.items() if digest(Path(p)) != d]
    if not changed:
        return None
    return (f"{', '.join(changed)} changed since the session started; the score is not recorded (restore "
            "the sealed files, or start a new session)")
