"""What the Prefect UI shows of a session: STATE.md, the attempts, the progress across its
phases, tokens and cost, and its verdict, as artifacts of the session's flow run.

Each artifact has a fixed key per session (`labrun-<idea's title>-<session id>-state`, `-attempts`,
`-progress`, `-usage`, `-verdict`), so the UI's Artifacts page keeps a version per run of the session
(a resume, a retry from the UI); within a run that version is updated in place.

Publishing costs the engine nothing: a background thread follows state.json, whichever
process saves it (the engine's, or its phase task's wherever that runs), reads the
session's files (state.json and STATE.md are written atomically, journals are append-only)
and sends what changed, at most once per interval, and once more when the run ends. A server that does not answer never stops a session: the
artifacts just stop updating, with a warning in the log. Every string is redacted.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from typing import Any
from uuid import UUID

from labrun.idea import slugify
from labrun.secrets import redact
from labrun.session import Session
from labrun.settings import settings
from labrun.state import state_md_text
from labrun.status import session_status

log = logging.getLogger("labrun")

CELL_CHARS = 300
ATTEMPT_COLUMNS = ("attempt", "phase", "status", "command", "exit code", "duration (s)",
                   "error", "fix applied", "metrics", "engine's rerun")
USAGE_COLUMNS = ("phase", "status", "runs", "input", "output", "cache read", "cache write", "USD")
"""Short headings (tokens, but for the cost), so that the table fits the UI's width."""


def artifact_key(title: str, session_id: str, kind: str) -> str:
    """`labrun-<idea's title>-<session>-<kind>`: the UI's artifact cards say which idea each
    is of. Keys allow lowercase letters, digits and dashes; session ids are hex."""
    return f"labrun-{slugify(title, 32)}-{session_id}-{kind}"


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    text = redact(value if isinstance(value, str) else str(value))
    return text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 1] + "…"


def attempts_table(report: dict[str, Any]) -> dict[str, list[Any]]:
    """Columns → values, so that the columns show even before the first attempt."""
    table: dict[str, list[Any]] = {c: [] for c in ATTEMPT_COLUMNS}
    for a in report["attempts"]:
        metrics = ", ".join(f"{k}={v}" for k, v in (a["metrics"] or {}).items())
        rerun = a["reproduction"]
        row = (a["n"], a["phase"], a["status"], a["command"], a["exit_code"], a["duration_s"],
               a["error"], a["fix_applied"], metrics, f"{rerun['status']}: {rerun['detail']}" if rerun else None)
        for column, value in zip(ATTEMPT_COLUMNS, row):
            table[column].append(_cell(value))
    return table


def usage_table(report: dict[str, Any]) -> dict[str, list[Any]]:
    table: dict[str, list[Any]] = {c: [] for c in USAGE_COLUMNS}
    rows = [(p["key"], p["status"], p["runs"], p["usage"]) for p in report["phases"]]
    rows.append(("session", "complete" if report["session"]["complete"] else "", "", report["usage"]))
    for key, status, runs, u in rows:
        values = (key, status, runs, u["input_tokens"], u["output_tokens"],
                  u["cache_read_input_tokens"], u["cache_creation_input_tokens"],
                  round(u["cost_usd"], 6))
        for column, value in zip(USAGE_COLUMNS, values):
            table[column].append(_cell(value))
    return table


def _md(text: Any) -> str:
    """Text in one cell of a Markdown table, redacted."""
    return " ".join(redact("—" if text is None else str(text)).split()).replace("|", "\\|")


def verdict_markdown(report: dict[str, Any]) -> str:
    """The session's verdict (`labrun.verdicts`): its line, each criterion's verdict and each
    claim's standing."""
    v = report["verdict"]
    so_far = "" if report["session"]["complete"] else " so far"
    lines = [f"**Verdict{so_far}:** {_md(v['line'])}", ""]
    if v["verdicts"]:
        lines += ["| criterion | verdict | decided by | basis |", "|---|---|---|---|"]
        lines += [f"| {c['id']}: {_md(c['text'])} | **{c['verdict']}** | {_md(c['by'])} | {_md(c['basis'])} |"
                  for c in v["verdicts"]]
    if v["claims"]:
        lines += ["", "| claim | value in the record | standing |", "|---|---|---|"]
        lines += [f"| {_md(c['id'])}: {_md(c['statement'])} | {_md(c['metric'])} = {_md(c['value'])} "
                  f"| {_md(c['standing'])} |" for c in v["claims"]]
    return "\n".join(lines) + "\n"


def progress(report: dict[str, Any]) -> float:
    """Per cent of the session's phases done."""
    phases = report["phases"]
    return round(100.0 * sum(p["status"] == "DONE" for p in phases) / len(phases), 1)


class SessionArtifacts:
    """Publishes one session's artifacts while a flow run works on it."""

    def __init__(self, session: Session, interval_s: float | None = None):
        self.session = session
        self.ws = session.ws
        self.session_id = session.state.session_id
        self.title = session.state.title
        self.interval_s = settings().artifacts_interval_s if interval_s is None else interval_s
        self.ids: dict[str, UUID] = {}
        self.sent: dict[str, Any] = {}
        self.publishes = 0
        self._stop = threading.Event()
        self._send_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._broken = False

    @classmethod
    def attach(cls, session: Session, interval_s: float | None = None) -> "SessionArtifacts":
        """Create the artifacts for this run (call it inside the flow run) and follow every
        save of the session's state."""
        publisher = cls(session, interval_s)
        publisher.start()
        return publisher

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        try:
            self._create()
        except Exception as e:  # the UI's view is never worth a session
            self._give_up(e)
            return
        run = contextvars.copy_context()  # the thread talks to the same API
        self._thread = threading.Thread(target=run.run, args=(self._loop,), daemon=True,
                                        name=f"labrun-artifacts-{self.session_id}")
        self._thread.start()

    def close(self) -> None:
        """Stop following the session, after sending its final state."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            if self._thread.is_alive():
                return
        self.flush()

    def flush(self) -> None:
        if self._broken:
            return
        try:
            self._update()
        except Exception as e:
            self._give_up(e)

    # -- publishing ------------------------------------------------------------------------

    def _loop(self) -> None:
        sent = self.ws.state_identity()
        while not self._stop.wait(self.interval_s):
            if (now := self.ws.state_identity()) == sent:
                continue
            sent = now
            self.flush()
            if self._broken:
                return

    def views(self) -> dict[str, Any]:
        report = session_status(self.ws.root)
        return {
            "state": redact(state_md_text(self.ws)),
            "attempts": attempts_table(report),
            "progress": progress(report),
            "usage": usage_table(report),
            "verdict": verdict_markdown(report),
        }

    def _create(self) -> None:
        from prefect.artifacts import (
            create_markdown_artifact,
            create_progress_artifact,
            create_table_artifact,
        )

        views = self.views()
        title = redact(self.title)
        sid = self.session_id
        made = {
            "state": (create_markdown_artifact, f"STATE.md of the labrun session {sid}: {title}"),
            "progress": (create_progress_artifact, f"Phases done, of {len(self.session.phases)}: session {sid}"),
            "attempts": (create_table_artifact, f"Experiment attempts of session {sid}"),
            "usage": (create_table_artifact, f"Tokens and cost per phase of session {sid}"),
            "verdict": (create_markdown_artifact, f"Criteria met and results reproduced: session {sid}: {title}"),
        }
        with self._send_lock:
            for kind, (create, description) in made.items():
                self.ids[kind] = create(views[kind], key=artifact_key(title, sid, kind), description=description)
            self.sent = views
            self.publishes += 1

    def _update(self) -> None:
        from prefect.artifacts import MarkdownArtifact, ProgressArtifact, TableArtifact
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import ArtifactUpdate

        views = self.views()
        changed = {k: v for k, v in views.items() if self.sent.get(k) != v}
        if not changed:
            return
        formats = {
            "state": lambda v: MarkdownArtifact(markdown=v).format(),
            "progress": lambda v: ProgressArtifact(progress=v).format(),
            "attempts": lambda v: TableArtifact(table=v).format(),
            "usage": lambda v: TableArtifact(table=v).format(),
            "verdict": lambda v: MarkdownArtifact(markdown=v).format(),
        }
        with self._send_lock, get_client(sync_client=True) as client:
            for kind, value in changed.items():
                client.update_artifact(self.ids[kind], ArtifactUpdate(data=formats[kind](value)))
                self.sent[kind] = value
            self.publishes += 1

    def _give_up(self, error: Exception) -> None:
        self._broken = True
        log.warning("the Prefect UI's artifacts of session %s stopped updating: %s",
                    self.session_id, redact(str(error).splitlines()[0] if str(error) else type(error).__name__))
