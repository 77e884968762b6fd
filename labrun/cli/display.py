"""What a session shows in the terminal while it runs, and the summary it ends with.

The engine logs one line per event and per turn (logger `labrun`). At a terminal each line is
coloured by what it says, under a spinner line naming the phase (N of M), the turn and what
runs now: the model's turn, an attempt, the engine's rerun; below it, a line per running
attempt (how long it has run, its GPUs, its log's last line), read again every few seconds
from the workspace, whichever process runs the attempt. Elsewhere (a pipe, a file, CI) they
are the same lines, plain and timestamped, and nothing redraws.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Callable

from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from labrun.cli.common import labrun_command, styled
from labrun.printable import printable

PHASE = re.compile(r"^phase (\d+ of \d+) (\S+) (?:started|resumed at turn (\d+))")
TURN = re.compile(r"^(\S+) · turn (\d+) · ")
ATTEMPT_STARTED = re.compile(r"^attempt (\d+) started: (.*)")
ENGINE_RERUN = re.compile(r"^attempt (\d+): the engine reruns it")
OUTCOME = re.compile(r"\b(SUCCESS|FAILED|TIMEOUT|INTERRUPTED|REPRODUCED|DIVERGED|SKIPPED|finished|complete)\b")


class SessionDisplay(logging.Handler):
    """Engine events and turns on `console` (stderr), one line each."""

    def __init__(self, console: Console, workspace: str | None = None):
        super().__init__()
        self.console = console
        self.doing = Doing(workspace)
        self.spinner = console.status(self.doing, spinner="dots") if console.is_terminal else None
        self.phase = ""
        self.started = False

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        if record.levelno >= logging.WARNING:
            line = f"[yellow]{escape(text)}[/yellow]"
        else:
            line = OUTCOME.sub(lambda m: styled(m.group(1)), escape(text), count=1)
        self.console.print(f"[dim]{stamp}[/dim] {line}")
        if self.spinner is not None:
            self._follow(text)

    def _follow(self, text: str) -> None:
        """The spinner's line: where the session is and what runs now."""
        if m := PHASE.match(text):
            self.phase = f"phase {m.group(1)} · {m.group(2)}"
            doing = f"the model's turn {m.group(3) or 1}"
        elif m := TURN.match(text):
            doing = f"the model's turn {int(m.group(2)) + 1}"
        elif m := ATTEMPT_STARTED.match(text):
            command = m.group(2)
            doing = f"attempt {m.group(1)}: {command[:70]}{'…' if len(command) > 70 else ''}"
        elif m := ENGINE_RERUN.match(text):
            doing = f"the engine's rerun of attempt {m.group(1)}"
        elif text == "session complete":
            self.close()
            return
        else:
            return
        if not self.started:
            self.spinner.start()
            self.started = True
        self.doing.text = f"{self.phase} · {doing}" if self.phase else doing

    def close(self) -> None:
        if self.spinner is not None and self.started:
            self.spinner.stop()
            self.started = False
        super().close()


class Doing:
    """The spinner's text: what runs now, then a line per running attempt of the session in
    `workspace`, read again at most every `every_s` (the spinner redraws many times a second)."""

    def __init__(self, workspace: str | None, every_s: float = 2.0):
        self.text = "starting"
        self.workspace = workspace
        self.every_s = every_s
        self._read_at = float("-inf")
        self._lines: list[str] = []

    def __rich__(self) -> Group:
        if self.workspace is not None and time.monotonic() - self._read_at >= self.every_s:
            self._read_at = time.monotonic()
            self._lines = running_lines(Path(self.workspace))
        return Group(Text(printable(self.text), no_wrap=True, overflow="ellipsis"),
                     *(Text(line, no_wrap=True, overflow="ellipsis") for line in self._lines))


def running_lines(root: Path) -> list[str]:
    """`attempt 3: running 2 min · GPU 0 · <its log's last line>` for each running attempt,
    control characters escaped; none while the session cannot be read (not started yet)."""
    from labrun.state import load_state
    from labrun.status import running_attempts
    from labrun.workspace import Workspace

    ws = Workspace(root)
    try:
        state, _ = load_state(ws)
    except Exception:  # no session yet, or its state being repaired: the next look shows it
        return []
    return [printable(f"attempt {a['n']}: {a['line']}" + (f" · {a['tail'][-1]}" if a["tail"] else ""))
            for a in running_attempts(ws, state)]


def summary(workspace: str) -> str:
    """The closing lines of a run: the phases, attempts, time, tokens, cost, the verdict
    (`labrun.verdicts`) and what to read."""
    from labrun.status import session_status

    report = session_status(Path(workspace))
    s, clock, usage = report["session"], report["session"]["clock"], report["usage"]
    done = sum(p["status"] == "DONE" for p in report["phases"])
    attempts = report["attempts"]
    failed = sum(a["status"] == "FAILED" for a in attempts)
    minutes = clock["elapsed_s"] / 60
    tokens = sum(v for k, v in usage.items() if k.endswith("tokens"))
    review = s.get("awaiting_review")
    head = styled("complete") if s["complete"] else ("awaits review" if review else styled("stopped"))
    lines = [f"[bold]Session {head}[/bold] · phases {done} of {len(report['phases'])} done · "
             f"attempts {len(attempts)} ({failed} failed) · {minutes:.1f} min · {tokens:,} tokens · "
             f"${usage['cost_usd']:.4f}"]
    lines.append(f"Verdict{'' if s['complete'] else ' so far'}: {escape(report['verdict']['line'])}")
    if s["complete"]:
        lines.append(f"Read {escape(workspace)}/REPORT.md; `{labrun_command()} status {escape(workspace)}` "
                     "shows the phases and attempts.")
    elif review and review["decision"] is None:
        files = ", ".join(review["outputs"][:8]) or "no files"
        command = f"{labrun_command()} review {escape(workspace)}"
        lines.append(f"Phase {review['phase']} awaits your review. It wrote: {escape(files)}.\n"
                     f"`{command}` shows what to read; then `{command} --approve` (--comment TEXT), "
                     "`--revise TEXT` or `--stop`.")
    elif stop := s.get("stopped_by_review"):
        lines.append(f"{escape(stop['reviewer'] or 'The reviewer')} stopped the session after phase {stop['phase']}.")
    return "\n".join(lines)


def fitted_table(headers: tuple[str, ...], rows: list[tuple[str, ...]], width: int, flexible: tuple[int, ...],
                 styles: dict[int, Callable[[str], str]] | None = None) -> Table:
    """A table of one line per row in `width` columns: the columns not in `flexible` keep their
    text's width, the `flexible` ones share what is left and are cut with an ellipsis (rich
    alone wraps them into a tall column of words, or squeezes every column). `rows` hold
    plain text; `styles` maps a column to a function giving a cell's markup."""
    natural = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    fixed = sum(n for i, n in enumerate(natural) if i not in flexible)
    left = max(width - 3 * len(headers) - 1 - fixed, 8 * len(flexible))  # 3: a border and padding each
    widths: dict[int, int] = {}
    for k, i in enumerate(flexible):  # each takes what it needs, up to an even share of what is left
        share = left // (len(flexible) - k)
        later = sum(natural[j] for j in flexible[k + 1:])
        widths[i] = max(min(natural[i], max(share, left - later)), len(headers[i]), 1)
        left -= widths[i]
    table = Table()
    for i, header in enumerate(headers):
        table.add_column(header, no_wrap=True, overflow="ellipsis", width=widths.get(i))
    style = styles or {}
    for row in rows:
        table.add_row(*(style[i](cell) if i in style else escape(cell) for i, cell in enumerate(row)))
    return table
