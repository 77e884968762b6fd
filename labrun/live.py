"""A running attempt as every view shows it while it runs (STATE.md, `labrun status`, the
terminal of `labrun run`, the Prefect UI): computed here, once, from what its task and its
supervisor wrote beside it in `.labrun/attempts/` and the last lines of its log.

The log is the agent's command's output: it is read beneath the workspace (no link followed),
its tail only, its lines redacted and their control characters escaped (`printable`: an
escape sequence recolours or retitles the terminal that shows STATE.md or `labrun status`).
In the UI they are untrusted Markdown still (`labrun.artifacts.shown`).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Literal

from labrun.commands import Supervised
from labrun.printable import printable
from labrun.secrets import redact
from labrun.workspace import Workspace
from labrun.wsfs import Refused

if TYPE_CHECKING:
    from labrun.state import Attempt

TAIL_LINES = 5
TAIL_BYTES = 8 << 10
"""How much of a log's end is read for its last lines."""
LINE_CHARS = 240
"""A log line longer than this is cut (a progress bar drawn on one line for an hour)."""
Stage = Literal["waiting", "starting", "running", "ended", "gone"]


@dataclass
class Live:
    """Attempt `n` while its record says RUNNING."""

    n: int
    stage: Stage
    """`waiting` for what it needs (GPUs) before its supervisor starts; `starting`: its
    supervisor started, its command not yet; `running`; `ended`: its supervisor reported the
    end, which the engine has not recorded yet; `gone`: its supervisor ended without a report
    of the end (the resume marks it INTERRUPTED)."""
    started: float | None = None
    """When its command started (epoch s), as its supervisor reports it."""
    elapsed_s: float | None = None
    """How long its command has run (its whole duration once it `ended`)."""
    gpus: list[str] = field(default_factory=list)
    waiting: str | None = None
    """What it waits for, in words, while it is `waiting`."""
    tail: list[str] = field(default_factory=list)
    """The last lines of its log, redacted, control characters escaped."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def live(ws: Workspace, attempt: Attempt, now: float | None = None) -> Live:
    """What `attempt` shows while it runs, as of `now` (epoch s)."""
    n = attempt.n
    report = _json(ws, ws.attempt_file(n, "supervisor"))
    run = _json(ws, ws.attempt_file(n, "run"))  # its GPUs, once its task holds them, before they are recorded
    gpus = attempt.gpus or [str(g) for g in run.get("gpus") or []]
    view = Live(n=n, stage="waiting", gpus=gpus, tail=tail(ws, attempt.log) if attempt.log else [])
    if not report:
        waiting = run.get("waiting")
        view.waiting = printable(redact(str(waiting))) if waiting else None
        return view
    view.started = report.get("started")
    if "ended" in report:
        view.stage, view.elapsed_s = "ended", report.get("duration_s")
    elif not Supervised(lambda: report).alive(report):
        view.stage = "gone"
    elif view.started is None:
        view.stage = "starting"
    else:
        view.stage = "running"
        view.elapsed_s = max(0.0, (time.time() if now is None else now) - view.started)
    return view


def running(ws: Workspace, attempts: Iterable[Attempt], now: float | None = None) -> list[Live]:
    """The live view of each of `attempts` that is RUNNING, in order."""
    return [live(ws, a, now) for a in attempts if a.status == "RUNNING"]


def tail(ws: Workspace, log: str, lines: int = TAIL_LINES) -> list[str]:
    """The last `lines` lines of the log at `log` (relative to the workspace), as a terminal
    would have left them (a line drawn over with `\\r` shows its last drawing), redacted, their
    control characters escaped; none when it cannot be read, or is a link."""
    try:
        fd = ws.files.open_file(log)
    except (OSError, Refused):
        return []
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - TAIL_BYTES)
        data = os.pread(fd, TAIL_BYTES, start)
    finally:
        os.close(fd)
    text = data.decode("utf-8", errors="replace")
    if start:  # the first line is cut (redaction cannot know a secret it holds only the end of)
        cut = re.split(r"[\r\n]", text, maxsplit=1)
        text = cut[1] if len(cut) > 1 else ""
    shown = []
    for line in redact(text).split("\n"):
        drawn = [part for part in line.split("\r") if part.strip()][-1:]  # what a terminal left of it
        shown += [printable(part) for d in drawn for part in d.splitlines() if part.strip()]
    return [line if len(line) <= LINE_CHARS else line[:LINE_CHARS - 1] + "…" for line in shown[-lines:]]


def _json(ws: Workspace, path) -> dict[str, Any]:
    """An engine record beside the attempt, read beneath the workspace; {} when there is none
    (or a link stands in its place)."""
    try:
        data = json.loads(ws.files.read_text(path))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
