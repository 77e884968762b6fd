"""What the commands share: the consoles, the one-line error, the defaults named in `--help`
and the check of the optional phases."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

console = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

from labrun.agents.registry import DEFAULT_AGENT  # noqa: F401  (named in --help)


STYLES = {"DONE": "green", "SUCCESS": "green", "REPRODUCED": "green", "SCORED": "green", "finished": "green",
          "complete": "green", "FAILED": "red", "TIMEOUT": "red", "DIVERGED": "red", "REFUSED": "red",
          "stopped": "red", "INTERRUPTED": "yellow", "SKIPPED": "yellow", "IN PROGRESS": "cyan",
          "RUNNING": "cyan", "PENDING": "dim"}
"""How a status reads at a terminal: done green, failed red, cut short yellow, running cyan."""


def styled(status: str) -> str:
    """`status` in rich markup, coloured by what it means."""
    colour = STYLES.get(status)
    return f"[{colour}]{status}[/{colour}]" if colour else status


def labrun_command() -> str:
    """labrun as the user can type it: `labrun` when that is on PATH, else the path they ran
    (`.venv/bin/labrun` after the README's quick start)."""
    import shutil
    import sys

    ran = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if ran is None or ran.name != "labrun":
        return "labrun"  # python -m labrun.cli, or a test
    found = shutil.which("labrun")
    if found and ran.exists() and Path(found).resolve() == ran.resolve():
        return "labrun"
    return str(ran)


class CliError(Exception):
    """A one-line message for the user; `code` is the exit status."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def phase_options(with_text: str, paper_style: str | None, asked=None) -> list[str]:
    """`--with` and `--paper-style` (of `run` and `queue`), checked: the optional phases named.
    `asked`: those the idea asks for (None: not known yet, so a style is not checked against
    the paper phase)."""
    from labrun.paper import load_style
    from labrun.phase_registry import phase_list

    with_phases = [p.strip() for p in with_text.split(",") if p.strip()]
    try:
        keys = phase_list([*with_phases, *(asked or ())])
    except ValueError as e:
        raise CliError(f"--with: {e}") from None
    if paper_style is not None:
        try:
            load_style(paper_style)
        except ValueError as e:
            raise CliError(f"--paper-style: {e}") from None
        if asked is not None and "paper" not in keys:
            raise CliError("--paper-style: this session has no paper phase; add --with paper")
    return with_phases
