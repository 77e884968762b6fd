"""What the Prefect UI shows of a session: STATE.md, the attempts, the progress across its
phases, tokens and cost, its verdict, REPORT.md and its figures, as artifacts of the session's
flow run (and, while a phase awaits review, what the reviewer reads: `publish_markdown`).

Each artifact has a fixed key per session (`labrun-<idea's title>-<session id>-state`, `-attempts`,
`-progress`, `-usage`, `-verdict`, `-report`, `-figures`, `-review`), and a flow run has one
version of each, updated in place: a retry of the run, or its resume after a review, updates
the version the run made before (`publish`), so the run's Artifacts tab shows each once. Another
flow run of the session (a `labrun resume` in a terminal) makes a version of its own; the UI's
Artifacts page shows the latest.

Figures are the images the session's phases wrote (PNG, JPEG, GIF, WebP, SVG), their bytes
redacted, embedded as `data:` URIs, which the UI's Markdown shows (a path in the workspace means
nothing to a browser).

What the agent wrote is untrusted Markdown (`untrusted_markdown`): a browser showing it must
fetch nothing the agent chose (an image at `https://attacker/?d=<secret>` would carry data past
every network rule of the session), so no image but the engine's own figures is shown, raw
HTML is shown as text and link targets as text. Every payload and description sent passes
`shown`, whichever view made it.

Publishing costs the engine nothing: a background thread follows state.json, whichever
process saves it (the engine's, or its phase task's wherever that runs), reads the
session's files (state.json and STATE.md are written atomically, journals are append-only;
the agent's files through `labrun.wsfs`, no link followed) and sends what changed, at most
once per interval, and once more when the run ends. A server that does not answer never stops
a session: the artifacts just stop updating, with a warning in the log.
"""

from __future__ import annotations

import base64
import contextvars
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any
from uuid import UUID

from labrun.idea import slugify
from labrun.secrets import redact, redact_bytes, redact_data
from labrun.session import Session
from labrun.settings import settings
from labrun.state import LIVE_INTERVAL_S, state_md_text
from labrun.status import session_status
from labrun.wsfs import Beneath, Refused

log = logging.getLogger("labrun")

CELL_CHARS = 300
ATTEMPT_COLUMNS = ("attempt", "phase", "status", "command", "exit code", "duration (s)",
                   "error", "fix applied", "metrics", "engine's rerun", "running now")
"""`running now`: a running attempt's time, GPUs and its log's last line (`labrun.live`)."""
USAGE_COLUMNS = ("phase", "status", "runs", "input", "output", "cache read", "cache write", "USD")
"""Short headings (tokens, but for the cost), so that the table fits the UI's width."""
FIGURE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
                ".webp": "image/webp", ".svg": "image/svg+xml"}
"""The images a browser shows from a `data:` URI, by suffix."""
FIGURE_BYTES = 1 << 20
"""A figure larger than this is named, not shown: the artifact travels whole at each update."""
FIGURES_BYTES = 4 << 20
REPORT_BYTES = 1 << 20
LOCAL_IMAGE = re.compile(r"!\[([^\]]*)\]\((?![a-zA-Z][a-zA-Z0-9+.-]*:)([^)\s]+)[^)]*\)")
"""An image of a Markdown text linked by its path in the workspace."""
IMAGE = re.compile(r"!\[([^\]]*)\]\(\s*<?([^)\s>]*)>?[^)]*\)")
LINK = re.compile(r"\[([^\]]*)\]\(\s*<?([^)\s>]*)>?[^)]*\)")
LINK_DEFINITION = re.compile(r"^( {0,3})\[(?=[^\]]+\]:)", re.MULTILINE)
"""`[name]: URL`, which `![name]` would show as an image."""
HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
HTML_START = re.compile(r"<(?=[A-Za-z/!?])")
"""What opens a tag, a comment, a declaration or an autolink; `a < b` and `x<5` are left."""
ENGINE_FIGURE = re.compile(r"!\[([^\]]*)\]\((data:image/[a-z+]+;base64,[A-Za-z0-9+/=]*)\)")
URL_CHARS = 120


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
    running = {r["n"]: " · ".join([r["line"], *r["tail"][-1:]]) for r in report["running"]}
    for a in report["attempts"]:
        metrics = ", ".join(f"{k}={v}" for k, v in (a["metrics"] or {}).items())
        rerun = a["reproduction"]
        row = (a["n"], a["phase"], a["status"], a["command"], a["exit_code"], a["duration_s"],
               a["error"], a["fix_applied"], metrics, f"{rerun['status']}: {rerun['detail']}" if rerun else None,
               running.get(a["n"]))
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


def _url(url: str) -> str:
    return url if len(url) <= URL_CHARS else url[: URL_CHARS - 1] + "…"


def untrusted_markdown(text: str, engine_figures: bool = False) -> str:
    """Markdown the agent wrote (or holding what it chose), made safe for a browser to show:
    every image becomes a line naming it, link targets are shown as text, raw HTML is shown
    as text (an HTML comment, shown as nothing, is dropped). `engine_figures`: the figures
    view, whose `data:` images (bytes the engine read and redacted) stay. Code blocks are
    treated alike: telling where one truly ends takes a full parser, and a wrong guess would
    let an image through."""
    kept: list[str] = []
    if engine_figures:  # set aside, so the passes below cannot touch them
        def keep(m: re.Match[str]) -> str:
            kept.append(m[0])
            return f"\0{len(kept) - 1}\0"
        text = ENGINE_FIGURE.sub(keep, text.replace("\0", ""))
    text = IMAGE.sub(lambda m: f"*(image `{_url(m[2])}`: not shown)*", text)
    text = LINK.sub(lambda m: f"{m[1]} (`{_url(m[2])}`)" if m[2] else m[1], text)
    text = HTML_START.sub("&lt;", HTML_COMMENT.sub("", text))
    text = LINK_DEFINITION.sub(r"\1\\[", text)
    text = text.replace("![", "!\\[")  # what the patterns above missed: a reference, a nested bracket
    return re.sub(r"\0(\d+)\0", lambda m: kept[int(m[1])], text) if kept else text


def shown(artifact, kind: str) -> tuple[Any, str | None]:
    """What is sent of `artifact` (a `prefect.artifacts.Artifact` of the view `kind`): its
    data and description, redacted, Markdown made safe (`untrusted_markdown`). Every view
    passes here, the engine's own text too: it quotes the agent's."""
    description = untrusted_markdown(redact(artifact.description)) if artifact.description else artifact.description
    if artifact.type == "markdown":
        artifact = artifact.model_copy(update={"markdown": untrusted_markdown(redact(artifact.markdown),
                                                                              engine_figures=kind == "figures")})
    elif artifact.type == "table":
        artifact = artifact.model_copy(update={"table": redact_data(artifact.table)})
    return artifact.format(), description


def read_agent_text(root: Path, rel: str, limit: int = REPORT_BYTES) -> str | None:
    """A file the agent wrote, as the workspace holds it (no link followed), redacted; one
    line in italics when it cannot be read; None when it is not there."""
    try:
        return redact(Beneath(root).read_text(rel, errors="replace", limit=limit))
    except FileNotFoundError:
        return None
    except (Refused, OSError) as e:
        return f"*{_md(e)}*"


def report_markdown(root: Path) -> str:
    """REPORT.md, the engine's results section in it; an image it links by its path in the
    workspace is named instead (the figures artifact shows it), any other as `shown` names it."""
    text = read_agent_text(root, "REPORT.md")
    if text is None:
        return "*No REPORT.md yet: the documentation phase writes it.*\n"
    return LOCAL_IMAGE.sub(lambda m: f"*(figure `{m[2]}`: in the session's figures artifact)*", text)


def figures(ws, phases) -> list[str]:
    """The images the session's phases wrote, in phase order."""
    found: dict[str, None] = {}
    for phase in phases:
        for rel in (ws.manifest(phase.key) or {}).get("files", {}):
            if Path(rel).suffix.lower() in FIGURE_TYPES:
                found[rel] = None
    return list(found)


def figures_markdown(root: Path, paths: list[str]) -> str:
    """Each figure under its path, shown from a `data:` URI (the UI's Markdown shows those;
    an image is only ever linked by URL), while they fit FIGURES_BYTES."""
    if not paths:
        return "*No figures yet: the images the phases write (PNG, JPEG, GIF, WebP, SVG) show here.*\n"
    parts, left = [], FIGURES_BYTES
    for rel in paths:
        try:
            data = Beneath(root).read_bytes(rel, FIGURE_BYTES)
        except FileNotFoundError:
            parts.append(f"- `{_md(rel)}`: no longer in the workspace")
            continue
        except (Refused, OSError) as e:
            parts.append(f"- `{_md(rel)}`: not shown: {_md(e)}")
            continue
        if len(data) > left:
            parts.append(f"- `{_md(rel)}`: not shown: the figures above take what an artifact holds; "
                         "it is in the workspace")
            continue
        left -= len(data)
        clean = redact_bytes(data)
        note = "\n\n*Secrets redacted from its bytes: it may not display.*" if clean != data else ""
        uri = f"data:{FIGURE_TYPES[Path(rel).suffix.lower()]};base64,{base64.b64encode(clean).decode()}"
        parts.append(f"### {_md(rel)}{note}\n\n![{_md(rel).replace(']', '')}]({uri})\n")
    return "\n".join(parts) + "\n"


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
        self.running = False
        """Whether an attempt ran when the views were last read."""

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
        """Sends what changed once state.json did, and every LIVE_INTERVAL_S while an attempt
        runs (its time and its log's last lines change with no save)."""
        sent, live_at = self.ws.state_identity(), time.monotonic()
        while not self._stop.wait(self.interval_s):
            now = self.ws.state_identity()
            if now == sent and not (self.running and time.monotonic() - live_at >= LIVE_INTERVAL_S):
                continue
            sent, live_at = now, time.monotonic()
            self.flush()
            if self._broken:
                return

    def views(self) -> dict[str, Any]:
        report = session_status(self.ws.root)
        self.running = bool(report["running"])
        return {
            "state": redact(state_md_text(self.ws)),
            "attempts": attempts_table(report),
            "progress": progress(report),
            "usage": usage_table(report),
            "verdict": verdict_markdown(report),
            "report": report_markdown(self.ws.root),
            "figures": figures_markdown(self.ws.root, figures(self.ws, self.session.phases)),
        }

    def _artifact(self, kind: str, value: Any):
        from prefect.artifacts import MarkdownArtifact, ProgressArtifact, TableArtifact

        sid, title = self.session_id, redact(self.title)
        made = {
            "state": (MarkdownArtifact, "markdown", f"STATE.md of the labrun session {sid}: {title}"),
            "progress": (ProgressArtifact, "progress", f"Phases done, of {len(self.session.phases)}: session {sid}"),
            "attempts": (TableArtifact, "table", f"Experiment attempts of session {sid}"),
            "usage": (TableArtifact, "table", f"Tokens and cost per phase of session {sid}"),
            "verdict": (MarkdownArtifact, "markdown", f"Criteria met and results reproduced: session {sid}: {title}"),
            "report": (MarkdownArtifact, "markdown", f"REPORT.md of session {sid}, with the engine's results section: {title}"),
            "figures": (MarkdownArtifact, "markdown", f"The figures the phases of session {sid} wrote: {title}"),
        }
        cls, field, description = made[kind]
        return cls(key=artifact_key(self.title, sid, kind), description=description, **{field: value})

    def _create(self) -> None:
        from prefect.client.orchestration import get_client

        views = self.views()
        with self._send_lock, get_client(sync_client=True) as client:
            for kind, value in views.items():
                self.ids[kind] = publish(client, self._artifact(kind, value), kind)
            self.sent = views
            self.publishes += 1

    def _update(self) -> None:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import ArtifactUpdate

        views = self.views()
        changed = {k: v for k, v in views.items() if self.sent.get(k) != v}
        if not changed:
            return
        with self._send_lock, get_client(sync_client=True) as client:
            for kind, value in changed.items():
                data, _ = shown(self._artifact(kind, value), kind)
                client.update_artifact(self.ids[kind], ArtifactUpdate(data=data))
                self.sent[kind] = value
            self.publishes += 1

    def _give_up(self, error: Exception) -> None:
        self._broken = True
        log.warning("the Prefect UI's artifacts of session %s stopped updating: %s",
                    self.session_id, redact(str(error).splitlines()[0] if str(error) else type(error).__name__))


def publish(client, artifact, kind: str) -> UUID:
    """`artifact` (a `prefect.artifacts.Artifact` with its key, of the view `kind`) in this
    flow run, once, as `shown`: the version the run made before (a retry, or the resume after
    a review, runs the same flow run again) updated in place, else a new one. Prefect's
    `create_*_artifact` would add a version at every run, each shown on the run's Artifacts tab."""
    from prefect.client.schemas.actions import ArtifactCreate, ArtifactUpdate
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    run = ctx.flow_run.id if ctx and ctx.flow_run else None
    data, description = shown(artifact, kind)
    if run is not None:
        made = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[artifact.key]),
                                           flow_run_id=ArtifactFilterFlowRunId(any_=[run])),
            sort=ArtifactSort.CREATED_DESC, limit=1)
        if made:
            client.update_artifact(made[0].id, ArtifactUpdate(data=data, description=description))
            return made[0].id
    return client.create_artifact(ArtifactCreate(type=artifact.type, key=artifact.key, description=description,
                                                 flow_run_id=run, data=data)).id


def publish_markdown(title: str, session_id: str, kind: str, markdown: str, description: str) -> UUID | None:
    """One more Markdown artifact of the session in this flow run (`publish`); None, with a
    warning, when the server does not take it."""
    from prefect.artifacts import MarkdownArtifact
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            return publish(client, MarkdownArtifact(key=artifact_key(title, session_id, kind), markdown=markdown,
                                                    description=description), kind)
    except Exception as e:  # the UI's view is never worth a session
        log.warning("the Prefect UI's %s artifact of session %s was not published: %s", kind, session_id,
                    redact(str(e).splitlines()[0] if str(e) else type(e).__name__))
        return None


def artifact_url(artifact_id: UUID) -> str | None:
    """The artifact's page in the Prefect UI (Prefect's `url_for` knows no artifact)."""
    from prefect.settings import get_current_settings

    ui = get_current_settings().ui_url
    return f"{ui.rstrip('/')}/artifacts/artifact/{artifact_id}" if ui else None
