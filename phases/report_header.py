"""REPORT.md's header: the engine's own account of its checks of the results (the
reproduction, the sealed evaluation), written under the report's title when the
documentation phase completes, whatever the agent wrote. It stands between
`<!-- labrun:checks -->` markers; the numbers rule reads past it, and a new stamp replaces it.
"""

from __future__ import annotations

from labrun.evidence import ENGINE_BLOCK
from labrun.session import Session
from labrun.phases.reproduction import reproduction_lines
from labrun.phases.sealed_scoring import sealed_line


def report_header(session: Session) -> str:
    lines = ["<!-- labrun:checks -->", *reproduction_lines(session)]
    if (sealed := sealed_line(session)) is not None:
        lines += [">", sealed]
    lines = [" ".join(line.splitlines()) for line in lines]  # a metric's name cannot add a line of its own
    return "\n".join([*lines, "<!-- /labrun:checks -->"]) + "\n\n"


def stamp_report(session: Session) -> None:
    """REPORT.md begins with the engine's header (the documentation phase's engine step),
    after its title when it has one; an earlier header is replaced."""
    files = session.ws.files
    try:
        text = ENGINE_BLOCK.sub("", files.read_text("REPORT.md", errors="replace")).lstrip("\n")
    except (OSError, ValueError):  # none, or not a file the engine reads (a link, a FIFO, too big)
        return
    title, rest = (text.split("\n", 1) + [""])[:2] if text.startswith("# ") else ("", text)
    head = f"{title}\n\n" if title else ""
    session.ws.write("REPORT.md", head + report_header(session) + rest.lstrip("\n"))
