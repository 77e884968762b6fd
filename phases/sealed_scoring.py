"""Sealed scoring: once the agent has completed the experiments (and the engine has rerun
them), the engine scores the artifact the idea's `sealed_evaluation` names with its scorer
and held-out data (`labrun.sealed`).

- **Apart from the workspace**: the artifact is copied, read without following a link (a
  link is refused: it could point at the held-out data itself), into a private folder of the
  engine's under the machine's /tmp, which no sandbox of the agent's shows and the agent's
  editor refuses, and which is removed once scored: the scorer's log, which may echo the
  held-out data, is kept nowhere.
- **In a sandbox of its own**, without network: that copy alone at the workspace's path, the
  scorer and the data read-only under `/tmp/labrun-sealed/`, a fresh /tmp. It runs as
  `scorer ARTIFACT DATA /tmp/labrun-score.json` (a `.py` scorer with the idea's
  `sealed_evaluation.python`, else labrun's own Python: never one the agent could write),
  and the score file's numbers are the scores.
- **Refused if tampered**: a scorer or data that changed since the session started is not
  run, and the session records REFUSED, saying which.
- **Recorded** once per artifact (its digest): SCORED with the scores, FAILED with why
  (no artifact, a link, the scorer failed, no score file), or REFUSED; in STATE.md,
  `status --json`, the UI's STATE.md artifact, and REPORT.md's engine section.
- **Durable**: a Prefect subtask cached by session and artifact digest, committed eagerly;
  a kill during it scores again on resume.
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
from pathlib import Path

from labrun.phases.execution import TaskSpec, engine_task, execute

from labrun.wsfs import Beneath, Refused
from labrun.commands import run_command
from labrun.crashpoints import crashpoint
from labrun.sandbox import Sandbox, bubblewrap, interpreter
from labrun.sealed import tampered
from labrun.session import Session
from labrun.snapshot import entry_digest
from labrun.state import Sealed, SealedScore
from labrun.tools import parse_metrics

INSIDE = Path("/tmp/labrun-sealed")
SCORE_FILE = Path("/tmp/labrun-score.json")
TIME_LIMIT_S = 3600


def score_sealed(session: Session) -> None:
    """Score the artifact, unless it was scored as it is (an engine step of the experiments phase)."""
    sealed = session.state.sealed
    if sealed is None:
        return
    artifact = artifact_digest(session.ws.root, sealed.artifact)
    if sealed.score is not None and sealed.score.artifact_digest == artifact:
        return
    session.store.log(f"sealed scoring of {sealed.artifact} started")
    record = execute("sealed-scoring", ScoringSpec.of(session, artifact_digest=artifact))
    _record(session, SealedScore.model_validate(record))


def artifact_digest(root: Path, rel: str) -> str:
    """The artifact's digest, "missing" when it is not a plain file: never a digest through a
    link (to the held-out data, it would tell the agent whether a guess of it is right)."""
    return entry_digest(root, rel) or "missing"  # entry_digest reads through no link


class ScoringSpec(TaskSpec):
    artifact_digest: str


@engine_task("sealed-scoring", "sealed scoring", "labrun-{spec.session_id}-sealed-{spec.artifact_digest:.16}")
def sealed_scoring(spec: ScoringSpec) -> dict:
    """The artifact's score, from the workspace alone (`labrun.phases.execution`)."""
    session = Session.attach(spec)
    try:
        return score(session).model_copy(update={"artifact_digest": spec.artifact_digest}).model_dump()
    finally:
        session.close()


def _record(session: Session, score: SealedScore) -> None:
    with session.store.transaction() as state:
        state.sealed.score = score
        session.store.event(f"sealed scoring {score.status}: {score.detail}")


def score(session: Session) -> SealedScore:
    sealed, root = session.state.sealed, session.ws.root
    if why := tampered(sealed):
        return SealedScore(status="REFUSED", detail=why)
    if bubblewrap() is None:
        return SealedScore(status="FAILED", detail="not scored: bubblewrap, which keeps the scorer sealed, "
                           "is not available here")
    shutil.rmtree(session.ws.legacy_sealed, ignore_errors=True)
    # The machine's /tmp: every sandbox of the agent's, and a coding CLI's namespace, has a /tmp of its own.
    with tempfile.TemporaryDirectory(prefix="labrun-scoring-", dir="/tmp") as made:
        return run_scorer(sealed, root, Path(made))


MAX_SCORE_BYTES = 64_000
MAX_SCORES = 10
"""What a score file may hold: a few numbers (`run_scorer`)."""


def run_scorer(sealed: Sealed, root: Path, place: Path) -> SealedScore:
    """Score a copy of the artifact in `place`, a private folder the agent cannot reach."""
    copy = place / "work"
    (copy / sealed.artifact).parent.mkdir(parents=True)
    try:
        Beneath(root).copy(sealed.artifact, copy / sealed.artifact)
    except FileNotFoundError:
        return SealedScore(status="FAILED", detail=f"the artifact {sealed.artifact} is not there: "
                                                   "the experiments did not write it")
    except (OSError, Refused) as e:  # a link could point at the held-out data
        why = e if isinstance(e, Refused) else e.strerror
        return SealedScore(status="FAILED", detail=f"the artifact {sealed.artifact} is not read: {why}")
    scorer, data = Path(sealed.scorer), Path(sealed.data) if sealed.data else None
    shown = ((scorer, INSIDE / scorer.name), *(((data, INSIDE / data.name),) if data else ()))
    if sealed.python:  # its environment at its own path (it finds its packages by where it lies), though in a home
        environment = Path(sealed.python).parent.parent
        shown += ((environment, environment),)
    sandbox = Sandbox(root, place / "tmp", network=False, shown=shown, mounted_from=copy)
    program = [sealed.python or interpreter()] if scorer.suffix == ".py" else []
    command = shlex.join([*program, str(INSIDE / scorer.name), str(root / sealed.artifact),
                          str(INSIDE / data.name) if data else "", str(SCORE_FILE)])
    result = run_command(command, place, place / "output.log", timeout_s=TIME_LIMIT_S,
                         max_output_bytes=50_000_000, on_start=lambda pgid: crashpoint("scoring"), sandbox=sandbox)
    if result.exit_code != 0:
        why = "it timed out" if result.timed_out else f"exit code {result.exit_code}"
        return SealedScore(status="FAILED", detail=f"the scorer failed ({why}); its output is not kept, as it may "
                           "show the held-out data: run the scorer yourself to see why")
    try:  # the scorer's folder is the sandbox's /tmp: read as the agent's files are, no link, no FIFO
        found = parse_metrics(Beneath(place / "tmp").read_text(SCORE_FILE.name, limit=MAX_SCORE_BYTES))
    except (OSError, ValueError) as e:  # Refused is a ValueError
        return SealedScore(status="FAILED", detail=f"the scorer wrote no readable score ({e})")
    # Numbers alone, and few: a scorer that runs the artifact (pickle.load) lets the agent's
    # code write this file, and what it writes must not carry the held-out data out.
    scores = {k: v for k, v in found.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if not scores or len(scores) > MAX_SCORES:
        return SealedScore(status="FAILED", detail=f"the scorer wrote {len(scores)} numeric scores; "
                           f"a sealed evaluation gives 1 to {MAX_SCORES} numbers")
    shown_scores = ", ".join(f"{k}={v}" for k, v in scores.items()) or "no scores"
    return SealedScore(status="SCORED", scores=scores, detail=f"{sealed.artifact}: {shown_scores}")


def sealed_line(session: Session) -> str | None:
    """REPORT.md's engine section's line on the sealed evaluation (None when the idea names none)."""
    sealed = session.state.sealed
    if sealed is None:
        return None
    if sealed.score is None:
        return "**Sealed evaluation:** not scored (the experiments did not complete)."
    return (f"**Sealed evaluation: {sealed.score.status}**, by the engine with the idea's scorer and "
            f"held-out data, which the agent never saw: {sealed.score.detail}")
