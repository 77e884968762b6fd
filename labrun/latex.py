"""Reading a LaTeX paper's source the way its completion rule needs: the files it inputs,
and the figures and citation keys it uses (the numbers it states: `labrun.prose_numbers`).

This is not a TeX parser. It reads what a paper written from a template uses (`\\input`,
`\\includegraphics`, `\\cite...`, BibTeX entries), leaving out comments.
"""

from __future__ import annotations

import os
import re
import shutil

COMMENT = re.compile(r"(?<!\\)%.*$", re.M)
INPUT = re.compile(r"\\(?:input|include)\s*\{([^}]+)\}")
GRAPHICS = re.compile(r"\\includegraphics\s*(?:\[[^\]]*\])?\s*\{([^}]+)\}")
CITE = re.compile(r"\\(?:no)?cite[a-zA-Z]*\*?\s*(?:\[[^\]]*\]\s*){0,2}\{([^}]+)\}")
BIB_ENTRY = re.compile(r"@\s*(?!comment|string|preamble)[a-zA-Z]+\s*[{(]\s*([^,\s]+)\s*,", re.I)
# Commands whose arguments are names, lengths or code, never claims: they are dropped.
def toolchain() -> str | None:
    """The path of `latexmk`, when it and `pdflatex` are on the PATH that agent commands
    get (the engine's own); None when TeX is not installed here."""
    path = os.environ.get("PATH", os.defpath)
    latexmk = shutil.which("latexmk", path=path)
    return latexmk if latexmk and shutil.which("pdflatex", path=path) else None


def uncommented(source: str) -> str:
    """A .tex file's text without its comments."""
    return COMMENT.sub("", source)


def body(source: str) -> str:
    """What the document says: the preamble (before `\\begin{document}`), when there is
    one, is blanked out (its lines kept, so line numbers stay the file's)."""
    head, sep, rest = source.partition("\\begin{document}")
    return "\n" * head.count("\n") + rest if sep else source


def inputs(source: str) -> list[str]:
    return [m.strip() for m in INPUT.findall(source)]


def graphics(source: str) -> list[str]:
    return [m.strip() for m in GRAPHICS.findall(source)]


def cite_keys(source: str) -> set[str]:
    return {k.strip() for group in CITE.findall(source) for k in group.split(",") if k.strip()} - {"*"}


def bib_keys(bib: str) -> set[str]:
    return set(BIB_ENTRY.findall(bib))
