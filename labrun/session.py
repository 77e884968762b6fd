"""A research session: a workspace held (its lock), its idea and its state, opened with a
run's parameters (`open`) or read by an engine task (`attach`), and the phase bookkeeping.
Its services each have one job: `records` (the attempts), `confinement` (where commands run
and what they get) and `limits` (what it may spend)."""

from __future__ import annotations

import functools
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from labrun import suggest
from labrun.agents.registry import DEFAULT_AGENT, names
from labrun.idea import Idea, load_idea
from labrun.state import PhaseRecord, SessionState, StateStore, load_state
from labrun.journal import Conversation
from labrun.keys import pass_env_names
from labrun.plan import Plan
from labrun.run_params import RunParams
from labrun.evidence import echoed, kept_text, unmeasured
from labrun.sealed import seal
from labrun.settings import settings
from labrun.secrets import declare, undumpable
from labrun.snapshot import entry_digest
from labrun.workspace import Workspace
from labrun.attempt_records import AttemptRecords
from labrun.confinement import Confinement
from labrun.limits import Limits, budget_source
from labrun.paper import DEFAULT_STYLE, load_style
from labrun.phase_registry import BY_KEY, Phase, Work, phase_list, review_after_phases



def check_limits(agent: str | None, budget_usd: float | None, max_turns: int | None) -> None:
    """What a deployment run can pass that the command line refuses: one line each."""
    if agent is not None and agent not in names():
        raise ValueError(suggest.unknown("agent", agent, names()))
    if budget_usd is not None and not budget_usd >= 0:
        raise ValueError(f"budget_usd {budget_usd}: a budget is zero or more US dollars")
    if max_turns is not None and max_turns < 1:
        raise ValueError(f"max_turns {max_turns}: a phase needs at least one turn")


class SessionMismatch(Exception):
    pass


@functools.lru_cache(maxsize=8)
def _idea_copy(path: str, identity: tuple[int, int, int]) -> Idea:
    """A session's copy of its idea, parsed once per version of the file: every engine task
    attaches to the session, and parsing YAML is the most of what attaching costs."""
    return load_idea(path)


class _Reading(StateStore):
    """The state as an engine task reads it: the engine that owns the session writes it."""

    def _hold_file(self) -> None:
        pass

    def _commit(self) -> None:
        raise RuntimeError("an engine task reads the session's state; the engine records what it returns")


def changed_outputs(manifest: dict[str, Any], recorded: dict[str, str], root: Path,
                    missing_only: bool = False) -> list[str]:
    """Files a finished phase produced that are gone, or differ from the last digest any
    finished phase recorded for them."""
    changed = []
    for rel in manifest.get("files", {}):
        now = entry_digest(root, rel)
        if now is None or (not missing_only and now != recorded.get(rel)):
            changed.append(rel)
    return changed


class Session:
    def __init__(self, ws: Workspace, store: StateStore, idea: Idea, egress: str | None = None):
        self.ws = ws
        self.store = store
        self.idea = idea
        self.records = AttemptRecords(ws, store)
        self.confinement = Confinement(ws, idea, store, egress)
        self.limits = Limits(ws, idea, store)

    @property
    def state(self) -> SessionState:
        return self.store.state

    # -- opening and closing ---------------------------------------------------------------

    @classmethod
    def open(cls, run: RunParams | str | Path, idea_path: str | Path | None = None, agent: str | None = None,
             **params: Any) -> "Session":
        """Open (or create) the session of `run` (a `RunParams`, or its workspace, idea and other
        fields) and hold its lock until `close`. `with_phases` names the optional phases a new
        session runs besides the default ones and those its idea asks for
        (`metadata.with_phases`); `paper_style` is the paper phase's style (else the idea's
        `metadata.paper_style`, else the plain one); `pass_env` names keys for the experiments
        besides the idea's (a resume adds them); `review_after` the phases a person reviews
        (else the idea's; a resume's replaces them). `from_phase` and `note` are the flow's."""
        if not isinstance(run, RunParams):
            check_limits(agent, params.get("budget_usd"), params.get("max_turns"))  # in one line
            run = RunParams(workspace=str(run), idea_path=str(idea_path) if idea_path else None, agent=agent, **params)
        agent, model, budget_usd, max_turns = run.agent, run.model, run.budget_usd, run.max_turns
        paper_style, network, review_after = run.paper_style, run.network, run.review_after
        workspace, idea_path = run.workspace, run.idea_path
        if not workspace:
            raise ValueError("a session needs its workspace")
        ws = Workspace(workspace)
        idea = load_idea(idea_path) if idea_path else None
        with_phases = [p for p in run.with_phases or () if p.strip()]
        pass_env = pass_env_names(run.pass_env or ())  # a bad name fails before anything is written
        # An unknown name fails before anything is written.
        keys = phase_list([*with_phases, *(idea.with_phases if idea else ())])
        style = paper_style or (idea.paper_style if idea else None)
        if style is not None:
            load_style(style)
        if review_after is not None:
            review_after = list(review_after)
        if idea is not None and not ws.has_session():  # before anything is written
            review_after = review_after_phases(idea.review_after if review_after is None else review_after, keys)
        elif review_after is not None:
            review_after_phases(review_after, phase_list(BY_KEY))
        if ws.has_session() and idea is not None:
            state = StateStore.load(ws).state
            if state.idea_hash != idea.content_hash:
                raise SessionMismatch(
                    f"{ws.root} already holds a session of another idea ({state.idea_path}); "
                    "use a new --workspace, or `labrun resume` to continue that one"
                )
        # Checked before anything is written: a sealed evaluation that cannot be kept sealed.
        sealed = seal(idea, Path(idea_path), ws.root) if idea is not None and not ws.has_session() else None
        ws.root.mkdir(parents=True, exist_ok=True)
        ws.lock()
        try:
            if ws.has_session():
                store = StateStore.load(ws)
                idea = load_idea(ws.idea_copy)
                session = cls(ws, store, idea)
                session._check_phases(keys if with_phases else None)
                session._check_paper_style(paper_style)
                with store.transaction():  # what opening changes is saved once
                    session._migrate()
                    session._take_options(agent, model, budget_usd, max_turns, network, list(pass_env),
                                          run.parallel_attempts)
                    session._take_reviews(review_after)
                    session._take_pool(run.experiments_pool, run.experiments_storage or settings().experiments_storage)
                    session.records.reconcile()
            else:
                if idea is None:
                    raise FileNotFoundError(f"{ws.root}: no labrun session here; start one with `labrun run IDEA.yaml --workspace {ws.root}`")
                shutil.copyfile(idea_path, ws.idea_copy)
                state = SessionState(
                    session_id=uuid.uuid4().hex[:12],
                    title=idea.title,
                    idea_path=str(Path(idea_path).resolve()),
                    idea_hash=idea.content_hash,
                    domain=idea.domain,
                    agent=agent or DEFAULT_AGENT,
                    model=model,
                    budget_usd=budget_usd if budget_usd is not None else idea.agent_budget_usd,
                    budget_from=budget_source(budget_usd, idea),
                    experiments_budget_usd=idea.budget_usd,
                    time_limit_s=idea.constraints.time_limit,
                    max_turns=max_turns,
                    parallel_attempts=run.parallel_attempts,
                    phases={k: PhaseRecord() for k in keys},
                    paper_style=(style or DEFAULT_STYLE) if "paper" in keys else None,
                    plan=Plan.for_criteria(idea.evaluation_criteria),
                    network=network is not False,
                    pass_env=pass_env,
                    sealed=sealed,
                    review_after=review_after,
                    experiments_pool=run.experiments_pool or idea.constraints.experiments_pool,
                    experiments_storage=run.experiments_storage or settings().experiments_storage,
                )
                store = StateStore(ws, state)
                session = cls(ws, store, idea)
                store.log(f"session created (agent {state.agent})")
            session.store.start_clock()
            session.store.follow_attempts()
            declare(session.confinement.key_names())  # their values are redacted from now on, whatever the names
            undumpable()
        except BaseException:
            ws.unlock()
            raise
        return session

    @classmethod
    def attach(cls, spec, writing: bool = False) -> "Session":
        """The session as its workspace holds it, for a task of the engine's in whatever
        process it runs (`labrun.phases.execution`). An engine task reads the state and never
        writes it: the engine records what the task returns. The phase task (`writing`)
        records into it as the agent's tools go, while the engine that gave its spec holds the
        workspace (its lease)."""
        ws = Workspace(spec.workspace)
        if writing and not ws.leased(spec.lease):
            raise SessionMismatch(f"{ws.root}: the engine that started this task no longer holds the "
                                  "workspace; run the session again to go on")
        ws.lease = spec.lease if writing else None
        state, _ = load_state(ws)
        if state.session_id != spec.session_id:
            raise SessionMismatch(f"{ws.root} holds session {state.session_id}, not {spec.session_id}")
        st = os.stat(ws.idea_copy)
        idea = _idea_copy(str(ws.idea_copy), (st.st_ino, st.st_size, st.st_mtime_ns))
        session = cls(ws, StateStore(ws, state) if writing else _Reading(ws, state), idea, spec.egress)
        declare(session.confinement.key_names())  # redacted in this process too
        undumpable()
        if writing:
            session.store.start_clock()
        return session

    def close(self) -> None:
        self.confinement.close()
        self.store.close()
        self.ws.unlock()

    def _check_phases(self, wanted: tuple[str, ...] | None) -> None:
        unknown = [k for k in self.state.phases if k not in BY_KEY]
        if unknown:
            raise SessionMismatch(f"{self.ws.root}: this session has a phase {unknown[0]!r} that this "
                                  f"labrun does not know (it knows {', '.join(BY_KEY)})")
        if wanted is not None and wanted != tuple(self.state.phases):
            raise SessionMismatch(
                f"{self.ws.root}: this session's phases were fixed when it started "
                f"({', '.join(self.state.phases)}); use a new --workspace for other phases")

    def _check_paper_style(self, wanted: str | None) -> None:
        if wanted is not None and wanted != self.state.paper_style:
            raise SessionMismatch(
                f"{self.ws.root}: this session's paper style was fixed when it started "
                f"({self.state.paper_style or 'none: it has no paper phase'}); use a new --workspace for another")
    def _migrate(self) -> None:
        """Bring a session started by an older labrun up to this one's state."""
        state, idea = self.state, self.idea
        plan = state.plan
        if not plan.criteria and not plan.runs and idea.evaluation_criteria:
            state.plan = Plan.for_criteria(idea.evaluation_criteria)
        state.experiments_budget_usd = idea.budget_usd
        for a in state.attempts:  # an attempt of a labrun that did not judge its metrics when it ended
            if a.status == "SUCCESS" and "unmeasured" not in a.model_fields_set:
                record = self.records.files(a.n) or {}
                kept = kept_text(self.ws.kept, record.get("before") or {})
                a.unmeasured, a.echoed = unmeasured(a, record, kept, self.ws.root), echoed(a, record, kept, self.ws.root)
        state.time_limit_s = idea.constraints.time_limit
        if state.budget_from is None:
            # Before the two budgets, the idea's constraints.budget limited the agent's own spend.
            if state.budget_usd is not None and state.budget_usd == idea.budget_usd:
                state.budget_usd = idea.agent_budget_usd
                state.budget_from = budget_source(None, idea)
                limit = f"${state.budget_usd:.2f} ({state.budget_from})" if state.budget_usd is not None else "no limit"
                self.store.event(
                    f"budgets split: the idea's constraints.budget (${idea.budget_usd:.2f}) is now the "
                    f"experiments' spending limit, no longer the agent's; the agent's own model use has "
                    f"{limit} (set one with `labrun resume {self.ws.root} --budget-usd X`)")
            else:
                state.budget_from = "--budget-usd" if state.budget_usd is not None else "none"

    def _take_options(self, agent: str | None, model: str | None, budget_usd: float | None,
                max_turns: int | None, network: bool | None, pass_env: list[str],
                parallel_attempts: int | None = None) -> None:
        """A resume keeps the session's settings unless told otherwise; keys passed with
        `--pass-env` add to the session's."""
        added = [n for n in dict.fromkeys(pass_env) if n not in self.confinement.key_names()]
        if added:
            self.state.pass_env += added
            self.store.event(f"the experiments' commands get {', '.join(added)} too from now on (--pass-env)")
        if max_turns is not None:
            self.state.max_turns = max_turns
        if parallel_attempts is not None:
            self.state.parallel_attempts = parallel_attempts
        if agent and agent != self.state.agent:
            self.state.agent = agent
        if model and model != self.state.model:
            self.store.event(f"model {self.state.model or 'default'} → {model} for the phases still to run")
            self.state.model = model
        if budget_usd is not None:
            self.state.budget_usd = budget_usd
            self.state.budget_from = "--budget-usd"
        if network is False and self.state.network:
            self.state.network = False
            self.store.event("agent commands run without network from now on (--no-network)")
        self.store.save()

    def _take_reviews(self, review_after: list[str] | None) -> None:
        """A run's `review_after` replaces the session's; a review still awaited of a phase
        no longer named is dropped."""
        if review_after is None:
            return
        wanted = review_after_phases(review_after, list(self.state.phases))
        if wanted == self.state.review_after:
            return
        self.state.review_after = wanted
        dropped = [r for r in self.state.reviews if not r.applied and r.phase not in wanted]
        self.state.reviews = [r for r in self.state.reviews if r not in dropped]
        self.store.event(f"phases reviewed by a person from now on: {', '.join(wanted) or 'none'}"
                         + "".join(f"; phase {r.phase} no longer awaits review" for r in dropped))
        self.store.save()

    def _take_pool(self, pool: str | None, storage: str | None) -> None:
        """A run's experiments pool and storage replace the session's (a resume without them keeps its own)."""
        if pool and pool != self.state.experiments_pool:
            self.state.experiments_pool = pool
            self.store.event(f"experiment attempts run on work pool {pool} from now on (--experiments-pool)")
        if storage and storage != self.state.experiments_storage:
            self.state.experiments_storage = storage
            self.store.event(f"experiment attempts get their files through {storage} from now on (--experiments-storage)")

    # -- phases ----------------------------------------------------------------------------

    def work(self, phase_key: str, sections: dict[str, str], parts: dict[str, Any] | None = None) -> Work:
        """What a phase's completion rule is checked against: `parts` are the structured
        parts of its `complete_phase` call, applied to the session's plan."""
        parts = parts or {}
        background = self.idea.background
        refs = tuple(r.repo for r in background.code_references or ()) if background else ()
        attempts = self.state.live_attempts()
        return Work(self.ws.root, sections, attempts, phase_key,
                    log=self.ws.phase_dir(phase_key), plan=self.state.plan.merged(parts, phase_key),
                    given=parts, code_references=refs,
                    files={a.n: self.records.files(a.n) or {} for a in attempts}, network=self.confinement.network_on)

    def give_sections(self, phase_key: str, sections: dict[str, str],
                      parts: dict[str, Any] | None = None) -> None:
        """Record what a phase's `complete_phase` gave: STATE sections and plan parts."""
        with self.store.transaction():
            self.state.sections.update(sections)
            if sections:
                self.store.event(f"{phase_key} gave sections: {', '.join(sections)}")
            if parts:
                self.state.plan = self.state.plan.merged(parts, phase_key)
                self.store.event(f"{phase_key} gave {', '.join(parts)}")

    def manifest(self, phase_key: str) -> dict[str, Any] | None:
        return self.ws.manifest(phase_key)

    def stale_outputs(self, phase_key: str) -> list[str]:
        manifest = self.manifest(phase_key)
        if manifest is None:
            return []
        # A phase cut off mid-way may have edited earlier outputs, as later phases may; its
        # edits are not recorded until it finishes, so only a missing file counts then.
        return changed_outputs(manifest, self.state.file_digests, self.ws.root,
                               missing_only=self.open_phase() is not None)

    def open_phase(self) -> str | None:
        """The phase whose conversation a crash cut off, if any."""
        for key, record in self.state.phases.items():
            if record.status != "DONE":
                convo = Conversation.latest(self.ws.phase_dir(key))
                if convo is not None and convo.completed is None:
                    return key
        return None

    def finish_phase(self, phase_key: str, manifest: dict[str, Any]) -> None:
        with self.store.transaction():
            self.ws.write_json(self.ws.phase_dir(phase_key) / "manifest.json", manifest)
            self.state.file_digests.update(manifest["files"])

    @property
    def phases(self) -> list[Phase]:
        """This session's phases, in order (fixed when it started)."""
        return [BY_KEY[k] for k in self.state.phases]
