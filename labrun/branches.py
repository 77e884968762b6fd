"""Branches of a session (`labrun rerun DIR --from PHASE`): the phases before PHASE are kept
as they stand, PHASE and the later ones run again as a new branch, and the branch they
replace is kept whole under `.labrun/branches/<n>/`.

A rerun is made in three steps; a crash may cut any of them short, and `finish_rerun` (at
every start of the session flow) finishes what it left:

1. archive: the replaced phases' journals and the files they produced, their attempt logs,
   the key outputs, and STATE.md, the state and the status as they stood, are linked or
   copied into `branches/.new-<n>/` (with a digest of every file the branch ended with, each
   file's copy kept by digest in the workspace's shared store), renamed `branches/<n>/` once
   whole. Before that rename nothing has happened; after it the new branch is decided (`branch.json` says what it is).
2. record: the new branch goes into the state: the replaced phases pending with their
   sections removed, the kept phases' cache keys pinned (`Branch.pinned`).
3. clear: the replaced phases' journals and the files they created leave the workspace,
   which then shows the new branch only.

The workspace always shows the current branch; `.labrun/branches/<n>/` is what branch n
showed when the next one replaced it. Attempts keep one numbering across branches.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any, Callable

from labrun import suggest
from labrun.crashpoints import crashpoint
from labrun.journal import Conversation, phase_usage
from labrun.phase_registry import BY_KEY
from labrun.limits import total_usage
from labrun.session import Session, changed_outputs
from labrun.snapshot import keep_copies, workspace_files
from labrun.state import Attempt, Branch, PhaseRecord, SessionState, StateStore, now
from labrun.tools import parse_metrics
from labrun.usage import Usage
from labrun.workspace import Workspace
from labrun.wsfs import Beneath

DIFF_LINES = 40
"""A changed text file's unified diff is cut after this many lines in `labrun diff`."""


class BranchError(Exception):
    """Bad input for a rerun or a branch command: one line that says what to do."""


def archive_dir(ws: Workspace, n: int) -> Path:
    return ws.branches / str(n)


def archived(ws: Workspace, n: int) -> dict[str, Any] | None:
    """branch.json of branch n's archive, if branch n was replaced."""
    path = archive_dir(ws, n) / "branch.json"
    return json.loads(path.read_text()) if path.exists() else None


def all_branches(state: SessionState) -> list[Branch]:
    """Every branch; a session that never reran has one, implied by its state."""
    return state.branches or [first_branch(state, state.agent, state.model)]


def first_branch(state: SessionState, agent: str, model: str | None) -> Branch:
    return Branch(n=1, from_phase=next(iter(state.phases)), agent=agent, model=model,
                  started_at=state.created_at)


# -- starting a branch ----------------------------------------------------------------------


def rerun(session: Session, from_phase: str, agent: str | None, model: str | None, note: str,
          flow_run: str | None, status: Callable[[Path], dict[str, Any]]) -> None:
    """Start a branch at `from_phase`, unless this request already started one: a retry of
    the flow run that started it, or the same request again (the same phase, agent, model
    and note as the current branch: a deployment run again with the same parameters)
    continues the current branch, finished or not. Another note starts another branch.
    `status` is `labrun status` (which reads the branches): the replaced branch keeps what it
    showed."""
    finish_rerun(session)
    state, root = session.state, session.ws.root
    note = " ".join(note.split())
    current = state.branches[-1] if state.branches else None
    if flow_run and any(b.flow_run == flow_run for b in state.branches):
        session.store.log(f"flow run {flow_run} continues branch {state.branch}, which it started")
        return
    check_rerun(state, from_phase, root)
    if (current and current.from_phase == from_phase and agent in (None, current.agent)
            and model in (None, current.model) and note == current.note):
        session.store.log(f"branch {current.n} is this same request (from {from_phase}): continuing "
                          "it; give another note to start a new branch")
        return
    reason = not_finished(state, from_phase, root)
    if reason:
        raise BranchError(reason)
    branch = Branch(n=state.branch + 1, from_phase=from_phase, agent=agent or state.agent,
                    model=model if (model or agent) else state.model, note=note, flow_run=flow_run)
    archive(session, branch, status)
    finish_rerun(session)


def check_rerun_start(root: Path, from_phase: str) -> None:
    """A rerun of a session that is there, from one of its phases: refused before a file is
    written (a deployment run comes without the command line's checks)."""
    ws = Workspace(root)
    if not ws.state_file.is_file():
        raise BranchError(f"{root}: no labrun session here to rerun; start one with `labrun run IDEA.yaml "
                          f"--workspace {root}`")
    check_rerun(StateStore.load(ws).state, from_phase, root)


def check_rerun(state: SessionState, from_phase: str, root: Path) -> None:
    """A rerun needs a phase of this session; the CLI asks before starting an engine."""
    if from_phase not in state.phases:
        raise BranchError(f"{root}: {suggest.unknown('phase', from_phase, state.phases)}")


def not_finished(state: SessionState, from_phase: str, root: Path) -> str | None:
    """Why a rerun cannot start at `from_phase` (None if it can)."""
    order = list(state.phases)
    for key in order[: order.index(from_phase) + 1]:
        if state.phases[key].status != "DONE":
            return (f"{root}: phase {key} has not finished ({state.phases[key].status}); a rerun "
                    f"starts from a finished phase: continue this one with `labrun resume {root}`")
    return None


def archive(session: Session, branch: Branch, status: Callable[[Path], dict[str, Any]]) -> None:
    """Step 1: keep the current branch whole under branches/<n>/ (see the module's doc)."""
    ws, state = session.ws, session.state
    order = list(state.phases)
    replaced = order[order.index(branch.from_phase):]
    kept = order[: order.index(branch.from_phase)]
    before = files_at_start(ws, branch.from_phase)
    now_files = workspace_files(ws.root)
    produced: set[str] = set()
    for key in replaced:
        manifest = session.manifest(key)
        if manifest and state.phases[key].status == "DONE":
            produced |= set(manifest["files"])
        else:  # cut off or failed: what changed since its conversation began
            start = files_at_start(ws, key)
            produced |= {f for f, d in now_files.items() if start is not None and start.get(f) != d}
    produced &= set(now_files)
    created = sorted(f for f in produced if f not in (before or {}))
    edited = sorted(produced - set(created))
    adopted = {}  # a kept phase's output edited by hand: the rerun takes it as it stands
    for key in kept:
        manifest = session.manifest(key) or {"files": {}}
        missing = changed_outputs(manifest, state.file_digests, ws.root, missing_only=True)
        if missing:
            raise BranchError(f"{ws.root}: {missing[0]}, an output of phase {key}, is missing; "
                              f"restore it, or rerun from {key}")
        for f in changed_outputs(manifest, state.file_digests, ws.root):
            adopted[f] = now_files[f]
        branch.pinned[key] = manifest["key"]

    final = archive_dir(ws, state.branch)
    tmp = final.with_name(f".new-{state.branch}")
    shutil.rmtree(tmp, ignore_errors=True)
    for f in created:
        _keep(ws, f, tmp / "files" / f)
    for f in sorted((set(edited) | key_outputs(state)) - set(created)):
        _keep(ws, f, tmp / "files" / f)
    moved = Usage()
    for key in replaced:
        for path in sorted(ws.phase_dir(key).rglob("*")):
            if path.is_file():
                _link(path, tmp / "phases" / key / path.relative_to(ws.phase_dir(key)))
        moved += phase_usage(ws.phase_dir(key))
    for a in state.attempts:
        if a.phase in replaced and a.log and (ws.root / a.log).is_file():
            _link(ws.root / a.log, tmp / "attempts" / Path(a.log).name)
    # Every file the branch ended with, by digest (a copy of each in the shared store, where
    # one costs nothing once kept): a later branch may change a file this one's replaced
    # phases never touched, and `labrun diff` reads this branch's version there.
    keep_copies(ws.root, now_files, ws.kept)
    _keep(ws, "STATE.md", tmp / "STATE.md")  # the engine's file, but in the agent's folder
    shutil.copy2(ws.state_file, tmp / "state.json")
    ws.write_json(tmp / "status.json", status(ws.root))
    sections = {s: state.sections[s] for k in replaced for s in BY_KEY[k].sections if s in state.sections}
    ws.write_json(tmp / "branch.json", {
        "n": state.branch, "agent": state.agent, "model": state.model,
        "replaced": replaced, "created": created, "edited": edited, "adopted": adopted,
        "sections": sections, "archived_usage": moved.model_dump(), "next": branch.model_dump(),
        "files": now_files,
    })
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    crashpoint("branch-archived")


def rerun_pending(ws: Workspace, state: SessionState) -> bool:
    """A rerun that a crash cut short after its archive was made: the flow finishes it."""
    return archived(ws, state.branch) is not None or bool(state.branches and not state.branches[-1].cleaned)


def finish_rerun(session: Session) -> None:
    """Finish a rerun that a crash cut short (steps 2 and 3); nothing to do otherwise."""
    ws = session.ws
    for leftover in ws.branches.glob(".new-*"):
        shutil.rmtree(leftover, ignore_errors=True)  # an archive never finished: no rerun
    record = archived(ws, session.state.branch)
    if record is not None:
        _record(session, record)
    branches = session.state.branches
    if branches and not branches[-1].cleaned:
        _clear(session, archived(ws, branches[-1].n - 1))


def _record(session: Session, record: dict[str, Any]) -> None:
    """Step 2: the new branch is the state's current one."""
    ws, state, store = session.ws, session.state, session.store
    with store.transaction():
        if not state.branches:
            state.branches.append(first_branch(state, record["agent"], record["model"]))
        spent = total_usage(ws, state)
        old = state.branches[-1]
        old.ended_at = now()
        old.usage = spent - old.spent_before
        old.archived = Usage.model_validate(record["archived_usage"])
        branch = Branch.model_validate(record["next"])
        branch.spent_before = spent
        branch.cleaned = False
        state.branches.append(branch)
        state.agent, state.model = branch.agent, branch.model
        for key in record["replaced"]:
            state.phases[key] = PhaseRecord()
            for section in BY_KEY[key].sections:
                state.sections.pop(section, None)
        state.plan = state.plan.forget(record["replaced"])
        for f in record["created"]:
            state.file_digests.pop(f, None)
        state.file_digests.update(record["adopted"])
        if record["adopted"]:
            store.event(f"taken as they stand for branch {branch.n}: {', '.join(record['adopted'])}")
        model = f", model {branch.model}" if branch.model else ""
        store.event(f"branch {branch.n} started from phase {branch.from_phase} (agent {branch.agent}{model})"
                    f"; branch {old.n} is kept in .labrun/branches/{old.n}")
    crashpoint("branch-recorded")


def _clear(session: Session, record: dict[str, Any]) -> None:
    """Step 3: the workspace shows the new branch only."""
    ws = session.ws
    for key in record["replaced"]:
        shutil.rmtree(ws.phase_dir(key), ignore_errors=True)
    for f in record["created"]:  # a file, or an environment (one entry of labrun.snapshot's)
        try:
            ws.files.remove(f.rstrip("/"))  # never beneath a link the agent left on the way
        except (OSError, ValueError):
            pass
    with session.store.transaction() as state:
        state.branches[-1].cleaned = True


def files_at_start(ws: Workspace, key: str) -> dict[str, str] | None:
    """The workspace's files when the phase's latest conversation began."""
    convo = Conversation.latest(ws.phase_dir(key))
    start = convo.system if convo else None
    return start.files_before if start else None


def key_outputs(state: SessionState) -> set[str]:
    """What `labrun diff` compares besides a branch's own outputs: the files the phases hand
    on, and the metrics files of successful attempts."""
    handed = {f for k in state.phases for f in BY_KEY[k].hands_on}
    return handed | {a.metrics_file for a in state.attempts if a.status == "SUCCESS" and a.metrics_file}


def _keep(ws: Workspace, rel: str, dst: Path) -> None:
    """The agent's file (or environment, file by file) `rel` copied into the archive at `dst`
    through the workspace's file API, so a link the agent left there brings nothing from
    elsewhere. A copy, not a hard link: the agent may hold another link to the same file,
    and change the archive through it."""
    files = list(ws.files.files(rel, links=True)) if rel.endswith("/") else [(rel, None)]
    for name, st in files:
        to = dst / name[len(rel):] if rel.endswith("/") else dst
        try:
            if st is not None and stat.S_ISLNK(st.st_mode):  # an environment's own link, kept as a link
                to.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(ws.files.readlink(name), to)
            else:
                ws.files.copy(name, to, digest_up_to=0)
        except (OSError, ValueError):  # gone, or not a regular file reached without a link
            continue


def _link(src: Path, dst: Path) -> None:
    """The engine's own file `src` (a phase's records, an attempt's log) in the archive: a
    hard link, or a copy where there can be none."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        return os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- reading branches (no Prefect) ----------------------------------------------------------


def summaries(ws: Workspace, state: SessionState, spent: Usage) -> list[dict[str, Any]]:
    """One row per branch: where it started, its agent and model, when it ran, its cost
    (`spent`: the session's usage so far)."""
    rows = []
    for b in all_branches(state):
        usage = b.usage if b.usage is not None else spent - b.spent_before
        rows.append({"n": b.n, "from_phase": b.from_phase, "agent": b.agent, "model": b.model,
                     "note": b.note, "started_at": b.started_at, "ended_at": b.ended_at,
                     "current": b.n == state.branch, "usage": usage.model_dump(),
                     "archive": None if b.n == state.branch else str(archive_dir(ws, b.n).relative_to(ws.root))})
    return rows


def no_branch(root: Path, state: SessionState, n: int) -> str:
    have = "branch 1" if state.branch == 1 else f"branches 1 to {state.branch}"
    return f"{root}: there is no branch {n}; this session has {have} (`labrun branches {root}`)"


def _view(ws: Workspace, state: SessionState, n: int) -> tuple[Path, list[Attempt], set[str], dict[str, str]]:
    """Where branch n's files are, its attempts as it saw them, the files it produced, and
    (for an archived branch) the digest of every file it ended with."""
    if n == state.branch:
        start = list(state.phases).index(all_branches(state)[-1].from_phase)
        produced = set()
        for key in list(state.phases)[start:]:
            manifest = ws.manifest(key)
            produced |= set(manifest["files"]) if manifest else set()
        return ws.root, state.attempts, produced, {}
    record = archived(ws, n)
    if record is None or not 1 <= n < state.branch:
        raise BranchError(no_branch(ws.root, state, n))
    then = SessionState.model_validate_json((archive_dir(ws, n) / "state.json").read_text())
    return (archive_dir(ws, n) / "files", then.attempts, set(record["created"]) | set(record["edited"]),
            record.get("files", {}))


def diff(root: Path, a: int, b: int) -> dict[str, Any]:
    """Two branches' metrics side by side, and which of their key outputs differ."""
    ws = Workspace(root)
    state = StateStore.load(ws).state
    views = {n: _view(ws, state, n) for n in (a, b)}
    metric_files: list[str] = []
    for _, attempts, _, _ in views.values():
        for att in attempts:
            if att.status == "SUCCESS" and att.metrics_file and att.metrics_file not in metric_files:
                metric_files.append(att.metrics_file)
    # The current branch is the agent's workspace, and an archive holds the agent's files:
    # both are read through the file API, which follows no link the agent left.
    trees = {n: Beneath(views[n][0]) for n in (a, b)}
    kept = Beneath(ws.kept) if ws.kept.is_dir() else None

    def read(n: int, rel: str) -> bytes | None:
        """Branch n's file: its own, or (one its replaced phases never touched) the copy kept
        by the digest it had when the branch ended."""
        found = _read(trees[n], rel)
        digest = views[n][3].get(rel)
        if found is None and digest and kept is not None:
            found = _read(kept, digest)
        return found

    metrics = []
    for f in metric_files:
        values = {n: _metrics(read(n, f)) for n in (a, b)}
        for name in dict.fromkeys([*values[a], *values[b]]):
            metrics.append({"file": f, "metric": name, "a": values[a].get(name), "b": values[b].get(name)})
    handed = {f for k in state.phases for f in BY_KEY[k].hands_on}
    paths = sorted((views[a][2] | views[b][2] | handed) - set(metric_files))
    files = []
    for f in paths:
        there = {n: read(n, f) for n in (a, b)}
        if there[a] is None and there[b] is None:
            continue
        if there[a] is None or there[b] is None:
            files.append({"path": f, "status": f"only in branch {a if there[a] is not None else b}", "diff": []})
            continue
        same = there[a] == there[b]
        files.append({"path": f, "status": "same" if same else "changed",
                      "diff": [] if same else _text_diff(there[a], there[b], f"branch {a}/{f}", f"branch {b}/{f}")})
    return {"a": a, "b": b, "metrics": metrics, "files": files}


def _read(files: Beneath, rel: str) -> bytes | None:
    """The file's bytes, None when it is not a regular file reached without a link (or too big)."""
    try:
        return files.read_bytes(rel)
    except (OSError, ValueError):
        return None


def _metrics(data: bytes | None) -> dict[str, Any]:
    try:
        return parse_metrics(data.decode()) if data is not None else {}
    except ValueError:  # UnicodeDecodeError too
        return {}


def _text_diff(a: bytes, b: bytes, name_a: str, name_b: str) -> list[str]:
    try:
        lines_a, lines_b = a.decode().splitlines(), b.decode().splitlines()
    except UnicodeDecodeError:
        return ["(binary files differ)"]
    lines = list(difflib.unified_diff(lines_a, lines_b, name_a, name_b, lineterm=""))
    return lines if len(lines) <= DIFF_LINES else lines[:DIFF_LINES] + [f"… {len(lines) - DIFF_LINES} more lines"]
