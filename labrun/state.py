"""The engine's record of a session, and STATE.md rendered from it.

`state.json` is the source of truth, written atomically as each change (a `transaction`)
ends; STATE.md is rendered from it at the same moment and written right after it when its
text changed, so the file can neither lag nor go missing (a kill between the two renames leaves
it one change behind, until the engine starts again and writes it with its first save). The agent
never writes either: its contributions arrive through `complete_phase` sections.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Literal

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from pydantic import AliasChoices, BaseModel, Field

from labrun.agents.registry import stand_in
from labrun.plan import Plan, coverage, output_exists
from labrun.crashpoints import crashpoint
from labrun.live import Live, running
from labrun.resources import TEMPLATES, template_cache
from labrun.secrets import redact
from labrun.usage import Usage, reported_spend
from labrun.workspace import Workspace, write_atomic
from labrun.phase_registry import DEFAULT, section_titles

log = logging.getLogger("labrun")
DEFAULT_TIME_LIMIT_S = 3600
"""NeuriCo's schema's default `constraints.time_limit`."""
PhaseStatus = Literal["pending", "IN PROGRESS", "DONE", "FAILED", "INTERRUPTED"]
TRANSITIONS = {"IN PROGRESS": "phase-start", "DONE": "phase-done", "FAILED": "phase-failed",
               "INTERRUPTED": "phase-failed"}
"""The crash point (labrun.crashpoints) just before each kind of phase-table write."""
AttemptStatus = Literal["RUNNING", "FAILED", "SUCCESS", "INTERRUPTED"]


def now() -> str:
    return utc(datetime.now(timezone.utc))


def utc(moment: datetime) -> str:
    """A moment as STATE.md writes it: `2026-05-04 13:05:27 UTC`."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


class PhaseRecord(BaseModel):
    status: PhaseStatus = "pending"
    runs: int = 0
    """Times the phase's task really ran; cache hits do not count."""
    error: str | None = None


class Reproduction(BaseModel):
    """The engine's rerun of a SUCCESS attempt (`labrun.phases.reproduction`)."""

    status: Literal["REPRODUCED", "DIVERGED", "SKIPPED"]
    detail: str
    """What was compared, what differed, or why it was not rerun."""
    metrics: dict[str, float | int | str | None] = Field(default_factory=dict)
    """What the rerun recorded."""
    duration_s: float | None = None
    log: str | None = None


class SealedScore(BaseModel):
    """The engine's scoring of the artifact with a sealed evaluation (`labrun.sealed`)."""

    status: Literal["SCORED", "FAILED", "REFUSED"]
    detail: str
    scores: dict[str, float | int | str | None] = Field(default_factory=dict)
    artifact_digest: str | None = None
    """The artifact as scored (a new artifact is scored again)."""
    log: str | None = None
    at: str = Field(default_factory=now)


class Sealed(BaseModel):
    """A sealed evaluation as the session found it when it started: its files, outside the
    workspace, hidden from the agent's commands, and their digests then."""

    scorer: str
    data: str | None = None
    python: str | None = None
    """The Python a `.py` scorer runs with; None: labrun's own."""
    artifact: str
    """The workspace file it scores."""
    digests: dict[str, str]
    """Path → digest when the session started: a change since is refused."""
    score: SealedScore | None = None


class Attempt(BaseModel):
    n: int
    phase: str
    status: AttemptStatus = "RUNNING"
    command: str
    purpose: str = ""
    run_id: str | None = None
    """The planned run it serves (`labrun.plan`), if any."""
    exit_code: int | None = None
    duration_s: float | None = None
    error: str | None = None
    fix_applied: str | None = None
    metrics: dict[str, float | int | str | None] = Field(default_factory=dict)
    outputs: list[str] = Field(default_factory=list)
    metrics_file: str | None = None
    log: str = ""
    pgid: int | None = None
    task_run: str | None = None
    """Its Prefect task run: the resume after a kill marks it Crashed, as the attempt is INTERRUPTED."""
    branch: int = 1
    """The branch of the session it ran in (`labrun rerun`); the numbering is one sequence."""
    reproduction: Reproduction | None = None
    """Set once the engine reran it (an attempt that a criterion judged met cites)."""
    unmeasured: str | None = None
    """Why its metrics and files are not evidence (`labrun.evidence.unmeasured`), judged once
    when it ended; None when they are."""
    echoed: dict[str, str] = Field(default_factory=dict)
    """Metric → where its value is written rather than computed (`labrun.evidence.echoed`): not
    measured, whatever the rest."""
    background: bool = False
    """Started with `run_in_background`: the agent's turn went on while it ran."""
    gpu_count: int = 0
    """The GPUs it asked for (`run_experiment`'s `gpus`)."""
    gpus: list[str] = Field(default_factory=list)
    """The GPUs it held, as CUDA_VISIBLE_DEVICES names them (`labrun.gpus`)."""
    beside: list[str] = Field(default_factory=list)
    """What else could write the workspace while it ran (other attempts, the agent's own
    commands): the engine cannot tell their writes from its own, so only its rerun vouches for
    its numbers, and only the files it declared count as its own."""


class Branch(BaseModel):
    """One run of the session's phases from `from_phase` on; `labrun rerun` starts the next,
    keeping this one under `.labrun/branches/<n>/` (labrun.branches)."""

    n: int
    from_phase: str
    agent: str
    model: str | None = None
    note: str = ""
    started_at: str = Field(default_factory=now)
    ended_at: str | None = None
    """When the next branch replaced it."""
    flow_run: str | None = None
    """The flow run that started it: a retry of that run continues it."""
    pinned: dict[str, str] = Field(default_factory=dict, validation_alias=AliasChoices("pinned", "kept"))
    """Phase → cache key, for the phases before `from_phase`: reused as they stand (`kept` in
    the state of an older labrun)."""
    spent_before: Usage = Field(default_factory=Usage)
    """The session's usage when it started; what it cost is what was spent after."""
    usage: Usage | None = None
    """What it cost, fixed when the next branch replaced it."""
    archived: Usage = Field(default_factory=Usage)
    """Usage of the phase journals moved into its archive (still part of the session's)."""
    cleaned: bool = True
    """False until the workspace is cleared of the replaced phases' outputs."""


ReviewDecision = Literal["approve", "revise", "stop"]


class Review(BaseModel):
    """A person's review of a finished phase (`labrun.review`): asked for when the phase
    completes, decided by `labrun review` or the Prefect UI's Resume form, then applied once."""

    phase: str
    branch: int = 1
    round: int = 1
    """1, and one more for each revision the phase was sent back with."""
    requested_at: str = Field(default_factory=now)
    outputs: list[str] = Field(default_factory=list)
    """What the phase wrote, for the reviewer to read (its manifest's files)."""
    decision: ReviewDecision | None = None
    text: str = ""
    """The approval's comment (it reaches every later phase's prompt) or the revision asked for."""
    reviewer: str | None = None
    """The OS user who ran `labrun review`, or what the Prefect UI's form said."""
    decided_at: str | None = None
    applied: bool = False
    pause_key: str | None = None
    """A deployment run's suspension for this review (`suspend_flow_run`'s key)."""
    flow_run: str | None = None
    """The suspended deployment run that waits for it."""


class FlowRunRecord(BaseModel):
    """The Prefect flow run that ran the session last."""

    id: str
    name: str
    deployment_id: str | None = None
    suspended_at: str | None = None
    """When it was suspended in Prefect while it ran (the UI's Suspend, or Pause in the new
    UI): its engine stopped before its next step, to go on when the run is resumed."""
    resume_by: str | None = None
    """The suspension's timeout: Prefect marks the run Failed if it is not resumed by then."""


class SessionState(BaseModel):
    session_id: str
    title: str
    idea_path: str
    idea_hash: str
    domain: str
    agent: str
    model: str | None = None
    budget_usd: float | None = None
    """The limit on the agent's own model use (`--budget-usd` or `constraints.agent_budget`)."""
    budget_from: str | None = None
    """Where `budget_usd` came from: `--budget-usd`, `constraints.agent_budget` or `none`
    (unset: a session from before the two budgets, migrated when it is opened)."""
    agent_spent_usd: float = 0.0
    """The agent's model use so far, in USD, as of the last reply."""
    experiments_budget_usd: float | None = None
    """The idea's `constraints.budget`: what the experiments may spend."""
    time_limit_s: int | None = None
    """The idea's `constraints.time_limit`."""
    elapsed_s: float = 0.0
    """Time the engine has spent on this session, across all its runs."""
    max_turns: int | None = None
    """Overrides every phase's turn limit when set."""
    parallel_attempts: int | None = None
    """Experiment attempts that may run at once (`--parallel-attempts`), when set."""
    paper_style: str | None = None
    """The paper phase's LaTeX style (`templates/paper_styles/`), when it has that phase."""
    network: bool = True
    """Agent commands may use the network (`--no-network` turns it off)."""
    pass_env: list[str] = Field(default_factory=list)
    """Keys the experiments' commands get besides the idea's, by name (`--pass-env`, `labrun.keys`)."""
    experiments_pool: str | None = None
    """The Prefect work pool each experiment attempt runs on (`--experiments-pool`,
    `constraints.experiments_pool`); None: where the engine runs."""
    experiments_storage: str | None = None
    """Where the pool's attempts get their files by content (`--experiments-storage`,
    `labrun.transfer`); None: its workers see the workspace's path."""
    created_at: str = Field(default_factory=now)
    phases: dict[str, PhaseRecord] = Field(
        default_factory=lambda: {k: PhaseRecord() for k in DEFAULT}
    )
    """The session's phases, in the order they run (fixed when it started)."""
    worklog: list[str] = Field(default_factory=list)
    sections: dict[str, str] = Field(default_factory=dict)
    attempts: list[Attempt] = Field(default_factory=list)
    file_digests: dict[str, str] = Field(default_factory=dict)
    """Last sha256 any finished phase recorded for each output file."""
    plan: Plan = Field(default_factory=Plan)
    """The run list, the evaluation criteria and their coverage (`labrun.plan`)."""
    last_run: FlowRunRecord | None = None
    sealed: Sealed | None = None
    """The idea's sealed evaluation, if it names one (`labrun.sealed`)."""
    branches: list[Branch] = Field(default_factory=list)
    """Empty until the first `labrun rerun`; then every branch, the current one last."""
    review_after: list[str] = Field(default_factory=list)
    """Phases a person reviews once they complete (`--review-after`, `metadata.review_after`)."""
    reviews: list[Review] = Field(default_factory=list)
    """Every review asked for, decided and applied, in order."""

    @property
    def branch(self) -> int:
        """The current branch's number (1 for a session that never reran)."""
        return self.branches[-1].n if self.branches else 1

    def live_attempts(self) -> list[Attempt]:
        """The attempts the current branch stands on: its own, and those of earlier branches
        made in phases that no later branch ran again."""
        return [a for a in self.attempts if not self.superseded(a.phase, a.branch)]

    def superseded(self, phase: str, branch: int) -> bool:
        """What `branch` did in `phase` was done again by a later branch (`labrun rerun`)."""
        order = list(self.phases)
        return phase in order and any(
            b.n > branch and b.from_phase in order and order.index(phase) >= order.index(b.from_phase)
            for b in self.branches)

    def reviews_of(self, phase: str | None = None) -> list[Review]:
        """The reviews (of `phase`) that the current branch stands on."""
        return [r for r in self.reviews if phase in (None, r.phase) and not self.superseded(r.phase, r.branch)]

    @property
    def awaiting_review(self) -> Review | None:
        """The review the session waits for: asked for and not applied yet."""
        return next((r for r in self.reviews_of() if not r.applied), None)

    @property
    def stopped_by_review(self) -> Review | None:
        return next((r for r in self.reviews_of() if r.applied and r.decision == "stop"), None)

    def notes_for(self, phase: str) -> list[dict[str, str]]:
        """What people asked of `phase` and every later one: the comments of the approvals of
        the phases before it, and the current branch's note (`labrun rerun --note`) from the
        phase that branch started at on."""
        order = list(self.phases)
        notes = [{"source": f"review of {r.phase}", "reviewer": r.reviewer or "", "text": r.text}
                 for r in self.reviews_of()
                 if r.applied and r.decision == "approve" and r.text and order.index(r.phase) < order.index(phase)]
        branch = self.branches[-1] if self.branches else None
        if branch and branch.note and order.index(phase) >= order.index(branch.from_phase):
            notes.append({"source": f"the rerun from {branch.from_phase} (branch {branch.n})", "reviewer": "",
                          "text": branch.note})
        return notes

    @property
    def active_phase(self) -> str | None:
        for key, record in self.phases.items():
            if record.status in ("IN PROGRESS", "FAILED", "INTERRUPTED"):
                return key
        return None

    @property
    def complete(self) -> bool:
        """Every phase finished, and no review of one still awaited."""
        return all(r.status == "DONE" for r in self.phases.values()) and self.awaiting_review is None

    def next_action(self, workspace: str) -> str:
        if stop := self.stopped_by_review:
            return (f"none: {stop.reviewer} stopped the session after phase {stop.phase}; start a branch with "
                    f"`labrun rerun {workspace} --from {stop.phase} --note TEXT` to go on differently")
        if (review := self.awaiting_review) and review.decision is None:
            return f"review phase {review.phase}: `labrun review {workspace}` (waiting since {review.requested_at})"
        if self.complete:
            return "none: the session is complete (REPORT.md holds the write-up)"
        run = self.last_run if self.last_run and self.last_run.deployment_id else None
        retry = (f"retry flow run {run.name} from the Prefect UI (its Retry button) or with "
                 f"`prefect flow-run retry {run.id}`") if run else None
        if self.last_run and self.last_run.suspended_at:
            return self._suspended(self.last_run, workspace)
        failed = [k for k, r in self.phases.items() if r.status in ("FAILED", "INTERRUPTED")]
        if failed:
            return (f"{retry or f'resume with `labrun resume {workspace}`'} "
                    f"(phase {failed[0]} stopped: {self.phases[failed[0]].error})")
        running = [k for k, r in self.phases.items() if r.status == "IN PROGRESS"]
        if running and run:
            return f"phase {running[0]} is running in flow run {run.name}; if that run crashed, {retry}"
        if running:
            return f"phase {running[0]} is running; if no labrun process is, `labrun resume {workspace}`"
        pending = next(k for k, r in self.phases.items() if r.status == "pending")
        return f"start phase {pending} (`labrun resume {workspace}`)"

    def _suspended(self, run: FlowRunRecord, workspace: str) -> str:
        """A run suspended from the Prefect UI: nothing runs until it is resumed. A deployment
        run goes on on a worker; Prefect cannot resume one without a deployment."""
        running = next((k for k, r in self.phases.items() if r.status == "IN PROGRESS"), None)
        pending = next((k for k, r in self.phases.items() if r.status == "pending"), None)
        where = (f"phase {running} goes on from its last finished step" if running else
                 f"phase {pending} starts" if pending else "the session goes on")
        head = f"flow run {run.name} was suspended from the Prefect UI at {run.suspended_at}, and nothing runs"
        if not run.deployment_id:
            return f"{head}: resume with `labrun resume {workspace}` ({where})"
        deadline = (f" before {run.resume_by} (then Prefect marks it Failed: press Retry, or "
                    f"`prefect flow-run retry {run.id}`)") if run.resume_by else ""
        return f"{head}: press Resume on its page in the Prefect UI{deadline}; {where}"


class Block(str):
    """Text STATE.md's template may print over several lines (`one_line` leaves it whole)."""


def _demote_headings(text: str) -> Block:
    """Agent text may not open a top-level section of its own inside STATE.md: its lines,
    broken at every line boundary a reader knows (`\r`, `\v`, U+2028, ...), end in `\n`
    alone before a heading is looked for."""
    lines = "\n".join(text.strip().splitlines())
    return Block(re.sub(r"^(#{1,2})(?=\s)", r"##\1", lines, flags=re.M))


def one_line(value: Any) -> Any:
    """Every value STATE.md's template prints stays on its line, unless it is a `Block`: an
    attempt's purpose, a metric's name or a command cannot start a section of its own."""
    return value if isinstance(value, Block) or not isinstance(value, str) else " ".join(value.splitlines())


_env = Environment(
    loader=FileSystemLoader(TEMPLATES),
    bytecode_cache=template_cache("labrun_state"),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    finalize=one_line,
)
_env.filters["demote"] = _demote_headings
_env.filters["block"] = Block


def duration(seconds: float) -> str:
    """`42 s`, `12 min`, `2 h 05 min`: a span of time as a person reads it."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def live_line(view: Live) -> str:
    """A running attempt's live view in words: `running 2 min · GPUs 0, 1`."""
    said = {"waiting": view.waiting or "waiting to start", "starting": "starting",
            "running": f"running {duration(view.elapsed_s or 0)}",
            "ended": f"ended after {duration(view.elapsed_s or 0)}, being recorded",
            "gone": "its supervisor is gone without reporting an end"}[view.stage]
    return said + (f" · GPU{'s' if len(view.gpus) > 1 else ''} {', '.join(view.gpus)}" if view.gpus else "")


def usd(amount: float) -> str:
    return f"${amount:,.2f}"


def add_clock_filters(env: Environment) -> None:
    env.filters["duration"] = duration
    env.filters["usd"] = usd


def session_clock(state: SessionState, agent_spent_usd: float | None = None) -> dict[str, Any]:
    """Time and money so far against the limits (`templates/clock.md.j2`); the agent's
    spend as last noted unless given exactly."""
    spent, reporting = reported_spend(state.attempts)
    statuses = [a.status for a in state.live_attempts()]
    return {"elapsed_s": state.elapsed_s, "time_limit_s": state.time_limit_s or DEFAULT_TIME_LIMIT_S,
            "agent_spent_usd": state.agent_spent_usd if agent_spent_usd is None else agent_spent_usd,
            "agent_budget_usd": state.budget_usd, "agent_budget_from": state.budget_from,
            "experiments_spent_usd": spent, "experiments_reporting": reporting,
            "experiments_budget_usd": state.experiments_budget_usd,
            "attempts": len(statuses), "succeeded": statuses.count("SUCCESS"), "failed": statuses.count("FAILED")}


def render_clock(clock: dict[str, Any]) -> str:
    """The clock's lines (`templates/clock.md.j2`) as plain text."""
    return _env.get_template("clock.md.j2").render(clock=clock, bullet="").strip()


def _cell(text: object) -> str:
    """Text that fits in one cell of a markdown table."""
    return " ".join(str(text).split()).replace("|", "\\|")


_env.filters["cell"] = _cell
_env.filters["live_line"] = live_line
_env.filters["moment"] = lambda epoch: utc(datetime.fromtimestamp(epoch, timezone.utc))
add_clock_filters(_env)


def render_state_md(state: SessionState, workspace: str | Path) -> str:
    plan = state.plan
    text = _env.get_template("STATE.md.j2").render(
        state=state,
        stand_in=stand_in(state.agent),
        plan=plan,
        coverage=coverage(plan, state.live_attempts()),
        outputs=[(p, output_exists(Path(workspace), p), plan.deviation(p)) for p in plan.outputs],
        numbered=list(enumerate(state.phases, 1)),
        of_total="" if tuple(state.phases) == DEFAULT else f" of {len(state.phases)}",
        section_titles=section_titles(state.phases),
        next_action=state.next_action(str(workspace)),
        clock=session_clock(state),
        live={view.n: view for view in running(Workspace(workspace), state.attempts)},
    )
    return redact(text)


class StateDamaged(Exception):
    """state.json and its previous copy are both unreadable."""


def _previous(path: Path) -> Path:
    return path.with_name(path.name + ".prev")


def _parse(path: Path) -> SessionState:
    data = path.read_bytes()
    if not data.strip():
        raise ValueError("it is empty")
    return SessionState.model_validate_json(data)


def _why(e: Exception) -> str:
    if isinstance(e, UnicodeDecodeError) or "utf-8" in str(e).lower():
        return "it is not UTF-8"
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    return first if first == "it is empty" else f"it does not parse: {first}"


def state_md_text(ws: Workspace) -> str:
    """STATE.md as the engine's record has it: rendered from state.json, never read back from
    the workspace, where any command of the agent's may have replaced the file."""
    return render_state_md(load_state(ws)[0], str(ws.root))


def load_state(ws: Workspace, restore: bool = False) -> tuple[SessionState, str | None]:
    """The session's state, and a note when state.json was damaged and its previous good
    copy (kept on every write) was used instead; `restore` also puts that copy back."""
    try:
        return _parse(ws.state_file), None
    except (OSError, ValueError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        damage = _why(e)
    previous = _previous(ws.state_file)
    try:
        state = _parse(previous)
    except (OSError, ValueError):
        raise StateDamaged(f"{ws.state_file}: {damage}, and there is no readable previous copy "
                           f"({previous.name}); start a new workspace") from None
    note = f"{ws.state_file.name} was damaged ({damage}); recovered the previous good copy ({previous.name})"
    if restore:
        ws.write(ws.state_file, previous.read_text())
    return state, note


def _keep_previous(path: Path) -> None:
    """The file on disk was written whole (atomically): keep it as the previous good copy,
    by a hard link, so that keeping it costs no write."""
    previous, tmp = _previous(path), path.with_name(f".{path.name}.prev.tmp")
    try:
        tmp.unlink(missing_ok=True)
        os.link(path, tmp)
        os.replace(tmp, previous)
    except FileNotFoundError:
        pass
    except OSError:  # no hard links on this filesystem
        write_atomic(previous, path.read_text())


LIVE_INTERVAL_S = 30.0
"""How often the engine renders STATE.md again while an attempt runs, between saves: its
elapsed time and the last lines of its log (`labrun.live`)."""
SPEND_SAVE_INTERVAL_S = 5.0
"""How stale the agent's spend may be in state.json and STATE.md while a phase streams replies:
each reply's usage is in the phase's journal the moment it arrives, so nothing is lost."""


class StateStore:
    """A session's state: changes are made inside a `transaction`, saved once as it ends
    (state.json whole, STATE.md when what it shows changed). Several stores may share a
    session, in one process or several (the engine's, and its phase task's wherever it
    runs): a transaction holds the state's file lock, and starts from what another store
    saved since."""

    def __init__(self, ws: Workspace, state: SessionState):
        self.ws = ws
        self.state = state
        self._lock = threading.RLock()
        self._file_lock: int | None = None
        self._seen = ws.state_identity()
        self._depth = 0
        self._clock: tuple[float, float] | None = None
        self._saved_at = 0.0
        self._state_md: tuple[str, tuple[int, int, int]] | None = None
        """STATE.md as last written, and its (inode, size, mtime) then: written again when the
        text differs or when anything else replaced the file since."""
        self._following: threading.Event | None = None

    def start_clock(self) -> None:
        """From now on every save adds the time this engine has run to `elapsed_s`."""
        self._clock = (self.state.elapsed_s, time.monotonic())

    @classmethod
    def load(cls, ws: Workspace) -> "StateStore":
        state, note = load_state(ws, restore=True)
        store = cls(ws, state)
        if note:
            store.event(note)
        return store

    @contextmanager
    def transaction(self) -> Iterator[SessionState]:
        """Change the state inside; the outermost transaction saves it once as it ends (not
        when its body raised: what a failed change left half made is saved by the next).
        One thread at a time: the others wait for it to end."""
        with self._lock:
            if self._depth == 0:
                self._hold_file()
            self._depth += 1
            try:
                yield self.state
                if self._depth == 1:
                    self._commit()
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._release_file()

    def _lock_file(self) -> None:
        if self._file_lock is None:
            self.ws.data.mkdir(parents=True, exist_ok=True)
            self._file_lock = os.open(self.ws.state_lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._file_lock, fcntl.LOCK_EX)

    def _hold_file(self) -> None:
        self._lock_file()
        try:
            if self.ws.state_identity() != self._seen:  # another store saved it since
                fresh, _ = load_state(self.ws)
                for name in type(fresh).model_fields:  # in place: whoever holds `state` sees it
                    setattr(self.state, name, getattr(fresh, name))
                self._seen = self.ws.state_identity()
        except BaseException:
            self._release_file()
            raise

    def _release_file(self) -> None:
        if self._file_lock is not None:
            fcntl.flock(self._file_lock, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._following is not None:
            self._following.set()
        with self._lock:  # not while the refresh holds it
            if self._file_lock is not None:
                os.close(self._file_lock)
                self._file_lock = None

    def follow_attempts(self, interval_s: float = LIVE_INTERVAL_S) -> None:
        """For the engine that holds the workspace, until `close`: STATE.md rendered again
        every `interval_s` while an attempt of the session runs, whichever process started
        it, so that its elapsed time and its log's last lines stay current between saves."""
        stop = self._following = threading.Event()

        def follow() -> None:
            while not stop.wait(interval_s):
                try:
                    self.refresh_state_md()
                except Exception as e:  # a view: never worth the session, tried again next time
                    log.warning("STATE.md not refreshed this time (%s)", redact(str(e) or type(e).__name__))

        threading.Thread(target=follow, daemon=True, name=f"labrun-state-md-{self.ws.root.name}").start()

    def refresh_state_md(self) -> None:
        """STATE.md rendered again, when an attempt runs, from the state as last saved (by
        this store or another: under the state's lock, so no older rendering lands over a
        newer one), without saving the state (nor syncing STATE.md to disk)."""
        with self._lock:
            if self._following is not None and self._following.is_set():  # closed
                return
            self._lock_file()
            try:
                state = self.state if self.ws.state_identity() == self._seen else load_state(self.ws)[0]
                if any(a.status == "RUNNING" for a in state.attempts):
                    self._write_state_md(render_state_md(state, self.ws.root))
            finally:
                self._release_file()

    def save(self) -> None:
        """Save now, or when the transaction this is called in ends."""
        with self.transaction():
            pass

    def note_spend(self, usd: float) -> None:
        """The agent's spend as of its last reply: saved with the next change, or now when the
        last save is older than `SPEND_SAVE_INTERVAL_S`."""
        with self._lock:
            if usd == self.state.agent_spent_usd:
                return
            if self._depth == 0 and time.monotonic() - self._saved_at >= SPEND_SAVE_INTERVAL_S:
                with self.transaction() as state:
                    state.agent_spent_usd = usd
            else:
                self.state.agent_spent_usd = usd

    def _commit(self) -> None:
        """The one place the state is written, in the outermost transaction."""
        if self._clock is not None:
            self.state.elapsed_s = round(self._clock[0] + time.monotonic() - self._clock[1], 1)
        _keep_previous(self.ws.state_file)
        self.ws.write(self.ws.state_file, redact(self.state.model_dump_json(indent=2)))
        self._seen = self.ws.state_identity()
        self._saved_at = time.monotonic()
        try:
            self._write_state_md(render_state_md(self.state, self.ws.root))
        except OSError as e:  # an agent process racing the engine for its name: state.json holds it all
            self._state_md = None
            log.warning("STATE.md not rewritten this time (%s); the next change writes it again", e)

    def _write_state_md(self, text: str) -> None:
        if self._state_md is not None and self._state_md == (text, self._stat_state_md()):
            return
        self.ws.write(self.ws.state_md, text, durable=False)  # rendered again from state.json
        self._state_md = (text, self._stat_state_md())

    def _stat_state_md(self) -> tuple[int, int, int]:
        try:
            st = os.lstat(self.ws.state_md)
        except OSError:
            return (0, -1, 0)
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def event(self, text: str) -> None:
        """A Worklog line (saved with the next `save`), shown as progress too."""
        text = redact(text)
        self.state.worklog.append(f"{now()} — {text}")
        log.info(text)

    def log(self, text: str) -> None:
        with self.transaction():
            self.event(text)

    def set_phase(self, key: str, status: PhaseStatus, event: str, error: str | None = None) -> None:
        """The one writer of the phase table, called in the order the flow walks its phases:
        IN PROGRESS by the phase task as it starts, DONE or FAILED by the flow from the
        task's Prefect state, INTERRUPTED by the flow when a signal stops it. A phase that starts makes every phase after it pending: the
        flow runs them after it, whatever they read before."""
        crashpoint(TRANSITIONS[status])
        with self.transaction() as state:
            record = state.phases[key]
            record.status = status
            record.error = error
            if status == "IN PROGRESS":
                keys = list(state.phases)
                for later in keys[keys.index(key) + 1:]:
                    state.phases[later] = PhaseRecord(runs=state.phases[later].runs)
            self.event(event)


def parse_state_md(text: str) -> dict[str, str]:
    """STATE.md's top-level sections, title → body. Used by tests and outside clients."""
    sections: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# "):
            current = line[2:].strip()
            sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
    return {k: v.strip() for k, v in sections.items()}


def phase_table(text: str) -> dict[str, str]:
    """`Phase N — key: status` lines of STATE.md's Current State, key → status (`Phase N of M
    — key: status` when the session's phases are not the default six)."""
    body = parse_state_md(text).get("Current State", "")
    return dict(re.findall(r"^Phase \d+(?: of \d+)? — (\w+): (.+)$", body, flags=re.M))
