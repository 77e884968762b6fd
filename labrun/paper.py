"""Paper styles, and what the paper phase starts from.

A style is a folder `templates/paper_styles/<name>/`: `style.yaml` (a one-line
`description` and `notes` for the prompt) beside the files it puts into `paper/` when the
paper phase starts: `main.tex.j2` (rendered with the title and the author line) and any
style file of our own (`*.sty`). Every style compiles with Debian's `texlive-latex-base`
and `texlive-latex-recommended` alone: nothing is downloaded. `plain` (LaTeX's article
class) is the default; the venue-like ones only imitate a venue's layout and say so.

A session's style is fixed when it starts: `--paper-style`, else the idea's
`metadata.paper_style` (NeuriCo's own field), else `plain`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from labrun import latex, suggest
from labrun.agents.registry import stand_in
from labrun.resources import TEMPLATES

if TYPE_CHECKING:
    from labrun.session import Session

STYLES = TEMPLATES / "paper_styles"
DEFAULT_STYLE = "plain"
FOLDER = "paper"
MAIN = f"{FOLDER}/main.tex"
COMPILE = f"latexmk -pdf -interaction=nonstopmode -halt-on-error -file-line-error -cd {MAIN}"
RESULTS = f"{FOLDER}/labrun_results.tex"
"""The engine's file of results, which every style's main.tex inputs (`phases.report_header`
fills it from the records; until then it defines the commands, with no value)."""
RESULTS_COMMANDS = "\n".join([
    "% Written by labrun from its own records; an edit here is replaced.",
    r"\makeatletter",
    r"\newcommand{\labrunvalue}[1]{\@ifundefined{labrun@value@#1}{\textbf{??}}{\@nameuse{labrun@value@#1}}}",
    r"\newcommand{\labrunverdict}[1]{\@ifundefined{labrun@verdict@#1}{\textbf{??}}{\@nameuse{labrun@verdict@#1}}}",
    r"\makeatother", ""])
NO_RESULTS = "\\newcommand{\\labrunresults}{}\n"


@dataclass(frozen=True)
class PaperStyle:
    name: str
    description: str
    notes: str
    folder: Path

    @property
    def files(self) -> list[Path]:
        """The files it puts into `paper/`, `main.tex.j2` first."""
        found = sorted(p for p in self.folder.iterdir() if p.is_file() and p.name != "style.yaml")
        return sorted(found, key=lambda p: p.name != "main.tex.j2")


def style_names() -> list[str]:
    return sorted(p.name for p in STYLES.iterdir() if (p / "style.yaml").is_file())


def load_style(name: str) -> PaperStyle:
    """The style `name`; a ValueError that lists the styles when there is none."""
    folder = STYLES / name
    if not name or "/" in name or not (folder / "style.yaml").is_file():
        raise ValueError(suggest.unknown("paper style", name, style_names(), "styles"))
    meta = yaml.safe_load((folder / "style.yaml").read_text())
    return PaperStyle(name, meta["description"].strip(), (meta.get("notes") or "").strip(), folder)


def author_line(agent: str) -> str:
    if stand_in(agent):
        return "labrun's scripted agent (an offline stand-in for demos and tests, not research)"
    return f"An autonomous research agent (labrun, agent \\texttt{{{agent}}})"


def setup(session: "Session") -> dict[str, Any]:
    """Put the session's style into `paper/` (never over a file that is there already) and
    give the paper phase's templates what they need: the style, whether TeX is installed
    here, and the command that compiles the paper."""
    style = load_style(session.state.paper_style or DEFAULT_STYLE)
    files = session.ws.files  # the agent's folder: never through a link it planted
    for folder in ("sections", "figures"):
        try:
            os.close(files.mkdirs(f"{FOLDER}/{folder}"))
        except (OSError, ValueError):
            pass  # a link or a file there: the paper's rule says what is missing
    env = Environment(loader=FileSystemLoader(style.folder), undefined=StrictUndefined,
                      keep_trailing_newline=True, autoescape=False)
    installed = []
    for source in style.files:
        name = source.name.removesuffix(".j2")
        path = f"{FOLDER}/{name}"
        installed.append(path)
        text = env.get_template(source.name).render(title=tex_escape(session.idea.title),
                                                    author=author_line(session.state.agent)) \
            if source.suffix == ".j2" else source.read_bytes()
        try:
            if files.lstat(path) is None:
                files.write(path, text)
        except (OSError, ValueError):
            pass  # a link or a folder in the way: the paper's rule says what is missing
    try:
        if files.lstat(RESULTS) is None:
            files.write(RESULTS, RESULTS_COMMANDS + NO_RESULTS)
    except (OSError, ValueError):
        pass
    return {"paper_style": style, "style_files": installed, "tex": latex.toolchain(),
            "compile_command": COMPILE, "main": MAIN}


def tex_escape(text: str) -> str:
    """Plain text as LaTeX source (a title from an idea file)."""
    special = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
               "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}"}
    return "".join(special.get(c, c) for c in text)
