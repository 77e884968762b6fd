"""The engine's record of a session's experiment attempts: each numbered attempt in the
state, and beside it in `.labrun/attempts/` the workspace it found and the files it wrote
(`attempt-NNN.files.json`), what its task noted as it ran (`attempt-NNN.run.json`) and what
its command's supervisor reports (`attempt-NNN.supervisor.json`, `labrun.supervisor`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterable

from labrun.commands import Supervised, kill_group
from labrun.prefect_processes import identified
from labrun.settings import settings
from labrun.snapshot import changed
from labrun.state import Attempt, StateStore
from labrun.workspace import Workspace

ENDED = {"status", "exit_code", "duration_s", "error", "metrics", "outputs", "unmeasured", "echoed", "task_run", "gpus", "beside"}
"""What an attempt's task finds out, for the engine to record."""


class AttemptRecords:
    def __init__(self, ws: Workspace, store: StateStore):
        self.ws = ws
        self.store = store

    def new(self, phase_key: str, inp, files_before: dict[str, str]) -> Attempt:
        """Attempt n, RUNNING; `files_before` is the workspace as it found it."""
        with self.store.transaction() as state:
            n = len(state.attempts) + 1
            attempt = Attempt(
                n=n,
                phase=phase_key,
                command=inp.command,
                purpose=inp.purpose,
                fix_applied=inp.fix_applied,
                run_id=inp.run_id,
                outputs=list(inp.outputs),
                metrics_file=inp.metrics_file,
                log=str(self.ws.attempt_log(n).relative_to(self.ws.root)),
                branch=state.branch,
                background=inp.run_in_background,
                gpu_count=inp.gpus,
            )
            self.ws.write_json(self.files_path(n), {"before": files_before, "wrote": None})
            state.attempts.append(attempt)
            self.store.event(f"attempt {n} started: {inp.command}")
        return attempt

    def update(self, n: int, **fields: Any) -> None:
        with self.store.transaction():
            attempt = self.store.state.attempts[n - 1]
            for k, v in fields.items():
                setattr(attempt, k, v)
            if "status" in fields:
                self.store.event(f"attempt {n} {attempt.status}" + (f": {attempt.error}" if attempt.error else ""))

    def record(self, n: int, ended: dict[str, Any]) -> None:
        """What the attempt's task returned (`labrun.phases.attempts`), into the state."""
        self.update(n, **{k: v for k, v in ended.items() if k in ENDED})

    def run_path(self, n: int) -> Path:
        return self.ws.attempt_file(n, "run")

    def run(self, n: int) -> dict[str, Any]:
        """What attempt n's task noted as it ran: its task run, its command's process group
        (by identity) and, once it ended, its record; {} before it started (or when a link
        stands in its place: read beneath the workspace, never through one)."""
        try:
            return json.loads(self.ws.files.read_text(self.run_path(n)))
        except (OSError, ValueError):
            return {}

    def files_path(self, n: int) -> Path:
        return self.ws.attempt_file(n, "files")

    def files(self, n: int) -> dict[str, Any] | None:
        """The workspace as attempt n found it (`before`) and the files it wrote itself
        (`wrote`, None until it ended); None for an attempt of an older labrun."""
        try:
            return json.loads(self.ws.files.read_text(self.files_path(n)))
        except (OSError, ValueError):
            return None

    def wrote(self, n: int, files_after: dict[str, str], rewritten: Iterable[str] = ()) -> None:
        """Record what attempt n changed in the workspace, for the retry rule and as evidence
        (`labrun.evidence`); `rewritten`: files it wrote again as they were."""
        files = self.files(n) or {"before": {}}
        files["wrote"] = sorted(set(changed(files["before"], files_after)) | set(rewritten))
        files["after"] = {k: files_after[k] for k in files["wrote"] if k in files_after}  # what it wrote, as evidence
        self.ws.write_json(self.files_path(n), files)

    def own_calls(self) -> list[list[float | None]]:
        """When the agent's own tools ran beside attempts (`PhaseAttempts.watch`), across runs of
        the engine; [] before any did (or when a link stands in its place)."""
        try:
            return json.loads(self.ws.files.read_text(self.ws.attempts / "own-calls.json"))
        except (OSError, ValueError):
            return []

    def note_own_calls(self, calls: list[list[float | None]]) -> None:
        self.ws.write_json(self.ws.attempts / "own-calls.json", calls, durable=False)

    def stop_path(self, n: int) -> Path:
        """Written by the engine that ends attempt n (`stop_experiment`), for its task to see
        while it waits to start."""
        return self.ws.attempts / f"attempt-{n:03d}.stop"

    def supervisor_path(self, n: int) -> Path:
        return self.ws.attempt_file(n, "supervisor")

    def supervised(self, n: int) -> Supervised:
        """Attempt n's command as its supervisor reports it (read beneath the workspace, never
        through a link; `labrun.supervisor`)."""
        def read() -> dict[str, Any]:
            try:
                return json.loads(self.ws.files.read_text(self.supervisor_path(n)))
            except (OSError, ValueError):
                return {}
        return Supervised(read)

    def reconcile(self, interrupted: bool = False) -> None:
        """An attempt still RUNNING belongs to an engine that stopped. Recorded if its task
        ended; left RUNNING if its command's supervisor still runs or reported its end (the
        phase's resume re-attaches to it and records it: `labrun.phases.attempts`), as is one
        sent to a work pool as a flow run of its own, which the resume waits for; else
        what it left is killed and it is marked INTERRUPTED. `interrupted`: this engine is
        stopping on a signal, which stops its attempts too, unless LABRUN_KEEP_EXPERIMENTS=on."""
        keep = settings().keep_experiments
        with self.store.transaction():
            for a in self.store.state.attempts:
                if a.status != "RUNNING":
                    continue
                run = self.run(a.n)
                if run.get("ended"):  # it ended, but the engine stopped before recording it
                    self.record(a.n, run["ended"])
                    continue
                if run.get("flow_run"):  # a flow run of its own on a work pool, which no signal here stops
                    line = (f"attempt {a.n} runs on as flow run {run['flow_run']} on work pool {run.get('pool')}; "
                            f"`labrun resume {self.ws.root}` records it")
                    _say(line) if interrupted else self.store.event(line)
                    continue
                supervised = self.supervised(a.n)
                report = supervised.read()
                if "ended" in report or supervised.alive(report):
                    if not interrupted:
                        self.store.event(f"attempt {a.n} " + ("ended while no engine ran" if "ended" in report
                                                              else "runs on") + "; the resume records it")
                        continue
                    if keep or "ended" in report:
                        _say(f"attempt {a.n} " + ("has ended" if "ended" in report else
                                                  "keeps running (LABRUN_KEEP_EXPERIMENTS=on)")
                             + f"; `labrun resume {self.ws.root}` records it")
                        continue
                if interrupted:
                    _say(f"attempt {a.n} stopped; with LABRUN_KEEP_EXPERIMENTS=on, Ctrl-C leaves experiments running")
                for group in supervised.groups(report):
                    kill_group(group)
                if run.get("pgid") and identified(run["pgid"], run["started"]) is not None:  # an older labrun's
                    kill_group(run["pgid"])
                self.interrupt(a.n, run.get("task_run"), "the session was interrupted while this attempt ran")

    def interrupt(self, n: int, task_run: str | None, why: str) -> None:
        a = self.store.state.attempts[n - 1]
        with self.store.transaction():
            a.status = "INTERRUPTED"
            a.error = why
            a.pgid = None
            a.task_run = task_run or a.task_run
            self.store.event(f"attempt {a.n} marked INTERRUPTED ({why})")


def _say(line: str) -> None:
    """At the terminal (and in the run's log), as the engine stops."""
    logging.getLogger("labrun").warning(line)
