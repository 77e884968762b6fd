"""Sealed scoring: once the agent has completed the experiments (and the engine has rerun
them), the engine scores the artifact the idea's `sealed_evaluation` names with its scorer
and held-out data (`labrun.sealed`).

- **In a sandbox of its own**, without network: the workspace read-only at its path, the
  scorer and the data read-only under `/tmp/labrun-sealed/`, a fresh /tmp. It runs as
  `scorer ARTIFACT DATA /tmp/labrun-score.json` (a `.py` scorer with the workspace's `.venv`
  Python when there is one, else `python3`), and the score file's numbers are the scores.
- **Refused if tampered**: a scorer or data that changed since the session started is not
  run, and the session records REFUSED, saying which.
- **Recorded** once per artifact (its digest): SCORED with the scores, FAILED with why
  (no artifact, the scorer failed, no score file), or REFUSED; in STATE.md, `status --json`,
  the UI's STATE.md artifact, and REPORT.md's header.
- **Durable**: a Prefect subtask cached by session and artifact digest, committed eagerly;
  a kill during it scores again on resume.
"""

from __future__ import annotations

import shlex
import shutil
from dataclasses import replace
from pathlib import Path

from prefect import task
from prefect.transactions import CommitMode, transaction

from labrun.commands import run_command
from labrun.crashpoints import crashpoint
from labrun.sandbox import bubblewrap
from labrun.sealed import tampered
from labrun.session import Session
from labrun.snapshot import entry_digest
from labrun.state import SealedScore
from labrun.tools import parse_metrics

INSIDE = Path("/tmp/labrun-sealed")
SCORE_FILE = Path("/tmp/labrun-score.json")
TIME_LIMIT_S = 3600


def score_sealed(session: Session) -> None:
    """Score the artifact, unless it was scored as it is (an engine step of the experiments phase)."""
    sealed = session.state.sealed
    if sealed is None:
        return
    artifact = entry_digest(session.ws.root, sealed.artifact) or "missing"
    if sealed.score is not None and sealed.score.artifact_digest == artifact:
        return
    with transaction(commit_mode=CommitMode.EAGER):
        record = sealed_scoring.with_options(result_storage=session.ws.results)(
            session_id=session.state.session_id, workspace=str(session.ws.root), artifact_digest=artifact)
    if sealed.score is None or sealed.score.artifact_digest != artifact:  # a cached result, its record lost
        _record(session, SealedScore.model_validate(record))


def _scoring_key(context, parameters) -> str:
    return f"labrun-{parameters['session_id']}-sealed-{parameters['artifact_digest'][:16]}"


@task(name="sealed-scoring", task_run_name="sealed scoring", cache_key_fn=_scoring_key, persist_result=True)
def sealed_scoring(session_id: str, workspace: str, artifact_digest: str) -> dict:
    session = Session.get(workspace)
    session.store.log(f"sealed scoring of {session.state.sealed.artifact} started")
    result = score(session)
    _record(session, result.model_copy(update={"artifact_digest": artifact_digest}))
    return session.state.sealed.score.model_dump()


def _record(session: Session, score: SealedScore) -> None:
    with session.store._lock:
        session.state.sealed.score = score
        session.store.event(f"sealed scoring {score.status}: {score.detail}")
        session.store.save()


def score(session: Session) -> SealedScore:
    sealed, root = session.state.sealed, session.ws.root
    if why := tampered(sealed):
        return SealedScore(status="REFUSED", detail=why)
    if not (root / sealed.artifact).is_file():
        return SealedScore(status="FAILED", detail=f"the artifact {sealed.artifact} is not there: "
                           "the experiments did not write it")
    if bubblewrap() is None:
        return SealedScore(status="FAILED", detail="not scored: bubblewrap, which keeps the scorer sealed, "
                           "is not available here")
    place = session.ws.sealed
    shutil.rmtree(place, ignore_errors=True)
    scorer, data = Path(sealed.scorer), Path(sealed.data) if sealed.data else None
    shown = ((scorer, INSIDE / scorer.name), *(((data, INSIDE / data.name),) if data else ()))
    sandbox = replace(session.sandbox(network=False), tmp=place / "tmp", readonly=(root,), cache=None,
                      hidden=(), shown=shown)
    python = root / ".venv/bin/python"
    program = [str(python if python.exists() else "python3")] if scorer.suffix == ".py" else []
    command = shlex.join([*program, str(INSIDE / scorer.name), str(root / sealed.artifact),
                          str(INSIDE / data.name) if data else "", str(SCORE_FILE)])
    log = place / "output.log"
    result = run_command(command, root, log, timeout_s=TIME_LIMIT_S, max_output_bytes=50_000_000,
                         on_start=lambda pgid: crashpoint("scoring"), sandbox=sandbox)
    recorded = dict(log=str(log.relative_to(root)))
    if result.exit_code != 0:
        why = "it timed out" if result.timed_out else f"exit code {result.exit_code}"
        return SealedScore(status="FAILED", detail=f"the scorer failed ({why}); see its log", **recorded)
    try:
        scores = parse_metrics((place / "tmp" / SCORE_FILE.name).read_text())
    except (OSError, ValueError) as e:
        return SealedScore(status="FAILED", detail=f"the scorer wrote no readable score ({e})", **recorded)
    shown_scores = ", ".join(f"{k}={v}" for k, v in scores.items()) or "no scores"
    return SealedScore(status="SCORED", scores=scores, detail=f"{sealed.artifact}: {shown_scores}", **recorded)


def sealed_line(session: Session) -> str | None:
    """REPORT.md's header line on the sealed evaluation (None when the idea names none)."""
    sealed = session.state.sealed
    if sealed is None:
        return None
    if sealed.score is None:
        return "> **Sealed evaluation:** not scored (the experiments did not complete)."
    return (f"> **Sealed evaluation: {sealed.score.status}**, by the engine with the idea's scorer and "
            f"held-out data, which the agent never saw: {sealed.score.detail}")
