"""Reproduction by the engine: once the agent has completed the experiments (and again after
the analysis), the engine runs again each SUCCESS attempt behind a claim (`labrun.claims`:
the attempts it cites and its baseline's), and records whether its metrics came out the same.

- **From the sources as that attempt found them.** Each rerun starts from a copy of the
  workspace rebuilt from the files kept when the attempt started (`snapshot.keep_copies`,
  `.labrun/kept/` by digest, checked as copied), not from the workspace as it is now: what
  the attempt wrote, and every later edit, are not there, nor its metrics file and declared
  outputs as they were before it ran (a file typed in and rewritten would replay). A file too big to keep is copied
  from the workspace if it is unchanged. Environments (`.venv/`) are shown read-only as they
  are now, but only a real folder reached through real folders: one that is now a link (to a
  credential store, to held-out data) or gone is SKIPPED, saying so. Nothing of the
  workspace is read through a link.
- **In a fresh sandbox**, with the same command: the copy is bound at the workspace's own
  path, so the command sees the paths it saw, with a /tmp and a home and caches of its own,
  made anew (not the session's `.labrun/cache/`, where the agent's runs could have left a
  result to replay); the workspace itself is out of its reach. The metrics file it writes is
  read without following a link.
- **Compared within a stated tolerance**: each metric a claim cites (every metric the attempt
  recorded, when none does), as numbers within a relative difference of
  `constraints.reproduce_tolerance` (0.001 unless set), anything else exactly; the others
  that differ (a run time) are said, not counted.
  - REPRODUCED: every metric matches;
  - DIVERGED: a metric differs or is missing, or the rerun failed;
  - SKIPPED: it could not be rerun (an input was not kept and has changed; the time bound
    was spent; reproduction is off).
- **Bounded**: all reruns together take at most `constraints.reproduce_minutes` (60 unless
  set; 0 turns reproduction off), each at most the attempt's own time limit.
- **Durable**: each rerun is a Prefect subtask cached by session and attempt, committed
  eagerly; a kill during one reruns it from a fresh copy on resume.

The outcome is in the attempt's record (STATE.md, `labrun status --json`) and at the top of
REPORT.md's engine section (`phases.report_header`), whatever it is; a claim whose attempt
DIVERGED is shown as unconfirmed there, and so is the verdict it bears on.
"""

from __future__ import annotations

import json
import math
import re
import os
import stat
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from labrun import gpus
from labrun.commands import kill_group, run_command
from labrun.crashpoints import crashpoint
from labrun.phases.execution import TaskSpec, engine_task, execute
from labrun.sandbox import bubblewrap
from labrun.prefect_processes import identified
from labrun.session import Session
from labrun.snapshot import CACHE_MARKER, ENVIRONMENT_MARKERS, ENVIRONMENT_NAMES, SKIPPED_NAMES, stat_digest
from labrun.state import Attempt, Reproduction
from labrun.tools import parse_metrics
from labrun.wsfs import Beneath, Refused
from labrun.verdicts import reproduce_settings
from labrun.workspace import write_json

GROUP = "group.json"


def settings(session: Session) -> tuple[float, float]:
    """(minutes, relative tolerance) for this session's reproduction."""
    return reproduce_settings(session.idea)


def backing_attempts(session: Session) -> list[Attempt]:
    """The SUCCESS attempts behind the claims (theirs and their baselines'), in order."""
    cited = {n for c in session.state.plan.claims for n in (*c.attempts, *c.baseline_attempts)}
    return [a for a in session.state.live_attempts() if a.n in cited and a.status == "SUCCESS"]


def reproduce(session: Session) -> None:
    """Rerun every backing attempt not yet rerun (an engine step of the experiments phase)."""
    minutes, tolerance = settings(session)
    for attempt in backing_attempts(session):
        if attempt.reproduction is not None:
            continue
        spent = sum(a.reproduction.duration_s or 0 for a in session.state.attempts if a.reproduction)
        session.store.log(f"attempt {attempt.n}: the engine reruns it to check its metrics")
        result = Reproduction.model_validate(execute("reproduction", ReproductionSpec.of(
            session, n=attempt.n, left_s=minutes * 60 - spent, tolerance=tolerance)))
        session.store.event(f"attempt {attempt.n} {result.status} by the engine's rerun: {result.detail}")
        session.records.update(attempt.n, reproduction=result)


class ReproductionSpec(TaskSpec):
    n: int
    left_s: float
    tolerance: float


@engine_task("reproduction", "reproduce attempt {spec.n}", "labrun-{spec.session_id}-reproduction-{spec.n}")
def reproduce_attempt(spec: ReproductionSpec) -> dict:
    """Attempt n again, from the workspace alone (`labrun.phases.execution`): its `Reproduction`."""
    session = Session.attach(spec)
    try:
        return reproduce_one(session, session.state.attempts[spec.n - 1], spec.left_s, spec.tolerance).model_dump()
    finally:
        session.close()


def _after(seconds: float) -> threading.Event:
    """An event set `seconds` from now."""
    event = threading.Event()
    timer = threading.Timer(seconds, event.set)
    timer.daemon = True
    timer.start()
    return event


def reproduce_one(session: Session, attempt: Attempt, left_s: float, tolerance: float) -> Reproduction:
    if left_s <= 0:
        minutes, _ = settings(session)
        why = "reproduction is turned off" if minutes == 0 else f"the {minutes:g} minutes for reproduction were spent"
        return Reproduction(status="SKIPPED", detail=f"not rerun: {why} (constraints.reproduce_minutes)")
    place = session.ws.reproductions / f"attempt-{attempt.n:03d}"
    end_left_over(place)
    copy, environments, missing = rebuild(session, attempt, place)
    if missing:
        return Reproduction(status="SKIPPED", detail=f"not rerun: {missing}")
    log = place / "output.log"
    waited = time.monotonic()
    try:  # as many GPUs as it had, its own while the rerun runs, waited for within its time
        held = gpus.claim(attempt.gpu_count, cancelled=_after(left_s))
    except gpus.GpuRefused as e:
        return Reproduction(status="SKIPPED", detail=f"not rerun: {e}")
    except gpus.GpuWaitCancelled:
        return Reproduction(status="SKIPPED", detail=f"not rerun: its {attempt.gpu_count} GPUs were not free within the "
                            f"{settings(session)[0]:g} minutes for reproduction (constraints.reproduce_minutes)")
    left_s -= time.monotonic() - waited
    try:
        sandbox = None
        if bubblewrap() is not None:
            sandbox = replace(session.confinement.sandbox().with_gpus(held), mounted_from=copy, tmp=place / "tmp",
                              cache=place / "home", readonly=tuple(session.ws.root / e for e in environments))
        limit_s = min(session.limits.time_limit_s, left_s)
        result = run_command(attempt.command, copy, log, timeout_s=limit_s, max_output_bytes=200_000_000,
                             on_start=lambda pgid: (note_group(place, pgid), crashpoint("reproduction")),
                             sandbox=sandbox, keys=session.confinement.key_names(), env=held.env())
    finally:
        held.close()
    recorded = dict(log=str(log.relative_to(session.ws.root)), duration_s=round(result.duration_s, 2))
    if result.timed_out and limit_s < session.limits.time_limit_s:
        return Reproduction(status="SKIPPED", detail=f"not finished when the {settings(session)[0]:g} minutes for "
                            "reproduction ran out (constraints.reproduce_minutes)", **recorded)
    if result.exit_code != 0:
        why = "it timed out" if result.timed_out else f"exit code {result.exit_code}"
        return Reproduction(status="DIVERGED", detail=f"the rerun failed ({why}); see its log", **recorded)
    try:  # the rerun's code wrote it: a link to the workspace's file would replay the attempt's numbers
        metrics = parse_metrics(Beneath(copy).read_text(attempt.metrics_file)) if attempt.metrics_file else {}
    except (OSError, ValueError) as e:  # Refused is a ValueError
        return Reproduction(status="DIVERGED", detail=f"the rerun wrote no readable {attempt.metrics_file} ({e})",
                            **recorded)
    # judged on what the claims cite: a run time or a memory peak that differs is no divergence
    claimed = {c.metric for c in session.state.plan.claims if attempt.n in c.attempts} | \
        {c.compared_metric for c in session.state.plan.claims if attempt.n in c.baseline_attempts}
    judged = {k: v for k, v in attempt.metrics.items() if k in claimed} if claimed else attempt.metrics
    differences = compare(judged, metrics, tolerance)
    others = compare({k: v for k, v in attempt.metrics.items() if k not in judged}, metrics, tolerance)
    also = f"; no claim's, and differing: {'; '.join(others)}" if others else ""
    if differences:
        return Reproduction(status="DIVERGED", detail="; ".join(differences) + also, metrics=metrics, **recorded)
    for made in ("work", "tmp"):  # kept only when it differs, to look into
        clear(session, place / made)
    return Reproduction(status="REPRODUCED", metrics=metrics, **recorded,
                        detail=f"{len(judged)} metric{'s' * (len(judged) != 1)} the same, "
                               f"within a relative {tolerance:g}" + also)


def note_group(place: Path, pgid: int) -> None:
    """The rerun's process group, by identity, for `end_left_over`."""
    try:
        write_json(place / GROUP, {"pgid": pgid, "started": psutil.Process(pgid).create_time()})
    except psutil.NoSuchProcess:
        pass  # ended already


def end_left_over(place: Path) -> None:
    """Kill what a rerun cut short by a killed engine left running: unsandboxed, nothing
    else ends it (in bubblewrap its lifeline does). Only the group it noted, if its leader
    is still that process."""
    try:
        noted = json.loads((place / GROUP).read_text())
    except (OSError, ValueError):
        return
    if identified(noted["pgid"], noted["started"]) is not None:
        kill_group(noted["pgid"])


def rebuild(session: Session, attempt: Attempt, place: Path) -> tuple[Path, list[str], str | None]:
    """The workspace as `attempt` found it, in `place/work` (made anew); its environments'
    paths; and, when it cannot be rebuilt, why."""
    root = session.ws.root
    clear(session, place)
    copy = place / "work"
    copy.mkdir(parents=True)
    before = (session.records.files(attempt.n) or {}).get("before")
    if before is None:
        return copy, [], f"attempt {attempt.n} has no record of the files it started from"
    environments = [rel.rstrip("/") for rel in before if rel.endswith("/")]
    for folder in folders(root, environments):  # empty ones too (a `results/` the code writes into)
        (copy / folder).mkdir(parents=True, exist_ok=True)
    for rel in environments:  # bound in whole over an empty folder, read-only
        try:
            os.close(session.ws.files.open(rel, os.O_RDONLY | os.O_DIRECTORY))
        except (OSError, Refused) as e:
            why = e if isinstance(e, Refused) else f"{rel} is {'not there' if isinstance(e, FileNotFoundError) else 'no folder'}"
            return copy, environments, f"the environment {rel}/ is not shown to the rerun: {why}"
        target = copy / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if bubblewrap() is None:  # unsandboxed, the rerun reaches all the user can anyway
            target.symlink_to(root / rel)
        else:
            target.mkdir()
    made = {attempt.metrics_file, *attempt.outputs}
    for rel, digest in before.items():
        if rel.endswith("/") or rel in made:  # what the attempt makes, the rerun makes anew: none is replayed
            continue
        target = copy / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if not fetch(session, rel, digest, target):
            return copy, environments, f"{rel} has changed since attempt {attempt.n} and no copy of it was kept"
    return copy, environments, None


def fetch(session: Session, rel: str, digest: str, target: Path) -> bool:
    """`rel` as the attempt found it, in `target`: its kept copy, else the workspace's file if
    unchanged; with the workspace's file's mode (a script run as `./run.sh`)."""
    found = False
    for folder, name in ((session.ws.kept, digest), (session.ws.root, rel)):
        try:
            sha, st = Beneath(folder).copy(name, target)
        except (OSError, Refused):
            continue
        if digest in (sha, stat_digest(st)):
            found = True
            break
    if not found:
        target.unlink(missing_ok=True)
        return False
    try:
        st = session.ws.files.lstat(rel)
    except Refused:
        return True
    if st is not None and stat.S_ISREG(st.st_mode):
        os.chmod(target, stat.S_IMODE(st.st_mode))
    return True


def folders(root: Path, environments: list[str]) -> list[str]:
    """The workspace's folders now, as `snapshot.workspace_files` walks it: no link, environment
    (it is bound in whole), cache or engine folder."""
    def skip(rel: str, names: list[str]) -> bool:
        return (rel.rsplit("/", 1)[-1] in SKIPPED_NAMES | ENVIRONMENT_NAMES or rel in environments
                or bool(set(names) & {*ENVIRONMENT_MARKERS, CACHE_MARKER}))

    return Beneath(root).folders(skip=skip)


def clear(session: Session, place: Path) -> None:
    """Remove a rerun's folder, which its code wrote (any depth, no link followed)."""
    try:
        session.ws.files.remove(place)
    except (OSError, ValueError):
        pass  # not there


def compare(recorded: dict[str, Any], rerun: dict[str, Any], tolerance: float) -> list[str]:
    """What differs, one item per metric ([] when the rerun matches)."""
    found = []
    for key, value in recorded.items():
        name = re.sub(r"([*_`\\])", r"\\\1", key)  # the agent's name, shown as written, not as emphasis
        if key not in rerun:
            found.append(f"{name} missing from the rerun")
            continue
        again = rerun[key]
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (value, again))
        same = math.isclose(value, again, rel_tol=tolerance, abs_tol=1e-12) if numbers else value == again
        if not same:
            found.append(f"{name} {value} then {again}")
    return found


def reproduction_lines(session: Session) -> list[str]:
    """REPORT.md's engine section on the reproduction."""
    minutes, tolerance = settings(session)
    rerun = [a for a in backing_attempts(session) if a.reproduction]
    if minutes == 0:
        return ["**Reproduction by the engine: turned off** (`constraints.reproduce_minutes: 0`); "
                "no result in this report was run again."]
    if not rerun:
        return ["**Reproduction by the engine:** no claim cites a successful attempt, so there was nothing "
                "to run again."]
    counts = {s: sum(a.reproduction.status == s for a in rerun) for s in ("REPRODUCED", "DIVERGED", "SKIPPED")}
    said = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    return [f"**Reproduction by the engine: {said}.** The engine ran again each attempt behind a claim, "
            "in a fresh sandbox from the files as that attempt found them, and compared its "
            f"metrics (relative tolerance {tolerance:g}).", "",
            *(f"- attempt {a.n}{f' ({a.run_id})' if a.run_id else ''}: **{a.reproduction.status}**, "
              f"{a.reproduction.detail}" for a in rerun)]
